"""Adapter of rule pilot: an arm's recipe trained at each candidate rate, and the rule's choice."""

import json
from pathlib import Path

from coordgap.config.play import EnvironmentConfig, ModelSpec, accepted_error_share
from coordgap.config.training import PilotConfig, TrainingRunConfig
from coordgap.env.observation import PromptTemplates
from coordgap.env.protocols import TOOLS
from coordgap.logs import job_log
from coordgap.training.pilot import (
    apply_rule,
    choice_record,
    pilot_markdown,
    pilot_table,
    train_pilot,
)

with job_log(snakemake.log[0], "pilot") as log:
    pilot = PilotConfig.from_dict(snakemake.params.pilot)
    recipe = TrainingRunConfig.from_dict(snakemake.params.recipe_run, snakemake.params.recipe)
    env = EnvironmentConfig.from_dict(snakemake.params.environment)
    log.info("pilot of arm %s (run %s): rates %s", pilot.arm, recipe.name, pilot.learning_rates)
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
    log.info(
        "learning rate %g (%s the rule)",
        choice.learning_rate,
        "kept" if choice.passed else "none kept",
    )
