"""Prefect flows that chain the pipeline's stages (flows/retrain.py) and schedule them (flows/schedule.py).

Importing this package sets Prefect defaults that suit the embedded set-up, unless already set:
a first start of the ephemeral API migrates its database (slow on a small machine, so a longer
start-up timeout), no analytics, and the project's loggers forwarded to Prefect's run logs
(inside a flow run; outside one they print to the console without a warning).
"""

import logging
import os

PROJECT_LOGGERS = ("dssm", "core.spark", "modeling", "scoring", "stages")

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", ",".join(PROJECT_LOGGERS))
# the same loggers run outside a flow too (`dssm train`, `dssm index`, a test): there they log to the
# console only, without a UserWarning per line
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
# Prefect's logging config puts the root logger at WARNING; the stages' progress lines are INFO.
for _name in PROJECT_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.INFO)
