"""Schema evolution: a source gains a nullable column while its program runs.

The files landed before the column was declared read as NULL in it; every view that does
not read it goes on from its state (same fingerprint, nothing rebuilt); a view that reads it
rebuilds from all the files; rows applied before it can still be deleted (their row-index
fingerprints do not change).  Dropping, retyping or adding a NOT NULL column is refused with
what to do, before anything is read or written.  Both engines.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_text
from incr.errors import CompileError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

BEFORE = """-- incr: buckets = 4
CREATE TABLE t (k VARCHAR, v BIGINT);
CREATE VIEW totals AS SELECT k, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY k;
CREATE VIEW everything AS SELECT * FROM t;
"""
AFTER = BEFORE.replace("v BIGINT)", "v BIGINT, discount DOUBLE)") + \
    "CREATE VIEW discounts AS SELECT k, SUM(discount) AS d, COUNT(discount) AS nd FROM t GROUP BY k;\n"
OLD = pa.schema([("k", pa.string()), ("v", pa.int64())])
NEW = OLD.append(pa.field("discount", pa.float64()))


def _land(landing: Path, seq: int, rows: list[dict], schema: pa.Schema, delete: bool = False,
          csv: bool = False) -> None:
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    data = pa.Table.from_pylist(rows, schema=schema)
    if csv:
        pacsv.write_csv(data, folder / f"{seq:04d}.csv")
    else:
        pq.write_table(data, folder / f"{seq:04d}.parquet")


def _check(warehouse: Path, compiled, live: list[dict]) -> None:
    rows = pa.Table.from_pylist([{**r, "discount": r.get("discount")} for r in live], schema=NEW)
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, {"t": rows}), answer) is None, plan.view


@pytest.mark.parametrize("local_rows", [None, 0], ids=["driver", "spark"])
def test_a_new_nullable_column_is_taken_without_rebuilding_views_that_do_not_read_it(
        spark, tmp_path, local_rows):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    before, after = compile_text(BEFORE, "p.sql"), compile_text(AFTER, "p.sql")

    def run(compiled):
        return Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()

    old = [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}]
    _land(landing, 0, old, OLD)
    # Sent with the column before it was declared: read without it then, NULL in it after.
    _land(landing, 1, [{"k": "c", "v": 4, "discount": 9.0}, {"k": "b", "v": 5, "discount": 9.0}],
          NEW, csv=True)
    _land(landing, 2, [{"k": "b", "v": 2}], OLD, delete=True)
    assert not run(before).rejected
    live = [{"k": "a", "v": 1}, {"k": "a", "v": 3}, {"k": "c", "v": 4}, {"k": "b", "v": 5}]
    state = warehouse / "state" / "totals" / before.plan("totals").state_fingerprint
    # ``discounts`` could share totals' state, but totals is served from its own: it keeps it.
    assert after.shares and after.plan("totals").shares is not None
    settled = Pipeline(after, landing, warehouse, spark=spark).compiled
    assert settled.plan("totals").state_fingerprint == before.plan("totals").state_fingerprint
    assert after.plan("everything").state_fingerprint != before.plan("everything").state_fingerprint

    # The column is declared; new files have it, and a delete of an old row names it NULL.
    _land(landing, 3, [{"k": "a", "v": 7, "discount": 0.5}, {"k": "d", "v": 1, "discount": None}], NEW)
    _land(landing, 4, [{"k": "a", "v": 1, "discount": None}, {"k": "b", "v": 5, "discount": None}],
          NEW, delete=True)
    _land(landing, 5, [{"k": "a", "v": 7, "discount": 0.5}], NEW, delete=True, csv=True)
    report = run(after)
    assert not report.rejected, report.rejected
    folded = {v.view: [] for v in after.plans}
    for b in report.applied:
        for m in b.views:
            if m.engine:
                folded[m.view].append(b.seq)
    assert folded["totals"] == [3, 4, 5]  # went on from its state: nothing rebuilt
    assert folded["everything"] == folded["discounts"] == [0, 1, 2, 3, 4, 5]
    assert state.is_dir()
    live = [r for r in live if r not in ({"k": "a", "v": 1}, {"k": "b", "v": 5})] + [{"k": "d", "v": 1}]
    _check(warehouse, after, live)

    # A file registered after the declaration must have the column, as any declared one.
    _land(landing, 6, [{"k": "e", "v": 1}], OLD)
    report = run(after)
    assert report.rejected is not None and "missing column(s) discount" in str(report.rejected)
    Pipeline(after, landing, warehouse, spark=spark).skip(6)
    assert not run(after).rejected

    # Dropped, retyped or NOT NULL: refused before anything is touched.
    for text, says in [(AFTER.replace(", discount DOUBLE", "").split("CREATE VIEW discounts")[0],
                        "column discount of table t .* is no longer declared"),
                       (AFTER.replace("discount DOUBLE", "discount BIGINT"),
                        "was declared DOUBLE and is now BIGINT"),
                       (AFTER.replace("discount DOUBLE", "discount DOUBLE, z INT NOT NULL"),
                        "column z added to table t .* is NOT NULL")]:
        _land(landing, 7, [{"k": "f", "v": 1, "discount": 1.0}], NEW)
        with pytest.raises(CompileError, match=says):
            run(compile_text(text, "p.sql"))
    _check(warehouse, after, live)
    # Taken back before any file landed under it: a declaration may change freely.
    (landing / "t" / "0007.parquet").unlink()
    assert not run(compile_text(AFTER.replace("discount DOUBLE", "discount DOUBLE, z INT"),
                                "p.sql")).rejected
    _land(landing, 7, [{"k": "f", "v": 1, "discount": 1.0}], NEW)
    assert not run(after).rejected
    _check(warehouse, after, live + [{"k": "f", "v": 1, "discount": 1.0}])
