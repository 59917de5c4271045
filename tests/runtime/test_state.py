"""State tables: compaction by each table's own bucket count, and what a run logs about them.

A view whose own stage is a global aggregate keeps one main row (1 bucket) but its join's
side tables are hashed into the program's buckets; compaction must judge each table by its
own count, or a side table looks over its threshold after every merge and is rewritten
whole each batch.  An initial load may be written by Spark's executors instead of merged,
and a state beyond the driver's limit is compacted by them.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_text
from incr.compiler.explain import explain_program
from incr.compiler.plan import BUCKET
from incr.config import COMPACT_FILES_PER_BUCKET
from incr.errors import StorageError
from incr.runtime.engine import Engines
from incr.runtime.ingest import load_batch
from incr.runtime.lock import Locks
from incr.runtime.pipeline import Pipeline
from incr.runtime.session import SparkEngine
from incr.runtime.state import INSERT, ViewState
from incr.runtime.store import DeltaStore

PROGRAM = """-- incr: buckets = 4
CREATE TABLE a (k BIGINT, v BIGINT);
CREATE TABLE b (k BIGINT, w BIGINT);
CREATE VIEW total AS SELECT SUM(a.v * b.w) AS s, COUNT(*) AS n FROM a JOIN b ON a.k = b.k;
"""


def _land(landing: Path, table: str, seq: int, rows: list[tuple[int, int]]) -> None:
    folder = landing / table
    folder.mkdir(parents=True, exist_ok=True)
    names = ["k", "v"] if table == "a" else ["k", "w"]
    data = pa.table({names[0]: [r[0] for r in rows], names[1]: [r[1] for r in rows]},
                    schema=pa.schema([(n, pa.int64()) for n in names]))
    pacsv.write_csv(data, folder / f"{seq:04d}.csv")


def test_side_tables_compact_by_their_own_bucket_count(spark, tmp_path):
    compiled = compile_text(PROGRAM, path="total.sql", name="total")
    plan = compiled.plans[0]
    side = next(t for t in plan.top.tables if t.side_of == "a")
    assert plan.top.buckets_of(side.name) == 4 and plan.top.buckets_of("main") == 1
    text = explain_program(compiled)
    assert "pmod(xxhash64(a__k), 4)" in text  # the side table's own buckets, not the main's 1

    landing = tmp_path / "landing"
    pipeline = Pipeline(compiled, landing, tmp_path / "wh", spark=spark)
    store = DeltaStore()
    path = pipeline.views["total"].table_path(side.name)
    files = []
    for seq in range(8):  # each batch of a touches every bucket of its side table
        _land(landing, "a", 2 * seq, [(k, seq + k) for k in range(12)])
        _land(landing, "b", 2 * seq + 1, [(seq % 3, 1)])
        assert pipeline.run().rejected is None
        files.append(len(store.table(path).file_uris()))
    limit = COMPACT_FILES_PER_BUCKET * 4
    rewrites = [h for h in store.history(path) if h.get("operation") == "WRITE"
                and h.get("operationParameters", {}).get("mode") == "Overwrite"]
    # Files accumulate up to the side table's own limit; before it, no batch rewrote it whole.
    assert max(files) <= limit + 4
    assert files[:3] == sorted(files[:3]) and files[2] > COMPACT_FILES_PER_BUCKET
    assert len(rewrites) <= 8 // 3, rewrites


def test_each_batch_and_view_logs_engine_rows_state_and_seconds(spark, tmp_path, caplog):
    program = """CREATE TABLE e (k VARCHAR, v BIGINT);
