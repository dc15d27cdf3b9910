"""The judge stage: a judged set graded from the logs' clicks (stages/judge/job.py)."""
