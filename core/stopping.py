"""SIGTERM and SIGINT stop a dssm command within seconds, as schedulers expect (Kubernetes waits 30 s,
systemd 90 s, before SIGKILL).

The first signal raises `Stopped` (a KeyboardInterrupt) in the main thread: what runs there unwinds,
so a stage publishes nothing (outputs are renamed into place only when complete), training leaves its
last checkpoint, and the MLflow runs are ended KILLED on the way out; the next run resumes. Further
SIGTERMs and SIGINTs are ignored from then on: one must not cut that cleanup short mid-write. A watchdog
thread makes sure of the exit: whatever still runs `GRACE_SECONDS` later (a worker thread, a call
stuck on a JVM the same signal ended) is cut off, its stack printed: the process's children are
terminated and it exits with 128 + the signal's number. A flow whose ephemeral Prefect server the
same signal ended exits so at once (`end_now`), once its MLflow runs are closed: Prefect's engine
would retry the crash report to that server until the deadline. A stop that a library caught and
turned into an error of its own (py4j) is still a stop (`stop_behind`), not a failure to retry. Its
helpers (Spark's JVM, torchrun, the ephemeral Prefect server) are ended by the guardian
(flows/guardian.py) once it is gone.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)
GRACE_SECONDS = 10.0
STACKS_SIGNAL = signal.SIGUSR1  # a dssm command prints every thread's stack on it (signals_stop)
_requested = threading.Event()
_deadline_at = [0.0]  # time.monotonic() at which the watchdog ends the process (begin)
_last_words: list = []  # what the watchdog does before it ends the process (at_deadline)


@contextlib.contextmanager
def at_deadline(action) -> Iterator[None]:
    """Within the block, have the watchdog call `action()` (at most 3 s) before it ends a process that did
    not unwind in time: a flow marks its MLflow parent run KILLED there, which its own unwinding did not reach."""
    _last_words.append(action)
    try:
        yield
    finally:
        _last_words.remove(action)


class Stopped(KeyboardInterrupt):
    """A signal asked this process to stop."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    def __reduce__(self):
        return (Stopped, (self.signum,))


def is_stop(error: BaseException) -> bool:
    """Whether `error` is a requested stop: a signal (ours, or Prefect's TerminationSignal, which Prefect
    raises in place of ours while a flow runs) or ^C. MLflow runs so ended are KILLED, not FAILED."""
    return isinstance(error, KeyboardInterrupt) or any(c.__name__ == "TerminationSignal" for c in type(error).__mro__)


