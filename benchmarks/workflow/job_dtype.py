"""Job of rule dtype: bf16 against float32, rollouts, update and probe, inside a Snakemake job."""

import json
import sys

sys.path.insert(0, snakemake.params.benchmarks)
from bench_dtype import compare

result = compare()
with open(snakemake.output[0], "w") as out:
    json.dump({"rule_threads": snakemake.threads, **result}, out, indent=2)
