"""Environments as Azure ML resolves them (curated, registered, inline image + conda file, build
context) and the per-environment Python environments the nodes run in place of this machine's venv."""
