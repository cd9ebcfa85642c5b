"""Adapter of rule prepare_model: convert a local model's weights into safetensors once."""

from pathlib import Path

from coordgap.logs import job_log
from coordgap.models.prepare import prepare_model

with job_log(snakemake.log[0], "prepare_model"):
    prepare_model(source=snakemake.params.source, dest=Path(snakemake.output[0]))
