"""What this process may run on."""

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, a container's cpuset, a test
    worker's share), not every CPU of the machine that os.cpu_count() reports."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this OS
        return os.cpu_count() or 1


def cpus_per_process(processes: int) -> int:
    """An even share of `usable_cpus()` for each of `processes` processes (at least one)."""
    return max(1, usable_cpus() // processes)
