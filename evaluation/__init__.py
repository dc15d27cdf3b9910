"""Evaluation: PROTOCOL.md metrics, baselines, reports, the MLflow model and registry, STS (docs/evaluation.md)."""
