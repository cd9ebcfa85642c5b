"""Policies that decide for philosophers: scripted references and model backends.

The backends: in-process local models, OpenAI-compatible endpoints and served checkpoints.
"""
