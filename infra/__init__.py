"""How the services start: the local stack (infra/stack.py); scale-out manifests beside it (infra/README.md)."""
