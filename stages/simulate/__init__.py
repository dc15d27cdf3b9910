"""The simulate stage."""
