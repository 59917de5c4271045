"""Recursive views (``WITH RECURSIVE``) against DuckDB's own recursion after every batch.

Random small graphs (8 nodes, so cycles, parallel links and self-loops are common) take
link insertions and deletions; the deletions remove one of several derivations of a tuple,
cut cycles and disconnect components.  Every view's answer table must equal DuckDB running
the view's SQL over the links live at that point.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from incr.compiler import compile_text
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

GRAPH = """
CREATE TABLE links (src BIGINT, dst BIGINT);
CREATE TABLE active (node BIGINT);
"""

REACH = ("WITH RECURSIVE r (src, dst) AS (SELECT src, dst FROM links UNION "
         "SELECT r.src, l.dst FROM r JOIN links l ON r.dst = l.src)")

PROGRAM = GRAPH + f"""
CREATE VIEW reach AS {REACH} SELECT src, dst FROM r;
CREATE VIEW fanout AS {REACH} SELECT src, COUNT(*) AS n FROM r GROUP BY src;
CREATE VIEW fanin AS WITH RECURSIVE b (src, dst) AS (SELECT src, dst FROM links UNION
        SELECT l.src, b.dst FROM links AS l JOIN b ON l.dst = b.src)
    SELECT dst, COUNT(*) AS n FROM b GROUP BY dst;
CREATE VIEW two_more AS {REACH}
    SELECT r.src, COUNT(*) AS n, MAX(l.dst) AS top FROM r JOIN links l ON r.dst = l.src GROUP BY r.src;
CREATE VIEW paths AS WITH RECURSIVE p (src, dst, hops) AS (
        SELECT src, dst, 1 FROM links
        UNION
        SELECT p.src, l.dst, p.hops + 1 FROM p JOIN links AS l ON p.dst = l.src WHERE p.hops < 4)
    SELECT src, dst, MIN(hops) AS fewest, COUNT(*) AS lengths FROM p WHERE src <> dst
    GROUP BY src, dst;
CREATE VIEW regions AS WITH RECURSIVE c (node, other) AS (
        SELECT node, node FROM active
        UNION
        SELECT c.node, l.dst FROM c JOIN links l ON c.other = l.src JOIN active a ON a.node = l.dst)
    SELECT region, COUNT(*) AS size FROM (SELECT node, MIN(other) AS region FROM c GROUP BY node) AS m
    GROUP BY region;
"""

SCHEMAS = {"links": pa.schema([("src", pa.int64()), ("dst", pa.int64())]),
           "active": pa.schema([("node", pa.int64())])}


def _land(landing: Path, table: str, seq: int, rows: list[tuple], delete: bool) -> None:
    folder = landing / table / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    header = ",".join(SCHEMAS[table].names)
    body = "".join(",".join(str(v) for v in row) + "\n" for row in rows)
    (folder / f"{seq:05d}.csv").write_text(f"{header}\n{body}")


def run_random_graph(spark, tmp_path: Path, seed: int, batches: int, local_rows: int) -> None:
    """Random inserts and deletes of links and active nodes; every view against DuckDB."""
    compiled = compile_text(PROGRAM, path="recursion.sql", name="recursion")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows)
    rng = random.Random(seed)
    live: dict[str, list[tuple]] = {"links": [], "active": []}
    for seq in range(batches):
        table = "links" if seq == 0 or rng.random() < 0.7 else "active"
        rows = live[table]
        delete = bool(rows) and rng.random() < 0.4
        if delete:
            gone = rng.sample(rows, min(len(rows), rng.randint(1, 3)))
            for row in gone:
                rows.remove(row)
            _land(landing, table, seq, gone, True)
        else:
            new = [(rng.randint(0, 7), rng.randint(0, 7)) if table == "links"
                   else (rng.randint(0, 7),) for _ in range(rng.randint(1, 5))]
            rows.extend(new)
            _land(landing, table, seq, new, False)
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        sources = {t: pa.Table.from_pylist([dict(zip(SCHEMAS[t].names, r)) for r in rs],
                                           schema=SCHEMAS[t]) for t, rs in live.items()}
        for plan in compiled.plans:
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
            assert diff is None, (f"seed {seed}, after batch {seq} ({'delete' if delete else 'insert'}"
                                  f" on {table}), view {plan.view}:\n{diff}")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recursive_views_equal_duckdb_after_every_batch_on_the_driver(tmp_path, seed):
    run_random_graph(None, tmp_path, seed, 14, 200_000)


def test_recursive_views_equal_duckdb_after_every_batch_in_spark(spark, tmp_path):
    run_random_graph(spark, tmp_path, 4, 4, 0)


def test_deleting_one_of_two_derivations_keeps_the_tuple_and_a_cut_cycle_empties(tmp_path):
    """0→1→2 and 0→2: deleting 0→1 keeps (0, 2); a cycle 3→4→3 cut at 4→3 loses (3, 3),
    (4, 4) and (4, 3), which only derived each other."""
    text = GRAPH + f"CREATE VIEW reach AS {REACH} SELECT src, dst FROM r;"
    compiled = compile_text(text, path="reach.sql", name="reach")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=None, local_rows=200_000)
    _land(landing, "links", 0, [(0, 1), (1, 2), (0, 2), (3, 4), (4, 3)], False)
    pipeline.run()
    _land(landing, "links", 1, [(0, 1), (4, 3)], True)
    report = pipeline.run()
    assert report.rejected is None
    answer, _ = read_answer(warehouse, compiled.plans[0])
    assert sorted(tuple(r.values()) for r in answer.to_pylist()) == [(0, 2), (1, 2), (3, 4)]
    log = pipeline.views["reach"].log[-1]
    assert log["dr_rows"] == 4  # (0, 1), (3, 3), (4, 3), (4, 4) went


def test_a_change_of_r_of_one_sign_folds_as_plain_rows():
    """ΔR all entering (a first load, an insert that beats nothing) or all leaving folds
    like a batch of a source, on the fold's one-signed path; a mixed one stays signed."""
    from incr.runtime.recursion import _one_sign

    def dr(weights: list[int]) -> pa.Table:
        return pa.table({"src": list(range(len(weights))), "_w": pa.array(weights, pa.int64())})

    assert _one_sign(dr([1, 1])) == (1, dr([1, 1]).drop_columns(["_w"]))
    assert _one_sign(dr([-1, -1])) == (-1, dr([-1, -1]).drop_columns(["_w"]))
    for signed in ([1, -1], [2, 1], []):
        assert _one_sign(dr(signed)) == (0, dr(signed))


