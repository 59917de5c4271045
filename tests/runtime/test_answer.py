"""Answer tables: per-group answers follow by change (one MERGE of the touched groups), the
rest are rewritten, and either way the answer equals the oracle after every batch.

The equivalence tests draw answers by change on and off over random programs; these tests
pin down what is easy to lose there: that the MERGE path is really taken (on both engines),
which views must rewrite, what it reads (only the touched buckets), and that the answer
table stays few-filed under many MERGEs.  A run that dies between the fold and the answer
(the answer then lags the state, and must be rewritten) is ``test_crash``'s.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_text
from incr.config import ANSWER_COMPACT_FILES, Settings
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from incr.runtime.store import DeltaStore

PROGRAM = """-- incr: buckets = 4
CREATE TABLE t (k VARCHAR, g BIGINT, v BIGINT);
CREATE VIEW per_group AS
    SELECT k, g AS gg, COUNT(*) AS n, MIN(v) AS lo FROM t GROUP BY k, g HAVING SUM(v) > 1;
CREATE VIEW keys AS SELECT DISTINCT k FROM t;
CREATE VIEW rows_ AS SELECT k, v FROM t WHERE v > 0;
CREATE VIEW hidden_key AS SELECT SUM(v) AS s FROM t GROUP BY k;
CREATE VIEW ranked AS SELECT k, SUM(v) AS s FROM t GROUP BY k ORDER BY s DESC, k LIMIT 2;
"""
SCHEMA = pa.schema([("k", pa.string()), ("g", pa.int64()), ("v", pa.int64())])
BY_CHANGE = {"per_group", "keys", "rows_"}
#: MERGE whatever share of the answer it reaches, however small the state (by default a
#: state of these few rows rewrites the answer: INCR_ANSWER_REWRITE_ROWS)
ALWAYS = Settings(answer_merge_reach=1.0, answer_rewrite_rows=0)


def _land(landing: Path, seq: int, rows: list[dict], delete: bool) -> None:
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), folder / f"{seq:04d}.parquet")


def _batches(rng: random.Random) -> list[tuple[bool, list[dict]]]:
    """Inserts, deletes that empty groups and drop them below HAVING, NULL keys, an empty batch."""
    live: list[dict] = []
    out: list[tuple[bool, list[dict]]] = []
    for seq in range(7):
        if seq in (3, 5):
            gone = set(rng.sample(range(len(live)), k=len(live) // 2))
            out.append((True, [r for i, r in enumerate(live) if i in gone]))
            live = [r for i, r in enumerate(live) if i not in gone]
        else:
            rows = [{"k": rng.choice(["a", "b", "c", None]), "g": rng.randint(0, 3),
                     "v": rng.randint(0, 5)} for _ in range(0 if seq == 4 else 25)]
            live += rows
            out.append((False, rows))
    return out


@pytest.mark.parametrize("local_rows", [0, 200_000], ids=["spark", "driver"])
def test_per_group_answers_follow_by_change_on_both_engines(spark, tmp_path, local_rows):
    compiled = compile_text(PROGRAM, path="answers.sql", name="answers")
    assert {p.view for p in compiled.plans if p.publish.by_change} == BY_CHANGE
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows,
                        config=ALWAYS)
    live: list[dict] = []
    ranked_modes: list[str] = []
    for seq, (delete, rows) in enumerate(_batches(random.Random(7))):
        _land(landing, seq, rows, delete)
        if delete:
            for r in rows:
                live.remove(r)
        else:
            live += rows
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        modes = {v.view: v.answer_mode for b in report.applied for v in b.views}
        ranked_modes.append(modes.pop("ranked"))
        for plan in compiled.plans:
            if plan.view == "ranked":
                continue
            expected = "change" if plan.view in BY_CHANGE and seq > 0 else "rewrite"
            assert modes[plan.view] == expected, (seq, plan.view)
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select, {"t": pa.Table.from_pylist(live, SCHEMA)}),
                                answer, ordered=plan.ordered)
            assert diff is None, f"batch {seq}, view {plan.view}: {diff}"
    # The top 2 is kept from its old rows and the touched groups, unless a delete pushed one
    # of its rows out (then recomputed whole).
    assert ranked_modes == ["rewrite", "top", "top", "rewrite", "top", "rewrite", "top"], ranked_modes
    store = DeltaStore()
    ops = [h["operation"] for h in store.history(warehouse / "answers" / "per_group")]
    assert ops[0] == "MERGE" and ops[-1] != "MERGE"  # newest first: merges after the first write
    ops = {h["operation"] for h in store.history(warehouse / "answers" / "hidden_key", 3)}
    assert ops == {"WRITE"}


def test_the_setting_turns_answers_by_change_off(spark, tmp_path):
    assert Settings.from_env({"INCR_ANSWER_BY_CHANGE": "0"}).answer_by_change is False
    with pytest.raises(ValueError, match="INCR_ANSWER_BY_CHANGE must be 0 or 1"):
        Settings.from_env({"INCR_ANSWER_BY_CHANGE": "yes"})
    compiled = compile_text(PROGRAM, path="answers.sql", name="answers")
    landing = tmp_path / "landing"
    pipeline = Pipeline(compiled, landing, tmp_path / "wh", spark=spark,
                        config=Settings(answer_by_change=False))
    for seq, (delete, rows) in enumerate(_batches(random.Random(3))[:3]):
        _land(landing, seq, rows, delete)
        report = pipeline.run()
        assert {v.answer_mode for b in report.applied for v in b.views} == {"rewrite"}


def test_an_answer_over_a_small_state_is_rewritten_until_the_state_grows(spark, tmp_path):
    """A per-group answer whose state tables hold at most INCR_ANSWER_REWRITE_ROWS rows is
    rewritten (cheaper than the MERGE by change there); once the state holds more, the
    answer follows by change; with the setting 0, or the driver-side engine off (the
    figures the rule rests on are the driver's), by change from the start.  Every answer
    equals DuckDB's after every batch, a delete that shrinks the state again included."""
    assert Settings.from_env({"INCR_ANSWER_REWRITE_ROWS": "7"}).answer_rewrite_rows == 7
    assert Settings().answer_rewrite_rows == 50_000  # the default
    compiled = compile_text(PROGRAM, path="answers.sql", name="answers")
    plan = next(p for p in compiled.plans if p.view == "per_group")
    # the state after each batch: one main row per group, one row per value of its MIN's bag
    batches = [
        (False, [{"k": "a", "g": g, "v": 2} for g in range(3)]),  # 3 + 3 rows
        (False, [{"k": "b", "g": 0, "v": 5}]),  # 4 + 4
        (False, [{"k": k, "g": g, "v": 3} for k in "cde" for g in range(3)]),  # 13 + 13
        (False, [{"k": "c", "g": 0, "v": 4}]),  # 13 + 14
        (True, [{"k": k, "g": g, "v": 3} for k in "cde" for g in range(3)]),  # 5 + 5
        (False, [{"k": "a", "g": 0, "v": 2}]),  # 5 + 5: a value the bag holds
    ]
    always = ["rewrite", "change", "change", "change", "change", "change"]
    for case, (limit, local_rows, expected) in enumerate((
            (10, 200_000, ["rewrite", "rewrite", "change", "change", "rewrite", "rewrite"]),
            (0, 200_000, always), (10, 0, always))):
        landing, warehouse = tmp_path / f"landing{case}", tmp_path / f"wh{case}"
        pipeline = Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows,
                            config=Settings(answer_rewrite_rows=limit))
        live: list[dict] = []
        modes = []
        for seq, (delete, rows) in enumerate(batches):
            _land(landing, seq, rows, delete)
            live = [r for r in live if r not in rows] if delete else live + rows
            report = pipeline.run()
            assert report.rejected is None, str(report.rejected)
            modes += [v.answer_mode for b in report.applied for v in b.views
                      if v.view == plan.view]
            answer, _ = read_answer(warehouse, plan)
            diff = diff_answers(oracle_answer(plan.select,
                                              {"t": pa.Table.from_pylist(live, SCHEMA)}), answer)
            assert diff is None, f"limit {limit}, local rows {local_rows}, batch {seq}: {diff}"
        assert modes == expected, (limit, local_rows, modes)


