"""The negatives stage."""
