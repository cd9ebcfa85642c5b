"""Adapter of rule summarize_selection: every policy's choice and every step's estimates."""

from pathlib import Path

from coordgap.config.training import TrainingRunConfig
from coordgap.data import STEP_GLOB
from coordgap.evaluation.checkpoints import selection, write_json
from coordgap.logs import job_log

with job_log(snakemake.log[0], "summarize_selection"):
    write_json(
        selection(
            run=TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run),
            policies=snakemake.params.policies,
            rollouts=sorted(Path(snakemake.input.rollouts).glob(f"{STEP_GLOB}.parquet")),
            validation=sorted(Path(snakemake.input.validation).glob(f"{STEP_GLOB}.parquet")),
            intervals=snakemake.params.analysis,
        ),
        Path(snakemake.output[0]),
    )