def _reach_pipeline(tmp_path: Path, rank_support: bool) -> tuple:
    text = GRAPH + f"CREATE VIEW reach AS {REACH} SELECT src, dst FROM r;"
    compiled = compile_text(text, path="reach.sql", name="reach")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=None, local_rows=200_000)
    pipeline.views["reach"].rank_support = rank_support
    return compiled, landing, warehouse, pipeline


def _reached(warehouse: Path, compiled) -> list[tuple]:
    answer, _ = read_answer(warehouse, compiled.plans[0])
    return sorted(tuple(r.values()) for r in answer.to_pylist())


@pytest.mark.parametrize("rank_support", [True, False])
def test_a_tuple_with_an_equally_short_proof_left_is_not_over_deleted(tmp_path, rank_support):
    """A diamond 0→1→3, 0→2→3 with a tail 3→4→5: deleting 1→3 loses (1, 3), (1, 4), (1, 5).
    With rank support (0, 3) keeps its proof through 2 and (0, 4), (0, 5) are never
    over-deleted; no rank support over-deletes all six, then rederives three."""
    compiled, landing, warehouse, pipeline = _reach_pipeline(tmp_path, rank_support)
    _land(landing, "links", 0, [(0, 1), (1, 3), (0, 2), (2, 3), (3, 4), (4, 5)], False)
    pipeline.run()
    _land(landing, "links", 1, [(1, 3)], True)
    assert pipeline.run().rejected is None
    assert _reached(warehouse, compiled) == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (2, 3),
                                             (2, 4), (2, 5), (3, 4), (3, 5), (4, 5)]
    log = pipeline.views["reach"].log[-1]
    assert log["dr_rows"] == 3
    assert log["over"] == (3 if rank_support else 6)


def test_a_tuple_whose_shortest_proof_went_is_rederived_with_a_new_rank(tmp_path):
    """0→1→2 and the longer 0→3→4→2: deleting 1→2 over-deletes (0, 2) (its proof of rank 0
    went) and rederives it through 4 with rank 2; deleting 3→4 then removes it, which the
    examination finds only because (0, 2) now ranks above (0, 4) (with its old rank 1 it
    would not be examined when (0, 4), also of rank 1, dies)."""
    compiled, landing, warehouse, pipeline = _reach_pipeline(tmp_path, True)
    _land(landing, "links", 0, [(0, 1), (1, 2), (0, 3), (3, 4), (4, 2)], False)
    pipeline.run()
    _land(landing, "links", 1, [(1, 2)], True)
    assert pipeline.run().rejected is None
    log = pipeline.views["reach"].log[-1]
    assert (log["over"], log["dr_rows"]) == (2, 1)  # (1, 2) and (0, 2) over-deleted; (1, 2) went
    fixpoint = pipeline.store.read(pipeline.views["reach"].fixpoint_path).to_pylist()
    assert {(t["src"], t["dst"]): t["_rank"] for t in fixpoint}[(0, 2)] == 2
    _land(landing, "links", 2, [(3, 4)], True)
    assert pipeline.run().rejected is None
    assert _reached(warehouse, compiled) == [(0, 1), (0, 3), (4, 2)]