def test_bucket_reads_touch_only_their_partitions(spark, tmp_path):
    compiled = compile_text(PROGRAM, path="answers.sql", name="answers")
    landing = tmp_path / "landing"
    pipeline = Pipeline(compiled, landing, tmp_path / "wh", spark=spark)
    _land(landing, 0, [{"k": f"k{i}", "g": i, "v": i} for i in range(200)], delete=False)
    assert pipeline.run().rejected is None
    store = DeltaStore()
    path = pipeline.views["per_group"].table_path("main")
    whole = store.read(path)
    assert set(whole["_bucket"].to_pylist()) == {0, 1, 2, 3}
    for wanted in ([1], [0, 3], []):
        part = store.read(path, buckets=wanted)
        assert set(part["_bucket"].to_pylist()) == set(wanted)
        assert part.num_rows == sum(1 for b in whole["_bucket"].to_pylist() if b in wanted)
        assert store.row_count(path, wanted) == part.num_rows
        files = store.snapshot(path, wanted).files
        assert all(any(f"_bucket={b}/" in f for b in wanted) for f in files)
        assert bool(files) == bool(wanted)


@pytest.mark.parametrize("local_state_rows", [1_000_000, 1], ids=["driver", "spark"])
def test_answer_merges_stay_few_files_and_sorted(spark, tmp_path, monkeypatch, local_state_rows):
    # Compaction of an answer over the driver's limit is written by Spark's executors.
    from incr.runtime.session import SparkEngine

    written: list[str] = []
    original = SparkEngine.write

    def spy(self, path, rows, **kwargs):
        if kwargs.get("batch") is None:  # a compaction (a publish records its batch)
            written.append(kwargs.get("mode", ""))
        return original(self, path, rows, **kwargs)

    monkeypatch.setattr(SparkEngine, "write", spy)
    compiled = compile_text(PROGRAM.replace("buckets = 4", "buckets = 2"), path="answers.sql",
                            name="answers")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=dataclasses.replace(ALWAYS, local_state_rows=local_state_rows))
    store = DeltaStore()
    rng = random.Random(11)
    live: list[dict] = []
    for seq in range(ANSWER_COMPACT_FILES + 6):
        rows = [{"k": f"k{rng.randint(0, 400):03d}", "g": 1, "v": 2} for _ in range(3)]
        live += rows
        _land(landing, seq, rows, delete=False)
        assert pipeline.run().rejected is None
        assert len(store.table(warehouse / "answers" / "keys").file_uris()) <= ANSWER_COMPACT_FILES + 1
    plan = compiled.plan("keys")
    answer, _ = read_answer(warehouse, plan)
    assert diff_answers(oracle_answer(plan.select, {"t": pa.Table.from_pylist(live, SCHEMA)}),
                        answer) is None
    assert "incr.answer_fingerprint" in store.history(warehouse / "answers" / "keys", 1)[0]
    # (the file count above stays bounded: compaction ran) the Spark-limited run rewrote the
    # compacted answer from the executors, the other on the driver
    assert ("overwrite" in written) == (local_state_rows == 1)


