"""A warehouse that is full, read-only, or written by someone else: a clear error, then recovery.

Each test applies a stream's first batches, makes the warehouse misbehave, lands more
batches and runs ``incr run`` as a real process: it must exit 4 with a message that names
the problem and the path, leave every answer equal to the oracle as of the whole batch it
names, and the next run after the problem is gone must apply everything exactly once.

The full and read-only warehouses are real filesystems (a small tmpfs mounted on the
warehouse folder, filled or remounted read-only), which needs root: elsewhere those tests
are skipped, saying why.
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from incr.compiler import compile_program
from tests.runtime.killing import (
    LOCAL_ROWS,
    PROGRAM,
    SCHEMAS,
    Stream,
    check_answers,
    kill_env,
    ledger_batches,
    random_rows,
    run_argv,
)


def _run(program: Path, landing: Path, warehouse: Path) -> subprocess.CompletedProcess:
    return subprocess.run(run_argv(program, landing, warehouse), env=kill_env(), capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MB tmpfs mounted on ``tmp_path/warehouse`` for the test's duration."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem for the warehouse needs root")
    mount = tmp_path / "warehouse"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _started(tmp_path: Path, warehouse: Path):
    """The kill tests' program with its first batches applied (the tables exist)."""
    program = tmp_path / "faulty.sql"
    program.write_text(PROGRAM)
    compiled = compile_program(program)
    stream = Stream(tmp_path / "landing", SCHEMAS)
    rng = random.Random(3)
    stream.land("s", "insert", random_rows(rng, "s", 60))
    stream.land("t", "insert", random_rows(rng, "t", 30))
    done = _run(program, stream.landing, warehouse)
    assert done.returncode == 0, done.stderr[-3000:]
    return compiled, program, stream, rng


def _more(stream: Stream, rng: random.Random) -> None:
    """A small batch (driver-side engine), a large one (Spark) and a delete."""
    stream.land("s", "insert", random_rows(rng, "s", 20))
    stream.land("s", "insert", random_rows(rng, "s", 2 * LOCAL_ROWS), parquet=True)
    stream.land("s", "delete", stream.live["s"][:7])
    stream.land("t", "insert", random_rows(rng, "t", 5))


def _recovers(compiled, program: Path, stream: Stream, warehouse: Path, before: dict) -> None:
    """The failed run changed no answer; the next one applies every batch once."""
    after = check_answers(compiled, warehouse, stream, "after the failed run")
    assert after == before, "the failed run published an answer"  # (or it would be a whole batch)
    done = _run(program, stream.landing, warehouse)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = check_answers(compiled, warehouse, stream, "after the run that recovered")
    batches = ledger_batches(warehouse, compiled.name)
    assert len(batches) == len(stream.files)
    assert seen["per_group"] == max(seq for rel, seq in batches.items() if stream.files[rel][0] == "s")


def test_a_full_disk_fails_the_run_clearly_and_the_next_run_recovers(tmp_path, small_disk):
    compiled, program, stream, rng = _started(tmp_path, small_disk)
    before = check_answers(compiled, small_disk, stream, "before")
    _more(stream, rng)
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave 64 KB: enough for the locks, not for a batch
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        f.write(b"\0" * max(0, free - 64 * 1024))
    done = _run(program, stream.landing, small_disk)
    assert done.returncode == 4, (done.returncode, done.stderr[-3000:])
    assert "no space left" in done.stderr.lower(), done.stderr[-3000:]
    assert str(small_disk) in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    filler.unlink()
    _recovers(compiled, program, stream, small_disk, before)


def test_a_read_only_warehouse_fails_the_run_clearly_and_the_next_run_recovers(tmp_path, small_disk):
    compiled, program, stream, rng = _started(tmp_path, small_disk)
    before = check_answers(compiled, small_disk, stream, "before")
    _more(stream, rng)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        done = _run(program, stream.landing, small_disk)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert done.returncode == 4, (done.returncode, done.stderr[-3000:])
    assert "read-only" in done.stderr.lower(), done.stderr[-3000:]
    assert str(small_disk) in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    _recovers(compiled, program, stream, small_disk, before)


