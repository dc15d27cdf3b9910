"""The pipeline's stages, one folder each: its settings (config.py), its job (job.py) and its adapter to
the flow (stage.py). A stage imports core, modeling and scoring, never another stage (tests/test_layering.py)."""
