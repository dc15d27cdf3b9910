"""SIGTERM stops a command within seconds, as a scheduler's stop does (core/stopping.py, issue 51): a
training leaves its last checkpoint, its MLflow run is KILLED and `--resume` continues it; a flow run
sent SIGTERM with its whole process group (as `timeout`, systemd and Kubernetes send it) in a Spark
stage exits, leaves no process and publishes nothing of that stage."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from test_flows import TINY_RUN, wait_for

BAR_SECONDS = 20  # the bar: a run sent SIGTERM exits within 20 s


def stop(proc: subprocess.Popen, group: bool) -> float:
    """SIGTERM to `proc` (or its process group); the seconds until it exited."""
    started = time.monotonic()
    if group:
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.monotonic() - started


@pytest.mark.integration
def test_sigterm_stops_a_training_of_two_ranks_that_resumes_from_its_checkpoint(tiny_data, tmp_path):
    """The signal reaches torchrun and both ranks (modeling/launch.py's stop_group); none is left. (One
    process: test_a_sigterm_after_90_s_of_training_resumes_from_a_checkpoint_under_a_minute_old.)"""
    nproc = 2
    import mlflow

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    out, store = tmp_path / "run", f"sqlite:///{tmp_path}/train.db"
    args = [sys.executable, "-m", "dssm.cli", "train", "--nproc", str(nproc), "--workdir", str(data)]
    args += ["model.ncell=8", "data.batch_size=16", "threads=1", "epochs=5000", "checkpoint_every=5"]
    args += ["eval_every=100000", f"out={out}", f"mlflow_uri={store}"]
    with open(tmp_path / "stderr", "wb") as err:  # a file, not a pipe: a full pipe would block the run
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        wait_for(out / "last.pt", proc, timeout=120)
        helpers = psutil.Process(proc.pid).children(recursive=True)  # torchrun and its ranks
        assert len(helpers) >= (nproc + 1 if nproc > 1 else 0)
        seconds = stop(proc, group=False)
    _, left = psutil.wait_procs(helpers, timeout=5)
    stderr = (tmp_path / "stderr").read_text()
    assert not left, [" ".join(p.cmdline()[:6]) for p in left]
    assert proc.returncode == 128 + signal.SIGTERM and seconds < BAR_SECONDS, (seconds, stderr[-2000:])
    assert "dssm train: stopped by SIGTERM" in stderr
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"

    from modeling.checkpoint import read_checkpoint

    stopped_at = read_checkpoint(out / "last.pt")["step"]
    assert stopped_at >= 5
    more = [f"max_steps={stopped_at + 6}", "--resume", "--on-change", "resume"]
    resumed = subprocess.run([*args, *more], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {stopped_at}" in resumed.stderr
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.integration
def test_sigterm_to_the_process_group_in_a_spark_stage_stops_the_flow_run(tmp_path):
    work = tmp_path / "w"
    err = open(tmp_path / "stderr", "wb")  # a file, not a pipe: a full pipe would block the run
    with err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dssm.cli", "run", "--workdir", str(work), *TINY_RUN],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        wait_for(work / "simulate" / "manifest.json", proc, timeout=300)  # clean (Spark) starts now
        time.sleep(3)
        group = [proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))]
        seconds = stop(proc, group=True)
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 128 + signal.SIGTERM and seconds < BAR_SECONDS, (seconds, stderr[-3000:])
    _, alive = psutil.wait_procs([psutil.Process(p) for p in group if psutil.pid_exists(p)], timeout=10)
    assert not alive, [" ".join(p.cmdline()[:4]) for p in alive]
    assert not (work / "clean").exists() and not (work / "report.json").exists()  # nothing of clean published
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status == "KILLED" for r in runs), [(r.info.run_name, r.info.status) for r in runs]


def test_a_stop_a_library_turned_into_its_own_error_stays_a_stop():
    """py4j catches every exception in its socket read, so Prefect's TerminationSignal, raised there by
    the SIGTERM, came out as a Py4JNetworkError: the stage failed as if the JVM had, was retried on the
    dead JVM, and the run went on for minutes (its parent run FAILED) instead of stopping."""
    from core.errors import StageFailed
    from core.stage import failing_as
    from core.stopping import Stopped

    def py4j_read(stop: BaseException):
        try:
            raise stop
        except BaseException:
            raise ConnectionError("Error while sending or receiving") from None  # context kept, as py4j's is

    class TerminationSignal(Exception):  # Prefect's (an Exception, not a KeyboardInterrupt)
        signal = signal.SIGTERM

    for stop in (TerminationSignal(), Stopped(signal.SIGTERM)):
        with pytest.raises(type(stop)):
            with failing_as("clean", "logs/"):
                py4j_read(stop)
    with pytest.raises(StageFailed):  # a failure is still a failure
        with failing_as("clean", "logs/"):
            py4j_read(ValueError("bad data"))


STUCK_FLOW_RUN = """
import os, signal, threading, time
from core.stopping import signals_stop

