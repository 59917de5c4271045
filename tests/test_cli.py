"""The command line as a user runs it: a separate process, its exit code and its output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """CREATE TABLE t (k VARCHAR, v BIGINT);
CREATE VIEW totals AS SELECT k, SUM(v) AS s FROM t GROUP BY k;
"""


def test_incr_run_on_spark_prints_no_spark_banner(tmp_path: Path):
    """Quiet by default: the run's own report on stdout, and on stderr nothing from Spark's
    startup (log4j profile, default log level, native-library notice, the JVM's incubator
    modules line)."""
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    (tmp_path / "landing" / "t").mkdir(parents=True)
    (tmp_path / "landing" / "t" / "0001.csv").write_text("k,v\na,1\nb,2\na,3\n")
    env = {**os.environ, "INCR_LOCAL_ROWS": "0"}  # every batch on Spark: the JVM starts
    done = subprocess.run([sys.executable, "-m", "incr.cli", "run", str(program),
                           "--landing", str(tmp_path / "landing"),
                           "--warehouse", str(tmp_path / "warehouse")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "1 batch(es) applied" in done.stdout
    for noise in ("log4j", "Setting default log level", "setLogLevel", "NativeCodeLoader",
                  " WARN ", "incubator"):
        assert noise not in done.stderr, done.stderr