def test_a_delete_moves_r_in_place_by_deletion_vectors(tmp_path):
    """R is not rewritten by a delete: the files it had stay, their deletion vectors mark
    the tuples that left, and the one rederived with a new rank is in a new file."""
    _, landing, _, pipeline = _reach_pipeline(tmp_path, True)
    store, path = pipeline.store, pipeline.views["reach"].fixpoint_path
    _land(landing, "links", 0, [(0, 1), (1, 2), (0, 3), (3, 4), (4, 2)], False)
    pipeline.run()
    before = set(store.live_adds(path))
    _land(landing, "links", 1, [(1, 2)], True)
    assert pipeline.run().rejected is None
    after = store.live_adds(path)
    assert before < set(after)  # nothing rewritten, one file added
    assert [a for name, a in after.items() if name in before and a.get("deletionVector")]
    assert sorted(tuple(t.values()) for t in store.read(path).to_pylist()) == [
        (0, 1, 0), (0, 2, 2), (0, 3, 0), (0, 4, 1), (3, 2, 1), (3, 4, 0), (4, 2, 0)]


def test_a_batch_reads_only_the_parts_of_r_it_reaches(tmp_path, monkeypatch):
    """R falls apart by src (the step copies r.src).  Two chains 0→1→2→3 and 10→11→12→13:
    inserting 3→4 can only move the paths from 3 (the link's own) and from the nodes whose
    paths end at 3 (0, 1, 2), so the driver reads their 6 tuples of R, not all 12; deleting
    11→12 reads the 5 paths from 10 and 11."""
    from incr.runtime.store import DeltaStore

    compiled, landing, warehouse, pipeline = _reach_pipeline(tmp_path, True)
    reads: list[tuple[str, int]] = []
    original = DeltaStore.read_matching

    def spy(self, path, matching, *args, **kwargs):
        rows = original(self, path, matching, *args, **kwargs)
        if Path(path).name == "_fixpoint":
            reads.append((next(iter(matching)), rows.num_rows))
        return rows

    monkeypatch.setattr(DeltaStore, "read_matching", spy)
    chains = [(0, 1), (1, 2), (2, 3), (10, 11), (11, 12), (12, 13)]
    _land(landing, "links", 0, chains, False)
    pipeline.run()
    assert pipeline.store.row_count(pipeline.views["reach"].fixpoint_path) == 12
    reads.clear()
    _land(landing, "links", 1, [(3, 4)], False)
    assert pipeline.run().rejected is None
    assert pipeline.views["reach"].log[-1]["parts"] == 4
    assert reads[:2] == [("dst", 3), ("src", 6)]  # paths ending at 3; then the paths from 0-3
    reads.clear()
    _land(landing, "links", 2, [(11, 12)], True)
    assert pipeline.run().rejected is None
    assert pipeline.views["reach"].log[-1]["parts"] == 2
    assert reads[:2] == [("dst", 1), ("src", 5)]
    closure = {(a, b) for a, b in [(0, 1), (1, 2), (2, 3), (3, 4), (10, 11), (12, 13)]}
    for _ in range(4):
        closure |= {(a, d) for a, b in closure for c, d in closure if b == c}
    assert _reached(warehouse, compiled) == sorted(closure)


class _Crash(Exception):
    pass


@pytest.mark.parametrize("point", ["recursion.after_dr", "recursion.after_fixpoint",
                                   "view.after_state", "view.after_answer"])
def test_a_run_stopped_inside_a_batch_resumes_it_exactly(tmp_path, monkeypatch, point):
    """A run stopped at each point of a delete batch and of an insert batch: the next run
    reads ΔR back (R has moved) or skips what committed, and the answers equal DuckDB's."""
    from incr.runtime import faults

    fired: set[int] = set()

    def crash_at(name: str, batch: int) -> None:
        if name == point and batch in (1, 3) and batch not in fired:
            fired.add(batch)
            raise _Crash(f"{name}:{batch}")

    text = GRAPH + f"CREATE VIEW fanout AS {REACH} SELECT src, COUNT(*) AS n FROM r GROUP BY src;"
    compiled = compile_text(text, path="reach.sql", name="reach")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    batches = [([(0, 1), (1, 2), (2, 0), (3, 4)], False), ([(0, 1), (2, 0)], True),
               ([(4, 5), (5, 3), (0, 1)], False), ([(1, 2), (4, 5)], True)]
    live: list[tuple] = []
    monkeypatch.setattr(faults, "crash_point", crash_at)
    for seq, (rows, delete) in enumerate(batches):
        _land(landing, "links", seq, rows, delete)
        for row in rows:
            (live.remove if delete else live.append)(row)
        try:
            Pipeline(compiled, landing, warehouse, spark=None, local_rows=200_000).run()
        except _Crash:
            report = Pipeline(compiled, landing, warehouse, spark=None, local_rows=200_000).run()
            done = point == "view.after_answer"  # the batch was whole; nothing is left to do
            assert report.rejected is None
            assert [b.seq for b in report.applied] == ([] if done else [seq])
        else:
            assert seq not in (1, 3), f"{point} was not reached in batch {seq}"
        links = pa.Table.from_pylist([{"src": a, "dst": b} for a, b in live],
                                     schema=SCHEMAS["links"])
        answer, _ = read_answer(warehouse, compiled.plans[0])
        diff = diff_answers(oracle_answer(compiled.plans[0].select, {"links": links}), answer,
                            ordered=False)
        assert diff is None, f"after batch {seq}, stopped at {point}:\n{diff}"
