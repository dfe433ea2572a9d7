"""tools/wheelhouse.py refuses what it must not build into or pin, before anything is downloaded (the
download itself, minutes and the network, is tests/offline)."""

import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import wheelhouse  # noqa: E402


def refused(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        wheelhouse.main(argv)
    return str(exc.value)


def test_a_file_a_link_or_a_foreign_folder_is_refused_by_name_and_left_as_it_was(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    assert refused([str(a_file)]) == f"wheelhouse {a_file} (argument): exists and is not a folder"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert "exists and is not a folder" in refused([str(link)])
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_text("a cat")
    assert "holds files and is not a wheelhouse this tool wrote" in refused([str(foreign)])
    assert a_file.read_text() == "mine" and (foreign / "cat.jpg").read_text() == "a cat"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "link", "photos"]  # no staging left


def test_a_folder_under_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    said = refused([str(tmp_path / "a-file" / "wheelhouse")])
    assert said == (f"wheelhouse {tmp_path}/a-file/wheelhouse (argument): "
                    f"{tmp_path}/a-file is a file, not a folder")


def wheel(path: Path, name: str, version: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody: text\n")
    return path


def test_a_wheel_whose_metadata_names_another_package_is_never_pinned(tmp_path):
    wheel(tmp_path / "einops-0.8.1-py3-none-any.whl", "einops", "0.8.1")
    assert wheelhouse.hashed("einops==0.8.1", tmp_path).startswith("einops==0.8.1 --hash=sha256:")
    wheel(tmp_path / "einops-0.8.1-py3-none-any.whl", "evil-package", "6.6.6")  # renamed by hand
    with pytest.raises(SystemExit, match="its metadata says evil-package 6.6.6, its file name einops 0.8.1"):
        wheelhouse.hashed("einops==0.8.1", tmp_path)
    (tmp_path / "einops-0.8.1-py3-none-any.whl").write_text("not a zip")
    with pytest.raises(SystemExit, match="not a readable wheel"):
        wheelhouse.hashed("einops==0.8.1", tmp_path)


def test_a_finished_wheelhouse_replaces_the_last_one_whole(tmp_path):
    final = tmp_path / "wheelhouse"
    final.mkdir()
    (final / "requirements.txt").write_text("old\n")
    (final / "stale-1.0-py3-none-any.whl").write_text("from an earlier run")
    built = wheelhouse.staging(final)
    (built / "requirements.txt").write_text("new\n")
    wheelhouse.replace(built, final)
    assert sorted(p.name for p in final.iterdir()) == ["requirements.txt"]
    assert (final / "requirements.txt").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheelhouse"]
