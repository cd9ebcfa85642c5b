"""Adapter of rule check_control: the positive control's check (results/stats/control.csv)."""

from coordgap.analysis.control import write_control
from coordgap.config.analysis import ControlConfig
from coordgap.logs import job_log

with job_log(snakemake.log[0], "check_control") as log:
    runs = snakemake.params.runs
    log.info("control arm of %d seeds", len(runs))
    write_control(
        episode_paths=snakemake.input.episodes,
        history_paths=snakemake.input.histories,
        runs=runs,
        control=ControlConfig.from_dict(snakemake.params.analysis["control"]),
        out=snakemake.output[0],
    )
