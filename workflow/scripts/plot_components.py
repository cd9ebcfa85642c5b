"""Adapter of rule plot_components: each model's mean reward stacked from its terms."""

from coordgap.analysis.figures import write_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_components"):
    write_figure(
        figure="components",
        table_csv=snakemake.input.components,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
        variant=snakemake.wildcards.variant,
    )