@pytest.mark.parametrize("vectors", [False, True], ids=["copy_on_write", "deletion_vectors"])
def test_a_merge_is_chosen_only_while_it_reaches_few_answer_files(spark, tmp_path, vectors):
    """Copy on write: a MERGE rewrites every file a touched group may be in.  With the answer
    in several key-sorted files, a batch of nearby keys MERGEs; one touching keys across
    the whole range rewrites the answer instead (cheaper than copying every file).  With
    deletion vectors (the default) both MERGE, and no file is rewritten: the old rows are
    marked deleted where they are, and the new ones added in one file."""
    from dataclasses import replace

    import incr.runtime.answer as answer_module

    compiled = compile_text(PROGRAM, path="answers.sql", name="answers")
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    pipeline = Pipeline(compiled, landing, warehouse, spark=spark,
                        config=Settings(answer_deletion_vectors=vectors, answer_rewrite_rows=0))
    path = warehouse / "answers" / "keys"
    small_files = 4096  # bytes: the answer of a few thousand keys spans many files
    original = answer_module.ANSWER_TARGET_FILE_BYTES
    answer_module.ANSWER_TARGET_FILE_BYTES = small_files
    try:
        _land(landing, 0, [{"k": f"k{i:05d}", "g": 1, "v": 1} for i in range(5000)], delete=False)
        assert pipeline.run().rejected is None
        store = DeltaStore()
        first = set(store.table(path).file_uris())
        assert len(first) > 4
        _land(landing, 1, [{"k": "k00007", "g": 1, "v": 1}], delete=False)  # one key: few files
        _land(landing, 2, [{"k": f"k{i:05d}x", "g": 1, "v": 1} for i in range(0, 5000, 50)],
              delete=False)  # keys across the whole range: every file
        modes = [{v.view: v.answer_mode for v in b.views} for b in pipeline.run().applied]
    finally:
        answer_module.ANSWER_TARGET_FILE_BYTES = original
    if vectors:
        assert modes[0]["keys"] == "change" and modes[1]["keys"] == "change"
        files = set(store.table(path).file_uris())
        assert first <= files and len(files - first) == 2  # every file kept, one added per batch
        deleted, held = store.deleted_rows(path)
        assert deleted == 1 and held == 5000 + 1 + 100  # k00007's old row; the others were new
    else:
        assert modes[0]["keys"] == "change" and modes[1]["keys"] == "rewrite"
    assert replace(Settings(), answer_merge_reach=1.0).answer_merge_reach == 1.0
    live = pa.Table.from_pylist(
        [{"k": f"k{i:05d}", "g": 1, "v": 1} for i in range(5000)] + [{"k": "k00007", "g": 1, "v": 1}]
        + [{"k": f"k{i:05d}x", "g": 1, "v": 1} for i in range(0, 5000, 50)], SCHEMA)
    plan = compiled.plan("keys")
    assert diff_answers(oracle_answer(plan.select, {"t": live}), read_answer(warehouse, plan)[0]) is None


