"""Sweep jobs (hyperparameter tuning): search spaces, sampling, early termination and limits, as Azure ML defines them."""
