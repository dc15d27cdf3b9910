"""The paraphrase stage."""
