# coordgap: dining-philosophers coordination of LLM agents, end to end.
#
#   snakemake --cores 8 all                          # local, the embedded CPU default
#   snakemake --workflow-profile profiles/slurm all  # GPU jobs on a SLURM cluster
#   snakemake -n --configfile config/paper.yaml      # the paper's study instead of the default
#
# Rules wire, src/coordgap computes, workflow/scripts adapt (README.md: Layout).

from snakemake.utils import min_version

min_version("9.19")


# The embedded default only when no --configfile is given: Snakemake would otherwise merge a
# command-line config file into it key by key, so a study config could never drop a model of
# the default. --config key=value overrides apply on top either way.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


# GPU limits from a profile serialise jobs on one workstation, not across a cluster's nodes.
resource_scopes:
    gpu="local",


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/models.smk"
include: "rules/episodes.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/analysis.smk"


# ---------------------------------------------------------------- targets


rule all:
    default_target: True
    input:
        final_targets(),


rule episodes:
    input:
        episode_targets(),


rule models:
    input:
        "resources/models/manifest.json",


rule train:
    input:
        "results/train/index.json",


rule evaluate:
    input:
        "results/eval/index.json",
        "results/test/index.json",
