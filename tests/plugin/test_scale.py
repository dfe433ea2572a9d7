"""The collectives probe through the plugin, its threshold made to fail, and the report's
projection from the command line (`llmbench-report --project`)."""

import json
import subprocess
import sys

PROBE = '''
def test_collectives(llmbench, llmbench_probe):
    result = llmbench.run(llmbench_probe)
    llmbench.check(result)
'''


def test_a_probe_below_its_busbw_floor_fails_and_the_report_projects(suite):
    suite.makepyfile(test_probe=PROBE)
    text = (suite.path / "tinycpu.toml").read_text().replace(
        "collectives = false", "collectives = true\ncollectives_max_bytes = 65536")
    text += "\n[thresholds]\nmin_busbw_gbps = 1e6\n"  # no link moves a PB/s
    (suite.path / "tinycpu.toml").write_text(text)
    result = suite.runpytest_subprocess(
        "-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp", "--world-size=1,2",
        "--llmbench-output=out", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*collectives-ws2: busbw at 65,536 bytes below the tinycpu threshold of 1e+06 GB/s (tinycpu.toml): "
        "all_reduce * GB/s*"])
    stored = {p.name: json.loads(p.read_text()) for p in (suite.path / "out" / "results").glob("*/*.json")}
    assert stored["tinycpu-collectives-ws2.json"]["status"] == "ok"  # measured and kept, then judged
    assert len(stored["tinycpu-collectives-ws2.json"]["collectives"]) == 4 * 14  # 8 B..64 KiB, x2
    # the report without pytest, projecting to world sizes of our choosing, the profile from its file
    out = subprocess.run([sys.executable, "-m", "pytest_llmbench.report", "out", "--project", "4,8",
                          "--profile-file", "tinycpu.toml"], cwd=suite.path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    report = (suite.path / "out" / "report" / "REPORT.md").read_text()
    projected = report.split("## Projection (projected, not measured)")[1].split("Validation")[0]
    assert [line.split(" | ")[2] for line in projected.splitlines() if line.startswith("| tinycpu")] == [
        "1", "2", "4", "8"]
    assert "| tinycpu | ddp seq64 | 2 |" in report.split("Validation, leave one world size out")[1]
    bad = subprocess.run([sys.executable, "-m", "pytest_llmbench.report", "out", "--project", "0"],
                         cwd=suite.path, capture_output=True, text=True)
    assert bad.returncode == 2 and "--project: '0': world sizes are integers of at least 1" in bad.stderr
