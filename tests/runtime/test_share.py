"""Views that share one state (issue 18): one fold per batch, each view's own answer.

The equivalence test checks their answers against DuckDB over random programs with sharing
on and off; these check how sharing runs: the state kept once under its own name, the
batch folded by the first view and published by change by the others, a view added to a
running program published from the state it joins, and the directories left behind when
views start or stop sharing removed once nothing reads them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr.compiler import CompiledProgram, compile_text
from incr.compiler.explain import explain_program
from incr.config import Settings
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime import pipeline as pipeline_module
from incr.runtime.answer import AnswerTable
from incr.runtime.local import DriverEngine
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

TABLE = "-- incr: buckets = 2\nCREATE TABLE t (k VARCHAR, v BIGINT, x DOUBLE);\n"
TOTALS = "CREATE VIEW totals AS SELECT k, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY k;\n"
EXTREMES = ("CREATE VIEW extremes AS SELECT k, MAX(x) AS top, MIN(v) AS low FROM t GROUP BY k "
            "HAVING COUNT(*) > 1 ORDER BY top DESC, k LIMIT 2;\n")
#: Another WHERE: it reads the shared state restricted to its rows.
FILTERED = "CREATE VIEW filtered AS SELECT k, SUM(v) AS s FROM t WHERE v > 2 GROUP BY k;\n"
#: Another grouping: a state of its own.
BY_V = "CREATE VIEW by_v AS SELECT v, COUNT(*) AS n FROM t GROUP BY v;\n"
#: Reads only what ``totals`` keeps (a sum and a count of v): the shared state is unchanged.
AVERAGE = "CREATE VIEW average AS SELECT k, AVG(v) AS mean FROM t GROUP BY k;\n"
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("x", pa.float64())])

#: (delete?, rows) per batch.
BATCHES = [
    (False, [("a", 1, 0.5), ("b", 5, 2.0), ("c", 2, 1.5), ("a", 3, 4.0)]),
    (False, [("a", 4, 1.0), ("d", 7, 3.5), ("b", 6, 0.25)]),
    (True, [("b", 5, 2.0), ("a", 1, 0.5)]),
    (False, [("b", 3, 9.0), ("e", 1, 1.0), ("c", 8, 2.5)]),
    (False, [("c", 9, 0.75), ("d", 1, 8.0)]),
]


def _land(landing: Path, seq: int) -> None:
    delete, rows = BATCHES[seq]
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
    pq.write_table(table, folder / f"{seq:04d}.parquet")


def _live(through: int) -> pa.Table:
    live: list[tuple] = []
    for delete, rows in BATCHES[:through + 1]:
        if delete:
            for row in rows:
                live.remove(row)
        else:
            live += rows
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in live], schema=SCHEMA)


def _check(warehouse: Path, compiled: CompiledProgram, through: int) -> None:
    for plan in compiled.plans:
        answer, batch = read_answer(warehouse, plan)
        assert batch == through, plan.view
        diff = diff_answers(oracle_answer(plan.select, {"t": _live(through)}), answer,
                            ordered=plan.ordered)
        assert diff is None, f"view {plan.view} after batch {through}:\n{diff}"


def _joined_step(landing: Path, warehouse: Path, run: Callable[[], object],
                 compiled: CompiledProgram, schemas: dict[str, pa.Schema],
                 live: dict[str, list[tuple]], seq: int, batch: tuple[str, bool, list[tuple]]
                 ) -> None:
    """Lands ``batch`` (table, delete?, rows) on a program of several tables as batch
    ``seq``, keeps ``live`` in step, runs, and checks every view against DuckDB."""
    table, delete, rows = batch
    folder = landing / table / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(zip(schemas[table].names, r)) for r in rows],
                                        schema=schemas[table]), folder / f"{seq:04d}.parquet")
    for row in rows:
        live[table].remove(row) if delete else live[table].append(row)
    run()
    sources = {t: pa.Table.from_pylist([dict(zip(schemas[t].names, r)) for r in rs],
                                       schema=schemas[t]) for t, rs in live.items()}
    for plan in compiled.plans:
        answer, through = read_answer(warehouse, plan)
        assert through == seq, plan.view
        diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
        assert diff is None, f"view {plan.view} after batch {seq}:\n{diff}"


def _states(warehouse: Path) -> set[str]:
    return {p.name for p in (warehouse / "state").iterdir()}


def _run_batches(compiled: CompiledProgram, dirs: tuple[Path, Path], spark, seqs: range,
                 local_rows: int = 1000, check: bool = False) -> None:
    """Lands batches ``seqs`` one at a time and runs ``compiled`` after each (``check``:
    then every view against DuckDB)."""
    landing, warehouse = dirs
    for seq in seqs:
        _land(landing, seq)
        Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
        if check:
            _check(warehouse, compiled, seq)


def test_views_sharing_a_state_fold_each_batch_once(spark, dirs):
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES + FILTERED + BY_V, name="shop")
    (share,) = compiled.shares
    assert share.views == ("totals", "extremes", "filtered")
    assert share.owner.startswith("_shared_shop.t.")
    assert share.restricted == (("filtered", "v > 2"),) and share.where is None
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000)
    for seq in range(len(BATCHES)):
        _land(landing, seq)
        (applied,) = pipeline.run().applied
        engines = {m.view: m.engine for m in applied.views}
        # The first view folds the batch into the shared state; the others publish from it.
        assert engines == {"totals": "driver", "extremes": "shared", "filtered": "shared",
                           "by_v": "driver"}
        modes = {m.view: m.answer_mode for m in applied.views}
        if seq:
            assert modes["totals"] == "change", modes  # by the groups the shared fold touched
        _check(warehouse, compiled, seq)
    assert _states(warehouse) == {share.owner, "by_v"}
    assert pipeline.owners == (share.owner, "by_v")


def test_views_sharing_a_state_read_its_touched_groups_once(spark, dirs, monkeypatch):
    """The first view to publish by change reads the shared state's rows of the groups the
    fold touched; the others publish from the rows it read."""
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + AVERAGE, name="shop")
    publishing: list[str] = []
    reads: list[tuple[str, str]] = []
    publish, delta = AnswerTable.publish, DriverEngine.delta

    def spied_publish(self, batch, *args, **kwargs):
        publishing.append(self.plan.view)
        try:
            return publish(self, batch, *args, **kwargs)
        finally:
            publishing.pop()

    def spied_delta(self, name, path, *args, **kwargs):
        if publishing:
            reads.append((publishing[-1], Path(path).name))
        return delta(self, name, path, *args, **kwargs)

    monkeypatch.setattr(AnswerTable, "publish", spied_publish)
    monkeypatch.setattr(DriverEngine, "delta", spied_delta)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000)
    for seq in range(3):
        _land(landing, seq)
        reads.clear()
        (applied,) = pipeline.run().applied
        _check(warehouse, compiled, seq)
    assert {m.view: m.answer_mode for m in applied.views} == {"totals": "change",
                                                              "average": "change"}
    assert len(reads) == 1, reads  # one view read the state table; the other did not


@pytest.mark.parametrize("write", ["merge", "replace_by_vectors"])
def test_the_tables_of_a_shared_state_are_written_side_by_side(spark, dirs, monkeypatch, write):
    """On the driver each state table's write (a MERGE of h(Δ), or the touched groups'
    new rows by deletion vectors) starts once its rows are computed and runs beside the
    others; a write that fails is raised once the others have ended, and the next run folds
    what the failed one left."""
    from incr.runtime.state import ViewState

    monkeypatch.setenv("INCR_DRIVER_THREADS", "2")
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES, name="shop")
    # state_vector_rows 0: every table with rows takes its batches by deletion vectors
    config = Settings(state_vector_rows=0 if write == "replace_by_vectors" else 1_000_000)
    merge = getattr(ViewState, write)
    # Only passes when two writes of one batch run at the same time (a BrokenBarrierError
    # fails the run after the timeout if they run one after the other).
    meet = threading.Barrier(2, timeout=20)
    events: list[tuple[str, str]] = []
    failing: set[str] = set()

    def spied(self, table, *args):
        if table.name != "main":
            meet.wait()  # the two bags of each batch
        if table.name in failing:
            events.append(("failed", table.name))
            raise StorageError(f"{table.name}: the disk is full")
        try:
            return merge(self, table, *args)
        finally:
            events.append(("merged", table.name))

    monkeypatch.setattr(ViewState, write, spied)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000, config=config)
    bags = sorted(t.name for t in compiled.plans[0].top.main_tables if t.name != "main")
    assert len(bags) == 2, bags
    for seq in range(2):  # the first batch is appended to the empty tables: no vectors
        _land(landing, seq)
        (applied,) = pipeline.run().applied
        _check(warehouse, compiled, seq)
        # a write beside the caller counts in a view's MERGE time as long as it was waited for
        assert sum(m.h_s + m.merge_s + m.answer_s for m in applied.views) <= applied.total_s
    assert {name for _, name in events} == {"main", *bags}

    events.clear()
    failing.add(bags[0])
    _land(landing, 2)
    with pytest.raises(StorageError, match="the disk is full"):
        pipeline.run()
    # The failure was raised once every write of the step had ended.
    assert sorted(events) == sorted([("merged", "main"), ("failed", bags[0]), ("merged", bags[1])])
    failing.clear()
    meet = threading.Barrier(1)  # the next run writes only the table left behind
    pipeline.run()
    _check(warehouse, compiled, 2)


def test_a_batchs_merge_seconds_hold_its_writes_on_one_driver_thread(spark, dirs, monkeypatch):
    """With one driver thread every state table's write runs on the caller's thread; each
    counts in the view's MERGE seconds (they went to no part of the batch before, and a
    bench showed them as time spent elsewhere)."""
    from incr.runtime.state import ViewState

    monkeypatch.setenv("INCR_DRIVER_THREADS", "1")
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES, name="shop")
    merge = ViewState.merge

    def slow(self, *args):  # a write that takes long enough to tell counted from lost
        time.sleep(0.05)
        return merge(self, *args)

    monkeypatch.setattr(ViewState, "merge", slow)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000)
    for seq in range(2):  # the first batch is appended to the empty tables: no MERGE
        _land(landing, seq)
        (applied,) = pipeline.run().applied
        _check(warehouse, compiled, seq)
    (folded,) = [m for m in applied.views if m.tables]
    assert len(folded.tables) == 3, folded.tables  # main and the two bags, each merged
    assert folded.merge_s >= sum(t["merge_s"] for t in folded.tables.values()) >= 0.15
    assert sum(m.h_s + m.merge_s + m.answer_s for m in applied.views) <= applied.total_s


def test_per_view_tasks_fold_the_shared_state_once(spark, dirs):
    """Airflow's view tasks: each view applies under its shared state's lock, in its own
    process; the second finds the batch folded and only publishes."""
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES, name="shop")
    for seq in range(3):
        _land(landing, seq)
        ready = Pipeline(compiled, landing, warehouse, spark=spark).prepare().ready_through
        first = Pipeline(compiled, landing, warehouse, spark=spark).apply_view("extremes", ready)
        second = Pipeline(compiled, landing, warehouse, spark=spark).apply_view("totals", ready)
        assert [m.engine for m in first] == ["driver"]
        # Folded already: a(state) only, at once from the state for the view's first answer,
        # then by the groups the other task's fold touched (logged beside the state).
        assert [(m.engine, m.answer_mode) for m in second] == \
            ([("shared", "change")] if seq else [])
        _check(warehouse, compiled, seq)


def test_a_task_behind_its_shared_state_publishes_the_logged_changes(spark, dirs):
    """A view's task that runs after the other view's tasks of several batches (each its
    own process) publishes the groups all those folds touched by change, and rewrites its
    answer, as exact, when a fold's touched groups are not in the log."""
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES, name="shop")

    def task(view: str, ready: int):
        return Pipeline(compiled, landing, warehouse, spark=spark).apply_view(view, ready)

    def prepared(seqs: range) -> int:
        for seq in seqs:
            _land(landing, seq)
        return Pipeline(compiled, landing, warehouse, spark=spark).prepare().ready_through

    ready = prepared(range(1))
    task("extremes", ready), task("totals", ready)
    for seq in (1, 2, 3):  # totals's tasks are late: extremes folds three batches alone
        task("extremes", prepared(range(seq, seq + 1)))
    late = task("totals", 3)
    assert [(m.batch, m.engine, m.answer_mode) for m in late] == \
        [(1, "", "ahead"), (2, "", "ahead"), (3, "shared", "change")]
    _check(warehouse, compiled, 3)

    task("extremes", prepared(range(4, 5)))
    log = next((warehouse / "state").glob("_shared_shop.*/*/.touched"))
    (log / f"{4:012d}.arrow").unlink()  # as if the folding task died before writing it
    assert [m.answer_mode for m in task("totals", 4)] == ["rewrite"]
    _check(warehouse, compiled, 4)


