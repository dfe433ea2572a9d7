# The two commands of the README:
#   make bench   the CPU benchmark suite on the local launcher, then the report
#   make test    the project's tests
# Both create .venv and install everything on first use (python3 is all they need).
# Offline: `make wheelhouse` writes every wheel into wheelhouse/; on a host with no network,
# `make install OFFLINE=wheelhouse` installs from it alone. `make image` builds the pod image
# from the same wheels (docker, else buildah; BASE=... for a local base, docker/debian-base.sh).

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
OUTPUT ?= .llmbench
WHEELHOUSE ?= wheelhouse
IMAGE ?= localhost/llmbench-harness:dev
# OFFLINE=DIR: install from that wheelhouse only, never from an index.
PIP_SOURCE = $(if $(OFFLINE),--no-index --find-links $(abspath $(OFFLINE)))
export PIP_CONSTRAINT = $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: install bench report test test-offline lint wheelhouse image cuda-check image-cuda clean cluster cluster-build node-build cluster-down

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(PIP_SOURCE) -c constraints.txt -e '.[train,k8s,test]'
	touch $@

# The tests' extra: Playwright, to drive the host's Chromium (tests/unit/test_report_html.py).
$(VENV)/.browser: $(VENV)/.installed
	$(BIN)/pip install -q $(PIP_SOURCE) -c constraints.txt -e '.[browser]'
	touch $@

bench: install
	$(BIN)/pytest tests/benchmarks -m auto --llmbench-output=$(OUTPUT) --benchmark-autosave \
		--benchmark-storage=$(OUTPUT)/benchmarks -p no:cacheprovider $(ARGS)

report: install
	$(BIN)/pytest --llmbench-report --llmbench-output=$(OUTPUT)

# Two test files at a time (pytest-xdist; a file's tests stay together, and the files that share
# 2-rank runs are one unit: tests/conftest.py; so each 2-rank fixture launches once). The folders
# of long launches go first and the unit tests fill the workers' gaps at the end. WORKERS=0 runs
# them one by one.
WORKERS ?= 2
test: install $(VENV)/.browser
	$(BIN)/pytest tests/harness tests/slurm tests/plugin tests/k8s tests/unit -n $(WORKERS) --dist loadfile $(ARGS)

# The wheelhouse, offline install and image, built and run for real (minutes; needs root,
# debootstrap and buildah or docker: .ci/run installs them).
test-offline: install
	$(BIN)/pytest tests/offline $(ARGS)

# WHEELHOUSE_ARGS: --no-torch (the host brings its own), --python-version 3.12 (another target).
wheelhouse: install
	$(BIN)/python tools/wheelhouse.py $(WHEELHOUSE) $(WHEELHOUSE_ARGS)

image:
	WHEELHOUSE=$(WHEELHOUSE) BASE=$(BASE) docker/build.sh $(IMAGE)

# The CUDA image (docker/Dockerfile): PyPI's torch 2.13.0, a CUDA 13.0 build (nodes need an NVIDIA
# driver >= 580), with the CUDA runtime wheels it names (2.6 GB more than the CPU wheelhouse), on the
# Debian base docker/debian-base.sh makes unless BASE names one. `make cuda-check` resolves that
# set from the wheels' metadata without downloading it (CI runs it: tests/offline).
CUDA_WHEELHOUSE ?= wheelhouse-cuda
CUDA_IMAGE ?= localhost/llmbench-harness:cuda
cuda-check: install
	$(BIN)/python tools/wheelhouse.py $(CUDA_WHEELHOUSE) --cuda --check

image-cuda: install
	$(BIN)/python tools/wheelhouse.py $(CUDA_WHEELHOUSE) --cuda
	base="$(BASE)"; [ -n "$$base" ] || base=$$(docker/debian-base.sh); \
	WHEELHOUSE=$(CUDA_WHEELHOUSE) BASE=$$base docker/build.sh $(CUDA_IMAGE)

# The real Kubernetes control plane the k8s tests use (tools/k8s_local.py): etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, Kueue, JobSet and Trainer built from source with Go 1.26
# (pins: tools/cluster/) into ~/.cache/llmbench-cluster once, then started on loopback ports.
# `make cluster` prints the KUBECONFIG to export; `make cluster-down` stops it.
CLUSTER_DIR ?= $(OUTPUT)/k8s
cluster-build:
	bash tools/cluster/build.sh

# A real node for it (tools/k8s_kubelet.py): the kubelet, CoreDNS, the CNI plugins and a pause process,
# built from source into the same cache (tools/cluster/build-node.sh); containerd and runc from apt.
node-build:
	bash tools/cluster/build-node.sh

cluster: install cluster-build
	$(BIN)/python tools/k8s_local.py up $(CLUSTER_DIR)

cluster-down:
	$(PYTHON) tools/k8s_local.py down $(CLUSTER_DIR)

lint: install
	$(BIN)/ruff check harness pytest_llmbench tests benchmarks tools

clean:
	rm -rf $(VENV) $(OUTPUT) $(WHEELHOUSE) .benchmarks .pytest_cache
