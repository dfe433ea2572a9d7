"""Options, precedence, markers, ids, skips and bad input (no benchmark is run here)."""

import pytest

SHOW = '''
from pytest_llmbench.session import SESSION_KEY

def test_show(request):
    s = request.config.stash[SESSION_KEY].settings
    print(f"STRATEGY={','.join(s.strategy)} FROM={s.sources['strategy']}")
    print(f"TIMEOUT={s.timeout} FROM={s.sources['timeout']}")
'''


@pytest.fixture
def show(pytester):
    pytester.makepyfile(test_show=SHOW)
    pytester.makeini("[pytest]\nllmbench_strategy = fsdp\nllmbench_timeout = 30\n")
    return pytester


def test_cli_beats_env_beats_ini(show, monkeypatch):
    result = show.runpytest_subprocess("-s")
    result.stdout.fnmatch_lines(["*STRATEGY=fsdp FROM=ini llmbench_strategy in *tox.ini",
                                 "TIMEOUT=30.0 FROM=ini*"])
    monkeypatch.setenv("LLMBENCH_STRATEGY", "zero2,zero3")
    result = show.runpytest_subprocess("-s")
    result.stdout.fnmatch_lines(["*STRATEGY=zero2,zero3 FROM=environment LLMBENCH_STRATEGY"])
    result = show.runpytest_subprocess("-s", "--strategy=ddp", "--strategy", "fsdp1")
    result.stdout.fnmatch_lines(["*STRATEGY=ddp,fsdp1 FROM=command line --llmbench-strategy"])


@pytest.mark.parametrize("args, message", [
    (["--strategy=zero4"], "command line --llmbench-strategy: unknown value 'zero4'"),
    (["--world-size=0"], "command line --llmbench-world-size: 0 must be >= 1"),
    (["--seq-len=12.5"], "command line --llmbench-seq-len: '12.5' is not an integer"),
    (["--llmbench-launcher=pbs"], "unknown value 'pbs'; choose from local, k8s, slurm"),
    (["--llmbench-profile-file=nope.toml"], "profile file 'nope.toml' does not exist"),
    (["--llmbench-fail-below=n_params:5%"], "is not a metric with a better direction"),
    (["--llmbench-fail-below=tokens_per_s"], "is not METRIC:PCT"),
    (["--llmbench-bisect=HEAD~1..HEAD"], "command line --llmbench-bisect: needs --llmbench-fail-below"),
    (["--llmbench-bisect=HEAD", "--llmbench-fail-below=tokens_per_s:5%"],
     "command line --llmbench-bisect: 'HEAD' is not GOOD..BAD"),
    (["--llmbench-bisect=a..b", "--llmbench-fail-below=tokens_per_s:5%", "--llmbench-ab=env=x.env"],
     "command line --llmbench-bisect: each step runs A/B against the range's good end itself"),
    (["--llmbench-fail-below=tokens_per_s:5%"],
     "command line --llmbench-fail-below: needs --llmbench-ab (a baseline side run in this session) or "
     "--llmbench-compare (a stored run) to gate against"),
    (["--llmbench-ab=HEAD~1"], "command line --llmbench-ab: 'HEAD~1' is not KIND=VALUE with KIND one of ref, "
                               "python, env, image"),
    (["--llmbench-ab=ref=no-such-ref-0xdead"], "command line --llmbench-ab: ref=no-such-ref-0xdead: no such "
                                               "git ref in"),
    (["--llmbench-ab=env=missing.env"], "command line --llmbench-ab: env=missing.env: cannot read it"),
    (["--llmbench-ab=image=ghcr.io/x/y:1"], "command line --llmbench-ab: image=ghcr.io/x/y:1: image= is the "
                                            "Kubernetes launcher's pod image"),
    (["--llmbench-ab=python=/usr/bin/python3"], "command line --llmbench-ab: python=/usr/bin/python3: "
                                                "/usr/bin/python3 cannot import the harness"),
    (["--llmbench-ab=env=x.env", "--llmbench-compare=last"],
     "command line --llmbench-ab: gates against a side run in this session; command line --llmbench-compare "
     "against a stored one: choose one"),
    (["--llmbench-compare=20990101T000000Z-dead"],
     "command line --llmbench-compare: no stored session '20990101T000000Z-dead' under .llmbench*results"),
    (["--llmbench-compare=last"], "command line --llmbench-compare: no earlier session stored under"),
    (["--llmbench-trials=0"], "command line --llmbench-trials: 0 must be >= 1"),
    (["--llmbench-trials=100000"], "command line --llmbench-trials: 100000 is more than 100"),
    (["--llmbench-trials=3", "--llmbench-trials-max=2", "--llmbench-fail-below=tokens_per_s:5%",
      "--llmbench-compare=last"],
     "command line --llmbench-trials-max: 2 is below the 3 trials of command line --llmbench-trials; the "
     "cap must be at least the trials every case runs"),
    (["--llmbench-ab=python=/bin/true", "--llmbench-trials-max=1", "--llmbench-fail-below=tokens_per_s:5%"],
     "command line --llmbench-trials-max: 1 is below the 4 rounds of the A/B gate's first look"),
    (["--llmbench-ab=python=/bin/true"], "command line --llmbench-ab: python=/bin/true: /bin/true is not a "
                                         "Python that runs the harness"),
    (["--variant=ac+zip"], "command line --llmbench-variant: unknown part 'zip' in 'ac+zip'"),
    (["--llmbench-trials-max=4"], "command line --llmbench-trials-max: only adds trials to settle the "
                                  "--llmbench-fail-below gate, which is not set"),
    (["--llmbench-timeout=nan"], "command line --llmbench-timeout: 'nan' is not a finite number of seconds"),
    (["--llmbench-timeout=inf"], "command line --llmbench-timeout: 'inf' is not a finite number of seconds"),
    (["--strategy="], "command line --llmbench-strategy: empty; give at least one value"),
    (["--world-size", ","], "command line --llmbench-world-size: empty; give at least one value"),
    (["--llmbench-compare=../.."], "command line --llmbench-compare: '../..' is not a session id"),
    (["--llmbench-compare=/etc"], "command line --llmbench-compare: '/etc' is not a session id"),
    (["--llmbench-runner=ci large"], "command line --llmbench-runner: 'ci large' is not a runner label"),
    (["--llmbench-runner=" + "r" * 64], "command line --llmbench-runner: '" + "r" * 64 + "' is not a runner"),
    (["--llmbench-runner=-x"], "command line --llmbench-runner: '-x' is not a runner label"),
])
def test_bad_flags_are_usage_errors(pytester, args, message):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


