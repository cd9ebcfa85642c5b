"""Adapter of rule pilot: an arm's recipe trained with each candidate update, and the choice."""

import json
from pathlib import Path

from coordgap.config.play import EnvironmentConfig, ModelSpec, accepted_error_share
from coordgap.config.training import PilotConfig, TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS
from coordgap.logs import job_log
from coordgap.training.pilot import (
    apply_rule,
    candidates,
    choice_record,
    pilot_markdown,
    pilot_table,
    train_pilot,
)

with job_log(snakemake.log[0], "pilot") as log:
    pilot = PilotConfig.from_dict(snakemake.params.pilot)
    recipe = TrainingRunConfig.from_dict(snakemake.params.recipe_run, snakemake.params.recipe)
    env = EnvironmentConfig.from_dict(snakemake.params.environment)
    log.info(
        "pilot of arm %s (run %s): %d candidates", pilot.arm, recipe.name, len(candidates(pilot))
    )
    histories = train_pilot(
        pilot=pilot,
        recipe=recipe,
        base=ModelSpec.from_dict(recipe.base_model, snakemake.params.base),
        weights=Path(snakemake.input.weights),
        env=env,
        templates=PromptTemplates.load(snakemake.input.prompts),
        base_seed=snakemake.params.seed,
        first_scenario=snakemake.params.first_scenario,
        root=Path(snakemake.output.table).parent,
        max_error_share=accepted_error_share(snakemake.config),
    )
    judged, choice = apply_rule(pilot_table(histories, TOOLS[env.protocol]), pilot)
    judged.write_csv(snakemake.output.table)
    Path(snakemake.output.markdown).write_text(pilot_markdown(judged, choice, pilot))
    record = choice_record(choice, pilot, recipe.name)
    Path(snakemake.output.choice).write_text(json.dumps(record, indent=2) + "\n")
    log.info("%s (%s the rule)", record, "kept" if choice.passed else "none kept")
