"""Job of rule direction: the control's first step under every update of the grid."""

import json
import sys

sys.path.insert(0, snakemake.params.benchmarks)
from bench_update_direction import measure

result = measure()
with open(snakemake.output[0], "w") as out:
    json.dump({"rule_threads": snakemake.threads, **result}, out, indent=2)
