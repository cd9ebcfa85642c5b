# Two commands on a fresh machine: `make all` runs the whole study, `make test` the tests.
# Both create .venv on first use; later runs reuse it.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch first, from its CPU wheel: a bare torch requirement would pull a multi-GB CUDA build.
TORCH := torch==2.13.0
CORES ?= 8
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: all test lint touch clean-results

all: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES) all

test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint
	$(BIN)/python -m pytest

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint

# After `dvc checkout` or `dvc pull` moved outputs, realign Snakemake's timestamps and metadata.
touch: $(VENV)/.installed
	$(BIN)/dvc status --quiet || { echo "dvc status is not clean: run dvc checkout first"; exit 1; }
	$(BIN)/snakemake --touch --cores 1 all

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

clean-results:
	rm -rf results logs .snakemake