with signals_stop(grace=1.0):
    pid = os.fork()  # a copy of this process, as Prefect's runner forks each flow run
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # as deaf to the stop as a C call that never returns

        def stuck_in_the_flow_run():
            time.sleep(60)

        stuck_in_the_flow_run()
        os._exit(0)
    threading.Thread(target=os.waitpid, args=(pid, 0)).start()  # the runner's thread that waits for it
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_run_stuck_past_the_deadline_says_where_before_it_is_ended():
    """A flow run that did not act on the SIGTERM (once in a fresh-clone suite: nothing from it for 10 s)
    left no trace of why: at its deadline the watchdog now asks its forked runs for their stacks."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_FLOW_RUN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout.readline() == "ready\n"
    seconds = stop(proc, group=False)
    stderr = proc.stderr.read()
    assert proc.returncode == 128 + signal.SIGTERM and seconds < BAR_SECONDS, stderr
    assert "still running 1 s after SIGTERM" in stderr and "stuck_in_the_flow_run" in stderr, stderr


SPARK_STARTED_IN_A_STOPPABLE_COMMAND = """
import os, signal, time
from core.spark import get_spark
from core.stopping import Stopped, signals_stop

with signals_stop():
    ours = signal.getsignal(signal.SIGINT)
    get_spark("local[1]", "sigint-kept")
    print("kept" if signal.getsignal(signal.SIGINT) is ours else "replaced", flush=True)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except Stopped:
        print("stopped", flush=True)
"""


def test_starting_spark_keeps_the_commands_sigint_handler():
    """A new SparkContext installs its own SIGINT handler, which raises wherever the main thread is and
    starts no watchdog: a ^C that landed in a py4j callback was printed as "Exception ignored" and the
    run went on to exit 0 (the tenth probe, one of four tries)."""
    command = [sys.executable, "-c", SPARK_STARTED_IN_A_STOPPABLE_COMMAND]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["kept", "stopped"], done.stderr[-2000:]


def test_signals_stop_works_where_stderr_is_no_file(capsys):
    """Tests call `dssm.cli.main` in process, where sys.stderr is pytest's capture (no file descriptor)."""
    from core.stopping import signals_stop

    before = signal.getsignal(signal.SIGTERM)
    with signals_stop():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.integration
def test_a_sigterm_after_90_s_of_training_resumes_from_a_checkpoint_under_a_minute_old(pipeline, tmp_path):
    """Checkpoints come by time as well as by steps (`checkpoint_seconds`, 60 by default): a stop never
    loses more than a minute of training. Here steps alone would never checkpoint (checkpoint_every is out
    of reach), so the checkpoint the run resumes from is the clock's. The run stops within seconds, its
    MLflow run KILLED, and `--resume` continues that run."""
    import mlflow

    from modeling.checkpoint import newest_checkpoint

    out, store = tmp_path / "run", f"sqlite:///{tmp_path}/train.db"
    args = [sys.executable, "-m", "dssm.cli", "train", f"data.negatives={pipeline['negatives']}"]
    args += [f"data.vocab={pipeline['vocab']}", "epochs=100000", "checkpoint_every=100000000", "eval_every=100000000"]
    args += ["data.batch_size=192"]  # a multiple of the session pipeline's 3 train shards
    args += [f"out={out}", f"mlflow_uri={store}"]
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 300
        while "training lstm: " not in (tmp_path / "stderr").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(90)
        sent = time.time()
        seconds = stop(proc, group=False)
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 128 + signal.SIGTERM and seconds < BAR_SECONDS, (seconds, stderr[-2000:])
    assert "dssm train: stopped by SIGTERM" in stderr
    path, state = newest_checkpoint(out)
    assert sent - path.stat().st_mtime < 60, (path, sent - path.stat().st_mtime)
    assert state["step"] % 100000000 != 0 and state["step"] > 0  # the clock's checkpoint, not a step count's
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "KILLED"
    more = [f"max_steps={state['step'] + 5}", "--resume", "--on-change", "resume"]
    resumed = subprocess.run([*args, *more], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {state['step']}" in resumed.stderr
    assert client.get_run(run.info.run_id).info.status == "FINISHED"  # the same MLflow run, continued


def test_sigterm_to_a_spark_command_alone_ends_its_jvm_with_it(pipeline, tmp_path):
    """Issue 74's probe: `dssm index` sent SIGTERM (the command's process, not its group) exited, and its JVM
    stayed up ~75 s finishing a stage. The command now ends its children as it stops."""
    cmd = [sys.executable, "-m", "dssm.cli", "clean", "--input", str(pipeline["simulate"]), "--master", "local[1]"]
    with open(tmp_path / "stderr", "wb") as err:  # a file, not a pipe: a full pipe would block the command
        proc = subprocess.Popen([*cmd, "--out", str(tmp_path / "c")], stdout=subprocess.DEVNULL, stderr=err)
    deadline, jvm = time.monotonic() + 180, None
    while jvm is None and time.monotonic() < deadline and proc.poll() is None:
        jvm = next((p for p in psutil.Process(proc.pid).children(recursive=True) if "java" in p.name()), None)
        time.sleep(0.2)
    assert jvm is not None, "no JVM started"
    time.sleep(4)  # Spark's session up, its first job under way
    seconds = stop(proc, group=False)
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 128 + signal.SIGTERM and seconds < BAR_SECONDS, (seconds, stderr[-2000:])
    assert not psutil.wait_procs([jvm], timeout=5)[1], "the JVM outlived its command"
    assert not (tmp_path / "c").exists()
