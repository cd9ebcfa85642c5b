"""Job of rule update: one group's rollouts and update, timed inside a Snakemake job."""

import json
import sys

sys.path.insert(0, snakemake.params.benchmarks)
from bench_train import time_step

result = time_step(groups_per_step=1, episodes_per_group=3)
with open(snakemake.output[0], "w") as out:
    json.dump({"rule_threads": snakemake.threads, **result}, out, indent=2)
