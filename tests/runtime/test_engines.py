"""The two engines agree wherever a rule exists once per engine, and every such rule is tested.

A rule computed by each engine its own way (a fingerprint, a row number, a type, a NOT NULL
check, ⊗ as a MERGE and as a query) is marked with ``incr.runtime.engine.per_engine``.
The first tests fail when such a rule has no cross-engine test, or when per-engine code
is not marked; the others are those cross-engine tests: the same inputs through both
engines, equal results.
"""

from __future__ import annotations

import ast
import datetime as dt
import importlib
import math
import pkgutil
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import incr.runtime
from incr.compiler import compile_text
from incr.compiler.program import parse_program
from incr.errors import InputError
from incr.runtime import fold as fold_module
from incr.runtime.engine import CROSS_ENGINE_TESTS, IMPLEMENTATIONS, Engines
from incr.runtime.ingest import load_batch
from incr.runtime.pipeline import Pipeline
from incr.runtime.rowindex import RowIndex
from incr.runtime.store import DeltaStore

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "incr" / "runtime"
#: Functions named like per-engine code that implement no semantic rule.
NOT_RULES = {"spark_session": "starts the SparkSession"}
PER_ENGINE_NAME = re.compile(r"^_?(local|spark)_")


def _import_runtime() -> None:
    for module in pkgutil.iter_modules(incr.runtime.__path__):
        importlib.import_module(f"incr.runtime.{module.name}")


def test_every_rule_with_two_implementations_has_a_cross_engine_test():
    _import_runtime()
    for rule, by_engine in IMPLEMENTATIONS.items():
        if len(by_engine) > 1:
            assert rule in CROSS_ENGINE_TESTS, (
                f"{rule!r} is implemented by {sorted(by_engine)} but no test drives both with "
                f"the same inputs; add one and list it in CROSS_ENGINE_TESTS")
    for rule, test in CROSS_ENGINE_TESTS.items():
        assert len(IMPLEMENTATIONS.get(rule, {})) > 1, f"{rule!r} is listed but not implemented twice"
        path, name = test.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), f"{test} (for {rule!r}) does not exist"


