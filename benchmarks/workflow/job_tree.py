"""Job of rule tree: local decisions along the previous path and today's, interleaved."""

import json
import sys

sys.path.insert(0, snakemake.params.benchmarks)
from bench_decisions import measure

result = measure()
with open(snakemake.output[0], "w") as out:
    json.dump({"rule_threads": snakemake.threads, **result}, out, indent=2)
