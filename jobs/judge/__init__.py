"""The judge stage: a judged set graded from the logs' clicks (jobs/judge/job.py)."""
