"""A Spark standalone cluster on 127.0.0.1, started from the pyspark package.

pip's pyspark ships ``bin/spark-class`` but not ``sbin/start-master.sh`` or
``start-worker.sh``, so trying incr on a real cluster (``INCR_SPARK_MASTER=spark://...``)
would otherwise need a separate Spark download.  :func:`standalone_cluster` starts one Master
and one Worker as child processes (each in its own process group, so stopping it also stops
the executors the Worker launched), waits until the Worker has registered, and stops both on
leaving, whatever happened inside.  Logs, the Worker's work directory (one folder per
application, with each executor's ``stdout`` and ``stderr``) and Spark's scratch space all go
to one folder, so nothing is left in ``/tmp`` or in the pyspark package.

The tests use it to run equivalence cases on a real cluster (``tests/runtime/test_cluster.py``);
``python -m incr.runtime.cluster`` starts one by hand and prints its master URL.

On one machine every executor sees the driver's paths.  On several machines the landing and
warehouse folders must be mounted at the same path on every host: Spark reads Delta tables
through the file list delta-rs gives the driver, and its executors write Parquet files into a
staging folder inside the table that the driver then commits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from incr.errors import IncrError

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(IncrError):
    """The local standalone cluster did not start (the message ends with its logs' tails)."""


def pyspark_home() -> Path:
    """The installed pyspark package: a complete SPARK_HOME (``bin/spark-class``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS's pick for port 0).

    Another process could take it before Spark binds it; :func:`standalone_cluster` then sees
    the Master exit and says so with its log.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, or a note that it does not exist."""
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@dataclass(frozen=True)
class LocalCluster:
    """A running standalone cluster: where to reach it and where its logs are.

    Attributes:
        master_url: the ``spark://`` URL applications connect to (``INCR_SPARK_MASTER``).
        web_url: the Master's web UI; its state as JSON is at ``{web_url}/json/``.
        folder: logs (``master.log``, ``worker.log``), the Worker's ``work/`` directory and
            Spark's scratch space ``local/``.
    """

    master_url: str
    web_url: str
    folder: Path

    @property
    def work_dir(self) -> Path:
        """The Worker's work directory: ``app-<id>/<executor>/{stdout,stderr}``."""
        return self.folder / "work"

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The Master's view of the cluster (workers, cores, running and completed apps)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=timeout) as response:
            return dict(json.load(response))

    def executor_logs(self) -> list[Path]:
        """The ``stderr`` file of every executor the Worker has launched, oldest app first."""
        return sorted(self.work_dir.glob("app-*/*/stderr"))

    def logs(self, lines: int = 30) -> str:
        """The tails of the Master's, the Worker's and every executor's log.

        For a failure message: what the cluster said is usually the only clue to why a job
        hung or died.
        """
        parts = [f"--- {name} ({self.folder / name}) ---\n{tail(self.folder / name, lines)}"
                 for name in ("master.log", "worker.log")]
        parts += [f"--- executor {p} ---\n{tail(p, lines)}" for p in self.executor_logs()]
        return "\n".join(parts)


def _environment(folder: Path) -> dict[str, str]:
    """The daemons' environment, kept apart from the machine's Spark settings.

    The pyspark package is SPARK_HOME; the configuration folder is an empty one (no
    ``spark-env.sh`` or defaults of the machine's); logs and scratch space are in ``folder``;
    and this interpreter is the executors' Python, so they import the same packages (pyarrow,
    incr) as the driver.
    """
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(pyspark_home()),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(folder),
        "SPARK_WORKER_DIR": str(folder / "work"),
        "SPARK_LOCAL_DIRS": str(folder / "local"),
        "PYSPARK_PYTHON": sys.executable,
    })
    return env


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts ``spark-class args`` in a new process group (session) with output to ``log``.

    ``spark-class`` execs the JVM, so the process is the daemon itself; the Worker's
    executors are its children, in the same group.
    """
    with log.open("ab") as out:
        return subprocess.Popen([str(pyspark_home() / "bin" / "spark-class"), *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def _stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """Ends ``process``'s whole group, so no executor outlives the cluster.

    SIGTERM first (a Worker then kills its executors), SIGKILL after ``grace`` seconds.
    """
    if process.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    with suppress(ProcessLookupError):  # the group may outlive its leader (an executor)
        os.killpg(process.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        process.wait(grace)


def _wait(cluster: LocalCluster, processes: dict[str, subprocess.Popen[bytes]],
          ready: Callable[[dict[str, Any]], bool], what: str, deadline: float) -> None:
    """Polls the Master's JSON until ``ready`` holds for it.

    Raises:
        ClusterError: a daemon exited, or the ``deadline`` (of ``time.monotonic``) passed
            before ``what`` happened; with the logs' tails.
    """
    last = "no answer yet"
    while True:
        for name, process in processes.items():
            if process.poll() is not None:
                raise ClusterError(f"the Spark {name} exited with code {process.returncode} "
                                   f"while starting\n{cluster.logs()}")
        try:
            state = cluster.state(timeout=2.0)
        except (OSError, ValueError) as e:  # not listening yet, or a partial answer
            last = str(e)
        else:
            if ready(state):
                return
            last = f"status {state.get('status')}, {state.get('aliveworkers', 0)} alive worker(s)"
        if time.monotonic() > deadline:
            raise ClusterError(f"the Spark standalone cluster did not start: {what} did not "
                               f"happen in time ({last})\n{cluster.logs()}")
        time.sleep(0.25)


@contextmanager
def standalone_cluster(folder: Path | None = None, *, cores: int = 1, memory: str = "1g",
                       timeout: float = 180.0) -> Iterator[LocalCluster]:
    """A Master and one Worker on 127.0.0.1 while in the block; both stopped on leaving.

    Ports are free ones (the Worker's own ports are Spark's random picks), so several
    clusters, and a local Spark's ports, do not collide.

    Args:
        folder: where logs and work directories go (a new temporary folder when None; one
            given is kept, for the logs).
        cores: the Worker's cores, all given to each application's executor.  An application
            waits forever for an executor that does not fit, so ``spark.executor.cores`` (if
            set) must not exceed this.
        memory: the Worker's memory for executors; ``spark.executor.memory`` (default 1g) must
            fit in it, for the same reason.
        timeout: seconds to wait for the Master to come up and the Worker to register.

    Yields:
        The running cluster.

    Raises:
        ClusterError: the cluster did not come up (with the Master's and Worker's logs).
    """
    with ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="incr-cluster-")))
        folder.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        env = _environment(folder)
        port, web = free_port(), free_port()
        cluster = LocalCluster(f"spark://{HOST}:{port}", f"http://{HOST}:{web}", folder)
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            processes["Master"] = _start([MASTER_CLASS, "--host", HOST, "--port", str(port),
                                          "--webui-port", str(web)], folder / "master.log", env)
            # The Worker starts once the Master is up: one that cannot reach its Master
            # retries only after several seconds.
            _wait(cluster, processes, lambda s: s.get("status") == "ALIVE",
                  "the Master coming up", deadline)
            processes["Worker"] = _start([WORKER_CLASS, "--host", HOST, "--port", "0",
                                          "--webui-port", "0", "--cores", str(cores),
                                          "--memory", memory, "--work-dir", str(cluster.work_dir),
                                          cluster.master_url], folder / "worker.log", env)
            _wait(cluster, processes,
                  lambda s: s.get("aliveworkers", 0) >= 1 and s.get("cores", 0) >= cores,
                  "the Worker registering", deadline)
            yield cluster
        finally:
            for name in ("Worker", "Master"):
                if name in processes:
                    _stop(processes[name])


def main(argv: list[str] | None = None) -> int:
    """``python -m incr.runtime.cluster``: starts a cluster and holds it until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m incr.runtime.cluster",
                                     description="Start a Spark standalone Master and Worker on "
                                                 "127.0.0.1 from the pyspark package.")
    parser.add_argument("--cores", type=int, default=1, help="the Worker's cores (default 1)")
    parser.add_argument("--memory", default="1g", help="the Worker's memory (default 1g)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="folder for logs and work directories (default: a temporary one, "
                             "deleted on exit)")
    args = parser.parse_args(argv)
    # The daemons are in their own sessions: a terminal's Ctrl-C does not reach them, and a
    # SIGTERM (a supervisor's stop) would end this process without stopping them.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with standalone_cluster(args.dir, cores=args.cores, memory=args.memory) as cluster:
            print(f"INCR_SPARK_MASTER={cluster.master_url}\n"
                  f"master UI {cluster.web_url}, logs in {cluster.folder}; Ctrl-C stops it",
                  flush=True)
            while True:
                time.sleep(3600)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
