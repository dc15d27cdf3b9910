"""The teacher stage."""
