"""Adapter of rule prepare_model: a model's weights, downloaded or converted once."""

from pathlib import Path

from coordgap.config.keys import ConfigError
from coordgap.config.play import is_served
from coordgap.logs import job_log
from coordgap.models.prepare import prepare_model

with job_log(snakemake.log[0], "prepare_model"):
    name = snakemake.wildcards.model
    entry = snakemake.config["models"][name]
    key = f"models.{name}.{'serve.source' if is_served(entry) else 'source'}"
    try:
        prepare_model(source=snakemake.params.source, dest=Path(snakemake.output[0]))
    except ValueError as error:
        # A malformed or placeholder source: name the key to edit, as the config checks do.
        raise ConfigError(f"config key '{key}': {error}") from error
