"""Adapter of rule select_checkpoints: every selection policy's checkpoint of one run."""

from pathlib import Path

from coordgap.config import AnalysisConfig, TrainingRunConfig
from coordgap.evaluation.checkpoints import select_checkpoints
from coordgap.logs import job_log

with job_log(snakemake.log[0], "select_checkpoints") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    choices = {Path(path).stem: Path(path) for path in snakemake.output.choices}
    select_checkpoints(
        run=run,
        policies=snakemake.params.policies,
        rollouts=sorted(Path(snakemake.input.rollouts).glob("step_????.parquet")),
        validation=[Path(path) for path in snakemake.input.validation],
        config=AnalysisConfig.from_dict(snakemake.params.reward, snakemake.params.analysis),
        selection_json=Path(snakemake.output.selection),
        choice_jsons=choices,
    )
    log.info("run %s: %s", run.name, Path(snakemake.output.selection).read_text())
