"""The vocab stage."""
