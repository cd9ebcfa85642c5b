"""Policies that decide for philosophers: scripted references now, model backends later."""
