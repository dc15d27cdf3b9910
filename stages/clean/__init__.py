"""The clean stage."""