#: A WHERE on its GROUP BY key and aggregates ``totals`` and ``extremes`` keep: its groups
#: of the shared state, the state unchanged.
NOT_B = ("CREATE VIEW not_b AS SELECT k, SUM(v) AS s, MAX(x) AS top FROM t WHERE k <> 'b' "
         "GROUP BY k HAVING COUNT(*) > 1;\n")


@pytest.mark.parametrize("added", [AVERAGE, NOT_B], ids=["average", "a WHERE on its key"])
def test_a_view_added_to_a_shared_state_publishes_from_it(spark, dirs, added):
    landing, warehouse = dirs
    before = compile_text(TABLE + TOTALS + EXTREMES, name="shop")
    _run_batches(before, dirs, spark, range(3))
    # ``average`` needs a sum and a count of v, which the shared state keeps already; so
    # does ``not_b`` the sum, the row count and the bag of x, for its groups.
    after = compile_text(TABLE + TOTALS + EXTREMES + added, name="shop")
    assert after.plan("totals").state_fingerprint == before.plan("totals").state_fingerprint
    report = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000).run()
    assert report.applied == []  # no batch read again: a(state) at batch 2
    _check(warehouse, after, 2)
    _run_batches(after, dirs, spark, range(3, 4), check=True)


def test_sharing_switched_on_keeps_served_views_apart_until_a_refresh(spark, dirs):
    """Switching sharing on rebuilds nothing a reader is served from: the views keep their
    own states (and fold each batch into them) until a refresh builds the shared state
    beside them; switched off, each view rebuilds its own and the shared one goes."""
    landing, warehouse = dirs
    views = TOTALS + EXTREMES
    off = compile_text("-- incr: share = off\n" + TABLE + views, name="shop")
    on = compile_text(TABLE + views, name="shop")
    _run_batches(off, dirs, spark, range(2))
    assert _states(warehouse) == {"totals", "extremes"}
    _land(landing, 2)
    report = Pipeline(on, landing, warehouse, spark=spark, local_rows=1000).run()
    assert {m.answer_mode for m in report.applied[0].views} != {"building"}  # folded, not rebuilt
    _check(warehouse, on, 2)
    assert _states(warehouse) == {"totals", "extremes"}

    pipeline = Pipeline(on, landing, warehouse, spark=spark, local_rows=1000)
    assert not pipeline.compiled.shares  # kept apart: each serves from its own state
    pipeline.refresh("extremes")  # regroups them: the shared state is built beside
    assert pipeline.compiled.shares == on.shares
    _land(landing, 3)
    report = pipeline.run()
    assert [m.answer_mode for b in report.applied for m in b.views if m.view == "totals"] == \
        ["building"] * 3 + ["rewrite"]
    _check(warehouse, on, 3)
    assert _states(warehouse) == {on.shares[0].owner}  # each view's own state is gone

    _land(landing, 4)
    Pipeline(off, landing, warehouse, spark=spark, local_rows=1000).run()
    _check(warehouse, off, 4)
    assert _states(warehouse) == {"totals", "extremes"}  # and the shared one, once unread


