"""GRPO training of local models on their own rollouts (README: "GRPO training").

``trajectories`` turns rollouts into ART's trajectory groups, ``grpo`` is the torch trainer
(ART's preprocessing and loss inside our optimizer loop), ``art_trainer`` drives ART's own
LocalBackend on a GPU, and ``loop`` runs a training run step by step, resumably.
"""
