"""Adapter of rule prepare_model: a model's weights, downloaded or converted once."""

from pathlib import Path

from coordgap.config.keys import ConfigError
from coordgap.logs import job_log
from coordgap.models.prepare import prepare_model

with job_log(snakemake.log[0], "prepare_model"):
    try:
        prepare_model(source=snakemake.params.source, dest=Path(snakemake.output[0]))
    except ValueError as error:
        # A malformed or placeholder source: name the key to edit, as the config checks do.
        raise ConfigError(f"config key '{snakemake.params.source_key}': {error}") from error