def test_a_commit_conflict_with_another_writer_fails_clearly_and_the_next_run_recovers(
        spark, tmp_path, monkeypatch):
    """Another writer (here a table-property change, data-neutral, as an outside OPTIMIZE or
    ALTER would be) commits to a table between incr's read of it and its MERGE's commit."""
    from deltalake import DeltaTable

    from incr.errors import StorageError
    from incr.runtime.pipeline import Pipeline

    warehouse = tmp_path / "warehouse"
    compiled, program, stream, rng = _started(tmp_path, warehouse)
    before = check_answers(compiled, warehouse, stream, "before")
    stream.land("s", "insert", random_rows(rng, "s", 20))
    stream.land("s", "delete", stream.live["s"][:7])
    stream.land("t", "insert", random_rows(rng, "t", 5))

    original, conflicted = DeltaTable.merge, []

    def merge_racing_another_writer(self, *args, **kwargs):
        builder = original(self, *args, **kwargs)
        if not conflicted:  # the builder has read the table; now the other writer commits
            conflicted.append(self.table_uri)
            DeltaTable(self.table_uri).alter.set_table_properties(
                {"delta.logRetentionDuration": "interval 30 days"})
        return builder

    monkeypatch.setattr(DeltaTable, "merge", merge_racing_another_writer)
    with pytest.raises(StorageError) as raised:
        Pipeline(compiled, stream.landing, warehouse, spark=spark).run()
    monkeypatch.undo()
    message = str(raised.value)
    assert conflicted and "another writer committed to" in message and "commit conflict" in message
    assert conflicted[0].removeprefix("file://").rstrip("/") in message, message
    _recovers(compiled, program, stream, warehouse, before)


FOLDER_PROGRAM = """-- incr: buckets = 2
CREATE TABLE t (k VARCHAR, x DOUBLE);
CREATE VIEW sums AS SELECT k, SUM(x) AS s, COUNT(*) AS n FROM t GROUP BY k;
CREATE VIEW top AS SELECT MAX(s) AS m FROM (SELECT k, SUM(x) AS s FROM t GROUP BY k) AS q;
"""


@pytest.mark.parametrize("local_rows", [0, 200_000], ids=["spark", "driver"])
def test_folders_named_with_spaces_and_glob_characters_are_read_as_named(spark, tmp_path,
                                                                         local_rows):
    """Landing and warehouse folders whose names hold a space, ``{}``, ``*``, ``?``, ``%``
    or ``#`` work on both engines, deletion vectors included (delta-rs lists such files
    percent-encoded and Spark expands glob characters); a folder delta-rs cannot hold
    tables under (``[``, ``%20``) is refused before anything is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from incr.compiler import compile_text
    from incr.config import Settings
    from incr.errors import StorageError
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.pipeline import Pipeline
    from incr.runtime.report import read_answer

    compiled = compile_text(FOLDER_PROGRAM, path="folders.sql", name="folders")
    root = tmp_path / "a b{c,d}*?%#e"
    landing, warehouse = root / "land ing", root / "ware house"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows,
                        config=Settings(state_vector_rows=0))
    batches = [("insert", [("a", 1.5), ("b", 2.0), ("a", 3.0)]),
               ("insert", [("b", 4.0), ("c", 0.5)]),
               ("delete", [("a", 1.5), ("c", 0.5)]),
               ("insert", [("a", 7.0)])]
    live: list[tuple] = []
    for seq, (op, rows) in enumerate(batches):
        folder = landing / "t" / ("_deletes" if op == "delete" else "")
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"k": [r[0] for r in rows], "x": [r[1] for r in rows]}),
                       folder / f"{seq:03d}.parquet")
        live = live + rows if op == "insert" else [r for r in live if r not in rows]
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        source = pa.table({"k": [r[0] for r in live], "x": [r[1] for r in live]})
        for plan in compiled.plans:
            diff = diff_answers(oracle_answer(plan.select, {"t": source}),
                                read_answer(warehouse, plan)[0])
            assert diff is None, f"after batch {seq}, {plan.view}: {diff}"
    for name, named in (("ware[house]", r"'\[' '\]'"), ("ware%20house", "'%20'")):
        with pytest.raises(StorageError, match=f"{named}.*use a folder without them"):
            Pipeline(compiled, landing, tmp_path / name, spark=spark)
        assert not (tmp_path / name).exists()