def test_per_engine_code_is_marked():
    _import_runtime()
    marked = {name.rsplit(".", 1)[-1] for by_engine in IMPLEMENTATIONS.values()
              for names in by_engine.values() for name in names}
    unmarked = []
    for path in sorted(RUNTIME.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    PER_ENGINE_NAME.match(node.name) and node.name not in NOT_RULES and \
                    node.name not in marked:
                unmarked.append(f"{path.name}:{node.lineno} {node.name}")
    assert not unmarked, f"per-engine code not marked with per_engine(...): {unmarked}"


# -- cross-engine tests ---------------------------------------------------------------------------
PROGRAM = """
CREATE TABLE t (s VARCHAR, b BIGINT NOT NULL, i INTEGER, sm SMALLINT, ti TINYINT, x DOUBLE,
                f FLOAT, ok BOOLEAN, d DATE, ts TIMESTAMP, m DECIMAL(12, 3));
CREATE VIEW v AS SELECT s, COUNT(*) AS n FROM t GROUP BY s;
"""
TABLE = parse_program(PROGRAM, "engines.sql").table("t")


def _rows(n: int = 60, null_b_at: int | None = None) -> pa.Table:
    rows = []
    for k in range(n):
        rows.append({
            "s": None if k % 11 == 0 else f"k{k % 7}é", "b": None if k == null_b_at else k % 5,
            "i": None if k % 13 == 0 else k * 1000, "sm": k % 300, "ti": k % 100 - 50,
            "x": [0.0, -0.0, 1.5, float("nan"), 1e300, -2.25][k % 6], "f": k / 4,
            "ok": None if k % 9 == 0 else k % 2 == 0, "d": dt.date(2024, 1, 1) + dt.timedelta(k),
            "ts": dt.datetime(2024, 1, 1, 12) + dt.timedelta(seconds=k * 37, microseconds=k),
            "m": Decimal(k * 1001) / 1000 if k % 5 else None,
        })
    rows += rows[:7]  # duplicates: the index counts copies
    schema = pa.schema([("s", pa.string()), ("b", pa.int64()), ("i", pa.int32()),
                        ("sm", pa.int16()), ("ti", pa.int8()), ("x", pa.float64()),
                        ("f", pa.float32()), ("ok", pa.bool_()), ("d", pa.date32()),
                        ("ts", pa.timestamp("us")), ("m", pa.decimal128(12, 3))])
    return pa.Table.from_pylist(rows, schema=schema)


def _both(spark) -> tuple[Engines, Engines]:
    return Engines(spark=spark), Engines(spark=spark, local_rows=0)


@pytest.mark.parametrize("absent", [frozenset(), frozenset({"x", "d", "m"})],
                         ids=["declared", "declared-later"])
def test_a_batch_reads_the_same_on_both_engines(spark, tmp_path, absent):
    """``absent``: columns declared after the file was registered, NULL in it (the file has
    them: they are not read)."""
    path = tmp_path / "batch.parquet"
    pq.write_table(_rows(), path)
    driver, spark_only = _both(spark)
    on_driver = load_batch(driver, TABLE, path, str(path), absent)
    in_spark = load_batch(spark_only, TABLE, path, str(path), absent)
    assert on_driver.arrow is not None and in_spark.arrow is None
    for name in absent:
        assert on_driver.arrow.column(name).null_count == on_driver.arrow.num_rows
    from_spark = in_spark.df.toArrow()
    expected = on_driver.arrow
    # One type map: Spark's types of the batch are the declared Arrow types (nullability aside).
    assert [(f.name, f.type) for f in from_spark.schema] == [(f.name, f.type) for f in expected.schema]
    assert _same_rows(from_spark.sort_by("_row"), expected)


def _same_rows(a: pa.Table, b: pa.Table) -> bool:
    """Row-wise equality with NaN equal to itself."""
    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return [{k: norm(v) for k, v in r.items()} for r in a.to_pylist()] == \
        [{k: norm(v) for k, v in r.items()} for r in b.to_pylist()]


def test_not_null_is_refused_alike_on_both_engines(spark, tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(_rows(null_b_at=17), path)
    messages = []
    for engines in _both(spark):
        with pytest.raises(InputError) as err:
            load_batch(engines, TABLE, path, "bad.parquet")
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "row 18, column b: NULL in a NOT NULL column" in messages[0]


@pytest.mark.parametrize("added", [frozenset(), frozenset({"s", "x", "m"})],
                         ids=["first", "added-later"])
def test_row_index_is_the_same_from_both_engines(spark, tmp_path, added):
    """``added``: columns declared after the table's first declaration, which count in a
    fingerprint only when set (``s`` and ``m`` hold NULLs)."""
    path = tmp_path / "batch.parquet"
    pq.write_table(_rows(), path)
    tables = []
    for name, engines in zip(("driver", "spark"), _both(spark)):
        store = DeltaStore()
        index = RowIndex(store, tmp_path / name, TABLE, lambda: added)
        loaded = load_batch(engines, TABLE, path, str(path))
        index.record_inserts(engines, lambda loaded=loaded: loaded.df, 0, loaded.arrow)
        tables.append(store.read(tmp_path / name).sort_by([("h1", "ascending"), ("h2", "ascending")]))
    assert tables[0].num_rows == 60  # 67 rows, 7 of them copies
    assert tables[0].equals(tables[1])


def test_row_index_compaction_is_the_same_on_both_engines(spark, tmp_path):
    """Past ROW_INDEX_COMPACT_FILES files the ± log folds to one row per live fingerprint
    (copies deleted to zero go), on the driver or, for an index over
    INCR_LOCAL_INDEX_ROWS, by Spark's executors: the same rows, the batch marker kept."""
    from incr.config import ROW_INDEX_COMPACT_FILES, Settings

    rows = _rows()
    path = tmp_path / "batch.parquet"
    pq.write_table(rows, path)
    gone = tmp_path / "gone.parquet"
    pq.write_table(rows.slice(0, 10), gone)
    logging = Engines(spark=spark)
    tables = []
    for name, limit in (("driver", 5_000_000), ("spark", 0)):
        store = DeltaStore()
        index = RowIndex(store, tmp_path / name, TABLE)
        for batch in range(ROW_INDEX_COMPACT_FILES):  # inserts, then deletes of 10 of them
            source = gone if batch % 2 else path
            loaded = load_batch(logging, TABLE, source, str(source))
            if batch % 2:
                index.record_deletes(logging, lambda x=loaded: x.df, batch, str(source),
                                     loaded.arrow)
            else:
                index.record_inserts(logging, lambda x=loaded: x.df, batch, loaded.arrow)
        engines = Engines(Settings(local_index_rows=limit), spark=spark)
        assert index._maybe_compact(engines) is False  # at the limit, not over it
        # one file more (a fingerprint whose copies all went: the fold drops it)
        store.append(tmp_path / name, pa.table({"h1": [1], "h2": [2], "n": [0]}),
                     batch=ROW_INDEX_COMPACT_FILES)
        assert index._maybe_compact(engines)
        assert store.file_count(tmp_path / name) < ROW_INDEX_COMPACT_FILES
        assert index.through() == ROW_INDEX_COMPACT_FILES
        tables.append(store.read(tmp_path / name).sort_by([("h1", "ascending"), ("h2", "ascending")]))
    assert tables[0].equals(tables[1].select(tables[0].column_names))
    keys = list(zip(tables[0]["h1"].to_pylist(), tables[0]["h2"].to_pylist()))
    assert len(keys) == len(set(keys)) and (1, 2) not in keys
    assert 0 < tables[0].num_rows < 60 and 0 not in tables[0]["n"].to_pylist()


SHAPES = """-- incr: buckets = 4
CREATE TABLE e (k VARCHAR, g BIGINT, v BIGINT, x DOUBLE);
CREATE VIEW agg AS SELECT k, COUNT(*) AS n, SUM(v) AS s, AVG(x) AS a, MIN(v) AS lo, MAX(x) AS hi,
    COUNT(DISTINCT g) AS dg, VAR_SAMP(x) AS vx FROM e GROUP BY k;
CREATE VIEW total AS SELECT COUNT(*) AS n, SUM(v) AS s, MAX(v) AS top FROM e;
"""


@pytest.mark.parametrize("local_rows", [None, 0], ids=["driver", "spark"])
def test_merge_and_combined_query_agree(spark, tmp_path, monkeypatch, local_rows):
    """⊗ and ⊗̃ as Delta MERGEs (the fast strategy) and as the combine query followed by ⊗=
    leave the same state after every insert and delete batch, on either engine."""
    import pyarrow.csv as pacsv

    compiled = compile_text(SHAPES, path="shapes.sql", name="shapes")
    landing = tmp_path / "landing"
    schema = pa.schema([("k", pa.string()), ("g", pa.int64()), ("v", pa.int64()), ("x", pa.float64())])
    batches = [
        [("a", 1, 5, 0.5), ("b", 2, -3, 1.25), ("a", 1, 7, 2.0), (None, 3, 1, -1.0), ("c", 4, 9, 8.0)],
        [("a", 2, 1, 0.25), ("b", 2, 4, 4.0), ("d", 5, 2, 2.5)],
        "delete:0",  # the first batch's "a" rows and "c"
        [("c", 4, 3, 1.0), ("a", 9, 8, 6.5)],
        "delete:1",
    ]
    inserted: list[list[tuple]] = []
    for seq, batch in enumerate(batches):
        if isinstance(batch, str):
            rows = [r for r in inserted[int(batch.split(":")[1])] if r[0] in ("a", "c", "b")][:3]
            folder = landing / "e" / "_deletes"
        else:
            rows, folder = batch, landing / "e"
            inserted.append(batch)
        folder.mkdir(parents=True, exist_ok=True)
        pacsv.write_csv(pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema),
                        folder / f"{seq:04d}.csv")

    def states(warehouse: Path) -> dict[str, list[dict]]:
        store = DeltaStore()
        out = {}
        for plan in compiled.plans:
            root = warehouse / "state" / plan.view / plan.state_fingerprint
            for t in plan.main_tables:
                data = store.read(root / t.name)
                out[f"{plan.view}.{t.name}"] = sorted(
                    data.select(sorted(data.column_names)).to_pylist(), key=repr)
        return out

    fast = Pipeline(compiled, landing, tmp_path / "fast", spark=spark, local_rows=local_rows)
    fast.run()
    combine = Pipeline(compiled, landing, tmp_path / "combine", spark=spark, local_rows=local_rows)
    original = fold_module.Fold._fast_merge
    calls = []

    def combined(self, stage, pending, delta, batch):
        calls.append(batch)
        self._combine_merge(stage, pending, delta, batch, outbox=False)

    monkeypatch.setattr(fold_module.Fold, "_fast_merge", combined)
    combine.run()
    monkeypatch.setattr(fold_module.Fold, "_fast_merge", original)
    assert calls, "the combine strategy did not run"
    a, b = states(tmp_path / "fast"), states(tmp_path / "combine")
    assert a.keys() == b.keys()
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for x, y in zip(a[name], b[name]):
            assert x.keys() == y.keys()
            for col in x:
                if isinstance(x[col], float) and x[col] is not None and y[col] is not None:
                    assert x[col] == pytest.approx(y[col], rel=1e-12, abs=1e-12), (name, col)
                else:
                    assert x[col] == y[col], (name, col, x, y)


def test_a_table_read_from_its_files_is_the_same_on_both_engines(spark, tmp_path):
    """Spark's read of a table's Parquet files (``read_delta``) and the driver's
    (``DriverEngine.scan``, for a table larger than it holds) give the same rows and types:
    the partition values from the folders, the rows of the deletion vectors left out."""
    from incr.compiler.plan import BUCKET
    from incr.runtime.local import DriverEngine, LocalSql
    from incr.runtime.session import read_delta

    rows = _rows()
    data = rows.append_column(BUCKET, pa.array([i % 3 for i in range(rows.num_rows)], pa.int32()))
    data = data.append_column("key", pa.array(range(rows.num_rows), pa.int64()))
    store = DeltaStore()
    path = tmp_path / "t"
    half = data.num_rows // 2
    store.write(path, data.slice(0, half), mode="append", batch=0, partition_by=[BUCKET])
    store.write(path, data.slice(half), mode="append", batch=1, partition_by=[BUCKET])
    store.replace_rows(path, pa.table({"key": pa.array([0, half], pa.int64())}),
                       data.slice(0, 0), batch=2)
    assert store.deleted_rows(path)[0] == 2  # marked in their files' vectors
    schema = store.schema(path)
    in_spark = read_delta(spark, store, str(path)).toArrow()
    engine = DriverEngine(LocalSql(max_state_rows=1), store)
    try:
        name = engine.scan("t", path)
        engine.sql.max_state_rows = data.num_rows  # the whole table, as Spark gives it
        on_driver = engine.collect(f"SELECT * FROM {name}", schema)
    finally:
        engine.close()
    assert [(f.name, f.type) for f in in_spark.schema] == [(f.name, f.type) for f in schema]
    assert on_driver.num_rows == data.num_rows - 2
    assert _same_rows(in_spark.sort_by("key"), on_driver.sort_by("key"))
