"""Print the options table of docs/GUIDE.md's Options section from the option table itself: every
option of pytest_llmbench/settings.py's OPTIONS and of each built-in launcher, with its flag, its
environment variable and its help.

    python tools/options_doc.py > /tmp/options.md   # then paste between the markers in docs/GUIDE.md

tests/unit/test_tables.py fails when docs/GUIDE.md no longer holds this exact block: an option added,
renamed or redescribed shows there until the table is regenerated.
"""

from __future__ import annotations

BEGIN = "<!-- options: tools/options_doc.py -->"
END = "<!-- end of options -->"


def rows() -> list[tuple[str, str, str]]:
    """(flags, environment variable, help) of every option, the plugin's first, then each launcher's."""
    from pytest_llmbench import launchers
    from pytest_llmbench.settings import OPTIONS

    out = []
    for where, options in [("", OPTIONS), *((f"{kind.name} launcher: ", kind.options)
                                            for kind in launchers.kinds().values())]:
        for option in options:
            flags = [f"--llmbench-{option.name}", *([option.short] if option.short else [])]
            value = "" if option.flag else " " + option.metavar
            said = " ".join(f"`{flag}{value}`" for flag in flags)
            out.append((said, f"`{option.env}`", where + option.help.replace("|", "\\|")))
    return out


def render() -> str:
    lines = [BEGIN, "", "| option | environment | meaning |", "| --- | --- | --- |"]
    lines += [f"| {flags} | {env} | {meaning} |" for flags, env, meaning in rows()]
    return "\n".join([*lines, "", END])


if __name__ == "__main__":
    print(render())
