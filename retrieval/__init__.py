"""Retrieval over the whole catalogue: batch embedding, the ANN index, search and its evaluation."""