def test_a_view_with_new_aggregates_shares_nothing_with_served_views_until_a_refresh(spark, dirs):
    """A view added beside views sharing a state, needing aggregates it does not keep,
    does not make them rebuild: they go on from their state, the new view builds its own;
    a refresh of any of them builds one state for all three, and the others are removed."""
    landing, warehouse = dirs
    before = compile_text(TABLE + TOTALS + EXTREMES, name="shop")
    _run_batches(before, dirs, spark, range(2))
    more = ("CREATE VIEW spread AS SELECT k, SUM(x) AS sx, STDDEV_POP(x) AS sd FROM t GROUP BY k;\n"
            "CREATE VIEW widest AS SELECT k, MAX(x) - MIN(x) AS w FROM t GROUP BY k;\n")
    after = compile_text(TABLE + TOTALS + EXTREMES + more, name="shop")
    owner = after.shares[0].owner
    assert owner == before.shares[0].owner
    assert after.plan("totals").state_fingerprint != before.plan("totals").state_fingerprint
    _land(landing, 2)
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000)
    settled = pipeline.compiled
    assert [s.views for s in settled.shares] == [("totals", "extremes"), ("spread", "widest")]
    assert settled.plan("totals").state_fingerprint == before.plan("totals").state_fingerprint
    new_owner = settled.plan("spread").state_owner
    assert new_owner.startswith(f"{owner}-")
    report = pipeline.run()
    modes = {m.view: m.answer_mode for m in report.applied[-1].views}
    assert modes["totals"] != "building" and modes["extremes"] != "building"
    _check(warehouse, after, 2)
    assert _states(warehouse) == {owner, new_owner}
    generations = {p.name for p in (warehouse / "state" / owner).iterdir()}
    assert generations == {before.plan("totals").state_fingerprint}  # kept, not rebuilt
    # The next run plans the same: the new views now serve from their own shared state.
    again = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000)
    assert again.compiled.shares == settled.shares

    Pipeline(after, landing, warehouse, spark=spark, local_rows=1000).refresh("spread")
    _land(landing, 3)
    Pipeline(after, landing, warehouse, spark=spark, local_rows=1000).run()
    _check(warehouse, after, 3)
    assert _states(warehouse) == {owner}
    generations = {p.name for p in (warehouse / "state" / owner).iterdir()}
    assert generations == {f"{after.plan('totals').state_fingerprint}.r1"}


def test_views_removed_from_a_shared_state_leave_the_others_as_they_are(spark, dirs):
    """A view leaving the program does not make the views it shared with rebuild: they
    keep the state (still holding its aggregates) down to the last of them, until a
    refresh regroups them into a state of their own aggregates."""
    landing, warehouse = dirs
    before = compile_text(TABLE + TOTALS + EXTREMES + AVERAGE, name="shop")
    (share,) = before.shares
    _run_batches(before, dirs, spark, range(2))
    generation = before.plan("totals").state_fingerprint
    assert _states(warehouse) == {share.owner}

    # ``extremes`` goes: its MAX(x) and MIN(v) are in no other view, so the state the share
    # pass plans for the others holds less, and would be built from batch 0.
    fewer = compile_text(TABLE + TOTALS + AVERAGE, name="shop")
    assert fewer.plan("totals").state_fingerprint != generation
    _land(landing, 2)
    pipeline = Pipeline(fewer, landing, warehouse, spark=spark, local_rows=1000)
    (kept,) = pipeline.compiled.shares
    assert (kept.owner, kept.views, kept.retained) == (share.owner, ("totals", "average"),
                                                       ("extremes",))
    assert pipeline.compiled.plan("average").state_fingerprint == generation
    report = pipeline.run()
    assert {m.view: m.answer_mode for m in report.applied[-1].views} == {
        "totals": "change", "average": "change"}
    _check(warehouse, fewer, 2)
    assert {p.name for p in (warehouse / "state" / share.owner).iterdir()} == {generation}

    # Down to one view: it keeps the shared state alone.
    alone = compile_text(TABLE + TOTALS, name="shop")
    assert not alone.shares
    _land(landing, 3)
    pipeline = Pipeline(alone, landing, warehouse, spark=spark, local_rows=1000)
    (kept,) = pipeline.compiled.shares
    assert (kept.views, kept.retained) == (("totals",), ("extremes", "average"))
    assert "still holds the aggregates of extremes, average" in explain_program(pipeline.compiled)
    report = pipeline.run()
    assert [m.answer_mode for m in report.applied[-1].views] == ["change"]
    _check(warehouse, alone, 3)
    assert _states(warehouse) == {share.owner}

    # A refresh builds the view's own state beside; once it serves from it, the shared one goes.
    pipeline.refresh("totals")
    assert not pipeline.compiled.shares
    _land(landing, 4)
    report = pipeline.run()
    assert [m.answer_mode for b in report.applied for m in b.views] == ["building"] * 4 + \
        ["rewrite"]
    _check(warehouse, alone, 4)
    assert _states(warehouse) == {"totals"}
    assert not Pipeline(alone, landing, warehouse, spark=spark, local_rows=1000).compiled.shares


