"""The runtime's file locks: held by live processes only, and named right when refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from incr.errors import StorageError
from incr.runtime.lock import locked

# Takes the lock, says so, and holds it until killed.
HOLD = """
import sys, time
from pathlib import Path
from incr.runtime.lock import locked
with locked(Path(sys.argv[1]), "the test's lock"):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_refused_lock_names_the_live_holder(tmp_path):
    path = tmp_path / "view-v.lock"
    path.write_text("pid 999999999".ljust(32))  # a long-dead holder left its pid behind
    proc = _holder(path)
    try:
        with (pytest.raises(StorageError, match=rf"the test's lock is being updated by pid {proc.pid};"),
              locked(path, "the test's lock")):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_of_a_killed_holder_is_taken_over_at_once(tmp_path):
    path = tmp_path / "ledger.lock"
    proc = _holder(path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert path.read_text().strip() == f"pid {proc.pid}"  # stale: names a dead process
    started = time.monotonic()
    with locked(path, "the test's lock"):
        assert path.read_text().strip() == f"pid {os.getpid()}"
    assert time.monotonic() - started < 1.0


def test_a_waiting_taker_gets_the_lock_when_its_holder_dies(tmp_path):
    path = tmp_path / "rows-t.lock"
    proc = _holder(path)
    later = f"import os, signal, time; time.sleep(0.5); os.kill({proc.pid}, signal.SIGKILL)"
    killer = subprocess.Popen([sys.executable, "-c", later])
    try:
        with locked(path, "the test's lock", wait_s=30):
            assert proc.wait(5) == -signal.SIGKILL
    finally:
        killer.wait()
        proc.kill()
        proc.wait()
