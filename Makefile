# The two commands of the README:
#   make bench   the CPU benchmark suite on the local launcher, then the report
#   make test    the project's tests
# Both create .venv and install everything on first use (python3 is all they need).

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
OUTPUT ?= .llmbench
export PIP_CONSTRAINT = $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: install bench report test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[train,k8s,test]'
	touch $@

bench: install
	$(BIN)/pytest tests/benchmarks -m auto --llmbench-output=$(OUTPUT) --benchmark-autosave \
		--benchmark-storage=$(OUTPUT)/benchmarks -p no:cacheprovider $(ARGS)

report: install
	$(BIN)/pytest --llmbench-report --llmbench-output=$(OUTPUT)

test: install
	$(BIN)/pytest tests/unit tests/plugin tests/harness tests/k8s $(ARGS)

lint: install
	$(BIN)/ruff check harness pytest_llmbench tests benchmarks

clean:
	rm -rf $(VENV) $(OUTPUT) .benchmarks .pytest_cache