CREATE VIEW plain AS SELECT k, SUM(v) AS s FROM e GROUP BY k;
CREATE VIEW texty AS SELECT reverse(k) AS uk, COUNT(*) AS n FROM e GROUP BY reverse(k);
"""
    compiled = compile_text(program, path="logs.sql", name="logs")
    landing = tmp_path / "landing"
    (landing / "e").mkdir(parents=True)
    for seq in range(2):
        pacsv.write_csv(pa.table({"k": ["x", "y", "x"], "v": [1, 2, seq]}),
                        landing / "e" / f"{seq:04d}.csv")
    with caplog.at_level(logging.INFO, logger="incr.runtime"):
        assert Pipeline(compiled, landing, tmp_path / "wh", spark=spark).run().rejected is None
    lines = [r.getMessage() for r in caplog.records if r.name == "incr.runtime"]
    per_batch = re.compile(r"batch 1 \(insert e, 3 rows\) → view (\w+): (driver|spark), (\d+) state "
                           r"rows touched, [\d.]+ s \(h [\d.]+, merge [\d.]+, answer [\d.]+\)")
    engines = {m.group(1): m.group(2) for line in lines if (m := per_batch.fullmatch(line))}
    assert engines == {"plain": "driver", "texty": "spark"}, lines
    # The fall back says why: reverse() is outside the driver-side set.
    assert any(re.search(r"fold batch 1 of e into view texty: back to Spark, .*it uses REVERSE", line)
               for line in lines), lines


GROUPED = """-- incr: buckets = 4
CREATE TABLE s (k VARCHAR, g BIGINT, v BIGINT, day DATE);
CREATE VIEW per_k AS SELECT k, g, COUNT(*) AS n, SUM(v) AS total, MIN(day) AS first
    FROM s GROUP BY k, g;
"""


def test_an_initial_load_written_by_spark_is_the_merged_state(spark, tmp_path):
    """h(ΔS) into an empty state, written by Spark's executors, equals the driver's append
    of the collected rows; and a later MERGE finds every row in it (file statistics)."""
    compiled = compile_text(GROUPED, path="grouped.sql", name="grouped")
    plan = compiled.plans[0]
    main = plan.main_tables[0]
    spec = next(s for s in plan.top.merge if s.table == main.name)
    engines = Engines(spark=spark, local_rows=0)
    store = DeltaStore()
    states = [ViewState(plan, store, tmp_path / name) for name in ("driver", "spark")]
    for state in states:
        state.ensure_tables(engines)
    decl = plan.source_tables[0]
    engine = SparkEngine(engines, store)

    def batch(seq: int, n: int) -> str:
        path = tmp_path / f"{seq}.parquet"
        pq.write_table(pa.table({
            "k": [None if i % 11 == 0 else f"k{i % 37}" for i in range(n)],
            "g": pa.array([i % 3 for i in range(n)], pa.int64()),
            "v": pa.array([i + seq for i in range(n)], pa.int64()),
            "day": [dt.date(2020, 1, 1) + dt.timedelta(days=(i * 7 + seq) % 400) for i in range(n)],
        }), path)
        view = f"incr_test_batch_{seq}"
        engine.frame(view, load_batch(engines, decl, path, path.name).df)
        return view

    try:
        first = batch(0, 500)
        rows = engine.collect(plan.h_query(main.name, first), states[0].schema(main.name))
        states[0].merge(main, spec, rows, 0, INSERT)
        written = states[1].append_from_spark(engine, main, plan.h_query(main.name, first), 0)
        assert written == rows.num_rows
        assert len(store.table(states[1].path(main.name)).file_uris()) <= 4  # one per bucket
        with pytest.raises(StorageError, match="holds rows"):
            states[1].append_from_spark(engine, main, plan.h_query(main.name, first), 1)
        second = batch(1, 60)
        more = engine.collect(plan.h_query(main.name, second), states[0].schema(main.name))
        for state in states:
            state.merge(main, spec, more, 1, INSERT)
    finally:
        engine.close()
    order = [(c, "ascending") for c in (BUCKET, *main.key_columns)]
    tables = [store.read(state.path(main.name)).sort_by(order) for state in states]
    assert tables[0].equals(tables[1])
    assert all(state.through(main.name) == 1 for state in states)


def test_a_state_beyond_the_driver_limit_is_compacted_by_spark_alike(spark, tmp_path, monkeypatch):
    """Compaction of a table over INCR_LOCAL_STATE_ROWS is written by Spark's executors (the
    driver never holds the table) and leaves the same rows, sorted, with the batch marker."""
    from incr.config import Settings
    from incr.oracle import diff_answers, oracle_answer
    from incr.runtime.report import read_answer

    compiled = compile_text(GROUPED, path="grouped.sql", name="grouped")
    plan = compiled.plans[0]
    written: list[str] = []
    original = SparkEngine.write

    def spy(self, path, rows, **kwargs):
        written.append(Path(path).name)
        return original(self, path, rows, **kwargs)

    monkeypatch.setattr(SparkEngine, "write", spy)
    runs = {name: Pipeline(compiled, tmp_path / "landing", tmp_path / name, spark=spark,
                           config=Settings(local_state_rows=limit))
            for name, limit in (("driver", 1_000_000), ("spark", 1))}
    live = []
    for seq in range(8):  # every batch touches each of the 4 buckets: a file per bucket
        rows = [(f"k{(seq * 5 + i) % 23}", i % 3, seq * 10 + i, dt.date(2020, 1, 1 + i % 28))
                for i in range(40)]
        live += rows
        folder = tmp_path / "landing" / "s"
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.table({c: [r[j] for r in rows] for j, c in
                                  enumerate(("k", "g", "v", "day"))}), folder / f"{seq:04d}.csv")
        for pipeline in runs.values():
            assert pipeline.run().rejected is None
    store = DeltaStore()
    state_tables = {t.name: t for t in plan.main_tables}
    assert set(written) & set(state_tables), written  # the limited run compacted in Spark
    for table in state_tables.values():
        paths = {n: p.views[plan.view].table_path(table.name) for n, p in runs.items()}
        assert store.file_count(paths["spark"]) <= COMPACT_FILES_PER_BUCKET * 4 + 4
        order = [(c, "ascending") for c in (BUCKET, *table.key_columns)]
        tables = {n: store.read(p).sort_by(order) for n, p in paths.items()}
        assert tables["driver"].equals(tables["spark"].select(tables["driver"].column_names))
        assert store.applied_through(paths["spark"]) == 7
    sources = {"s": pa.table({c: [r[j] for r in live] for j, c in
                              enumerate(("k", "g", "v", "day"))})}
    expected = oracle_answer(plan.select, sources)
    for pipeline in runs.values():
        answer, _ = read_answer(pipeline.warehouse, plan)
        assert diff_answers(expected, answer) is None


def test_explain_shows_the_state_types_a_run_stored(spark, tmp_path):
    """Spark sums a DECIMAL(15,2) into a DECIMAL(25,2); explain says so once a run stored it."""
    from incr.runtime.report import stored_types

    text = """CREATE TABLE t (k BIGINT, d DECIMAL(15,2));