def test_bad_env_and_ini_values_name_their_source(pytester, monkeypatch):
    pytester.makepyfile(test_x="def test_x(): pass")
    monkeypatch.setenv("LLMBENCH_WORLD_SIZE", "two")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*environment LLMBENCH_WORLD_SIZE: 'two' is not an integer*"])
    monkeypatch.delenv("LLMBENCH_WORLD_SIZE")
    monkeypatch.setenv("LLMBENCH_RUNNER", "pool\x1b[2Ja")  # an escape sequence, shown inert
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*environment LLMBENCH_RUNNER: 'pool\\x1b[[]2Ja' is not a runner label*"])
    monkeypatch.delenv("LLMBENCH_RUNNER")
    pytester.makeini("[pytest]\nllmbench_timeout = -3\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini llmbench_timeout in *: -3.0 must be > 0*"])


def test_bad_profile_file_names_file_and_key(suite):
    pytester = suite
    text = (pytester.path / "tinycpu.toml").read_text().replace('device = "cpu"', 'device = "tpu"')
    (pytester.path / "mine.toml").write_text(text)
    result = pytester.runpytest_subprocess("--llmbench-profile-file=mine.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*profile file mine.toml: key 'device': 'tpu' is not one of cpu, cuda*"])


def test_profile_markers_select_cases_with_readable_ids(suite):
    result = suite.runpytest_subprocess("--strict-markers", "--collect-only", "-q", "-m", "a10",
                                        "--strategy=zero2")
    result.stdout.fnmatch_lines(["test_suite.py::test_training[a10-qlora-qlora-zero2+ac-ws1-seq512]",
                                 "test_suite.py::test_training[a10-qlora-qlora-zero2+ac-ws2-seq512]",
                                 "test_suite.py::test_training[a10-qlora-qlora-zero2+ac-ws4-seq512]",
                                 "test_suite.py::test_training[a10-zero2-ws1-seq1024]",
                                 "test_suite.py::test_training[a10-zero2-ws2-seq1024]",
                                 "test_suite.py::test_training[a10-zero2-ws4-seq1024]",
                                 "6/* tests collected (* deselected)*"])
    # a10-qlora names the a10 marker too; its cases carry their workload's marker
    result = suite.runpytest_subprocess("--strict-markers", "--collect-only", "-q", "-m", "a10 and qlora")
    result.stdout.fnmatch_lines(["*a10-qlora-qlora-ddp+ac-ws4-seq512*", "15/* tests collected*"])
    result = suite.runpytest_subprocess("--strict-markers", "--collect-only", "-q", "-m", "a10 and pretrain")
    result.stdout.fnmatch_lines(["*a10-ddp-ws1-seq1024*", "12/* tests collected*"])
    result = suite.runpytest_subprocess("--strict-markers", "--collect-only", "-q", "-m",
                                        "h100 and multinode")
    result.stdout.fnmatch_lines(["*h100-ddp-ws16-seq1024*"])
    result.stdout.no_fnmatch_line("*h100-ddp-ws8-seq1024*")


