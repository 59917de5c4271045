"""Build, then swap: a changed or refreshed view rebuilds beside the one being served.

A BI reader keeps reading the view's answer table while its definition changes.  These
tests change views under such a reader and check what it sees at every step: the old
answer, whole and unchanged, until the new state has caught up; then the new answer in
one commit after the old versions; time travel still showing what was published at each
batch; the old state kept until the swap (so a change abandoned midway costs no rebuild
to go back), and removed after it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr import cli
from incr.compiler import CompiledProgram, compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.answer import STATE_KEY
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from incr.runtime.store import DeltaStore, commit_batches, trusted_commits
from incr.serving.snapshots import ProgramLayout, Snapshots

#: One view's rebuild is what these tests follow, so the two views keep their own states
#: (tests/runtime/test_share.py rebuilds and refreshes states that views share).
PROGRAM = """-- incr: buckets = 4
-- incr: share = off
CREATE TABLE t (k VARCHAR, v BIGINT);
CREATE VIEW totals AS SELECT k, SUM(v) AS s, COUNT(*) AS n FROM t GROUP BY k;
CREATE VIEW ranked AS SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY s DESC, k LIMIT 2;
"""
#: ``totals`` with a filter: a new state fingerprint, so a rebuild from batch 0.
CHANGED = PROGRAM.replace("FROM t GROUP BY k;", "FROM t WHERE v > 1 GROUP BY k;", 1)
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])

#: (delete?, rows) per batch: inserts, a delete, more inserts.
BATCHES = [
    (False, [{"k": "a", "v": 1}, {"k": "b", "v": 5}, {"k": "c", "v": 2}]),
    (False, [{"k": "a", "v": 4}, {"k": "d", "v": 7}]),
    (True, [{"k": "b", "v": 5}]),
    (False, [{"k": "b", "v": 3}, {"k": "e", "v": 1}]),
    (False, [{"k": "c", "v": 9}]),
    (False, [{"k": "a", "v": 2}, {"k": "f", "v": 6}]),
]


def _land(landing: Path, seq: int) -> None:
    delete, rows = BATCHES[seq]
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{seq:04d}.parquet")


def _live(through: int) -> pa.Table:
    live: list[dict] = []
    for delete, rows in BATCHES[:through + 1]:
        if delete:
            for row in rows:
                live.remove(row)
        else:
            live += rows
    return pa.Table.from_pylist(live, schema=SCHEMA)


def _check(warehouse: Path, compiled: CompiledProgram, view: str, through: int,
           batch: int | None = None) -> None:
    """The view's answer (as of ``batch``, or the latest) equals ``compiled``'s view over
    the data through ``through``."""
    plan = compiled.plan(view)
    answer, at = read_answer(warehouse, plan, batch)
    assert batch is None or at == batch
    assert diff_answers(oracle_answer(plan.select, {"t": _live(through)}), answer) is None, \
        (view, through, batch)


def _commits(warehouse: Path, view: str) -> list[tuple[int, int]]:
    path = warehouse / "answers" / view
    return list(commit_batches(path, 0, DeltaStore().table(path).version()))


def _state_dirs(warehouse: Path, view: str) -> set[str]:
    return {p.name for p in (warehouse / "state" / view).iterdir() if p.is_dir()}


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "landing", tmp_path / "warehouse"


def test_a_changed_view_is_served_as_it_was_until_its_rebuild_has_caught_up(spark, paths, capsys):
    landing, warehouse = paths
    old, new = compile_text(PROGRAM, "p.sql"), compile_text(CHANGED, "p.sql")
    for seq in range(4):
        _land(landing, seq)
    assert not Pipeline(old, landing, warehouse, spark=spark).run().rejected
    before = _commits(warehouse, "totals")
    old_dir = old.plan("totals").state_fingerprint
    assert _state_dirs(warehouse, "totals") == {old_dir}

    # The changed program meets a bad file at batch 6: its rebuild stops there, unpublished.
    for seq in (4, 5):
        _land(landing, seq)
    (landing / "t" / "0006.parquet").write_bytes(b"PAR1 not really")
    report = Pipeline(new, landing, warehouse, spark=spark).run()
    assert report.rejected is not None and report.rejected_batch.seq == 6
    modes = {b.seq: {v.view: v.answer_mode for v in b.views} for b in report.applied}
    assert [modes[s]["totals"] for s in range(6)] == ["building"] * 6
    assert _commits(warehouse, "totals") == before  # not one version written
    _check(warehouse, old, "totals", 3)  # the reader still sees the old view at batch 3
    new_dir = new.plan("totals").state_fingerprint
    assert _state_dirs(warehouse, "totals") == {old_dir, new_dir}  # both kept
    status = {s.view: s for s in Pipeline(new, landing, warehouse, spark=spark).status()}
    assert status["totals"].serving_old == 3 and status["totals"].state_batch == 5
    assert status["ranked"].serving_old is None and status["ranked"].answer_batch == 5
    # The program's consistent snapshot stays at the last batch the old answer shows.
    assert Snapshots(warehouse, ProgramLayout.of(new)).latest_batch() == 3
    program = landing.parent / "p.sql"
    program.write_text(CHANGED)
    assert cli.main(["answer", str(program), "--warehouse", str(warehouse), "--view", "totals"]) == 0
    assert "changed and is rebuilding" in capsys.readouterr().err

    # The change is abandoned: the old program goes on from its own state, nothing rebuilt.
    Pipeline(old, landing, warehouse, spark=spark).skip(6)
    report = Pipeline(old, landing, warehouse, spark=spark).run()
    assert [b.seq for b in report.applied if any(v.view == "totals" for v in b.views)] == [4, 5]
    _check(warehouse, old, "totals", 5)
    assert _state_dirs(warehouse, "totals") == {old_dir}  # the abandoned build is dropped

    # The change again, to the end this time: one commit swaps the new answer in.
    before = _commits(warehouse, "totals")
    report = Pipeline(new, landing, warehouse, spark=spark).run()
    modes = {b.seq: {v.view: v.answer_mode for v in b.views} for b in report.applied}
    assert [modes[s]["totals"] for s in range(5)] == ["building"] * 5
    assert modes[5]["totals"] == "rewrite"
    after = _commits(warehouse, "totals")
    assert after[:len(before)] == before and [b for _, b in after[len(before):]] == [5]
    _check(warehouse, new, "totals", 5)
    assert _state_dirs(warehouse, "totals") == {new_dir}  # the old state goes after the swap
    assert not Pipeline(new, landing, warehouse, spark=spark).status()[0].serving_old
    # Time travel: every batch still answers what was published at it (the old view's).
    assert trusted_commits(after) == after
    for seq in range(6):
        _check(warehouse, old, "totals", seq, batch=seq)


def test_an_answer_only_change_keeps_every_published_batch_as_it_was(spark, paths):
    """``LIMIT 2`` → ``LIMIT 1`` with batches pending: the state is reused (no rebuild), the
    new answer appears once, at the last batch, and ``--batch N`` answers what was published
    at N."""
    landing, warehouse = paths
    old = compile_text(PROGRAM, "p.sql")
    new = compile_text(PROGRAM.replace("LIMIT 2", "LIMIT 1"), "p.sql")
    for seq in range(3):
        _land(landing, seq)
        Pipeline(old, landing, warehouse, spark=spark).run()
    for seq in (3, 4):
        _land(landing, seq)
    report = Pipeline(new, landing, warehouse, spark=spark).run()
    ranked = [next(v for v in b.views if v.view == "ranked") for b in report.applied]
    assert [m.answer_mode for m in ranked] == ["building"] * 4 + ["rewrite"]
    # The state is kept: batches 0-2 are not folded again, 3 and 4 onto it.
    assert [m.engine for m in ranked] == ["", "", "", "driver", "driver"]
    assert [b for _, b in _commits(warehouse, "ranked")] == [0, 1, 2, 4]
    _check(warehouse, new, "ranked", 4)
    for seq in range(3):
        _check(warehouse, old, "ranked", seq, batch=seq)


def test_a_full_refresh_rebuilds_beside_the_served_state_then_swaps(spark, paths, capsys):
    landing, warehouse = paths
    program = paths[0].parent / "p.sql"
    program.write_text(PROGRAM)
    compiled = compile_text(PROGRAM, "p.sql")
    argv = [str(program), "--landing", str(landing), "--warehouse", str(warehouse)]
    for seq in range(4):
        _land(landing, seq)
    assert cli.main(["run", *argv]) == 0
    fingerprint = compiled.plan("totals").state_fingerprint
    before = _commits(warehouse, "totals")

    # Started, not run: the next run does it; until then, nothing a reader sees changes.
    assert cli.main(["refresh", *argv, "--view", "totals", "--no-run"]) == 0
    assert _state_dirs(warehouse, "totals") == {fingerprint, f"{fingerprint}.r1"}
    capsys.readouterr()
    assert cli.main(["status", *argv, "--json"]) == 0
    status = {v["view"]: v for v in json.loads(capsys.readouterr().out)["views"]}
    assert status["totals"]["serving_old"] == 3 and status["totals"]["state_batch"] == -1
    assert cli.main(["answer", *argv[:1], "--warehouse", str(warehouse), "--view", "totals"]) == 0
    assert "rebuilding" not in capsys.readouterr().err  # same definition: no note
    _check(warehouse, compiled, "totals", 3)

    _land(landing, 4)
    report = Pipeline(compiled, landing, warehouse, spark=spark).run()
    totals = [next(v for v in b.views if v.view == "totals") for b in report.applied]
    assert [m.answer_mode for m in totals] == ["building"] * 4 + ["rewrite"]
    assert all(m.engine for m in totals)  # every batch folded again into the new state
    assert [b for _, b in _commits(warehouse, "totals")] == [b for _, b in before] + [4]
    _check(warehouse, compiled, "totals", 4)
    assert _state_dirs(warehouse, "totals") == {f"{fingerprint}.r1"}
    path = warehouse / "answers" / "totals"
    assert DeltaStore().last_commit(path)[STATE_KEY] == f"{fingerprint}.r1"

    # A second refresh through the command: it runs at once.
    assert cli.main(["refresh", *argv, "--view", "totals"]) == 0
    assert _state_dirs(warehouse, "totals") == {f"{fingerprint}.r2"}
    _check(warehouse, compiled, "totals", 4)
    assert cli.main(["refresh", *argv, "--view", "nope"]) != 0
    assert "has no view nope" in capsys.readouterr().err


def test_a_run_holding_an_old_runtime_writes_to_the_new_generation(spark, paths):
    """A runtime made before a refresh (an Airflow task that waited for the view's lock)
    finds the new generation when it folds: it never writes to a directory the refresh's
    swap removes."""
    landing, warehouse = paths
    compiled = compile_text(PROGRAM, "p.sql")
    for seq in range(2):
        _land(landing, seq)
    Pipeline(compiled, landing, warehouse, spark=spark).run()
    waiting = Pipeline(compiled, landing, warehouse, spark=spark)
    waiting.prepare()
    runtime = waiting.views["totals"]
    Pipeline(compiled, landing, warehouse, spark=spark).refresh("totals")
    assert runtime.state_root.name.endswith(".r1")
    _land(landing, 2)
    through = waiting.prepare().ready_through
    metrics = waiting.apply_view("totals", through)
    assert [m.answer_mode for m in metrics] == ["building", "building", "rewrite"]
    _check(warehouse, compiled, "totals", 2)
    fingerprint = compiled.plan("totals").state_fingerprint
    assert _state_dirs(warehouse, "totals") == {f"{fingerprint}.r1"}


def test_an_iterative_view_refreshes_to_the_answer_it_had(spark, paths):
    """PageRank's X, ΔX and frontier live in the state generation too: a refresh replays
    every batch into a new one (the loop included) and lands on the same ranks."""
    from tests.runtime.test_iterate import _graph_batches, _pagerank_text
    from tests.runtime.test_iterate import _land as land_edges

    landing, warehouse = paths
    compiled = compile_text(_pagerank_text(), path="pagerank.sql")
    plan = compiled.plans[0]
    for seq, (kind, rows) in enumerate(_graph_batches(np.random.default_rng(3))):
        land_edges(landing, "edges", seq, rows, delete=kind == "delete")
        Pipeline(compiled, landing, warehouse, spark=spark).run()
    before, at = read_answer(warehouse, plan)
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark)
    pipeline.refresh(plan.view)
    report = pipeline.run()
    assert [b.views[0].answer_mode for b in report.applied] == ["building", "building", "rewrite"]
    after, at_after = read_answer(warehouse, plan)
    assert at_after == at
    old = dict(zip(before["node"].to_pylist(), before["rank"].to_pylist()))
    new = dict(zip(after["node"].to_pylist(), after["rank"].to_pylist()))
    assert old.keys() == new.keys() and max(abs(old[k] - new[k]) for k in old) < 1e-9
    root = warehouse / "state" / plan.view
    assert {p.name for p in root.iterdir()} == {f"{plan.state_fingerprint}.r1"}
    assert (root / f"{plan.state_fingerprint}.r1" / "_iterate").is_dir()
