"""Checkpoint evaluation and selection (README.md: Checkpoint discipline).

``checkpoints`` plays a checkpoint's episodes (validation scenarios, or the test grid for a
selected one) through the same runner as every model; ``selection`` turns the training curve
and the validation episodes into each selection policy's choice.
"""
