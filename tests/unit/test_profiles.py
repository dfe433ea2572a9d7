import tomllib
from pathlib import Path

import pytest

from pytest_llmbench.cases import Case, make_spec
from pytest_llmbench.profiles import BUILTIN_DIR, ProfileError, load_profile, load_profiles, parse_profile


def test_builtin_profiles_load_and_build_valid_specs():
    profiles = load_profiles()
    assert set(profiles) == {path.stem for path in BUILTIN_DIR.glob("*.toml")} and len(profiles) >= 8
    assert profiles["cpu"].dtype == "fp32" and profiles["h100"].dtype == "bf16"
    assert profiles["a10"].env["NCCL_IB_DISABLE"] == "1"
    assert profiles["h100"].env["NCCL_IB_DISABLE"] == "0"
    for profile in profiles.values():
        for ws in profile.world_sizes:
            spec = make_spec(profile, profile.strategies[0], ws, profile.seq_lens[0])
            assert spec.world_size == ws
    a10 = profiles["a10"]
    assert Case(a10, make_spec(a10, "zero2", 4, 1024)).id == "a10-zero2-ws4-seq1024"
    assert make_spec(a10, "zero2", 4, 1024).nnodes == 4  # one A10 per node
    assert make_spec(profiles["h100"], "ddp", 16, 1024).nnodes == 2


@pytest.mark.parametrize("text, key", [
    ('device = "tpu"', "device"),
    ('strategies = ["ddp", "zero9"]', "strategies"),
    ("world_sizes = [0]", "world_sizes"),
    ("steps = 2\nwarmup_steps = 5", "steps"),
    ("colour = 1", "colour"),
    ('[thresholds]\nmin_scaling_efficiency = { two = 0.5 }', "thresholds.min_scaling_efficiency.two"),
    ('[thresholds]\nmax_peak_memory_gib = -1', "thresholds.max_peak_memory_gib"),
    ('[thresholds]\nmin_busbw_gbps = 0', "thresholds.min_busbw_gbps"),
    ("[thresholds]\nlaunch_noise_cv = 1.5", "thresholds.launch_noise_cv"),
    ("[thresholds]\nmemory_noise_cv = 0", "thresholds.memory_noise_cv"),
    ('scaling = "strong"', "global_batch_tokens"),
    ("global_batch_tokens = 4096", "global_batch_tokens"),
    ('scaling = "sideways"', "scaling"),
    ("collectives = 1", "collectives"),
    ('plan_models = ["gpt5"]', "plan_models"),
    ("[network]\nintra_node_busbw_gbps = 0", "network.intra_node_busbw_gbps"),
    ("[network]\nnvlink = 450", "network.nvlink"),
    # values that once slipped past: a scalar floor crashed pytest, nan disabled checks, 0 s timeouts
    ("[thresholds]\nmin_scaling_efficiency = 3", "thresholds.min_scaling_efficiency"),
    ("timeout_s = nan", "timeout_s"),
    ("timeout_s = 0", "timeout_s"),
    ("lr = inf", "lr"),
    ("usd_per_device_hour = nan", "usd_per_device_hour"),
    ("[thresholds]\nmax_peak_memory_gib = nan", "thresholds.max_peak_memory_gib"),
    ("[thresholds]\nmin_busbw_gbps = nan", "thresholds.min_busbw_gbps"),
    ("[network]\ninter_node_busbw_gbps = inf", "network.inter_node_busbw_gbps"),
    ('strategies = ["ddp", "zero2", "ddp"]', "strategies"),
    ('[env]\nNCCL_DEBUG = "INFO\\u0000"', "env.NCCL_DEBUG"),
    ('[env]\nPET_MASTER_ADDR = "elsewhere"', "env.PET_MASTER_ADDR"),
    ('[env]\nLLMBENCH_RUN_ID = "x"', "env.LLMBENCH_RUN_ID"),
    ('[env]\nMASTER_PORT = "1"', "env.MASTER_PORT"),
])
def test_bad_profiles_name_file_and_key(tmp_path, text, key):
    base = {"device": '"cpu"', "dtype": '"fp32"', "model": '"tiny"', "micro_batch": "1",
            "grad_accum": "1", "steps": "4", "warmup_steps": "1", "strategies": '["ddp"]',
            "world_sizes": "[1]", "seq_lens": "[64]"}
    lines = [f"{k} = {v}" for k, v in base.items() if not text.startswith(f"{k} ")
             and not (k == "warmup_steps" and "warmup_steps" in text)]
    table = text.startswith("[")
    body = "\n".join(lines) + "\n" + text if table else text + "\n" + "\n".join(lines)
    path = tmp_path / "mine.toml"
    path.write_text(body)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and repr(key) in str(info.value)