def test_time_travel_shows_what_was_published_even_after_the_answer_query_changed(spark, tmp_path):
    """An answer-only change (``LIMIT 2`` → ``LIMIT 1``) republishes the answer from the
    current state; ``--batch N`` still answers what the program published at batch N."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    rows = [[{"k": "a", "g": 0, "v": 5}, {"k": "b", "g": 0, "v": 3}], [{"k": "c", "g": 0, "v": 9}]]
    old = compile_text(PROGRAM, "p.sql")
    for seq, batch in enumerate(rows):
        _land(landing, seq, batch, delete=False)
        Pipeline(old, landing, warehouse, spark=spark).run()
    new = compile_text(PROGRAM.replace("LIMIT 2", "LIMIT 1"), "p.sql")
    Pipeline(new, landing, warehouse, spark=spark).run()  # nothing new lands: a republish
    plan_old = next(p for p in old.plans if p.view == "ranked")
    plan_new = next(p for p in new.plans if p.view == "ranked")
    latest, batch = read_answer(warehouse, plan_new)
    assert batch == 1 and latest.num_rows == 1
    for seq in range(2):
        live = pa.Table.from_pylist([r for b in rows[:seq + 1] for r in b], schema=SCHEMA)
        then, _ = read_answer(warehouse, plan_old, seq)
        assert diff_answers(oracle_answer(plan_old.select, {"t": live}), then) is None, seq
