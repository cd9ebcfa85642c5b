"""Adapter of the plot_<figure> rules: one figure of coordgap.analysis.catalog from its table."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], snakemake.rule):
    write_figure(
        figure=snakemake.params.figure,
        table_csv=snakemake.input.table,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
        # Only a figure drawn per reward variant has the wildcard.
        variant=getattr(snakemake.wildcards, "variant", None),
    )