def stop_behind(error: BaseException) -> BaseException | None:
    """The stop (is_stop) that `error` was raised while handling, if any: a library that catches every
    exception (py4j turns the signal's exception, raised in its socket read, into a Py4JNetworkError)
    must not turn a stop into a failure, which a stage would retry on a JVM the same signal ended."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        if is_stop(error):
            return error
        seen.add(id(error))
        pending += [error.__cause__, error.__context__]
    return None


def signal_of(error: BaseException) -> int:
    """The signal number behind a stop (is_stop): ours, Prefect's TerminationSignal's, else SIGINT (^C)."""
    return int(getattr(error, "signum", None) or getattr(error, "signal", None) or signal.SIGINT)


def begin(signum: int, grace: float = GRACE_SECONDS) -> None:
    """A stop has begun (once per process): the watchdog that ends the process `grace` seconds from now
    if it is still running. Called by our handler, and where Prefect's own handler took the signal (a
    flow run: flows/retrain.py), since that handler starts none."""
    if _requested.is_set():
        return
    _requested.set()
    _deadline_at[0] = time.monotonic() + grace
    log.warning("%s: stopping (at most %.0f s)", signal.Signals(signum).name, grace)
    threading.Thread(target=_deadline, args=(signum, grace), name="dssm-stop", daemon=True).start()
    if threading.current_thread() is threading.main_thread():
        # A second signal (Prefect's handler raises on each) must not cut the cleanup short half-way through
        # an MLflow write: the stop is under way, and the watchdog ends the process if it takes too long.
        for again in (signal.SIGTERM, signal.SIGINT):
            signal.signal(again, signal.SIG_IGN)


@contextlib.contextmanager
def signals_stop(grace: float = GRACE_SECONDS) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT stop this process as the module says; the handlers before
    it come back after it (a command called in process, as the tests do). Main thread only: Python's rule."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame) -> None:
        begin(signum, grace)
        raise Stopped(signum)

    before = {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
    # faulthandler answers from C, so even a process whose main thread is stuck in a C call (where no Python
    # handler runs) says where it is stuck when a watchdog asks (_exit); forked children inherit it. To fd 2, as
    # every dump here: sys.stderr may be no file (a command called in process, under pytest's capture)
    faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)
    try:
        yield
    finally:
        faulthandler.unregister(STACKS_SIGNAL)
        for signum, previous in before.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)  # None: set from C


def _deadline(signum: int, grace: float) -> None:
    time.sleep(grace)
    # not through logging: the main thread may hold a handler's lock where it is stuck
    with contextlib.suppress(OSError):
        os.write(2, f"dssm: still running {grace:.0f} s after {signal.Signals(signum).name}: exiting now\n".encode())
        faulthandler.dump_traceback(file=2, all_threads=True)  # where it was stuck, for the report
    _exit(signum)


def end_now(signum: int, why: str) -> None:
    """Exit at once, as the watchdog would at its deadline: what is left to unwind can only wait (e.g.
    a flow engine retrying, for up to a minute, a Prefect server that the same signal ended)."""
    with contextlib.suppress(OSError):
        os.write(2, f"dssm: {why}: exiting now\n".encode())
    _exit(signum)


def _exit(signum: int) -> None:
    for action in _last_words:  # each in a thread of its own: one stuck on a lock the main thread holds is left
        last = threading.Thread(target=_quietly, args=(action,), daemon=True)
        last.start()
        last.join(3.0)
    import psutil

    with contextlib.suppress(psutil.Error):
        children = psutil.Process().children(recursive=True)
        _ask_for_stacks(children)
        end_processes(children)
    os._exit(128 + signum)


def end_children(wait: float | None = None) -> None:
    """End what this process started (Spark's JVM, torchrun, a scheduler's flow runs) before it exits on a
    stop: a JVM left to its own shutdown hooks after its Python went away stayed up ~75 s finishing a stage
    nobody waits for. Those still running get SIGTERM and, unless `wait` is given, what is left of the stop's
    grace to finish their own stop (a flow run reports itself crashed and closes its MLflow runs: killed
    after 3 s, a loaded machine's scheduled run was left RUNNING); then SIGKILL."""
    import psutil

    if wait is None:
        wait = max(1.0, _deadline_at[0] - 1.0 - time.monotonic()) if _requested.is_set() else 3.0
    with contextlib.suppress(psutil.Error):
        end_processes(psutil.Process().children(recursive=True), wait)


def _ask_for_stacks(processes: list) -> None:
    """Our forked copies among `processes` (a Prefect runner's flow-run processes: our command line and
    our faulthandler hook, signals_stop) print every thread's stack, a report of where a run that did
    not stop in time was stuck."""
    import psutil

    ours, asked = psutil.Process().cmdline(), 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.cmdline() == ours:
                process.send_signal(STACKS_SIGNAL)
                asked += 1
    if asked:
        time.sleep(0.5)  # the dumps are written from their signal handlers at once


def _quietly(action) -> None:
    with contextlib.suppress(Exception):
        action()


def end_processes(processes: list, wait: float = 3.0, signalled: list | None = None) -> None:
    """Terminate `processes` (psutil.Process; only those in `signalled` when given, which pass the
    signal on to the rest themselves); kill those left after `wait` seconds."""
    import psutil

    for process in processes if signalled is None else signalled:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=wait)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
