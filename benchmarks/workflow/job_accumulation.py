"""Job of rule accumulation: one row per optimizer step against all rows in one, same rows."""

import json
import sys

sys.path.insert(0, snakemake.params.benchmarks)
from bench_accumulation import compare

result = compare()
with open(snakemake.output[0], "w") as out:
    json.dump({"rule_threads": snakemake.threads, **result}, out, indent=2)