def test_markers_are_registered(suite):
    result = suite.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.a10: benchmark cases of the a10 profile*",
                                 "@pytest.mark.multinode:*", "@pytest.mark.k8s:*"])


def test_gpu_cases_skip_with_a_reason_on_a_cpu_host(suite):
    result = suite.runpytest_subprocess("-m", "a10 and pretrain", "--strategy=ddp", "--world-size=1", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*a10-ddp-ws1-seq1024 needs 1 CUDA device(s) on this host; found 0*"])


def test_a_variant_a_strategy_cannot_run_is_a_skip_with_the_reason(suite):
    result = suite.runpytest_subprocess("-m", "tinycpu", "--llmbench-profile-file=tinycpu.toml",
                                        "--strategy=zero2", "--variant=powersgd2", "--world-size=1", "-rs",
                                        "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*tinycpu-zero2+powersgd2-ws1-seq64: variant powersgd does not apply to "
                                 "zero2: PowerSGD is a DDP communication hook*"])


def test_an_impossible_case_is_a_usage_error_naming_the_flag(suite):
    result = suite.runpytest_subprocess("-m", "cpu", "--strategy=ddp", "--seq-len=99999")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*seq_len from command line --llmbench-seq-len*"
                                 "seq_len: 99999 exceeds the model's * positions*"])


def test_an_override_invalid_only_for_a_deselected_profile_is_no_error(suite):
    """--llmbench-steps=6 is fine for tinycpu (2 warm-up steps) but not for a10 (10): only the
    selected cases count."""
    args = ["--llmbench-profile-file=tinycpu.toml", "--collect-only", "-q", "--llmbench-steps=6"]
    result = suite.runpytest_subprocess("-m", "tinycpu", *args)
    assert result.ret == pytest.ExitCode.OK
    result = suite.runpytest_subprocess("-m", "a10 and pretrain", "--strategy=ddp", "--world-size=1", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid benchmark case a10-ddp-ws1-seq1024 (strategy from command line "
                                 "--llmbench-strategy, world_size from *, steps from command line "
                                 "--llmbench-steps; profile *a10.toml): steps: 6 must be greater than "
                                 "warmup_steps (10)*"])


def test_a_value_given_twice_runs_once(suite):
    result = suite.runpytest_subprocess("--collect-only", "-q", "-m", "tinycpu",
                                        "--llmbench-profile-file=tinycpu.toml", "--strategy=ddp,ddp",
                                        "--world-size=2,2", "--seq-len=64")
    result.stdout.fnmatch_lines(["test_suite.py::test_training[[]tinycpu-ddp-ws2-seq64[]]",
                                 "1/* tests collected*"])


def test_an_output_that_cannot_take_results_is_one_usage_error_before_anything_runs(suite):
    (suite.path / "afile").write_text("x")
    for flag, message in [("afile", "afile exists and is not a folder"),
                          ("afile/out", "afile/out does not exist and cannot be created in")]:
        for report in ([], ["--llmbench-report"]):
            result = suite.runpytest_subprocess(f"--llmbench-output={flag}", *report, "-m", "tinycpu",
                                                "--llmbench-profile-file=tinycpu.toml",
                                                "-p", "no:cacheprovider")
            assert result.ret == pytest.ExitCode.USAGE_ERROR, (flag, report)
            result.stderr.fnmatch_lines([f"*command line --llmbench-output: {message}*"])
