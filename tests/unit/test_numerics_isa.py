"""The local model's numeric tests under each oneDNN ISA cap: CI must pass on every CPU kind.

Machines of this kind differ in CPU, and oneDNN picks its bf16 kernels by the instructions it
finds (AMX, AVX512-BF16, AVX-512, AVX2): each rounds differently. The normal test run covers
whatever path this machine takes by default; this test reruns the tests marked ``numerics`` in
``test_local_model.py`` (the sampler's log-probs) and ``test_training.py`` (the trainer's
decision-level ratio on the unchanged policy) with ``ONEDNN_MAX_CPU_ISA`` capping oneDNN at
each lower path, so their stated bounds are checked on all of them from one machine.

Those marked ``float32`` too are left out of the reruns: torch computes float32 products,
attention and their gradients without oneDNN (MKL and ATen's own kernels), so no cap can
change a bit of them. The first test here checks exactly that on the model's real layers,
eager and compiled, and that the same probe does see oneDNN at work in bf16.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

CPUINFO = Path("/proc/cpuinfo")
TESTS = [Path(__file__).with_name(name) for name in ("test_local_model.py", "test_training.py")]
# AVX512_CORE_AMX is the default on machines that have it: the normal run is that path.
CAPS = ("AVX512_CORE_BF16", "AVX512_CORE", "AVX2")
# oneDNN's paths from the top down, each with the /proc/cpuinfo flags a CPU needs to take it.
PATHS = {
    "AVX512_CORE_AMX": {"amx_bf16", "amx_tile"},
    "AVX512_CORE_BF16": {"avx512_bf16"},
    "AVX512_CORE": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "AVX2": {"avx2"},
}


# A bf16 matmul under oneDNN's verbose log, which names the kernel's ISA (brg_matmul:<isa>).
PROBE = (
    "import torch; torch.nn.Linear(64, 64).to(torch.bfloat16)"
    "(torch.randn(64, 64, dtype=torch.bfloat16))"
)


@pytest.fixture(scope="module")
def own_path() -> str:
    """The ISA of oneDNN's bf16 kernels on this machine by default: what the normal run tests."""
    log = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kernels = re.findall(r"brg_matmul:(\w+)", log)
    # No oneDNN bf16 matmul by default (another CPU kind): every cap is a path to test.
    return kernels[0].upper() if kernels else ""


# The model's forward and backward passes with a LoRA adapter, padded (masked attention, as
# a group of decisions has), eager and, when asked, again with one decoder layer compiled
# (compile_update).
LAYERS_PROBE = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
dtype = getattr(torch, sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=dtype, use_kernels=False)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
ids = torch.arange(48).reshape(2, 24) * 7
mask = torch.ones_like(ids)
mask[1, :5] = 0
model(input_ids=ids, attention_mask=mask).logits.float().logsumexp(-1).sum().backward()
if sys.argv[3] == "eager":
    sys.exit()
layers = model.get_base_model().model.layers
layers[1] = torch.compile(layers[1], dynamic=True)
model(input_ids=ids, attention_mask=mask).logits.float().logsumexp(-1).sum().backward()
"""


def onednn_calls(model_dir: Path, dtype: str, compiled: bool) -> int:
    """How many oneDNN primitives the layers probe executes in ``dtype`` (with the compiled
    layer's passes too if ``compiled``)."""
    log = subprocess.run(
        [
            sys.executable,
            "-c",
            LAYERS_PROBE,
            str(model_dir),
            dtype,
            "compiled" if compiled else "eager",
        ],
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(re.findall(r"^onednn_verbose.*,exec,", log, re.M))


def test_float32_never_reaches_onednn(smollm2_dir: Path, own_path: str) -> None:
    assert onednn_calls(smollm2_dir, "float32", compiled=True) == 0
    # This CPU has oneDNN bf16 kernels: the probe sees them (eager is enough to show it).
    if own_path:
        assert onednn_calls(smollm2_dir, "bfloat16", compiled=False) > 0


def cpu_top_path() -> str:
    """The highest oneDNN path this CPU's instructions allow: a cap at or above it changes
    nothing (an AVX2-only CPU runs the same kernels under every cap)."""
    flags = set(re.search(r"^flags\s*:(.*)$", CPUINFO.read_text(), re.M).group(1).split())
    return next(path for path, needs in PATHS.items() if needs <= flags)


@pytest.mark.parametrize("cap", CAPS)
def test_numeric_tests_hold_on_every_kernel_path(
    cap: str, smollm2_dir: Path, own_path: str
) -> None:
    if cap == own_path:
        pytest.skip(f"{cap} is this machine's default kernel path: the normal run tested it")
    top = cpu_top_path()
    if list(PATHS).index(cap) <= list(PATHS).index(top):
        pytest.skip(f"this CPU's top path is {top}: under the {cap} cap it runs the normal path")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": cap, "COORDGAP_TEST_MODEL_DIR": str(smollm2_dir)}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-m", "numerics and not float32", *TESTS),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, f"{cap}:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout
