"""Adapter of rule write_model_manifest: the provenance of every prepared model in one file."""

from coordgap.logs import job_log
from coordgap.models.manifest import write_manifest

with job_log(snakemake.log[0], "write_model_manifest"):
    write_manifest(folders=list(snakemake.input.models), out=snakemake.output[0])
