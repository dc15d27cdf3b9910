"""The mine stage."""
