"""The propensity stage."""
