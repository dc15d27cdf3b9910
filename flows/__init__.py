"""Prefect flows that chain the pipeline's stages (flows/retrain.py) and schedule them (flows/schedule.py).

Importing this package sets Prefect defaults that suit the embedded set-up, unless already set:
a first start of the ephemeral API migrates its database (slow on a small machine, so a longer
start-up timeout), no analytics, and the project's loggers forwarded to Prefect's run logs.
"""

import logging
import os

PROJECT_LOGGERS = ("dssm", "core.spark", "modeling", "scoring", "stages")

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", ",".join(PROJECT_LOGGERS))
# Prefect's logging config puts the root logger at WARNING; the stages' progress lines are INFO.
for _name in PROJECT_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.INFO)
