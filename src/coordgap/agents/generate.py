"""A configured model's cell: open the model's policies, then play the cell with ``run_cell``.

``coordgap.agents.runner`` plays any cell from a policy factory; this module gives it the
factory of a model entry (``coordgap.policies.factory``: its weights, server or API client),
which training never needs: its rollouts are played by the policy being trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coordgap import preemption
from coordgap.agents.runner import Cell, run_cell
from coordgap.policies.factory import open_policy_factory

if TYPE_CHECKING:
    from pathlib import Path

    from coordgap.agents.runner import CellOutputs
    from coordgap.config.play import EnvironmentConfig, ModelSpec
    from coordgap.env.observation import PromptTemplates


def generate_cell(
    model: ModelSpec,
    n: int,
    env: EnvironmentConfig,
    episodes: int,
    base_seed: int,
    first_scenario: int,
    outputs: CellOutputs,
    templates: PromptTemplates,
    weights: Path | None = None,
    checkpoint: str = "base",
    progress: bool = True,
    serve_host: str = "loopback",
    max_error_share: float = 0.0,
    played_as: ModelSpec | None = None,
    merge: bool = True,
) -> Cell:
    """Play one model x N cell (resuming a killed run) and write its three tables.

    SIGTERM and SIGINT stop the cell as ``coordgap.preemption.run`` describes.

    Args:
        model: The model, of any kind.
        n: Number of philosophers.
        env: The table rules.
        episodes: Episodes in the cell.
        base_seed: The config's seed; every seed derives from it (see ``EpisodeSeeds``).
        first_scenario: Episode ``k`` plays scenario ``first_scenario + k``.
        outputs: Where the tables go.
        templates: Prompt templates for language models.
        weights: The prepared weights folder of a ``local`` or served model.
        checkpoint: What the ``checkpoint`` column says: ``base``, or the training checkpoint
            whose adapter the model carries.
        progress: Show a progress bar on stderr.
        serve_host: Where a served model's server listens (``loopback`` or ``node``).
        max_error_share: The largest share of ``error`` episodes the cell may have
            (``experiment.max_error_share``).
        played_as: ``model`` as a server the caller started already serves it
            (``coordgap.policies.serving.serve_models``); None: ``model`` itself, its own
            server started here if it has one. The cell's identity is ``model``'s either way.
        merge: Write the tables; if False, leave the complete journal (see ``run_cell``).

    Returns:
        The cell played.

    Raises:
        Preempted: A signal stopped the cell; finished episodes are journalled.
        EndpointAuthError: The model's endpoint refused its API key.
        EndpointRequestError: The endpoint refused a request in a way no retry can change.
        EndpointUnavailable: Consecutive calls went unanswered (``coordgap.policies.breaker``).
        CellErrors: Too many episodes ended in ``error``.
        ServerStartError: A served model's server did not start.
    """
    cell = Cell(
        model.name, n, env, episodes, base_seed, first_scenario, model.settings(), checkpoint
    )
    played = played_as or model
    opened = open_policy_factory(played, env, templates, weights, serve_host)
    with opened as (make_policy, max_in_flight):
        preemption.run(
            run_cell(
                cell,
                outputs,
                make_policy,
                max_in_flight,
                progress,
                max_error_share,
                merge,
                played.calls_to,
            )
        )
    return cell