def test_a_view_removed_from_a_shared_join_leaves_its_columns_in_the_side_tables(spark, dirs):
    """Over a join the shared state's side tables keep the columns every view read: after
    a view leaves, the others keep them (and fold them) as they were."""
    landing, warehouse = dirs
    tables = ("-- incr: buckets = 2\nCREATE TABLE a (k BIGINT, g VARCHAR, x DOUBLE);\n"
              "CREATE TABLE b (k BIGINT, v BIGINT, h VARCHAR);\n")
    p = "CREATE VIEW p AS SELECT g, SUM(v) AS s FROM a JOIN b ON a.k = b.k GROUP BY g;\n"
    q = ("CREATE VIEW q AS SELECT g, MAX(x) AS top, COUNT(DISTINCT h) AS hs "
         "FROM a JOIN b ON a.k = b.k GROUP BY g;\n")
    schemas = {"a": pa.schema([("k", pa.int64()), ("g", pa.string()), ("x", pa.float64())]),
               "b": pa.schema([("k", pa.int64()), ("v", pa.int64()), ("h", pa.string())])}
    batches = [("a", False, [(1, "u", 0.5), (2, "w", 1.5), (3, "u", 2.0)]),
               ("b", False, [(1, 4, "m"), (2, 5, "n"), (3, 6, "m"), (1, 7, "o")]),
               ("a", False, [(4, "w", 3.0), (1, "w", 9.0)]),
               ("b", True, [(1, 4, "m")]),
               ("b", False, [(4, 2, "n"), (2, 1, "p")]),
               ("a", True, [(2, "w", 1.5)])]
    live: dict[str, list[tuple]] = {"a": [], "b": []}

    def step(compiled: CompiledProgram, seq: int) -> None:
        _joined_step(landing, warehouse,
                     Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000).run,
                     compiled, schemas, live, seq, batches[seq])

    both = compile_text(tables + p + q, name="shop")
    (share,) = both.shares
    for seq in range(3):
        step(both, seq)
    sides = {t.side_of: t.key_columns for t in both.plan("p").tables if t.side_of is not None}
    assert sides == {"a": ("a__k", "a__g", "a__x"), "b": ("b__k", "b__v", "b__h")}  # x, h: q's

    only_p = compile_text(tables + p, name="shop")
    pipeline = Pipeline(only_p, landing, warehouse, spark=spark, local_rows=1000)
    assert pipeline.compiled.plan("p").tables == both.plan("p").tables
    assert [(s.owner, s.retained) for s in pipeline.compiled.shares] == [(share.owner, ("q",))]
    for seq in range(3, len(batches)):
        step(only_p, seq)
    assert _states(warehouse) == {share.owner}
    assert {g.name for g in (warehouse / "state" / share.owner).iterdir()} == {
        both.plan("p").state_fingerprint}


def test_tasks_of_views_sharing_a_folded_state_publish_at_once_reading_no_batch(
        spark, dirs, monkeypatch):
    """Once a view's task folded the shared state, the other views' tasks hold its lock
    shared: they publish at the same time (each under its answer's own lock), read no
    batch, and a fold waits for them."""
    landing, warehouse = dirs
    compiled = compile_text(TABLE + TOTALS + EXTREMES + AVERAGE, name="shop")
    # a task blocked by another fails at once; answers by change however small the state
    config = Settings(shared_wait_s=0.0, answer_rewrite_rows=0)

    def fresh() -> Pipeline:
        return Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000, config=config)

    _land(landing, 0)
    fresh().run()
    _land(landing, 1)
    through = fresh().prepare().ready_through
    fresh().apply_view("totals", through)  # folds batch 1

    loads: list[str] = []
    load = pipeline_module.Pipeline._load

    def spied_load(self, batch, progress):
        loads.append(str(batch))
        return load(self, batch, progress)

    monkeypatch.setattr(pipeline_module.Pipeline, "_load", spied_load)
    inside, release = threading.Event(), threading.Event()
    publish = AnswerTable.publish

    def paused(self, *args, **kwargs):
        if self.plan.view == "extremes":
            inside.set()
            assert release.wait(300)
        return publish(self, *args, **kwargs)

    monkeypatch.setattr(AnswerTable, "publish", paused)
    done: dict[str, list] = {}
    worker = threading.Thread(target=lambda: done.update(
        extremes=fresh().apply_view("extremes", through)))
    worker.start()
    try:
        assert inside.wait(300)  # extremes publishes, holding the state's lock shared ...
        (m,) = fresh().apply_view("average", through)  # ... while average publishes too
        assert (m.batch, m.engine, m.answer_mode) == (1, "shared", "change")
        _land(landing, 2)  # ... and a fold of the next batch must wait for them
        with pytest.raises(StorageError, match="is being updated by pid"):
            fresh().run()
    finally:
        release.set()
        worker.join(300)
    assert [(m.batch, m.answer_mode) for m in done["extremes"]] == [(1, "top")]
    assert loads == []  # neither read the batch
    _check(warehouse, compiled, 1)
    monkeypatch.undo()
    fresh().run()
    _check(warehouse, compiled, 2)


ROLLUP = "-- incr: share = rollup\n"
#: The finest grouping: the state the coarser views below are answered from.
BY_KP = ("CREATE VIEW by_kp AS SELECT k, v % 2 AS p, SUM(v) AS s, MAX(x) AS top FROM t "
         "GROUP BY k, v % 2;\n")
#: Coarser (BRR); its MIN, MAX and COUNT(DISTINCT) keep bags the regrouping sums by value.
BY_K = ("CREATE VIEW by_k AS SELECT k, AVG(v) AS mean, MIN(x) AS low, COUNT(DISTINCT v) AS dv "
        "FROM t GROUP BY k HAVING COUNT(*) > 1;\n")
#: Coarser by the other key (with by_k, CMORR), ranked.
BY_P = ("CREATE VIEW by_p AS SELECT v % 2 AS p, MAX(x) AS top, SUM(v) AS s FROM t "
        "GROUP BY v % 2 ORDER BY top DESC LIMIT 1;\n")


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_coarser_views_are_answered_from_a_finer_state(spark, dirs, local_rows):
    """share = rollup: views grouped by some of another view's keys are answered from its
    state, regrouped (BRR, and CMORR for two such groupings): one state, one fold per batch,
    every answer equal to DuckDB's after every batch, deletions included."""
    landing, warehouse = dirs
    compiled = compile_text(ROLLUP + TABLE + BY_KP + BY_K + BY_P, name="shop")
    (share,) = compiled.shares
    assert share.views == ("by_kp", "by_k", "by_p")
    assert [v for v, _ in share.rolled] == ["by_k", "by_p"]
    text = explain_program(compiled)
    assert "BRR" in text and "CMORR" in text and "regrouped" in text
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    for seq in range(len(BATCHES)):
        _land(landing, seq)
        (applied,) = pipeline.run().applied
        modes = {m.view: m.answer_mode for m in applied.views}
        assert modes["by_p"] == "rewrite", modes
        if seq and local_rows:
            assert modes["by_kp"] == "change", modes
        _check(warehouse, compiled, seq)
    assert _states(warehouse) == {share.owner}
    off = compile_text(TABLE + BY_KP + BY_K + BY_P, name="shop")
    assert not off.shares and "share = rollup" in explain_program(off)



@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_coarser_views_declared_before_the_finer_one_are_answered_from_its_state(
        spark, dirs, local_rows):
    """The same views with the coarser ones first: the first view to run creates the shared
    state, working out its tables over no rows and the view's output over them, which for a
    regrouped view regroups the state (``v % 2`` is ``key1`` there, ``key0`` in the view's
    answer).  Spark refused that query before, on the answer's name: every run failed.  Now
    every answer equals DuckDB's after every batch."""
    landing, warehouse = dirs
    compiled = compile_text(ROLLUP + TABLE + BY_P + BY_K + BY_KP, name="shop")
    (share,) = compiled.shares
    assert sorted(v for v, _ in share.rolled) == ["by_k", "by_p"]
    for seq in range(len(BATCHES)):
        _land(landing, seq)
        Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows).run()
        _check(warehouse, compiled, seq)
    assert _states(warehouse) == {share.owner}


