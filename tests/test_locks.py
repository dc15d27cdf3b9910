"""One writer per output (core/locks.py): a second command writing what another is writing fails at once,
naming the holder; the lock dies with its holder, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import DssmError
from core.locks import holding, lock_file, output_lock

ROOT = Path(__file__).resolve().parents[1]
HOLD = (
    "import sys, time; from core.locks import output_lock\n"
    "with output_lock(sys.argv[1]):\n print('held', flush=True); time.sleep(60)"
)


def holder(out: Path) -> subprocess.Popen:
    """A second real process holding `out`'s lock until killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_train_or_stage_into_a_held_output_fails_at_once_naming_the_holder(tiny_data, tmp_path):
    out = tmp_path / "train" / "lstm"
    proc = holder(out)
    try:
        keys = [f"data.negatives={tiny_data}/negatives", f"data.vocab={tiny_data}/vocab", f"out={out}"]
        train = subprocess.run([sys.executable, "-m", "dssm.cli", "train", *keys, "mlflow_uri=none", "max_steps=2"],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert train.returncode == 2, train.stderr[-2000:]
        assert f"{out} is in use by another writer (pid {proc.pid}: -c {out})" in train.stderr
        assert not out.exists()  # nothing of the first writer's touched
        simulate = subprocess.run(
            [sys.executable, "-m", "dssm.cli", "simulate", "--out", str(out), "--impressions", "100"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert simulate.returncode == 2 and f"pid {proc.pid}" in simulate.stderr, simulate.stderr[-2000:]
    finally:
        proc.send_signal(signal.SIGKILL)  # the kernel releases a killed holder's lock: no stale lock
        proc.wait()
    with output_lock(out):
        assert f"pid {os.getpid()}" in lock_file(out).read_text()


def test_the_lock_is_per_output_and_names_the_kind_of_holder(tmp_path):
    with holding(tmp_path / ".lock", "work", "run"), output_lock(tmp_path / "a"), output_lock(tmp_path / "b"):
        proc = subprocess.run([sys.executable, "-c", HOLD, str(tmp_path / "a")], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 1 and "is in use by another writer" in proc.stderr
    with pytest.raises(DssmError, match="in use by another run"), holding(tmp_path / ".lock", "work", "run"):
        with holding(tmp_path / ".lock", "work", "run"):  # a second open of the same lock, even in one process
            pass
