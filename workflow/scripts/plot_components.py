"""Adapter of rule plot_components: each model's mean reward stacked from its terms."""

from coordgap.analysis.figures import write_components_figure
from coordgap.logs import job_log

with job_log(snakemake.log[0], "plot_components"):
    write_components_figure(
        components_csv=snakemake.input.components,
        variant=snakemake.wildcards.variant,
        png=snakemake.output.png,
        pdf=snakemake.output.pdf,
        csv=snakemake.output.csv,
    )