#: Aggregates of the key by_k leaves out (v % 2, a θ column of by_kp's state): their bags
#: are the state's groups, no table of their own.
OF_P = ("CREATE VIEW of_p AS SELECT k, COUNT(DISTINCT v % 2) AS parities, MIN(v % 2) AS lo, "
        "VAR_POP(v % 2) AS spread FROM t GROUP BY k;\n")


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_a_bag_of_a_key_of_the_finer_state_is_read_from_its_groups(spark, dirs, local_rows):
    """COUNT(DISTINCT), MIN and a variance of a column the shared state is grouped by read
    its live groups: the state keeps no bag for them (one MERGE fewer per batch), and the
    answers equal DuckDB's after every batch, a delete that takes a group's last row of one
    parity included (after batch 2, b keeps one parity of two)."""
    landing, warehouse = dirs
    compiled = compile_text(ROLLUP + TABLE + BY_KP + OF_P, name="shop")
    (share,) = compiled.shares
    assert share.views == ("by_kp", "of_p")
    plan = compiled.plan("of_p")
    (bag,) = plan.answer.bags
    assert bag.value_of is not None and bag.table == plan.answer.main
    tables = {t.name for t in plan.main_tables}
    assert len(tables) == 2  # main and by_kp's bag of x (its MAX): none of v % 2
    assert all(t.value_key is None or t.value_key.expr.sql == "x" for t in plan.main_tables)
    assert "bags of θ's own columns (no table)" in explain_program(compiled)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    for seq in range(len(BATCHES)):
        _land(landing, seq)
        pipeline.run()
        _check(warehouse, compiled, seq)
    answer, _ = read_answer(warehouse, plan)
    assert answer.sort_by("k").column("parities").to_pylist() == [2, 2, 2, 1, 1]
    # A group whose key is NULL holds no value: its rows count for no variance.
    nulls = [("a", None, 1.0), ("a", None, 2.0), ("f", None, 3.0)]
    pq.write_table(pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in nulls], schema=SCHEMA),
                   landing / "t" / f"{len(BATCHES):04d}.parquet")
    pipeline.run()
    live = pa.concat_tables([_live(len(BATCHES) - 1), pa.Table.from_pylist(
        [dict(zip(SCHEMA.names, r)) for r in nulls], schema=SCHEMA)])
    for p in compiled.plans:
        answer, _ = read_answer(warehouse, p)
        assert diff_answers(oracle_answer(p.select, {"t": live}), answer, ordered=p.ordered) is None
    (state,) = (warehouse / "state" / share.owner).iterdir()
    assert {p.name for p in state.iterdir() if not p.name.startswith(".")} == tables


def test_a_regrouped_answer_follows_by_change_while_a_batch_touches_few_of_its_groups(
        spark, dirs):
    """A view regrouped from a finer state MERGEs the answer rows of the coarse groups a
    batch touched, recomputed from their rows of that state (in every bucket), while they
    are at most ``INCR_ANSWER_MERGE_REACH`` of its rows; a batch touching more rewrites
    it.  MIN and COUNT(DISTINCT) stay exact when a delete takes a group's minimum."""
    landing, warehouse = dirs
    per_k = ("CREATE VIEW per_k AS SELECT k, MIN(x) AS low, COUNT(DISTINCT v) AS dv, "
             "SUM(v) AS s FROM t GROUP BY k;\n")
    compiled = compile_text(ROLLUP + TABLE + BY_KP + per_k, name="shop")
    (share,) = compiled.shares
    assert share.views == ("by_kp", "per_k") and compiled.plan("per_k").publish.by_change
    assert "regrouped: each batch MERGEs" in explain_program(compiled)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000)
    reports = []
    live: dict[str, list[tuple]] = {"t": []}
    ten = [(f"k{i}", v, float(i + v)) for i in range(10) for v in (0, 1)]
    steps = [
        (ten, "rewrite", 10),  # the first answer
        ([("k3", 5, 0.5)], "change", 1),  # 1 of 10 groups
        ([("k3", 5, 0.5), ("k5", 0, 5.0)], "change", 2),  # their minimums deleted
        ([(f"k{i}", 7, 1.0) for i in range(8)], "rewrite", 10),  # 8 of 10
    ]
    for seq, (rows, mode, written) in enumerate(steps):
        delete = seq == 2
        _joined_step(landing, warehouse, lambda: reports.append(pipeline.run()), compiled,
                     {"t": SCHEMA}, live, seq, ("t", delete, rows))
        (applied,) = reports[-1].applied
        (m,) = [m for m in applied.views if m.view == "per_k"]
        assert (m.answer_mode, m.answer_rows) == (mode, written), (seq, m)


#: Coarser, each with a WHERE on by_kp's keys only: it keeps whole groups of by_kp's state.
ODD_K = ("CREATE VIEW odd_k AS SELECT k, SUM(v) AS s, MAX(x) AS top, COUNT(*) AS n FROM t "
         "WHERE v % 2 = 1 GROUP BY k;\n")
NOT_A = "CREATE VIEW not_a AS SELECT v % 2 AS p, SUM(v) AS s FROM t WHERE k <> 'a' GROUP BY v % 2;\n"


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_coarser_views_whose_where_reads_the_finer_keys_regroup_the_rows_it_keeps(
        spark, dirs, local_rows):
    """A view answered from a finer state whose WHERE reads only that state's keys keeps
    whole finer groups: it regroups the state's rows its WHERE keeps and adds nothing to
    the state, so added to a running program it publishes from the state at once.  Its
    answers equal DuckDB's after every batch, a delete that takes a group's last row its
    WHERE keeps (b's odd v, batch 2) included."""
    landing, warehouse = dirs
    before = compile_text(ROLLUP + TABLE + BY_KP + BY_K, name="shop")
    _run_batches(before, dirs, spark, range(3), local_rows)
    after = compile_text(ROLLUP + TABLE + BY_KP + BY_K + ODD_K + NOT_A, name="shop")
    (share,) = after.shares
    assert share.sifted == ("odd_k", "not_a") and not share.keyed
    assert after.plan("odd_k").state_fingerprint == before.plan("by_kp").state_fingerprint
    rollup = after.plan("odd_k").answer.rollup
    assert rollup is not None and rollup.where is not None
    assert "only the rows of it their WHERE keeps, regrouped" in explain_program(after)
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=local_rows)
    assert pipeline.run().applied == []  # a(state) at batch 2, of the rows each WHERE keeps
    _check(warehouse, after, 2)
    answer, _ = read_answer(warehouse, after.plan("odd_k"))
    assert "b" not in answer.column("k").to_pylist()
    _run_batches(after, dirs, spark, range(3, len(BATCHES)), local_rows, check=True)
    assert _states(warehouse) == {share.owner}


#: A WHERE reading x (not one of by_kp's keys): its aggregates restricted to its rows.
BIG_X = ("CREATE VIEW big_x AS SELECT k, v % 2 AS p, SUM(v) AS s, COUNT(*) AS n, MIN(v) AS low, "
         "MAX(x) AS top FROM t WHERE x > 1 GROUP BY k, v % 2;\n")
#: The same WHERE ANDed with conjuncts on the keys: of by_kp's grouping (a HAVING on k) and
#: coarser (the finer groups of odd v kept, then regrouped by k).
KEPT_BIG_X = ("CREATE VIEW kept_big_x AS SELECT k, v % 2 AS p, COUNT(*) AS n, MIN(v) AS low "
              "FROM t WHERE k <> 'a' AND x > 1 GROUP BY k, v % 2;\n")
