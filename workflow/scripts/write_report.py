"""Adapter of rule write_report: results/report.md, and the same as one page (report.html)."""

from pathlib import Path

from coordgap.analysis.html import write_report_html
from coordgap.analysis.report import ReportInputs, write_report
from coordgap.logs import job_log
from coordgap.provenance import Provenance

with job_log(snakemake.log[0], "write_report"):
    given = snakemake.input
    write_report(
        inputs=ReportInputs(
            summary=Path(given.summary),
            comparisons=Path(given.comparisons),
            power=Path(given.power),
            monitors=Path(given.monitors),
            paper_reference=Path(given.paper_reference),
            figures=[Path(png) for png in given.figures],
            timeline=Path(given.timeline),
            tables=[Path(csv) for csv in given.tables],
            selections=[Path(path) for path in given.selections],
            training_figures=[Path(png) for png in given.training_figures],
            histories=[Path(path) for path in given.histories],
            seeds=Path(given.seeds),
            seed_comparisons=Path(given.seed_comparisons),
            arm_figures=[Path(png) for png in given.arm_figures],
            # The control check's table, where the study has a positive control.
            control=next((Path(csv) for csv in given.control), None),
            records=[Path(path) for path in given.records],
        ),
        config=snakemake.params.config,
        # Snakemake runs the job in the workflow's folder: its git checkout is the code's.
        provenance=Provenance.collect(snakemake.params.config, root=Path.cwd()),
        out_md=snakemake.output.markdown,
    )
    write_report_html(snakemake.output.markdown, snakemake.output.page)
