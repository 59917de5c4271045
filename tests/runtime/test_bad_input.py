"""Bad input: a clear error naming the file, line/row, column and reason; nothing changes.

The contract (``incr.runtime.pipeline``, ``incr.runtime.ingest``):

* a bad batch file is rejected with an :class:`~incr.errors.InputError` naming the file (and
  the line or row and the column when known) and saying what is wrong;
* a rejected batch leaves every state table, the row index and every answer table exactly
  as they were (same Delta versions, same answer rows);
* ``Pipeline.run()`` returns a report with ``rejected`` set and applies nothing after it;
* later runs try the same batch again (it is never skipped silently) and apply it once the
  file is replaced with good content under the same name; the answer then equals the DuckDB
  oracle over every good row.

To keep Spark work low, a baseline warehouse (one good batch applied) is built once per module
and copied for each test; most rejections happen before Spark is touched.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from incr import cli
from incr.compiler import compile_text
from incr.errors import CompileError, InputError, StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

PROGRAM = """-- incr: buckets = 2
CREATE TABLE t (k VARCHAR NOT NULL, v BIGINT, x DOUBLE);
CREATE VIEW agg AS SELECT k, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS mn FROM t GROUP BY k;
"""
APPEND_ONLY_PROGRAM = "-- incr: append_only = t\n" + PROGRAM
COMPILED = compile_text(PROGRAM, path="p.sql", name="p")
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("x", pa.float64())])

Row = tuple  # (k, v, x)

# Batch 0 of the baseline: ("b", 10, 0.25) is there twice, everything else once.
BASE: list[Row] = [("a", 1, 1.5), ("a", 2, None), ("b", 10, 0.25), ("b", 10, 0.25),
                   ("c", None, -1.0)]
GOOD: list[Row] = [("a", 5, 0.5), ("d", 7, None)]  # what a fixed insert file holds


# -- writing batch files -------------------------------------------------------------------------
def csv_bytes(rows: list[Row]) -> bytes:
    lines = ["k,v,x"] + [",".join("" if f is None else str(f) for f in r) for r in rows]
    return ("\n".join(lines) + "\n").encode()


def jsonl_bytes(rows: list[Row]) -> bytes:
    return "".join(json.dumps(dict(zip(SCHEMA.names, r))) + "\n" for r in rows).encode()


def parquet_bytes(rows: list[Row], schema: pa.Schema = SCHEMA) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows],
                                        schema=schema), sink)
    return sink.getvalue()


def land(landing: Path, name: str, content: bytes, delete: bool = False) -> Path:
    """Writes a batch file (replacing any file of that name) and returns its path."""
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    return path


# -- observing the warehouse ---------------------------------------------------------------------
def delta_versions(warehouse: Path) -> dict[str, int]:
    """Version of every Delta table in the warehouse but the ledger (which logs registrations)."""
    out = {}
    for log in warehouse.rglob("_delta_log"):
        table = log.parent
        rel = table.relative_to(warehouse).as_posix()
        if rel.endswith("/ledger"):
            continue
        out[rel] = DeltaTable(str(table)).version()
    return out


@dataclass
class Snapshot:
    versions: dict[str, int]
    answers: dict[str, tuple[list[dict], int | None]]


def snapshot(warehouse: Path, compiled=COMPILED) -> Snapshot:
    answers = {}
    for plan in compiled.plans:
        table, batch = read_answer(warehouse, plan)
        rows = sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))
        answers[plan.view] = (rows, batch)
    return Snapshot(delta_versions(warehouse), answers)


def assert_unchanged(before: Snapshot, warehouse: Path, compiled=COMPILED) -> None:
    after = snapshot(warehouse, compiled)
    assert after.versions == before.versions, "a rejected batch changed state/index/answer tables"
    assert after.answers == before.answers, "a rejected batch changed an answer"
    # The state of view agg, its answer and (unless append-only) the row index are compared.
    assert any(k.startswith("state/agg/") for k in before.versions)
    assert "answers/agg" in before.versions
    if not compiled.program.tables[0].append_only:
        assert "_incr/p/rows/t" in before.versions


def live(inserted: list[Row], deleted: list[Row] = ()) -> list[Row]:
    out = list(inserted)
    for r in deleted:
        out.remove(r)
    return out


def assert_oracle(warehouse: Path, rows: list[Row], compiled=COMPILED) -> None:
    source = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        expected = oracle_answer(plan.select, {"t": source})
        diff = diff_answers(expected, answer, ordered=plan.ordered)
        assert diff is None, f"view {plan.view}:\n{diff}"


def assert_rejected(report, path: Path, fragments: list[str], seq: int) -> InputError:
    err = report.rejected
    assert isinstance(err, InputError), f"expected a rejection, got {report}"
    assert err.exit_code == 3
    assert report.rejected_batch is not None and report.rejected_batch.seq == seq
    message = str(err)
    assert str(path) in message, f"message does not name the file {path}: {message}"
    assert err.location is not None and err.location.path == str(path)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return err


# -- the baseline: batch 0 applied, copied per test ----------------------------------------------
@pytest.fixture(scope="module")
def baseline(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bad_input_base")
    landing, warehouse = root / "landing", root / "warehouse"
    land(landing, "0000_base.csv", csv_bytes(BASE))
    report = Pipeline(COMPILED, landing, warehouse, spark=spark).run()
    assert report.rejected is None and [b.seq for b in report.applied] == [0]
    return root


@pytest.fixture
def world(baseline, tmp_path, spark) -> tuple[Path, Path, Pipeline]:
    """A private copy of the baseline: (landing, warehouse, pipeline)."""
    for name in ("landing", "warehouse"):
        shutil.copytree(baseline / name, tmp_path / name)
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    return landing, warehouse, Pipeline(COMPILED, landing, warehouse, spark=spark)


# -- one bad file, rejected, retried, fixed ------------------------------------------------------
@dataclass
class Case:
    id: str
    name: str                  # file name in landing/t/ (or landing/t/_deletes/)
    bad: bytes | Callable[[], bytes]
    fragments: list[str]       # must appear in the message (besides the file path)
    line: int | None = None    # expected location line (None: not checked)
    column: int | None = None
    fix: bytes | None = None   # good content under the same name (None: no fix step)
    delete: bool = False
    inserted: list[Row] = field(default_factory=lambda: list(GOOD))
    deleted: list[Row] = field(default_factory=list)


def random_bytes() -> bytes:
    return os.urandom(512)


CASES = [
    Case("csv-non-integer", "0001_b.csv", csv_bytes([("a", 1, 1.0)]) + b"b,12x,2.0\n",
         ["row 2", "column v", "'12x'", "not a valid BIGINT"], line=3, fix=csv_bytes(GOOD)),
    Case("csv-too-few-fields", "0001_b.csv", b"k,v,x\na,1,1.0\nb,2\n",
         ["row 2 has 2 fields but the header has 3"], line=3),
    Case("csv-too-many-fields", "0001_b.csv", b"k,v,x\na,1,1.0\nb,2,2.0,9\n",
         ["row 2 has 4 fields but the header has 3"], line=3),
    Case("csv-missing-column", "0001_b.csv", b"k,v\na,1\n",
         ["missing column(s) x", "k VARCHAR, v BIGINT, x DOUBLE"], line=1),
    Case("csv-not-utf8", "0001_b.csv", "k,v,x\nk\xe9,1,1.0\n".encode("latin-1"),
         ["not UTF-8"]),
    Case("csv-empty", "0001_b.csv", b"", ["empty"]),
    Case("csv-null-in-not-null", "0001_b.csv", b"k,v,x\na,1,1.0\n,2,2.0\n",
         ["row 2", "column k", "NULL in a NOT NULL column"]),
    Case("json-invalid-line-3", "0001_b.jsonl",
         b'{"k": "a", "v": 1}\n{"k": "b", "v": 2}\n{"k": "c" "v": 3}\n',
         ["row 3 is not valid JSON", "Expecting ',' delimiter"], line=3, column=11,
         fix=jsonl_bytes(GOOD)),
    Case("json-string-in-double", "0001_b.jsonl", b'{"k": "a", "v": 1, "x": "1.5"}\n',
         ["row 1", "column x", '"1.5"', "not a valid DOUBLE"], line=1),
    Case("parquet-wrong-type", "0001_b.parquet",
         lambda: parquet_bytes([("a", "1", 1.0)], pa.schema([("k", pa.string()), ("v", pa.string()),
                                                             ("x", pa.float64())])),
         ["column v", "string", "declared BIGINT"]),
    Case("parquet-corrupt", "0001_b.parquet", random_bytes,
         ["not a readable Parquet file"], fix=parquet_bytes(GOOD)),
    Case("parquet-null-in-not-null", "0001_b.parquet",
         lambda: parquet_bytes([("a", 1, 1.0), ("b", 2, 2.0), (None, 3, 3.0)]),
         ["row 3", "column k", "NULL in a NOT NULL column"]),
    Case("delete-never-inserted", "0001_d.csv", csv_bytes([("a", 1, 1.5), ("zz", 7, 7.0)]),
         ["not live", "row 2", "k='zz'", "v=7", "x=7.0", "deleted 1 time(s), 0 live copies"],
         delete=True, fix=csv_bytes([("b", 10, 0.25), ("b", 10, 0.25)]),
         inserted=[], deleted=[("b", 10, 0.25), ("b", 10, 0.25)]),
    Case("delete-twice-inserted-once", "0001_d.jsonl", jsonl_bytes([("a", 1, 1.5), ("a", 1, 1.5)]),
         ["not live", "row 1", "k='a'", "v=1", "x=1.5", "deleted 2 time(s), 1 live copy"],
         delete=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_file_is_rejected_retried_and_applied_once_fixed(world, case: Case):
    landing, warehouse, pipeline = world
    before = snapshot(warehouse)
    bad = case.bad() if callable(case.bad) else case.bad
    path = land(landing, case.name, bad, delete=case.delete)

    report = pipeline.run()
    err = assert_rejected(report, path, case.fragments, seq=1)
    if case.line is not None:
        assert err.location.line == case.line, str(err)
        assert f"{path}:{case.line}" in str(err)
    if case.column is not None:
        assert err.location.column == case.column, str(err)
        assert f"{path}:{case.line}:{case.column}: " in str(err)
    assert report.applied == []
    assert_unchanged(before, warehouse)
    assert_oracle(warehouse, BASE)  # the answers still reflect the good rows only

    # A later run tries the same batch again: still rejected, still nothing changed.
    again = pipeline.run()
    assert_rejected(again, path, case.fragments, seq=1)
    assert again.applied == []
    assert_unchanged(before, warehouse)

    # Fixed under the same name: the batch is applied, and the answer equals the oracle.
    # (Spark work: done for one case per format and for a delete batch only.)
    if case.fix is None:
        return
    land(landing, case.name, case.fix, delete=case.delete)
    fixed = pipeline.run()
    assert fixed.rejected is None, str(fixed.rejected)
    assert fixed.registered == 0
    assert [(b.seq, b.kind) for b in fixed.applied] == [(1, "delete" if case.delete else "insert")]
    assert_oracle(warehouse, live(BASE + case.inserted, case.deleted))
    assert read_answer(warehouse, COMPILED.plan("agg"))[1] == 1


@pytest.mark.parametrize("local_rows", [200_000, 0], ids=["driver", "spark"])
def test_a_column_added_upstream_is_ignored_with_a_warning(world, spark, local_rows, caplog):
    """Schema drift: files that gained a column (CSV, Parquet) or a key (JSON lines) are
    applied with the declared columns, and the run warns which file and columns were left
    out; a delete batch with the new column matches its rows by the declared ones.  (A
    missing or retyped column is rejected: the csv-missing-column and parquet-wrong-type
    cases above.)"""
    landing, warehouse, _ = world
    pipeline = Pipeline(COMPILED, landing, warehouse, spark=spark, local_rows=local_rows)
    wider = pa.schema([*SCHEMA, ("region", pa.string())])
    csv_path = land(landing, "0001_b.csv", b"k,v,x,region\na,5,0.5,north\nd,7,,south\n")
    json_path = land(landing, "0002_b.jsonl", b'{"k": "e", "v": 3, "x": 2.0, "tags": [1, 2]}\n'
                                              b'{"k": "a", "shipped": true, "v": 4}\n')
    parquet_path = land(landing, "0003_b.parquet",
                        parquet_bytes([("f", 8, 1.0, None), ("b", 10, 0.25, "east")], wider))
    delete_path = land(landing, "0004_d.csv", b"region,k,v,x\nwest,b,10,0.25\n", delete=True)
    with caplog.at_level("WARNING", logger="incr.runtime"):
        report = pipeline.run()
    assert report.rejected is None, str(report.rejected)
    assert [b.seq for b in report.applied] == [1, 2, 3, 4]
    assert_oracle(warehouse, live(BASE + [("a", 5, 0.5), ("d", 7, None), ("e", 3, 2.0), ("a", 4, None),
                                          ("f", 8, 1.0), ("b", 10, 0.25)], [("b", 10, 0.25)]))
    warned = [r.getMessage() for r in caplog.records if "not declared for t" in r.getMessage()]
    for path, columns in [(csv_path, "region"), (json_path, "tags, shipped"), (parquet_path, "region"),
                          (delete_path, "region")]:
        assert any(str(path) in w and f"column(s) {columns} are" in w for w in warned), (path, warned)


def test_unsupported_extension_is_rejected(world):
    landing, warehouse, pipeline = world
    before = snapshot(warehouse)
    path = land(landing, "0001_b.txt", csv_bytes(GOOD))

    report = pipeline.run()
    err = report.rejected
    assert isinstance(err, InputError), report
    assert err.location.path == str(path) and err.exit_code == 3
    assert str(path) in str(err) and "unsupported batch file type .txt" in str(err)
    assert report.applied == []
    assert_unchanged(before, warehouse)
    assert pipeline.run().rejected is not None  # tried again, still refused
    assert_unchanged(before, warehouse)

    path.unlink()  # landed again with a supported name
    land(landing, "0001_b.csv", csv_bytes(GOOD))
    fixed = pipeline.run()
    assert fixed.rejected is None, str(fixed.rejected)
    assert_oracle(warehouse, BASE + GOOD)


def test_a_link_leading_outside_the_landing_folder_is_refused(world, tmp_path):
    landing, warehouse, pipeline = world
    before = snapshot(warehouse)
    outside = tmp_path / "elsewhere" / "secret.csv"
    outside.parent.mkdir()
    outside.write_bytes(csv_bytes(GOOD))
    link = landing / "t" / "0001_b.csv"
    link.symlink_to(outside)

    report = pipeline.run()
    err = report.rejected
    assert isinstance(err, InputError) and err.location.path == str(link), report
    assert f"leads to {outside}, outside the landing folder" in str(err)
    assert report.applied == []
    assert_unchanged(before, warehouse)

    # A link that stays inside the landing folder is a file like any other.
    inside = landing / "t" / "_kept" / "good.csv"
    inside.parent.mkdir()
    inside.write_bytes(csv_bytes(GOOD))
    link.unlink()
    link.symlink_to(inside)
    fixed = pipeline.run()
    assert fixed.rejected is None, str(fixed.rejected)
    assert_oracle(warehouse, BASE + GOOD)


# -- append-only sources refuse delete batches ---------------------------------------------------
def test_delete_batch_for_append_only_table_is_refused(spark, dirs):
    landing, warehouse = dirs
    compiled = compile_text(APPEND_ONLY_PROGRAM, path="p.sql", name="p")
    assert compiled.program.tables[0].append_only
    land(landing, "0000_base.jsonl", jsonl_bytes(BASE))
    path = land(landing, "0001_d.csv", csv_bytes([("a", 1, 1.5)]), delete=True)
    land(landing, "0002_more.csv", csv_bytes(GOOD))
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)

    report = pipeline.run()
    assert [b.seq for b in report.applied] == [0]
    assert_rejected(report, path, ["append-only", "delete batches are refused"], seq=1)
    assert not (warehouse / "_incr" / "p" / "rows").exists()  # no row index for append-only
    assert_oracle(warehouse, BASE, compiled)
    before = snapshot(warehouse, compiled)

    again = pipeline.run()
    assert_rejected(again, path, ["append-only"], seq=1)
    assert again.applied == []  # batch 2 waits behind the refused batch
    assert_unchanged(before, warehouse, compiled)


# -- a rejection in the middle of a sequence -----------------------------------------------------
def test_rejection_mid_sequence_stops_there_and_resumes_after_fix(world):
    landing, warehouse, pipeline = world
    land(landing, "0001_ins.jsonl", jsonl_bytes(GOOD))
    land(landing, "0002_del.csv", csv_bytes([("a", 1, 1.5)]), delete=True)
    # Deletes the row a second time: it was inserted once and is gone after batch 2.
    bad = land(landing, "0003_del.parquet", parquet_bytes([("a", 1, 1.5)]), delete=True)
    land(landing, "0004_ins.csv", csv_bytes([("e", 3, 3.0), ("a", 4, -2.0)]))

    report = pipeline.run()
    assert report.registered == 4
    assert [b.seq for b in report.applied] == [1, 2]
    assert report.ready_through == 2
    assert_rejected(report, bad, ["deleted 1 time(s), 0 live copies", "k='a'"], seq=3)
    expected = live(BASE + GOOD, [("a", 1, 1.5)])
    assert_oracle(warehouse, expected)
    [status] = pipeline.status()
    assert (status.state_batch, status.answer_batch, status.pending) == (2, 2, 2)
    assert status.state_rows and status.state_bytes > 0 and status.answer_version is not None
    assert status.answer_rows == read_answer(warehouse, COMPILED.plans[0])[0].num_rows
    rejection = pipeline.last_rejection()
    assert (rejection.seq, rejection.table, rejection.path) == (3, "t", "t/_deletes/0003_del.parquet")
    assert "0 live copies" in rejection.message
    before = snapshot(warehouse)

    again = pipeline.run()
    assert again.applied == [] and again.rejected_batch.seq == 3
    assert_unchanged(before, warehouse)

    # Fixed: delete a row that is live (NULLs match NULLs), then batch 4 follows in the same run.
    land(landing, "0003_del.parquet", parquet_bytes([("c", None, -1.0)]), delete=True)
    fixed = pipeline.run()
    assert fixed.rejected is None, str(fixed.rejected)
    assert [b.seq for b in fixed.applied] == [3, 4]
    assert pipeline.last_rejection() is None
    assert_oracle(warehouse, live(expected + [("e", 3, 3.0), ("a", 4, -2.0)], [("c", None, -1.0)]))
    assert pipeline.run().applied == []  # nothing applied twice


def test_an_index_write_failing_beside_the_fold_fails_the_run_and_the_next_run_records_it(
        world, monkeypatch):
    """An insert batch's row index is recorded on a background thread while the views fold
    the batch (:func:`incr.runtime.parallel.later`): a failed write still fails the run, once
    the fold is done, and the next run records the batch, so deleting its rows is accepted."""
    from incr.runtime.rowindex import RowIndex

    landing, warehouse, pipeline = world
    land(landing, "0001_ins.csv", csv_bytes(GOOD))

    def failing(self, counts, batch):
        raise StorageError("writing the row index failed: no space left on device (test)")
    with monkeypatch.context() as patched:
        patched.setattr(RowIndex, "_append", failing)
        with pytest.raises(StorageError, match="no space left"):
            pipeline.run()
    [status] = pipeline.status()
    assert status.state_batch == 1  # the view folded the batch beside the failed write

    assert pipeline.run().rejected is None  # the index catches up; the view is not folded twice
    land(landing, "0002_del.csv", csv_bytes([GOOD[0]]), delete=True)
    report = pipeline.run()
    assert report.rejected is None, str(report.rejected)
    assert [b.seq for b in report.applied] == [2]
    assert_oracle(warehouse, live(BASE + GOOD, [GOOD[0]]))


# -- the command line ----------------------------------------------------------------------------
def test_cli_run_exits_3_and_names_the_file(spark, dirs, capsys):
    landing, warehouse = dirs
    program = landing.parent / "p.sql"
    program.write_text(PROGRAM)
    path = land(landing, "0000_b.csv", b"k,v,x\na,oops,1.0\n")
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        code = cli.main(["run", str(program), "--landing", str(landing),
                         "--warehouse", str(warehouse)])
        out, err = capsys.readouterr()
        assert code == 3
        assert f"error: {path}:2: " in err
        assert "column v" in err and "'oops'" in err and "not a valid BIGINT" in err
        assert "stopped at batch 0" in out

        # `incr status` says which batch was rejected and why, as text and as JSON.
        paths = ["--landing", str(landing), "--warehouse", str(warehouse)]
        assert cli.main(["status", str(program), *paths]) == 0
        out, _ = capsys.readouterr()
        assert "rejected: batch 0 (table t, file t/0000_b.csv)" in out and "'oops'" in out
        assert cli.main(["status", str(program), *paths, "--json"]) == 0
        status = json.loads(capsys.readouterr()[0])
        assert status["rejected"]["seq"] == 0 and "not a valid BIGINT" in status["rejected"]["message"]
        assert [v["pending"] for v in status["views"]] == [1] and status["batches"] == 1
        assert status["landed_unregistered"] == []  # the rejected file is batch 0

        # An unsupported file is refused with the same exit code.
        txt = land(landing, "0001_c.txt", b"hello\n")
        code = cli.main(["run", str(program), "--landing", str(landing),
                         "--warehouse", str(warehouse)])
        out, err = capsys.readouterr()
        assert code == 3
        assert f"error: {txt}" in err and "unsupported batch file type .txt" in err
        assert f"stopped at {txt}" in out
    finally:
        # The CLI's spark_session() re-applies incr's defaults to the shared test session.
        spark.conf.set("spark.sql.shuffle.partitions", shuffle)


# -- the driver-side path and Spark check deletes alike -------------------------------------------
def test_bad_delete_message_is_the_same_on_the_driver_and_in_spark(baseline, tmp_path, spark):
    """Small batches check deletes on the driver (pyarrow, our Spark hash), large ones in
    Spark: both must reject the same rows with the same words, and accept the same fix."""
    bad = csv_bytes([("a", 1, 1.5), ("zz", 7, 7.0), ("a", 1, 1.5), ("c", None, -1.0),
                     ("yy", None, None), ("qq", 1, 1.0)])
    messages = {}
    for local_rows in (0, 1000):
        root = tmp_path / f"local-{local_rows}"
        for name in ("landing", "warehouse"):
            shutil.copytree(baseline / name, root / name)
        pipeline = Pipeline(COMPILED, root / "landing", root / "warehouse", spark=spark,
                            local_rows=local_rows)
        path = land(root / "landing", "0001_d.csv", bad, delete=True)
        report = pipeline.run()
        assert report.rejected is not None and report.applied == []
        messages[local_rows] = str(report.rejected).replace(str(path), "FILE")
        land(root / "landing", "0001_d.csv", csv_bytes([("a", 1, 1.5), ("c", None, -1.0)]),
             delete=True)
        fixed = pipeline.run()
        assert fixed.rejected is None and [b.seq for b in fixed.applied] == [1]
        assert_oracle(root / "warehouse", live(BASE, [("a", 1, 1.5), ("c", None, -1.0)]))
    assert messages[0] == messages[1000]
    assert "deleted 2 time(s), 1 live copy" in messages[0] and "(and 1 more)" in messages[0]


# -- a compiled query Spark refuses ------------------------------------------------------------
def test_a_compiled_query_spark_refuses_names_the_view_and_loses_nothing(spark, dirs, monkeypatch):
    """A gap in the compiler (a form Spark cannot run) is an incr error naming the view and
    Spark's reason, not Spark's analysis error and plan; the answer stays as it was, and
    the batch applies once the query runs."""
    from incr.compiler.plan import IncrementalPlan

    landing, warehouse = dirs
    land(landing, "0000_base.jsonl", jsonl_bytes(BASE))
    pipeline = Pipeline(COMPILED, landing, warehouse, spark=spark, local_rows=0)
    assert [b.seq for b in pipeline.run().applied] == [0]
    land(landing, "0001_more.csv", csv_bytes(GOOD))
    before = snapshot(warehouse)

    def refused(self, *args, **kwargs) -> str:
        return "SELECT no_such_function(1) AS s"
    with monkeypatch.context() as patched:
        patched.setattr(IncrementalPlan, "answer_sql", refused)
        patched.setattr(IncrementalPlan, "answer_change_sql", refused)
        with pytest.raises(CompileError) as raised:
            Pipeline(COMPILED, landing, warehouse, spark=spark, local_rows=0).run()
    message = str(raised.value)
    assert "view agg" in message and "no_such_function" in message, message
    assert "== Physical Plan ==" not in message and "\n" not in message, message
    assert snapshot(warehouse).answers == before.answers

    report = Pipeline(COMPILED, landing, warehouse, spark=spark, local_rows=0).run()
    assert report.rejected is None
    assert_oracle(warehouse, BASE + GOOD)