ODD_BIG_X = ("CREATE VIEW odd_big_x AS SELECT k, SUM(v) AS s, MAX(x) AS top FROM t "
             "WHERE v % 2 = 1 AND (x > 1) GROUP BY k;\n")


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_a_where_s_conjuncts_on_the_state_s_keys_add_nothing_to_it(spark, dirs, local_rows):
    """Of a WHERE ANDing conjuncts on the state's keys with others, only the others restrict
    the view's aggregates (CASE WHEN); those on the keys keep whole groups of the state (a
    HAVING on its keys, or its finer groups kept before they are regrouped).  Views whose
    other conjuncts are another view's WHERE then add nothing to the state: added to a
    running program, they publish from it at once.  Their answers equal DuckDB's after
    every batch, a delete of a kept row (b, 5, 2.0 in batch 2) included."""
    landing, warehouse = dirs
    before = compile_text(ROLLUP + TABLE + BY_KP + BIG_X, name="shop")
    _run_batches(before, dirs, spark, range(3), local_rows)
    after = compile_text(ROLLUP + TABLE + BY_KP + BIG_X + KEPT_BIG_X + ODD_BIG_X, name="shop")
    (share,) = after.shares
    assert (share.keyed, share.sifted) == (("kept_big_x",), ("odd_big_x",))
    assert share.parted == (("kept_big_x", "x > 1"), ("odd_big_x", "x > 1"))
    assert after.plan("odd_big_x").state_fingerprint == before.plan("by_kp").state_fingerprint
    explained = explain_program(after)
    assert "kept_big_x (WHERE k <> 'a' AND x > 1) reads it restricted to the rows of x > 1" \
        in explained
    assert "only the rows of it the rest of its WHERE keeps, regrouped" in explained
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=local_rows)
    assert pipeline.run().applied == []  # a(state) at batch 2, from the state's aggregates
    _check(warehouse, after, 2)
    _run_batches(after, dirs, spark, range(3, len(BATCHES)), local_rows, check=True)
    assert _states(warehouse) == {share.owner}


#: Views that all have a WHERE, ANDing conjuncts on k with x > 1: the state reads x > 1.
WEST = ("CREATE VIEW west AS SELECT k, SUM(v) AS s, MAX(x) AS top FROM t "
        "WHERE k IN ('a', 'b') AND x > 1 GROUP BY k;\n")
EAST = ("CREATE VIEW east AS SELECT k, COUNT(*) AS n, MIN(v) AS low FROM t "
        "WHERE x > 1 AND k = 'c' GROUP BY k;\n")
NORTH = ("CREATE VIEW north AS SELECT k, SUM(v) AS s, COUNT(*) AS n FROM t "
         "WHERE k <> 'a' AND (x > 1) GROUP BY k;\n")
BIG = "CREATE VIEW big AS SELECT k, MAX(x) AS top, MIN(v) AS low FROM t WHERE x > 1 GROUP BY k;\n"


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_views_whose_wheres_differ_by_conjuncts_on_the_keys_keep_the_state_s_where(
        spark, dirs, local_rows):
    """A state whose views all have a WHERE reads the rows of their conjuncts off the keys
    (ORed when they differ): views ANDing other conjuncts on k with the same x > 1 read its
    aggregates unrestricted, by a HAVING on k.  Another such view, or one of x > 1 alone,
    added to the running program adds nothing to the state and publishes from it at once
    (ORing the whole WHEREs would have changed the state's WHERE: the views added would have
    built a state of their own from every batch).  Every answer equals DuckDB's after every
    batch, a delete of a kept row (b, 5, 2.0 in batch 2) and of a row no view keeps (a, 1,
    0.5) included."""
    landing, warehouse = dirs
    before = compile_text(TABLE + WEST + EAST, name="shop")
    (share,) = before.shares
    assert share.where == "x > 1" and share.parted == (("west", "x > 1"), ("east", "x > 1"))
    assert "west (WHERE k IN ('a', 'b') AND x > 1) reads its aggregates unrestricted" \
        in explain_program(before)
    _run_batches(before, dirs, spark, range(3), local_rows, check=True)
    after = compile_text(TABLE + WEST + EAST + NORTH + BIG, name="shop")
    (share,) = after.shares
    assert share.where == "x > 1" and share.keyed == ("west", "east", "north")
    assert {p.state_fingerprint for p in after.plans} == {before.plan("west").state_fingerprint}
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=local_rows)
    assert pipeline.run().applied == []  # a(state) at batch 2, from the state as it is
    _check(warehouse, after, 2)
    _run_batches(after, dirs, spark, range(3, len(BATCHES)), local_rows, check=True)
    assert _states(warehouse) == {share.owner}


DAYS = "-- incr: buckets = 2\nCREATE TABLE s (day DATE, k VARCHAR, v BIGINT);\n"
DAILY = "CREATE VIEW daily AS SELECT day, k, SUM(v) AS s, COUNT(*) AS n FROM s GROUP BY day, k;\n"
#: Grouped by functions of daily's keys (seed 003's lineage-key algebra: a day falls in one
#: month, a name in one initial), with bags its MAX and COUNT(DISTINCT) regroup by value.
MONTHLY = ("CREATE VIEW monthly AS SELECT year(day) AS y, month(day) AS m, SUM(v) AS s, "
           "MAX(v) AS top, COUNT(DISTINCT k) AS names FROM s GROUP BY year(day), month(day);\n")
INITIALS = ("CREATE VIEW initials AS SELECT substr(k, 1, 1) AS i, day, MIN(v) AS low FROM s "
            "GROUP BY substr(k, 1, 1), day;\n")


@pytest.mark.parametrize("local_rows", [1000, 0], ids=["driver", "spark"])
def test_views_grouped_by_functions_of_the_finer_keys_are_answered_from_its_state(
        spark, dirs, local_rows):
    """share = rollup: a view grouped by a function of another view's keys (months of its
    days, initials of its names) is answered from that view's state, regrouped by the
    function's values: one state, one fold per batch.  A batch touching one month MERGEs
    that month's answer row alone (one touching most months rewrites it), and every
    answer equals DuckDB's after every batch, a delete that takes a month's maximum and a
    name's last row included."""
    landing, warehouse = dirs
    compiled = compile_text(ROLLUP + DAYS + DAILY + MONTHLY + INITIALS, name="shop")
    (share,) = compiled.shares
    assert share.views == ("daily", "monthly", "initials")
    assert [v for v, _ in share.rolled] == ["monthly", "initials"]
    rollup = compiled.plan("monthly").answer.rollup
    assert rollup is not None and not rollup.keys and len(rollup.derived) == 2
    assert compiled.plan("monthly").publish.by_change
    assert "monthly (GROUP BY YEAR(day), MONTH(day))" in explain_program(compiled)
    off = compile_text(DAYS + DAILY + MONTHLY, name="shop")
    assert "daily's state groups by what its GROUP BY is computed from" in explain_program(off)
    schema = pa.schema([("day", pa.date32()), ("k", pa.string()), ("v", pa.int64())])
    jan, feb, mar = (dt.date(2026, m, d) for m, d in ((1, 5), (2, 9), (3, 1)))
    steps = [
        ([(jan, "ann", 4), (jan, "bob", 7), (feb, "ann", 2), (mar, "cid", 9), (feb, "al", 1)],
         "rewrite"),
        ([(feb, "bea", 5), (feb, "ann", 8)], "change"),  # February alone: 1 of 3 months
        ([(feb, "ann", 8), (feb, "al", 1)], "change"),  # its maximum and a name's last row
        # three months (one new) of three: rewritten
        ([(jan, "ann", 1), (mar, "dan", 3), (dt.date(2027, 1, 2), "eve", 6)], "rewrite"),
    ]
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    reports: list = []
    live: dict[str, list[tuple]] = {"s": []}
    for seq, (rows, mode) in enumerate(steps):
        _joined_step(landing, warehouse, lambda: reports.append(pipeline.run()), compiled,
                     {"s": schema}, live, seq, ("s", seq == 2, rows))
        (applied,) = reports[-1].applied
        modes = {m.view: m.answer_mode for m in applied.views}
        assert modes["monthly"] == mode, (seq, modes)
    answer, _ = read_answer(warehouse, compiled.plan("monthly"))
    assert answer.sort_by([("y", "ascending"), ("m", "ascending")]).to_pylist() == [
        {"y": 2026, "m": 1, "s": 12, "top": 7, "names": 2},
        {"y": 2026, "m": 2, "s": 7, "top": 5, "names": 2},
        {"y": 2026, "m": 3, "s": 12, "top": 9, "names": 2},
        {"y": 2027, "m": 1, "s": 6, "top": 6, "names": 1}]
    assert _states(warehouse) == {share.owner}


