"""``llmbench-plan --model config.json`` reads a file people download: data, never code, bounded.

Each case below was a traceback, a hang, a prompt to run custom code or an unbounded read before
(issue 49); now each is a usage error (exit 2) naming the file and what is wrong with it.
"""

import json
import os
import socket
import threading

import pytest

from pytest_llmbench.planner import cli as plan_cli

TIME = ["--device", "h100-sxm", "--world-size", "8", "--seq-len", "64", "--strategy", "fsdp",
        "--precision", "bf16", "--time"]
TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 128, "intermediate_size": 128, "max_position_embeddings": 64}


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: a config must never reach the Hub."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def plan(path, capsys, *extra) -> tuple[int, str, str]:
    """The planner on ``path`` with stdin closed (transformers' "run custom code? [y/N]" reads it)."""
    with open(os.devnull) as devnull, pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", devnull)
        code = plan_cli.main(["--model", str(path), *TIME, *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def evil_folder(tmp_path):
    """A folder holding a module that leaves a mark when imported."""
    mark = tmp_path / "RAN"
    (tmp_path / "evil.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\nclass Evil: pass\n")
    return mark


def test_auto_map_of_a_type_without_a_causal_lm_runs_nothing_and_says_so(tmp_path, capsys, no_network):
    mark = evil_folder(tmp_path)
    config = {**TINY, "model_type": "albert", "embedding_size": 32, "_name_or_path": str(tmp_path),
              "auto_map": {"AutoModelForCausalLM": "evil.Evil", "AutoConfig": "org/repo--evil.Cfg"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, _, err = plan(tmp_path / "config.json", capsys)
    assert code == 2, err
    assert "no causal-LM class for model_type 'albert'" in err and "auto_map" in err
    assert "never run" in err and str(tmp_path / "config.json") in err
    assert not mark.exists()


def test_auto_map_beside_a_known_type_is_dropped_and_the_library_class_counted(tmp_path, capsys, no_network):
    mark = evil_folder(tmp_path)
    config = {**TINY, "_name_or_path": str(tmp_path), "trust_remote_code": True,
              "auto_map": {"AutoModelForCausalLM": "evil.Evil"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = plan(tmp_path / "config.json", capsys, "--json")
    assert code == 0, err
    assert json.loads(out)["plans"][0]["world_sizes"]["8"]["step_time_s"] > 0
    assert not mark.exists()


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: p.write_bytes(b'{"model_type": "llama", "x": "' + b"a" * (5 * 2**20) + b'"}'),
     "larger than 4 MiB"),
    (lambda p: p.write_text('{"a":' * 100_000 + "1" + "}" * 100_000), "nested too deep"),
    (lambda p: p.write_text(json.dumps({**TINY, "x": json.loads("[" * 33 + "1" + "]" * 33)})),
     "nested deeper than 32"),
    (lambda p: p.write_bytes(b'{"model_type": "llama", "name": "\xff"}'), "not UTF-8"),
    (lambda p: p.write_text('{"model_type": "llama", "rope_theta": NaN}'), "NaN is not a finite number"),
    (lambda p: p.write_text(json.dumps({**TINY, "num_hidden_layers": 10**9})), "num_hidden_layers 1000000000 "
                                                                              "is outside 1..4,096"),
    (lambda p: p.write_text(json.dumps({**TINY, "num_hidden_layers": 10**30})), "is outside 1..4,096"),
    (lambda p: p.write_text(json.dumps({**TINY, "vocab_size": 2.5})), "vocab_size 2.5 is not an integer"),
    (lambda p: p.write_text(json.dumps({**TINY, "model_type": "mpt", "expansion_ratio": 1e30})),
     "expansion_ratio 1e+30 is not a number in (0, 64]"),
    (lambda p: p.write_text(json.dumps({**TINY, "model_type": ["llama"]})), "no model_type"),
])
def test_a_config_that_is_not_a_small_regular_json_file_is_a_usage_error(tmp_path, capsys, make, says):
    path = tmp_path / "config.json"
    make(path)
    done = []
    # a FIFO with no writer blocked open() forever: the call runs aside so that a hang fails, not waits
    worker = threading.Thread(target=lambda: done.append(plan(path, capsys)), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "llmbench-plan did not return within 60 s"
    code, _, err = done[0]
    assert code == 2 and says in err and str(path) in err, err


def test_a_step_time_says_when_the_model_cannot_fit_the_device(tmp_path, capsys):
    """A 70B-wide model on one node under DDP: a step time, and a word that the run cannot start."""
    config = {**TINY, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
              "num_hidden_layers": 80, "intermediate_size": 28672, "vocab_size": 128256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, err = plan(tmp_path / "config.json", capsys, "--strategy", "ddp,zero3", "--json")
    assert code == 0, err
    fits = {p["strategy"]: p["world_sizes"]["8"]["fits_device"] for p in json.loads(out)["plans"]}
    assert fits == {"ddp": False, "zero3": False}
    assert "ddp grad_accum 1 at N=8 does not fit" in err and "H100" in err
    code, out, err = plan(tmp_path / "config.json", capsys, "--strategy", "zero3", "--device-memory-gib",
                          "4000", "--json")
    assert json.loads(out)["plans"][0]["world_sizes"]["8"]["fits_device"] is True and "not fit" not in err


def test_a_model_folder_and_a_multimodal_text_config_are_read(tmp_path, capsys, no_network):
    """``--model DIR`` reads DIR/config.json (a downloaded snapshot); a multimodal config's language
    model under ``text_config`` (Gemma 3's layout: the vocabulary outside it) is what the planner
    sizes: the same step time as that language model's own config."""
    folder = tmp_path / "gemma-like"
    folder.mkdir()
    text = {k: v for k, v in TINY.items() if k != "vocab_size"}
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llava", "vocab_size": TINY["vocab_size"], "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32}}))
    (tmp_path / "plain.json").write_text(json.dumps(TINY))
    code, nested, err = plan(folder, capsys, "--json")
    assert code == 0, err
    code, plain, err = plan(tmp_path / "plain.json", capsys, "--json")
    assert code == 0, err
    nested, plain = json.loads(nested), json.loads(plain)
    assert nested.pop("model") == str(folder) and plain.pop("model") == str(tmp_path / "plain.json")
    assert nested == plain and nested["params"] > 0
    (folder / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": [1]}))
    code, _, err = plan(folder, capsys)
    assert code == 2 and "text_config is not a config with a model_type" in err


def test_a_run_that_fits_an_80gb_part_is_not_called_too_big():
    """The part's memory is what its driver reports (nvidia-smi memory.total: 81,559 MiB on an H100
    80GB HBM3, 79.6 GiB), not "80 GB" read as 80e9 bytes (74.5 GiB). A 77 GiB plan fits an H100; it
    did not before, and it still does not fit an A100 40GB (40,537 MiB)."""
    from types import SimpleNamespace

    from harness import devices
    from pytest_llmbench.planner import step, time_cli

    plan = [("fsdp", 1, {8: SimpleNamespace(total=77 * time_cli.GIB)}, None)]
    h100 = time_cli.Setting(devices.get("h100-sxm"), step.Network(8, None))
    limit, source = time_cli.device_limit_gib(h100, None)
    assert limit == pytest.approx(79.65, abs=0.01) and "81,559 MiB" in source
    assert time_cli.misfits(h100, None, plan) == []
    a100 = time_cli.Setting(devices.get("a100-40gb"), step.Network(8, None))
    [(_, _, _, sentence)] = time_cli.misfits(a100, None, plan)
    assert "77.0 GiB per device against 39.6 GiB" in sentence and "40,537 MiB" in sentence


def test_a_part_without_published_figures_says_what_stands_in(tmp_path, capsys):
    """An L40S has no measured MAMF and no published FlashAttention figure: --time names both
    stand-ins, in the text and in the JSON; the parts the figures were measured on name none."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdin", open(os.devnull))
        code = plan_cli.main(["--model", str(tmp_path / "config.json"), *TIME[2:], "--device", "l40s"])
    out = capsys.readouterr().out
    assert code == 0 and "Stand-ins on the NVIDIA L40S: its MAMF: dense peak x 83%" in out
    assert "FlashAttention-2's A100 80GB share of dense peak (73%" in out
    code, out, err = plan(tmp_path / "config.json", capsys, "--json")
    assert code == 0, err
    assert json.loads(out)["plans"][0]["world_sizes"]["8"]["stand_ins"] == []  # TIME's h100-sxm: measured
