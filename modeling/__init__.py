"""torch models and training: word hashing, encoders (one registry), losses, optimiser, the DDP loop."""
