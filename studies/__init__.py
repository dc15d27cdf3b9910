"""Research studies still rerun: scripts, run as `python studies/NAME.py`."""
