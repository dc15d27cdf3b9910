"""The shared base every layer builds on: atomic stage outputs and manifests, errors, text
normalisation, judged-set and sentence-pair readers, the MLflow store. Imports nothing above it."""
