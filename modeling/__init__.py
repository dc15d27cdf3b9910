"""Placeholder package: see docs/architecture.md (built by a later issue)."""
