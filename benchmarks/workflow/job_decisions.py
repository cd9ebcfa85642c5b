"""Job of rule decisions: one group of 5 decisions, timed inside a Snakemake job."""

import json
import statistics
import sys

import torch

sys.path.insert(0, snakemake.params.benchmarks)
from bench_local import time_groups

result = time_groups("bfloat16", (5,), repeats=3, decisions=5)
median = statistics.median(result["seconds"][5])
with open(snakemake.output[0], "w") as out:
    json.dump(
        {
            "rule_threads": snakemake.threads,
            "torch_threads": torch.get_num_threads(),
            "ms_per_decision": 1000 * median / result["decisions"],
            "seconds": result["seconds"][5],
        },
        out,
        indent=2,
    )
