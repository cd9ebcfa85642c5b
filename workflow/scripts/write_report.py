"""Adapter of rule write_report: results/report.md with tables, figure and published numbers."""

from coordgap.analysis.report import write_report
from coordgap.config import AnalysisConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "write_report"):
    write_report(
        summary_csv=snakemake.input.summary,
        comparisons_csv=snakemake.input.comparisons,
        figure_png=snakemake.input.figure,
        paper_reference_yaml=snakemake.input.paper_reference,
        config=AnalysisConfig.from_dict(snakemake.params.reward, snakemake.params.analysis),
        out_md=snakemake.output[0],
    )
