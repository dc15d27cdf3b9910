"""Paper reproductions: scripts, run as `python reproductions/NAME.py` (`make table4`)."""
