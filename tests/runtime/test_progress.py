"""A long run says how far it is: batches, rows, rate and time left, after every batch."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from incr import cli
from incr.runtime.progress import Progress, as_lines, on_terminal


def test_the_line_counts_what_was_applied_and_estimates_the_rest_from_bytes():
    now = [0.0]
    lines: list[tuple[str, bool]] = []
    meter = Progress(4, 4_000_000, lambda line, last: lines.append((line, last)),
                     clock=lambda: now[0])
    now[0] = 10.0
    meter.advance(1_000_000, 50_000)
    first = "1/4 batches · 50,000 rows · 5.0k rows/s · 1.0 MB of 4.0 MB · 10s elapsed · ETA 30s"
    assert lines[-1] == (first, False)
    now[0] = 100.0
    meter.advance(2_000_000, 2_000_000)
    assert lines[-1][0].endswith("3.0 MB of 4.0 MB · 1m40s elapsed · ETA 33s")
    meter.finish()  # stopped before the last batch (a rejected one)
    assert lines[-1] == (lines[-2][0] + " (stopped)", True)


def test_the_last_batch_ends_the_line_and_no_eta_is_guessed_before_any_bytes():
    out = io.StringIO()
    meter = Progress(2, 100, on_terminal(out), clock=lambda: 1.0)
    meter.advance(0, 0)
    assert "ETA ?" in out.getvalue() and not out.getvalue().endswith("\n")
    meter.advance(100, 7)
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "ETA" not in text.split("\r")[-1]
    meter.finish()  # nothing more: the run was whole
    assert out.getvalue() == text
    seen: list[str] = []
    as_lines(seen.append)("x", False)
    assert seen == ["progress: x"]


def test_incr_run_prints_a_line_per_batch_with_progress(tmp_path: Path, capsys, spark):
    program = tmp_path / "p.sql"
    program.write_text("CREATE TABLE t (k VARCHAR, v BIGINT);\n"
                       "CREATE VIEW s AS SELECT k, SUM(v) AS s FROM t GROUP BY k;\n")
    landing = tmp_path / "landing" / "t"
    landing.mkdir(parents=True)
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    for seq in range(3):
        pq.write_table(pa.Table.from_pylist([{"k": "a", "v": seq}] * (seq + 1), schema=schema),
                       landing / f"{seq:04d}.parquet")
    argv = [str(program), "--landing", str(tmp_path / "landing"),
            "--warehouse", str(tmp_path / "warehouse")]
    assert cli.main(["run", *argv, "--progress"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("progress: ")]
    assert [line.split(" · ")[:2] for line in err] == [
        ["progress: 1/3 batches", "1 rows"], ["progress: 2/3 batches", "3 rows"],
        ["progress: 3/3 batches", "6 rows"]]
    assert "ETA" in err[0] and "ETA" not in err[-1]
    assert cli.main(["run", *argv]) == 0  # not a terminal, no --progress: quiet
    assert "progress" not in capsys.readouterr().err