def test_missing_required_key(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('device = "cpu"\n')
    with pytest.raises(ProfileError, match=r"key 'dtype': required key is missing"):
        load_profile(path)


def test_the_readmes_profile_example_loads_and_selects_its_cases():
    """README.md's "Your own benchmark test" profile, as a user would save it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    text = readme.split("```toml\n", 1)[1].split("```", 1)[0]
    profile = parse_profile("my-h100", tomllib.loads(text), source="README.md")
    assert profile.device == "cuda" and profile.runs_on("NVIDIA H100 80GB HBM3")
    assert profile.min_scaling_efficiency == {8: 0.85}
    assert make_spec(profile, "zero3", 8, 1024).case_id == "zero3-ws8-seq1024"


@pytest.mark.parametrize("name", ["a(b)", "gpu:1", "_hidden", "7nodes"])
def test_a_profile_file_name_that_cannot_be_a_marker_is_refused(tmp_path, name):
    path = tmp_path / f"{name}.toml"
    path.write_text((Path(__file__).resolve().parents[1] / "data" / "tinycpu.toml").read_text())
    with pytest.raises(ProfileError, match=r"becomes the profile's name, marker and case ids"):
        load_profile(path)


def test_a_profile_file_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "latin.toml"
    path.write_bytes('description = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ProfileError, match=r"latin.toml: not UTF-8 text \(byte 18\)"):
        load_profile(path)



def test_a_memory_budget_the_device_cannot_exceed_is_refused(tmp_path):
    """A peak never exceeds the device's memory, so a budget at or above it could never fail (the l40s
    profile shipped 45 GiB on a 44 GiB part): the profile is refused, naming the key."""
    path = tmp_path / "mine.toml"
    path.write_text('device = "cpu"\ndtype = "fp32"\nmodel = "tiny"\nmicro_batch = 1\ngrad_accum = 1\n'
                    'steps = 4\nwarmup_steps = 1\nstrategies = ["ddp"]\nworld_sizes = [1]\nseq_lens = [64]\n'
                    'device_memory_gib = 44.0\n[thresholds]\nmax_peak_memory_gib = 45.0\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and "could never fail" in str(info.value)
    path.write_text(path.read_text().replace("45.0", "41.0"))
    assert load_profile(path).max_peak_memory_gib == 41.0


def test_built_in_gpu_profiles_name_parts_of_the_device_table_and_nothing_else():
    """Issue 62: a profile names device parts; the device facts (the GPU name patterns, the memory) live
    once, in harness/devices.py. A plan is held to the part's memory: the a100 profile's 80 GB parts give
    80.0 GiB where it declared 79, and a 40 GB A100 is no longer taken for it."""
    from harness import devices

    for name, profile in load_profiles().items():
        raw = tomllib.loads(Path(profile.source).read_text())
        assert "device_names" not in raw and "device_memory_gib" not in raw, name
        if profile.device == "cuda":
            assert profile.parts and set(profile.parts) <= set(devices.DEVICES), name
            assert profile.memory_gib == min(devices.DEVICES[p].memory_gib for p in profile.parts)
    a100 = load_profiles()["a100"]
    assert a100.memory_gib == 80.0 and not a100.runs_on("NVIDIA A100-SXM4-40GB")
    assert a100.runs_on("NVIDIA A100-SXM4-80GB") and a100.runs_on("NVIDIA A100 80GB PCIe")
