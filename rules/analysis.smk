# Statistics, figures and the report.


rule compute_stats:
    input:
        episodes=episode_targets(),
        code=src_files("analysis", "env/reward.py", "config.py"),
    output:
        summary=report(
            "results/stats/summary.csv",
            caption="../workflow/report/summary.rst",
            category="Statistics",
        ),
        comparisons=report(
            "results/stats/comparisons.csv",
            caption="../workflow/report/comparisons.rst",
            category="Statistics",
        ),
        metrics="results/metrics.json",
    params:
        reward=lookup(dpath="reward", within=config),
        analysis=lookup(dpath="analysis", within=config),
    log:
        "logs/compute_stats/compute_stats.log",
    benchmark:
        "logs/compute_stats/compute_stats.benchmark.tsv"
    resources:
        **RESOURCES["light"],
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/compute_stats.py"


rule plot_reward:
    input:
        summary="results/stats/summary.csv",
        code=src_files("analysis", "env/reward.py"),
    output:
        png=report(
            "results/figures/reward_{variant}.png",
            caption="../workflow/report/reward.rst",
            category="Figures",
            labels={"figure": "reward by model and N", "variant": "{variant}"},
        ),
        pdf="results/figures/reward_{variant}.pdf",
    log:
        "logs/plot_reward/{variant}.log",
    benchmark:
        "logs/plot_reward/{variant}.benchmark.tsv"
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/plot_reward.py"


rule write_report:
    input:
        summary="results/stats/summary.csv",
        comparisons="results/stats/comparisons.csv",
        figure=f"results/figures/reward_{VARIANTS[0]}.png",
        paper_reference="config/paper_reference.yaml",
        code=src_files("analysis", "env/reward.py", "config.py"),
    output:
        "results/report.md",
    params:
        reward=lookup(dpath="reward", within=config),
        analysis=lookup(dpath="analysis", within=config),
    log:
        "logs/write_report/write_report.log",
    benchmark:
        "logs/write_report/write_report.benchmark.tsv"
    conda:
        CONDA_ENV
    script:
        "../workflow/scripts/write_report.py"
