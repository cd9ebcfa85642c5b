"""Adapter of rules index_training, index_selections and index_tests: a phase's contents."""

from coordgap.data import write_index
from coordgap.logs import job_log

with job_log(snakemake.log[0], snakemake.rule):
    write_index(snakemake.input.outputs, snakemake.output[0])
