"""``benchmarks/gpu_check.py`` end to end on this CPU, at its tiny shape.

The GPU run itself cannot be tested here (no GPU); this runs every code path it times, on the
CPU, and checks what the JSON reports.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def share(value: float) -> bool:
    return 0 < value <= 1


def test_gpu_check_runs_on_cpu(smollm2_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--shape", "tiny"]
    command += ["--budget-s", "60", "--tokenizer", str(smollm2_dir), "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert results["complete"]
    assert positive(results["wall_s"])
    assert results["device"]["requested"] == "cpu"
    assert results["device"]["torch"]
    assert isinstance(results["device"]["cuda_available"], bool)
    assert positive(results["bf16_matmul_peak_flops"])
    shape = results["shape"]
    assert shape["name"] == "tiny"
    assert shape["vocab_size"] == 49152
    assert 0 < shape["linear_parameters"] < shape["parameters"]
    assert shape["parameters_at_qwen3_vocab"] > shape["parameters"]

    sampler = results["sampler"]
    assert sampler["repeats"] >= 1
    assert sampler["decisions"] == 15
    assert sampler["max_memory_allocated"] in (None, 0)
    assert set(sampler["groups"]) == {"1", "5", "15"}
    for row in sampler["groups"].values():
        assert len(row["seconds"]) == sampler["repeats"]
        assert positive(row["ms_per_decision"])
        assert positive(row["decisions_per_s"])
        assert math.isclose(row["ms_per_decision"] * row["decisions_per_s"], 1000)
        assert share(row["fraction_of_bf16_peak"])

    trainer = results["trainer"]
    assert trainer["rows"] > 0
    assert trainer["tokens"] > trainer["rows"]
    assert trainer["max_memory_allocated"] in (None, 0)
    for field in ("rollout_seconds", "first_update_seconds", "seconds", "seconds_per_row"):
        assert positive(trainer[field]), field
    assert math.isclose(trainer["seconds_per_row"] * trainer["rows"], trainer["seconds"])
    assert positive(trainer["tokens_per_s"])
    assert share(trainer["fraction_of_bf16_peak"])

    # The rows to paste into benchmarks/README.md's results table.
    rows = [line for line in done.stdout.splitlines() if line.startswith("| GPU check")]
    assert len(rows) == 2
    assert all(row.endswith("| — | reported |") for row in rows)