@pytest.mark.parametrize("vector_rows", [0, 4], ids=["scan", "vectors"])
def test_a_coarse_group_computed_from_the_keys_reads_only_its_finer_groups(
        spark, dirs, monkeypatch, vector_rows):
    """A month's rows of the daily state's MAX bag are found by the month's days, which
    ``main`` (a row per day and name) gives, not by ``month(day)`` (or ``date_trunc``) over
    the whole bag: with the bag larger than the driver holds and a month's rows not, a
    batch touching one month publishes the monthly views by change on the driver (before,
    the whole bag went to Spark), a delete of the month's maximum included, equal to DuckDB
    after every batch."""
    landing, warehouse = dirs
    truncated = ("CREATE VIEW months AS SELECT date_trunc('month', day) AS m, MAX(v) AS top "
                 "FROM s GROUP BY date_trunc('month', day);\n")
    compiled = compile_text(ROLLUP + DAYS + DAILY + MONTHLY + truncated, name="shop")
    assert compiled.plan("monthly").answer.rollup.derived
    assert compiled.plan("months").answer.rollup.derived
    # 12 months x 2 names: 24 groups in main; 5 values each: 120 rows in the MAX bag.
    config = Settings(local_state_rows=40, state_vector_rows=vector_rows, answer_rewrite_rows=0)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000, config=config)
    fell: list[tuple[str, str]] = []
    fell_back = pipeline.engines.fell_back

    def spy(step: str, subject: str, reason: str) -> None:
        fell.append((step, subject))
        fell_back(step, subject, reason)

    monkeypatch.setattr(pipeline.engines, "fell_back", spy)
    schema = pa.schema([("day", pa.date32()), ("k", pa.string()), ("v", pa.int64())])
    days = [dt.date(2026, m, 3) for m in range(1, 13)]
    every = [(d, k, 10 * m + 5 * i + v) for m, d in enumerate(days)
             for i, k in enumerate(("ann", "bob")) for v in range(5)]
    steps = [
        ("s", False, every),
        ("s", False, [(days[4], "ann", 99), (days[4], "cid", 1)]),  # May alone
        ("s", True, [(days[4], "ann", 99), (days[4], "bob", 49)]),  # May's two largest go
    ]
    reports: list = []
    live: dict[str, list[tuple]] = {"s": []}
    for seq, batch in enumerate(steps):
        fell.clear()
        _joined_step(landing, warehouse, lambda: reports.append(pipeline.run()), compiled,
                     {"s": schema}, live, seq, batch)
        if seq:
            (applied,) = reports[-1].applied
            modes = {m.view: m.answer_mode for m in applied.views}
            assert modes["monthly"] == modes["months"] == "change", modes
            assert not {("answer", "view monthly"), ("answer", "view months")} & set(fell), fell
    answer, _ = read_answer(warehouse, compiled.plan("monthly"))
    may = next(r for r in answer.to_pylist() if r["m"] == 5)
    assert (may["top"], may["names"]) == (48, 3)


def test_a_coarser_view_added_beside_a_finer_state_publishes_from_it(spark, dirs):
    """A view added to a running program, grouped by fewer keys and needing only what the
    finer state keeps, is answered from that state: no batch is read again.  (A view that
    keeps a state alone keeps it under its own name; like views of one grouping, a view
    added beside it shares only after a refresh.)"""
    landing, warehouse = dirs
    before = compile_text(ROLLUP + TABLE + BY_KP + BY_K, name="shop")
    _run_batches(before, dirs, spark, range(3))
    coarse = "CREATE VIEW totals AS SELECT k, SUM(v) AS s, MAX(x) AS top FROM t GROUP BY k;\n"
    after = compile_text(ROLLUP + TABLE + BY_KP + BY_K + coarse, name="shop")
    (share,) = after.shares
    assert after.plan("totals").state_fingerprint == after.plan("by_kp").state_fingerprint
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000)
    assert pipeline.compiled.plan("totals").shares == share.owner
    assert pipeline.run().applied == []  # a(state) at batch 2, regrouped
    _check(warehouse, after, 2)
    _run_batches(after, dirs, spark, range(3, 4), check=True)
    assert _states(warehouse) == {share.owner}


def test_the_finer_view_removed_leaves_the_coarser_ones_their_state(spark, dirs):
    """The view whose grouping keys the state leaves the program: the views regrouped
    from the state keep it (still keyed by the removed view's grouping) rather than rebuild."""
    landing, warehouse = dirs
    before = compile_text(ROLLUP + TABLE + BY_KP + BY_K + BY_P, name="shop")
    (share,) = before.shares
    _run_batches(before, dirs, spark, range(2))
    after = compile_text(ROLLUP + TABLE + BY_K + BY_P, name="shop")
    _land(landing, 2)
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000)
    (kept,) = pipeline.compiled.shares
    assert (kept.owner, kept.views, kept.retained) == (share.owner, ("by_k", "by_p"), ("by_kp",))
    (applied,) = pipeline.run().applied
    assert {m.answer_mode for m in applied.views} == {"rewrite"}  # 2 of 2 groups touched
    _check(warehouse, after, 2)
    assert _states(warehouse) == {share.owner}


JOINED = """-- incr: share = rollup
-- incr: buckets = 2
CREATE TABLE a (k BIGINT, g VARCHAR, x DOUBLE);
CREATE TABLE b (k BIGINT, v BIGINT);
CREATE VIEW fine AS SELECT g, b.k % 2 AS p, SUM(v) AS s, COUNT(DISTINCT x) AS dx
  FROM a JOIN b ON a.k = b.k GROUP BY g, b.k % 2;
CREATE VIEW coarse AS SELECT g, SUM(v) AS s, MAX(x) AS top, COUNT(*) AS n
  FROM a JOIN b ON a.k = b.k GROUP BY g HAVING COUNT(*) > 1;
"""
#: (table, delete?, rows) per batch: both sides move, deletes on each.
JOINED_BATCHES = [
    ("a", False, [(1, "p", 0.5), (2, "q", 1.5), (3, "p", 2.5), (4, "r", 0.5)]),
    ("b", False, [(1, 10), (2, 20), (2, 5), (3, 7), (4, 1), (4, 2)]),
    ("a", True, [(2, "q", 1.5)]),
    ("a", False, [(2, "p", 9.0), (5, "q", 3.0)]),
    ("b", True, [(4, 1), (1, 10)]),
    ("b", False, [(5, 3), (1, 4)]),
]