CREATE VIEW s AS SELECT k, SUM(d) AS total FROM t GROUP BY k;
"""
    compiled = compile_text(text, path="s.sql", name="s")
    plan = compiled.plans[0]
    landing, warehouse = tmp_path / "landing", tmp_path / "wh"
    before = explain_program(compiled, {"s": stored_types(warehouse, plan)})
    assert "types inferred" in before and "types as stored" not in before
    (landing / "t").mkdir(parents=True)
    (landing / "t" / "0000.csv").write_text("k,d\n1,2.50\n1,1.25\n")
    assert Pipeline(compiled, landing, warehouse, spark=spark).run().rejected is None
    stored = stored_types(warehouse, plan)
    assert stored["main"]["sum_d"] == "DECIMAL(25, 2)" and stored["main"]["k"] == "BIGINT"
    after = explain_program(compiled, {"s": stored})
    assert "types as stored by the last run" in after
    assert re.search(r"sum_d\s+DECIMAL\(25, 2\)", after), after


def test_a_table_loaded_past_the_vector_threshold_is_ready_before_its_next_batch(
        spark, tmp_path, monkeypatch):
    """The batch that first fills a state table past ``INCR_STATE_VECTOR_ROWS`` also enables
    its deletion vectors and mirrors its files by the column they are sorted by (a side
    table's join key), so the next batch searches it by key at once: it writes no mirror by
    reading a file back, and the answer stays exact."""
    from incr.config import Settings
    from incr.runtime import mirror
    from incr.runtime.report import read_answer
    from incr.runtime.store import has_deletion_vectors

    compiled = compile_text(PROGRAM, path="total.sql", name="total")
    landing = tmp_path / "landing"
    pipeline = Pipeline(compiled, landing, tmp_path / "wh", spark=spark,
                        config=Settings(state_vector_rows=10, mirror_rows=1))
    side = next(t for t in compiled.plans[0].top.tables if t.side_of == "a")
    path = pipeline.views["total"].table_path(side.name)
    _land(landing, "a", 0, [(k, k) for k in range(40)])
    assert pipeline.run().rejected is None
    store = DeltaStore()
    assert has_deletion_vectors(store.table(path))
    keyed = {p.name.rsplit("@", 1)[1] for p in (path / mirror.DIRECTORY).rglob("*.arrow")}
    assert keyed == {f"{side.sort_columns[0]}.arrow"} and side.sort_columns[0] == "a__k"
    read_back: list = []
    real = mirror.write
    monkeypatch.setattr(mirror, "write", lambda *a: read_back.append(a) or real(*a))
    _land(landing, "b", 1, [(k, 2) for k in range(0, 40, 3)])
    _land(landing, "a", 2, [(k, 1) for k in range(0, 40, 5)])
    assert pipeline.run().rejected is None
    assert [a[1] for a in read_back if Path(a[0]) == path] == []
    answer, _ = read_answer(tmp_path / "wh", compiled.plans[0])
    expected = sum(k * 2 for k in range(0, 40, 3)) + sum(2 for k in range(0, 40, 15))
    assert answer.to_pylist() == [{"s": expected, "n": 14 + 3}]


def test_an_answer_rewritten_past_the_mirror_size_is_ready_for_its_first_merge(
        spark, tmp_path, monkeypatch):
    """An answer a later batch MERGEs by deletion vectors gets them, and the key mirrors of
    its files, when it is rewritten whole (its first publish, after the load): the first
    batch after it searches the answer by key at once, writing no mirror by reading a file
    back, and the answer stays exact."""
    from incr.config import Settings
    from incr.runtime import mirror
    from incr.runtime.report import read_answer
    from incr.runtime.store import has_deletion_vectors

    program = ("CREATE TABLE a (k BIGINT, v BIGINT);\n"
               "CREATE VIEW per AS SELECT k, SUM(v) AS s FROM a GROUP BY k;\n")
    compiled = compile_text(program, path="per.sql", name="per")
    landing, warehouse = tmp_path / "landing", tmp_path / "wh"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=Settings(state_vector_rows=10, mirror_rows=1,
                                        answer_rewrite_rows=0))  # by change, however small
    _land(landing, "a", 0, [(k, k) for k in range(40)])
    assert pipeline.run().rejected is None
    path = warehouse / "answers" / "per"
    assert has_deletion_vectors(DeltaStore().table(path))
    keyed = {p.name.rsplit("@", 1)[1] for p in (path / mirror.DIRECTORY).rglob("*.arrow")}
    assert keyed == {"k.arrow"}
    read_back: list = []
    real = mirror.write
    monkeypatch.setattr(mirror, "write", lambda *a: read_back.append(a) or real(*a))
    _land(landing, "a", 1, [(k, 1) for k in range(0, 40, 5)])
    report = pipeline.run()
    assert report.rejected is None
    assert [v.answer_mode for b in report.applied for v in b.views] == ["change"]
    assert [a[1] for a in read_back if Path(a[0]) == path] == []
    answer, _ = read_answer(warehouse, compiled.plans[0])
    assert sorted(answer.to_pylist(), key=lambda r: r["k"]) == [
        {"k": k, "s": k + (1 if k % 5 == 0 else 0)} for k in range(40)]


def test_the_root_is_looked_up_once_per_hold_of_the_view_s_lock(tmp_path, monkeypatch):
    """A state's newest generation is looked up (a directory listing) on every use, so a
    process sees another's refresh; while it holds the view's lock no other process can
    start one, so it is looked up once per hold, and again after this process starts one
    (by any object)."""
    plan = compile_text(PROGRAM, name="p").plans[0]
    store = DeltaStore()
    state = ViewState(plan, store, tmp_path)
    locks = Locks(tmp_path / "locks", "p")
    state.pin = lambda: locks.holding(plan.state_owner)
    listed: list[int] = []
    generation = ViewState._generation
    monkeypatch.setattr(ViewState, "_generation",
                        lambda self: listed.append(1) or generation(self))
    (state.view_root / plan.state_fingerprint).mkdir(parents=True)
    by_hand = state.view_root / f"{plan.state_fingerprint}.r1"  # another process's refresh
    assert state.root.name == plan.state_fingerprint
    by_hand.mkdir()
    assert state.root == by_hand and len(listed) == 2  # not held: looked up every time
    with locks.hold(views=(plan.state_owner,)):
        assert state.root == state.root == state.path("main").parent == by_hand
        assert len(listed) == 3
        made = ViewState(plan, store, tmp_path).new_generation()  # this process, another object
        assert len(listed) == 4
        assert state.root == made == state.root and made.name.endswith(".r2")
        assert len(listed) == 5
    with locks.hold(views=(plan.state_owner,)):  # a new hold: looked up once again
        assert state.root == state.root == made
    assert len(listed) == 6
