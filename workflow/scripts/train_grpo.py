"""Adapter of rule train_grpo: train one GRPO run, resuming a killed one."""

from pathlib import Path

import torch

from coordgap.config.play import EnvironmentConfig, ModelSpec, accepted_error_share
from coordgap.config.training import TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.logs import job_log
from coordgap.provenance import write_record
from coordgap.tracking import tracked
from coordgap.training.loop import RunOutputs, train_run

with job_log(snakemake.log[0], "train_grpo") as log:
    run = TrainingRunConfig.from_dict(snakemake.wildcards.run, snakemake.params.run)
    log.info("run %s: %s trainer, %d steps", run.name, run.trainer, run.steps)
    # Snakemake sets the job's thread variables from the rule's threads; torch reads them.
    log.info("torch threads: %d", torch.get_num_threads())
    with tracked(snakemake.config, run.name, "train", settings=run.settings()) as stream:
        train_run(
            run=run,
            base=ModelSpec.from_dict(run.base_model, snakemake.params.base),
            weights=Path(snakemake.input.weights),
            env=EnvironmentConfig.from_dict(snakemake.params.environment),
            templates=PromptTemplates.load(snakemake.input.prompts),
            base_seed=snakemake.params.seed,
            first_scenario=snakemake.params.first_scenario,
            outputs=RunOutputs(Path(snakemake.output.history).parent, run.steps),
            max_error_share=accepted_error_share(snakemake.config),
            on_step=stream.log,
        )
    # Snakemake runs the job in the workflow's folder: its git checkout is the code's.
    write_record(snakemake.output.provenance, snakemake.params.provenance, root=Path.cwd())
