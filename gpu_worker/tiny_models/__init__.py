"""Tiny random-weight pipelines of every supported family, built offline (demo models and tests)."""