def _run_joined(spark, landing: Path, warehouse: Path, compiled: CompiledProgram) -> None:
    """Runs :data:`JOINED_BATCHES` through ``compiled`` (tables ``a`` and ``b``), every view
    checked against DuckDB after each."""
    schemas = {"a": pa.schema([("k", pa.int64()), ("g", pa.string()), ("x", pa.float64())]),
               "b": pa.schema([("k", pa.int64()), ("v", pa.int64())])}
    live: dict[str, list[tuple]] = {"a": [], "b": []}
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000)
    for seq, batch in enumerate(JOINED_BATCHES):
        _joined_step(landing, warehouse, pipeline.run, compiled, schemas, live, seq, batch)


def test_views_over_one_join_are_regrouped_from_its_finer_state(spark, dirs):
    """share = rollup over a join: the coarser view reads the finer view's state (and side
    tables are one pair), equal to DuckDB after every batch on either side."""
    landing, warehouse = dirs
    compiled = compile_text(JOINED, name="joined")
    (share,) = compiled.shares
    assert share.join and [v for v, _ in share.rolled] == ["coarse"]
    _run_joined(spark, landing, warehouse, compiled)
    assert _states(warehouse) == {share.owner}


def test_views_over_one_join_with_their_own_wheres_share_its_state(spark, dirs):
    """Views over one join with different WHEREs (on either side's columns) keep one state
    of the rows any of them reads, each restricted to its own: equal to DuckDB after every
    batch on either side, deletes included, a group with no row of a view's WHERE absent
    from its answer."""
    landing, warehouse = dirs
    compiled = compile_text("""-- incr: buckets = 2
CREATE TABLE a (k BIGINT, g VARCHAR, x DOUBLE);
CREATE TABLE b (k BIGINT, v BIGINT);
CREATE VIEW big AS SELECT g, SUM(v) AS s, COUNT(*) AS n FROM a JOIN b ON a.k = b.k
  WHERE v > 4 GROUP BY g;
CREATE VIEW cheap AS SELECT g, MAX(v) AS top, COUNT(DISTINCT b.k) AS ks FROM a JOIN b ON a.k = b.k
  WHERE x < 2 GROUP BY g HAVING COUNT(*) > 1;
CREATE VIEW odd AS SELECT g, MIN(x) AS lo FROM a JOIN b ON a.k = b.k WHERE v % 2 = 1 GROUP BY g;
""", name="joined")
    (share,) = compiled.shares
    assert share.join and share.views == ("big", "cheap", "odd")
    assert share.where == "a__x < 2 OR b__v % 2 = 1 OR b__v > 4"
    assert share.restricted == (("big", "b__v > 4"), ("cheap", "a__x < 2"),
                                ("odd", "b__v % 2 = 1"))
    _run_joined(spark, landing, warehouse, compiled)
    assert _states(warehouse) == {share.owner}


def test_a_coarser_view_added_beside_a_lone_view_shares_after_a_refresh(spark, dirs):
    """A view keeping a state alone keeps it under its own name: a coarser view added beside
    it builds its own (explain says why) until a refresh regroups the two into one state."""
    landing, warehouse = dirs
    before = compile_text(ROLLUP + TABLE + BY_KP, name="shop")
    _run_batches(before, dirs, spark, range(2))
    coarse = "CREATE VIEW totals AS SELECT k, SUM(v) AS s, MAX(x) AS top FROM t GROUP BY k;\n"
    after = compile_text(ROLLUP + TABLE + BY_KP + coarse, name="shop")
    pipeline = Pipeline(after, landing, warehouse, spark=spark, local_rows=1000)
    assert not pipeline.compiled.shares
    assert dict(pipeline.compiled.alone) == {
        "by_kp": "it keeps the state it is served from rather than rebuild it to share with "
                 "totals (a refresh of the views regroups them)",
        "totals": "it is new beside by_kp, which keeps the state it is served from (a refresh "
                  "of the views regroups them)"}
    pipeline.run()
    _check(warehouse, after, 1)
    pipeline.refresh("totals")
    (share,) = pipeline.compiled.shares
    assert share.views == ("by_kp", "totals") and [v for v, _ in share.rolled] == ["totals"]
    _land(landing, 2)
    pipeline.run()
    _check(warehouse, after, 2)
    _land(landing, 3)
    Pipeline(after, landing, warehouse, spark=spark, local_rows=1000).run()
    _check(warehouse, after, 3)
    assert _states(warehouse) == {share.owner}


def test_an_answer_smaller_than_its_state_is_computed_on_the_driver_from_its_files(
        spark, dirs, monkeypatch):
    """A regrouped view and a top-k view whose answers hold at most
    ``INCR_LOCAL_STATE_ROWS`` rows are rewritten on the driver from a state larger than
    that: DuckDB reads the state's files as the query runs (the rows its deletion vectors
    delete left out), where before each such answer was a Spark job.  Equal to DuckDB
    over the live rows after every batch, deletes included."""
    landing, warehouse = dirs
    fine = "CREATE VIEW by_kv AS SELECT k, v, SUM(x) AS s, COUNT(*) AS n FROM t GROUP BY k, v;\n"
    coarse = ("CREATE VIEW per_k AS SELECT k, SUM(v) AS total, MIN(x) AS low, COUNT(*) AS n "
              "FROM t GROUP BY k;\n")
    top = ("CREATE VIEW top_kv AS SELECT k, v, SUM(x) AS s FROM t GROUP BY k, v "
           "ORDER BY s DESC, k, v LIMIT 2;\n")
    compiled = compile_text(ROLLUP + TABLE + fine + coarse + top, name="shop")
    (share,) = compiled.shares
    assert set(share.views) == {"by_kv", "per_k", "top_kv"}
    # The state's 30 groups are more than the driver holds; the small answers are not.
    config = Settings(local_state_rows=12, state_vector_rows=4)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=1000, config=config)
    from_spark: list[str] = []
    write_from_spark = AnswerTable._write_from_spark

    def spy(self: AnswerTable, batch: int) -> int:
        from_spark.append(self.plan.view)
        return write_from_spark(self, batch)

    monkeypatch.setattr(AnswerTable, "_write_from_spark", spy)
    scans: list[tuple[str, bool]] = []  # (table, past deletion vectors), read from files
    scan = DriverEngine.scan

    def scanned(self: DriverEngine, name: str, path: Path) -> str:
        out = scan(self, name, path)
        if name in self._views:  # a DuckDB view over the files, not rows read whole
            scans.append((name, f"{name}__gone" in self._tables))
        return out

    monkeypatch.setattr(DriverEngine, "scan", scanned)
    live: dict[str, list[tuple]] = {"t": []}
    every = [(f"k{i}", v, float(v * 3 + i)) for i in range(3) for v in range(10)]
    steps = [
        ("t", False, every),
        ("t", False, [(f"k{i}", 4, 40.0 + i) for i in range(3)]),  # every coarse group
        ("t", True, [("k0", 0, 0.0), ("k1", 9, 28.0), ("k2", 9, 29.0), ("k2", 4, 42.0)]),
        ("t", False, [("k0", 11, 1.5), ("k1", 12, 0.5), ("k2", 3, 99.0)]),
    ]
    for seq, batch in enumerate(steps):
        from_spark.clear()
        _joined_step(landing, warehouse, pipeline.run, compiled, {"t": SCHEMA}, live, seq, batch)
        if seq:  # the first answers take Spark's types, from Spark
            assert "per_k" not in from_spark and "top_kv" not in from_spark, (seq, from_spark)
    assert {name.split("_state_")[0] for name, _ in scans} == {"incr_per_k", "incr_top_kv"}
    assert any(past for _, past in scans), "no answer read the state's files past its vectors"
