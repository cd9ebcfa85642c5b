"""Adapter of rule compute_power: the episodes per cell needed, beside the paper's and ours."""

from coordgap.analysis.comparisons import write_power
from coordgap.config.analysis import PowerConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "compute_power"):
    write_power(
        summary_csv=snakemake.input.summary,
        paper_reference_yaml=snakemake.input.paper_reference,
        settings=PowerConfig.from_dict(snakemake.params.power),
        out_csv=snakemake.output[0],
    )
