"""The training history's contract: one row per GRPO step (``history.parquet``).

A row's reward columns summarize any cell of a run (``rollout_rewards``): its validation and
test cells are tracked with the same names as its training curve (``coordgap.tracking``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from coordgap.env.protocols import Tool
from coordgap.env.variants import RewardVariant, reward_expr

if TYPE_CHECKING:
    from coordgap.config.training import TrainingRunConfig

HISTORY_SCHEMA: dict[str, pl.DataType] = {
    "run": pl.String(),
    "step": pl.Int64(),  # the checkpoint that played this step's rollouts; the update follows
    "n": pl.Int64(),
    "episodes": pl.Int64(),
    "errors": pl.Int64(),
    "reward_mean": pl.Float64(),  # under the variant and weights trained on
    "reward_std": pl.Float64(),
    "reward_min": pl.Float64(),
    "reward_max": pl.Float64(),
    # Every variant under the run's weights, so a shaped run's curve shows its paper reward.
    **{f"reward_{v}_{stat}": pl.Float64() for v in RewardVariant for stat in ("mean", "std")},
    "meals_mean": pl.Float64(),
    # Rounds per episode that ended with a philosopher holding both forks: chances to eat.
    "both_forks_mean": pl.Float64(),
    "deadlock_rate": pl.Float64(),
    "groups": pl.Int64(),
    "groups_trainable": pl.Int64(),
    "trajectories": pl.Int64(),
    "rows": pl.Int64(),
    "optimizer_steps": pl.Int64(),  # one per row, or per grad_accumulation_sequences rows
    "tokens": pl.Int64(),
    "trained_tokens": pl.Int64(),
    "loss": pl.Float64(),
    "grad_norm": pl.Float64(),
    "clipped_share": pl.Float64(),  # optimizer steps whose gradient the max_grad_norm clip cut
    "ratio_log_mean": pl.Float64(),
    "ratio_log_first": pl.Float64(),
    # cos(the update's change of the weights, its unclipped policy-gradient estimate)
    "ascent_cosine": pl.Float64(),
    # What the step did to the policy (coordgap.training.probe): the rollouts' choices, the
    # mean entropy of the six-way policy mu that drew them, and after the update the probe
    # set's KL(mu || mu_0) in float32 (what the weights learnt) and in the model's dtype (the
    # policy that acts, bf16 rounding included), and mean mu of each tool in float32 (null
    # where the trainer cannot score).
    **{f"actions_{tool.value}": pl.Float64() for tool in Tool},
    "entropy_mean": pl.Float64(),
    "probe_kl": pl.Float64(),
    "probe_kl_acting": pl.Float64(),
    **{f"probe_{tool.value}": pl.Float64() for tool in Tool},
    # The positive control's reward (coordgap.env.variants), its expectation computed exactly
    # after the update: the mean over the step's N seats of mu(right | the seat's round-1
    # prompt), in the model's dtype (the policy as it acts), and the same for the untrained
    # model (null where the trainer cannot score, and under sequential turns, whose round-1
    # prompts depend on the policy: coordgap.training.probe).
    "r1_exact": pl.Float64(),
    "r1_exact_base": pl.Float64(),
    "seconds_rollout": pl.Float64(),
    "seconds_update": pl.Float64(),
    "seconds": pl.Float64(),
}


def rollout_rewards(episodes: pl.DataFrame, run: TrainingRunConfig) -> dict[str, Any]:
    """A step's rollout statistics for its history row, from its episode table alone.

    Rewards use the run's weights; ``reward_*`` is the variant trained on, and
    ``reward_<variant>_*`` every variant. Episodes that ended in an error count apart.

    Args:
        episodes: The step's rollout episode table.
        run: The training run.

    Returns:
        The reward, meal, readiness and deadlock columns of a history row.
    """
    ok = episodes.filter(pl.col("status") == "ok")
    row: dict[str, Any] = {"episodes": ok.height, "errors": episodes.height - ok.height}
    trained = ok.select(reward_expr(run.variant, run.weights))["reward"]
    row |= {
        "reward_mean": trained.mean(),
        # Population standard deviation, as ART's advantages use.
        "reward_std": trained.std(ddof=0),
        "reward_min": trained.min(),
        "reward_max": trained.max(),
    }
    for variant in RewardVariant:
        rewards = ok.select(reward_expr(variant, run.weights))["reward"]
        row |= {f"reward_{variant}_mean": rewards.mean(), f"reward_{variant}_std": rewards.std(0)}
    row |= {
        "meals_mean": ok["meals_total"].mean(),
        "both_forks_mean": ok["both_forks"].mean(),
        "deadlock_rate": ok["deadlock"].mean(),
    }
    return row
