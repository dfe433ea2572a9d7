"""The pod image (docker/) agrees with the rest of the project.

These checks run in a second and catch the drift that would break the image: pins that
differ from what the tests ran with, a user that the Job's securityContext would refuse, a
harness that needs more than the image ships. tests/offline builds the image for real and
runs a case in it (minutes; `make test-offline`).
"""

import ast
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()


def final_stage() -> str:
    return DOCKERFILE.rsplit("\nFROM ", 1)[1]


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line)


def test_image_pins_torch_and_deepspeed_as_the_tests_ran_them():
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE, re.M))
    assert args["TORCH_VERSION"] == pins()["torch"]
    assert args["DEEPSPEED_VERSION"] == pins()["deepspeed"]
    assert args["NVML_VERSION"] == pins()["nvidia-ml-py"]
    for name in ("transformers", "peft", "bitsandbytes"):
        assert args[f"{name.upper()}_VERSION"] == pins()[name]
    # the Debian base docker/debian-base.sh makes: the CUDA runtime comes as torch's wheels
    assert args["BASE"] == "localhost/llmbench-base:bookworm"


def test_the_cuda_image_says_which_driver_it_needs():
    """PyPI's torch 2.13.0 is a CUDA 13.0 build (cuda-toolkit 13.0.3 in its metadata): the NVIDIA
    container runtime mounts the driver's compute and NVML libraries and refuses a node whose
    driver is older than CUDA 13.0 needs (>= 580) with this requirement, at start, not mid-case."""
    env = final_stage()
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in env


def test_runtime_stage_is_non_root_with_the_uid_the_job_requires():
    user = re.findall(r"^USER (\S+)$", final_stage(), re.M)
    assert user == ["1000:1000"]
    job = (ROOT / "pytest_llmbench" / "k8s_templates" / "job.yaml.j2").read_text()
    assert "runAsUser: 1000" in job and "runAsNonRoot: true" in job


def test_runtime_stage_has_no_compiler_and_copies_only_the_harness():
    stage = final_stage()
    installs = " ".join(re.findall(r"apt-get install ([^\n&]+)", stage))
    for tool in ("gcc", "g++", "build-essential", "cuda-nvcc", "clang", "python3-dev"):
        assert tool not in installs
    assert "--no-index" in DOCKERFILE and "pip install" not in stage  # wheels only, in the builder
    copies = re.findall(r"^COPY (.+)$", stage, re.M)
    assert copies == ["--from=builder /opt/venv /opt/venv", "harness/ /opt/llmbench/harness/"]
    assert 'ENTRYPOINT ["python", "-m", "torch.distributed.run"]' in stage


def test_job_command_matches_the_image_entrypoint():
    job = (ROOT / "pytest_llmbench" / "k8s_templates" / "job.yaml.j2").read_text()
    command = re.search(r"^ +command: (.+)$", job, re.M)[1]
    assert yaml.safe_load(command) == ["python", "-m", "torch.distributed.run"]
    assert re.search(r'^ +args: \["-m", "harness",', job, re.M)


def test_harness_needs_only_what_the_image_ships():
    """Every import in harness/ is the standard library or a package the image installs."""
    assert '"nvidia-ml-py==${NVML_VERSION}"' in DOCKERFILE
    for name in ("transformers", "peft", "bitsandbytes"):
        assert f'"{name}==${{{name.upper()}_VERSION}}"' in DOCKERFILE
    allowed = {"torch", "deepspeed", "pynvml", "harness", "transformers", "peft", "bitsandbytes",
               *sys.stdlib_module_names}
    for path in (ROOT / "harness").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.relative_to(ROOT)} imports {name}"


def test_build_context_is_the_dockerfile_harness_and_wheels_only():
    script = (ROOT / "docker" / "build.sh").read_text()
    copied = re.findall(r'^cp (?:-r )?(\S+) "\$context/?(\S*)"$', script, re.M)
    assert copied == [("docker/Dockerfile", ""), ("harness", "harness")]
    # the wheels hard-linked where the context shares their filesystem, else copied: nothing else
    linked = re.findall(r'^cp -rl (\S+) "\$context/(\S*)" 2>/dev/null \|\| \{ rm -rf "\$context/(\S*)"; '
                        r'cp -r (\S+) "\$context/(\S*)"; \}$', script, re.M)
    assert linked == [('"$wheelhouse"', "wheelhouse", "wheelhouse", '"$wheelhouse"', "wheelhouse")]
    assert set(re.findall(r"^COPY (\S+) ", DOCKERFILE, re.M)) == {"wheelhouse/", "--from=builder", "harness/"}
