"""The equivalence test: after every batch, every answer table equals DuckDB on all live rows.

Hypothesis draws a random program in the supported class (one source; WHERE; GROUP BY
columns, expressions or nothing, or ROLLUP / CUBE / GROUPING SETS of them with GROUPING();
HAVING; ORDER BY + LIMIT; plain SELECTs and SELECT DISTINCT; every supported aggregate over
columns, expressions and CASE) and a random sequence of insert and delete
batches landed as CSV, JSON lines or Parquet.  After each batch ``Pipeline.run()`` applies
it, and each view's answer table is compared with DuckDB running the view's own SELECT over
the rows live at that point (bag semantics: a deleted row removes one copy).  Each
example runs with the driver-side path for small batches on, off, or for some batches only.

Examples per run: ``INCR_EQUIV_EXAMPLES`` (default 12, ``make soak`` uses 150).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from incr.compiler import compile_text
from incr.config import Settings
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer
from tests.runtime.answers import ANSWER_CONFIGS

EXAMPLES = int(os.environ.get("INCR_EQUIV_EXAMPLES", "12"))

TABLE = """CREATE TABLE t (
    k1 VARCHAR,
    k2 BIGINT,
    v  BIGINT,
    x  DOUBLE,
    d  DECIMAL(10,2),
    day DATE
);"""
SCHEMA = pa.schema([("k1", pa.string()), ("k2", pa.int64()), ("v", pa.int64()),
                    ("x", pa.float64()), ("d", pa.decimal128(10, 2)), ("day", pa.date32())])

KEYS = ["k1", "k2", "k2 % 2", "upper(k1)", "d * 2", "CASE WHEN v > 10 THEN 'big' ELSE 'small' END",
        "day",
        # a start of 0 and negative lengths, which DuckDB and Spark's substr take otherwise
        "substr(k1 || 'xyz', k2 - 1, k2 - 2)"]
AGGREGATES = [
    "COUNT(*)", "COUNT(v)", "SUM(v)", "SUM(x)", "SUM(d)", "AVG(x)", "AVG(v)", "AVG(d)",
    "MIN(x)", "MAX(v)", "MIN(k1)", "MAX(d)", "COUNT(DISTINCT v)", "COUNT(DISTINCT k1)",
    "STDDEV_SAMP(x)", "VAR_SAMP(v)", "STDDEV_POP(v)", "VAR_POP(x)", "SUM(v * 2 + 1)",
    "SUM(CASE WHEN x > 1 THEN v ELSE 0 END)", "MAX(abs(x))",
    # rounding as DuckDB rounds: a DOUBLE to decimals in floating point, to an integer half
    # to even, a DECIMAL half away from zero; floor of a DOUBLE a DOUBLE
    "round(AVG(x), 2)", "SUM(CAST(x AS BIGINT))", "MAX(CAST(d AS INTEGER))", "floor(MIN(x))",
]
#: Groupings that are a function of a key of KEYS (seed 003's lineage-key algebra): under
#: share = rollup, answered from the state of a family grouped by that key.
DERIVED = {
    "k1": ["substr(k1, 1, 1)", "length(k1)", "regexp_replace(k1, '[a-c]', '#')",
           # a pattern is RE2's under DuckDB's options (Spark's is Java's, and takes none)
           "regexp_matches(k1, '^[AB]$', 'i')",
           # a negative count takes all but that many in DuckDB (nothing in Spark)
           "left(k1 || 'xy', -1)"],
    "k2": ["k2 % 3", "k2 > 1", "10 // k2"],  # NULL where k2 is 0 (Spark's DIV fails)
    "k2 % 2": ["k2 % 2 = 0"],
    "upper(k1)": ["length(upper(k1))"],
    "d * 2": ["d * 2 > 10"],
    KEYS[5]: [f"length({KEYS[5]})"],
    # time grains (one a DATE again: the day of a TIMESTAMP), days of the week as DuckDB
    # counts them (Sunday 0, ISO Monday 1) and names of months as it writes them
    "day": ["year(day)", "weekofyear(day)", "month(day)", "date_trunc('month', day)",
            "CAST(date_trunc('month', day) AS DATE)", "dayofweek(day)", "isodow(day)",
            "monthname(day)",
            # months counted as DuckDB counts them, ISO weeks of ISO years, seconds of an epoch
            "date_diff('month', DATE '2026-11-30', day)", "yearweek(day)", "epoch(day)",
            "epoch_ms(day)",
            # the seconds of a duration (Spark cast the interval to a TIMESTAMP, and failed)
            "epoch(CAST(day AS TIMESTAMP) - TIMESTAMP '2026-01-01 06:30:00')"],
    KEYS[7]: [f"length({KEYS[7]})"],
}
WHERES = ["v > 3", "k1 <> 'c'", "x IS NOT NULL", "k2 IN (0, 1, 2)", "v % 3 = 0 OR x < 0",
          "v % k2 = 1", "v / k2 > 2",  # NULL where k2 is 0
          # a dashboard's time window: a DATE against literals of a day and of an instant
          "day >= DATE '2026-12-30'", "day < TIMESTAMP '2027-01-02 12:00:00'",
          # DuckDB's ~ is a full match (before its 2.0); Spark's RLIKE finds one anywhere
          "k1 ~ '[a-b]'",
          # both sides lowered as DuckDB lowers them (Spark's ILIKE lowers by Java's mapping)
          "k1 ILIKE 'A%' OR k1 NOT ILIKE k1",
          # DuckDB's sign of NaN is 0, its round to tens 0 of NaN and of an infinity
          "sign(x) >= 0 OR round(x, -1) = 0"]
HAVINGS = ["COUNT(*) > 1", "SUM(v) > 10", "MIN(x) < 2"]


def mixed_wheres(keys: list[str]) -> list[str]:
    """WHEREs ANDing a conjunct on ``keys`` only with one reading more: answered from a state
    keyed by them, the first keeps whole groups of it, the second restricts the aggregates."""
    on = [f"({keys[0]}) IS NOT NULL", f"({keys[-1]}) IS NULL"] if keys else []
    on += [w for w in ("k1 <> 'c'", "k2 IN (0, 1, 2)") if w.split()[0] in keys]
    return [f"{a} AND ({b})" for a in on for b in ("v > 3", "v % 3 = 0 OR x < 0")]


@st.composite
def aggregate_view(draw, name: str, keys: list[str] | None = None, where: str | None = None,
                   family_keys: list[str] | None = None) -> str:
    """A view; with ``keys`` and ``where`` given, one of a family over the same input and
    grouping (views that share one state, unless the program turns sharing off).

    ``family_keys``: the family's finest grouping; a view may take COUNT(DISTINCT), MIN,
    MAX or a variance of one of them (a bag of a θ column of the shared state: its groups).
    """
    family = keys is not None
    if keys is None:
        n_keys = draw(st.integers(0, 2))
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=n_keys, max_size=n_keys, unique=True))
    aggs = draw(st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=4, unique=True))
    items = [f"{k} AS g{i}" for i, k in enumerate(keys)]
    # Unaliased aggregates are named as DuckDB names them (``count_star()``, ``sum(v)``).
    items += [a if draw(st.booleans()) else f"{a} AS a{i}" for i, a in enumerate(aggs)]
    if family_keys and draw(st.booleans()):
        of_key = draw(st.lists(st.sampled_from(
            [f"{f}{k})" for k in family_keys for f in ("COUNT(DISTINCT ", "MIN(", "MAX(")]
            + [f"VAR_POP({k})" for k in family_keys if k in ("k2", "k2 % 2", "d * 2")]),
            min_size=1, max_size=2, unique=True))
        items += [f"{a} AS ka{i}" for i, a in enumerate(of_key)]
    if draw(st.booleans()) and len(aggs) > 1:
        items.append("COUNT(*) * 2 + SUM(v) AS combo")
    # Grouping sets (a fifth of the grouped views): ROLLUP, CUBE or GROUPING SETS of the keys,
    # with GROUPING() among the items and first in ORDER BY (with the keys, a total order).
    sets = draw(st.sampled_from(["", "", "", "", "ROLLUP", "CUBE", "SETS"])) \
        if keys and not family else ""
    if sets:
        items.append(f"GROUPING({', '.join(keys)}) AS gg")
    sql = f"SELECT {', '.join(items)} FROM t"
    if where is None and not family and draw(st.booleans()):
        where = draw(st.sampled_from(WHERES))
    if where:
        sql += f" WHERE {where}"
    if sets == "SETS":
        listed = draw(st.sampled_from([[keys, []], [keys[:1], keys[1:], []], [keys]]))
        sql += " GROUP BY GROUPING SETS (" + ", ".join(f"({', '.join(s)})" for s in listed) + ")"
    elif sets:
        sql += f" GROUP BY {sets} ({', '.join(keys)})"
    elif keys:
        sql += f" GROUP BY {', '.join(keys)}"
    if draw(st.booleans()):
        sql += f" HAVING {draw(st.sampled_from(HAVINGS))}"
    if keys and draw(st.booleans()):
        # Ordering by every key makes the order total, as a LIMIT needs.
        order = ", ".join(([f"gg {draw(st.sampled_from(['ASC', 'DESC']))}"] if sets else []) +
                          [f"g{i} {draw(st.sampled_from(['ASC', 'DESC']))} NULLS FIRST"
                           for i in range(len(keys))])
        sql += f" ORDER BY {order}"
        if draw(st.booleans()):
            sql += f" LIMIT {draw(st.integers(1, 4))}"
    return f"CREATE VIEW {name} AS {sql};"


@st.composite
def plain_view(draw, name: str) -> str:
    cols = draw(st.lists(st.sampled_from(["k1", "k2", "v", "x", "d", "v + 1 AS v1", "x * 2",
                                          "upper(k1)"]),
                         min_size=1, max_size=4, unique=True))
    distinct = "DISTINCT " if draw(st.booleans()) else ""
    sql = f"SELECT {distinct}{', '.join(cols)} FROM t"
    if draw(st.booleans()):
        sql += f" WHERE {draw(st.sampled_from(WHERES))}"
    return f"CREATE VIEW {name} AS {sql};"


@st.composite
def programs(draw) -> tuple[str, bool]:
    append_only = draw(st.booleans()) and draw(st.booleans())  # a quarter of the programs
    if draw(st.booleans()):  # a family of views over one input and grouping (issue 18)
        n_keys = draw(st.integers(0, 2))
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=n_keys, max_size=n_keys, unique=True))
        where = draw(st.sampled_from(["", *WHERES]))
        views = []
        for i in range(draw(st.integers(2, 3))):
            own = keys
            if i and len(keys) == 2 and draw(st.booleans()):
                # a coarser grouping: under share = rollup, answered from the others' state
                own = [keys[draw(st.integers(0, 1))]]
            # a WHERE of its own: the view reads the shared state restricted to its rows
            mine = draw(st.sampled_from(["", *WHERES])) if i and draw(st.booleans()) else where
            views.append(draw(aggregate_view(f"v{i}", own, mine, keys)))
    else:
        views = [draw(aggregate_view(f"v{i}")) for i in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        views.append(draw(plain_view("p0")))
    header = "-- incr: buckets = 4\n" + ("-- incr: append_only = t\n" if append_only else "")
    # sharing on, off, and on with coarser groupings regrouped from finer states (BRR)
    header += draw(st.sampled_from(["", "-- incr: share = off\n", "-- incr: share = rollup\n"]))
    return header + TABLE + "\n" + "\n".join(views) + "\n", append_only


def random_row(rng: random.Random) -> dict:
    def maybe(value):
        return None if rng.random() < 0.12 else value

    # x is now and then 1e16: a DOUBLE sum or moment that kept it would be off by whole units
    # once it is deleted (live values are exact quarters, so DuckDB's own sum is exact then).
    return {"k1": maybe(rng.choice(["a", "b", "c", "d"])), "k2": maybe(rng.randint(0, 3)),
            "v": maybe(rng.randint(-5, 20)),
            "x": maybe(1e16 if rng.random() < 0.05 else rng.randint(-12, 40) / 4),
            "d": maybe(Decimal(rng.randint(-9999, 99999)) / 100),
            # ten days over a year's end: ISO weeks 52, 1 and 2, two years, two months
            "day": maybe(date(2026, 12, 26) + timedelta(days=rng.randint(0, 9)))}


def land(landing: Path, seq: int, rows: list[dict], delete: bool, fmt: str) -> None:
    folder = landing / "t" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    path = folder / f"{seq:04d}.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        path.write_text("".join(json.dumps({k: (str(v) if isinstance(v, (Decimal, date)) else v)
                                            for k, v in r.items()}) + "\n" for r in rows))


def apply_pending(data, new_pipeline: Callable[[], Pipeline], pipeline: Pipeline, tasks: bool,
                  last: bool) -> frozenset[str]:
    """Applies the landed batches with one ``incr run`` of ``pipeline`` (``tasks`` false) or
    as Airflow does: a prepare task, then one task per view in any order, each its own
    process (a ``new_pipeline()``).  Unless ``last``, some view tasks may be late: they catch up in the next
    call's, and views sharing a state then publish what other tasks' folds touched.
    Returns the late views (their answers are a batch behind)."""
    if not tasks:
        report = pipeline.run()
        assert report.rejected is None, str(report.rejected)
        for batch in report.applied:
            for m in batch.views:
                if pipeline.compiled.plan(m.view).answer.rollup is not None:
                    event(f"regrouped answer: {m.answer_mode}")
        return frozenset()
    event("per-view tasks")
    report = new_pipeline().prepare()
    assert report.rejected is None, str(report.rejected)
    views = [p.view for p in pipeline.compiled.plans]
    late = frozenset() if last else frozenset(data.draw(
        st.lists(st.sampled_from(views), unique=True, max_size=len(views) - 1),
        label="late tasks"))
    for view in data.draw(st.permutations(views), label="task order"):
        if view not in late:
            for m in new_pipeline().apply_view(view, report.ready_through):
                event(f"task's answer: {m.answer_mode} ({m.engine or 'no fold'})")
    return late


def leaving(rng: random.Random, compiled, steps: int) -> int | None:
    """Before which step (if any) a view leaves the program: views it shared a state with
    keep it (its aggregates in it, :mod:`incr.compiler.passes.share`), the others go on.
    Drawn from the rows' generator, so the examples Hypothesis draws stay the same."""
    if len(compiled.plans) < 2:
        return None
    return rng.choice([None, None, *range(1, steps)])


def without_view(rng: random.Random, text: str, compiled) -> str:
    """``text`` without one of its views (drawn; half the time one sharing a state)."""
    shared = [v for s in compiled.shares for v in s.views]
    gone = rng.choice(shared if shared and rng.random() < 0.5 else
                      [p.view for p in compiled.plans])
    event("a view leaves the program" + (" it shares a state in" if any(
        gone in s.views for s in compiled.shares) else ""))
    return "\n".join(line for line in text.split("\n")
                     if not line.startswith(f"CREATE VIEW {gone} AS ")) + "\n"


def check_all(compiled, warehouse: Path, live: list[dict], step: str,
              skip: frozenset[str] = frozenset()) -> None:
    source = pa.Table.from_pylist(live, schema=SCHEMA)
    for plan in compiled.plans:
        if plan.view in skip:
            continue
        answer, _ = read_answer(warehouse, plan)
        expected = oracle_answer(plan.select, {"t": source})
        diff = diff_answers(expected, answer, ordered=plan.ordered)
        assert diff is None, f"{step}, view {plan.view}:\n{plan.select}\n{diff}"


@pytest.mark.parametrize("seed", [0])
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=programs(), ops=st.lists(st.sampled_from(["insert", "insert", "delete", "wipe"]),
                                        min_size=2, max_size=5), data=st.data())
def test_answers_equal_oracle_after_every_batch(spark, tmp_path_factory, seed, program, ops, data):
    run_and_check(spark, tmp_path_factory, program, ops, data)


@st.composite
def rollup_programs(draw, rollup_only: bool = False) -> tuple[str, bool]:
    """A family over one input grouped by two keys and by each alone (BRR; CMORR when both
    coarser groupings are there) or by a function of one (:data:`DERIVED`, with or without
    the other key), mostly under ``share = rollup``, its twin under ``off`` (always rollup
    with ``rollup_only``)."""
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=2, max_size=2, unique=True))
    where = draw(st.sampled_from(["", *WHERES]))
    derived = [g for i, k in enumerate(keys) for f in DERIVED[k]
               for g in ([f], [keys[1 - i], f])]
    # more keys than the finer grouping, each computed from it: that state is still the finer
    derived += [[keys[1 - i], *DERIVED[k]] for i, k in enumerate(keys) if len(DERIVED[k]) > 1]
    groupings = [keys, *draw(st.lists(st.sampled_from([keys, keys[:1], keys[1:], *derived]),
                                      min_size=1, max_size=3))]
    if draw(st.booleans()):  # a coarser view first: it creates the finer state, regrouped
        groupings = groupings[1:] + groupings[:1]
    # now and then a view with a WHERE of its own: restricted to its rows, then regrouped;
    # one on the finer keys only keeps whole finer groups, regrouped without adding to the state
    # and one ANDing such a WHERE with another does so with the first, restricted by the other
    on_keys = [f"{k} IS NOT NULL" for k in keys] + [f"{keys[1]} IS NULL"]
    on_keys += mixed_wheres(keys)
    views = [draw(aggregate_view(f"v{i}", g, draw(st.sampled_from(["", *WHERES, *on_keys]))
                                 if i and draw(st.booleans()) else where, keys))
             for i, g in enumerate(groupings)]
    append_only = draw(st.booleans()) and draw(st.booleans())
    header = "-- incr: buckets = 4\n" + ("-- incr: append_only = t\n" if append_only else "")
    header += draw(st.sampled_from(["-- incr: share = rollup\n"] * 3
                                   + ([] if rollup_only else ["-- incr: share = off\n"])))
    return header + TABLE + "\n" + "\n".join(views) + "\n", append_only


@st.composite
def restricted_programs(draw, same_rest: bool = False) -> tuple[str, bool]:
    """A family over one input and grouping whose views each have a WHERE of their own (or
    none), two of them at least different: one state of the rows any of them reads, each
    view restricted to its own (sharing on; rollup, or off as the twin).

    ``same_rest``: always WHEREs of one conjunct off the keys, ANDed with different ones on
    them or alone, and sharing on or rollup.
    """
    n_keys = draw(st.integers(1 if same_rest else 0, 2))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=n_keys, max_size=n_keys, unique=True))
    # WHEREs on the GROUP BY keys only (of any type) read the view's groups of the state;
    # ANDed with others, those restrict the aggregates and the first the groups
    on_keys = [f"{k} IS NOT NULL" for k in keys] + [f"{k} IS NULL" for k in keys[:1]]
    on_keys += draw(st.lists(st.sampled_from(mixed_wheres(keys)), max_size=2)) if keys else []
    pool = ["", *WHERES, *on_keys]
    if keys and (same_rest or draw(st.integers(0, 3)) == 0):
        # one conjunct off the keys, ANDed with different ones on them or alone: the state
        # reads its rows, and each view its groups of it, its aggregates unrestricted
        rest = draw(st.sampled_from(["v > 3", "v % 3 = 0 OR x < 0"]))
        pool = [rest, *(w for w in mixed_wheres(keys) if w.endswith(f"({rest})"))]
    wheres = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=3, unique=True))
    views = [draw(aggregate_view(f"v{i}", keys, w, keys)) for i, w in enumerate(wheres)]
    append_only = draw(st.booleans()) and draw(st.booleans())
    header = "-- incr: buckets = 4\n" + ("-- incr: append_only = t\n" if append_only else "")
    header += draw(st.sampled_from(["", "", "-- incr: share = rollup\n",
                                    *([] if same_rest else ["-- incr: share = off\n"])]))
    return header + TABLE + "\n" + "\n".join(views) + "\n", append_only


@settings(max_examples=max(EXAMPLES // 2, 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=restricted_programs(), ops=st.lists(
    st.sampled_from(["insert", "insert", "delete", "wipe"]), min_size=2, max_size=4),
    data=st.data())
def test_views_with_their_own_wheres_equal_oracle_after_every_batch(spark, tmp_path_factory,
                                                                    program, ops, data):
    """Views of one grouping with different WHEREs, sharing one state each restricted to its
    own rows (aggregates of CASE WHEN, groups by a count), equal DuckDB after every batch:
    MIN, MAX and COUNT(DISTINCT) under deletes, HAVING, ORDER BY/LIMIT, global aggregates
    over none of their rows."""
    run_and_check(spark, tmp_path_factory, program, ops, data)


@settings(max_examples=max(EXAMPLES // 4, 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=restricted_programs(same_rest=True), ops=st.lists(
    st.sampled_from(["insert", "insert", "delete"]), min_size=2, max_size=4), data=st.data())
def test_views_whose_wheres_differ_by_conjuncts_on_their_keys_equal_oracle_after_every_batch(
        spark, tmp_path_factory, program, ops, data):
    """Views whose WHEREs AND one conjunct off their GROUP BY keys with different ones on
    them (or have it alone) share a state of that conjunct's rows and read its aggregates
    unrestricted, each its groups of it: they equal DuckDB after every batch, deletes of
    rows no view keeps included."""
    run_and_check(spark, tmp_path_factory, program, ops, data)


@settings(max_examples=max(EXAMPLES // 2, 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=rollup_programs(), ops=st.lists(st.sampled_from(["insert", "insert", "delete"]),
                                               min_size=2, max_size=4), data=st.data())
def test_regrouped_views_equal_oracle_after_every_batch(spark, tmp_path_factory, program, ops,
                                                        data):
    """Views answered from a finer grouping's state (issue 18's BRR and CMORR) equal DuckDB
    after every batch, MIN, MAX and COUNT(DISTINCT) under deletes included."""
    run_and_check(spark, tmp_path_factory, program, ops, data)


#: Regrouped answers by change whenever the touched groups are no more than the answer's
#: rows, with deletion vectors (answers and state) or copying the files a MERGE touches; or
#: always rewritten, by the driver from the finer state's files once it holds more rows than
#: the driver does (INCR_LOCAL_STATE_ROWS 4).
REGROUPED_CONFIGS = (
    Settings(answer_merge_reach=1.0, state_vector_rows=0, answer_rewrite_rows=0),
    Settings(answer_merge_reach=1.0, answer_deletion_vectors=False, state_deletion_vectors=False,
             answer_rewrite_rows=0),
    # rewritten, from the finer state's files once it holds more than the driver does
    Settings(answer_merge_reach=0.0, state_vector_rows=0, local_state_rows=4),
)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=rollup_programs(rollup_only=True),
       ops=st.lists(st.sampled_from(["insert", "insert", "delete"]), min_size=3, max_size=6),
       data=st.data())
def test_regrouped_answers_by_change_equal_oracle_after_every_batch(spark, tmp_path_factory,
                                                                    program, ops, data):
    """Views regrouped from a finer state whose answers follow by change (the coarse groups
    a batch touched, recomputed from their rows of the finer state, in every bucket) equal
    DuckDB after every batch, deletes included."""
    run_and_check(spark, tmp_path_factory, program, ops, data, configs=REGROUPED_CONFIGS)


SUBSTRINGS = ("-- incr: buckets = 4\n" + TABLE + """
CREATE VIEW parts AS SELECT substr(k1 || 'xyz', k2 - 1, k2 - 2) AS part, substr(k1, 0, 2) AS head,
    substring(k1 || 'xyz', 3, -2) AS back, COUNT(*) AS n, SUM(v) AS s
  FROM t GROUP BY substr(k1 || 'xyz', k2 - 1, k2 - 2), substr(k1, 0, 2), substring(k1 || 'xyz', 3, -2);
""", False)


@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.just(SUBSTRINGS),
       ops=st.lists(st.sampled_from(["insert", "delete"]), min_size=3, max_size=4), data=st.data())
def test_substrings_from_any_start_equal_oracle_after_every_batch(spark, tmp_path_factory,
                                                                  program, ops, data):
    """Substrings from a start of 0, of a negative length, and from a start and of a length
    that rows compute (0 and negative among them) take DuckDB's characters, on the driver
    and in Spark."""
    run_and_check(spark, tmp_path_factory, program, ops, data)


#: Under share = rollup, ``top``, ``filtered`` and ``flags`` keep one state by (k1, k2), the
#: last two regrouping it (by k1; by k2 % 2 and upper(k1)): the written-out counts and CASEs
#: of the shorthand regrouped from a finer state (seed 003's BRR).
SHORTHAND = ("-- incr: buckets = 4\n-- incr: share = rollup\n" + TABLE + """
CREATE VIEW filtered AS SELECT k1, COUNT(*) FILTER (WHERE v > 3) AS big, SUM(x) FILTER (WHERE k2 <> 1), \
COUNT(DISTINCT k2) FILTER (WHERE x > 0) AS kinds, MIN(d) FILTER (v % 2 = 0) AS low, bool_or(v > 15), \
bool_and(x >= 0) AS all_positive FROM t GROUP BY ALL;
CREATE VIEW flags AS SELECT k2 % 2 AS odd, upper(k1) AS k, \
bool_and(v > 0) FILTER (WHERE x IS NOT NULL) AS pos, COUNT(*) AS n, count_if(x > 2), \
mean(v) AS mv FROM t GROUP BY ALL HAVING bool_or(v > 10);
CREATE VIEW overall AS SELECT 'all' AS label, bool_or(k1 = 'a') AS any_a, \
COUNT(*) FILTER (WHERE day >= DATE '2026-12-30') AS late FROM t GROUP BY ALL;
CREATE VIEW top AS SELECT k1, k2, COUNT(*) AS n FROM t GROUP BY ALL ORDER BY ALL DESC NULLS FIRST LIMIT 3;
CREATE VIEW seen AS SELECT k1, v, bool_or(x > 5) OVER (PARTITION BY k1 ORDER BY v) AS seen FROM t;
""", False)


@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=st.just(SHORTHAND),
       ops=st.lists(st.sampled_from(["insert", "delete"]), min_size=3, max_size=4), data=st.data())
def test_aggregate_shorthand_equals_oracle_after_every_batch(spark, tmp_path_factory, program,
                                                            ops, data):
    """FILTER (WHERE ...), bool_or, bool_and (as aggregates, under HAVING, as a window),
    count_if, mean, GROUP BY ALL (a constant no key: one row over no rows) and ORDER BY ALL,
    written out as counts, CASEs and positions, equal DuckDB's own after every batch, groups
    whose every value is NULL or filtered out included."""
    run_and_check(spark, tmp_path_factory, program, ops, data)


def run_and_check(spark, tmp_path_factory, program: tuple[str, bool], ops: list[str],
                  data, configs: tuple[Settings, ...] = ANSWER_CONFIGS) -> None:
    """Runs ``program`` over random batches (``ops``), each view against DuckDB after each;
    the answers' settings are drawn from ``configs``."""
    text, append_only = program
    compiled = compile_text(text, path="equivalence.sql", name="equivalence")
    root = tmp_path_factory.mktemp("equiv")
    landing, warehouse = root / "landing", root / "warehouse"
    # The driver-side path (DuckDB + our Spark hash) for every batch, none, or only the
    # small ones: mixing the paths checks their buckets and fingerprints agree.
    local_rows = data.draw(st.sampled_from([0, 8, 200_000]), label="local rows")
    # Answers by change (a MERGE of the touched groups, a top-k from its old rows) always,
    # when it pays, or never (rewritten whole).
    config = data.draw(st.sampled_from(configs), label="answers")

    def new_pipeline() -> Pipeline:
        return Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows,
                        config=config)

    pipeline = new_pipeline()
    tasks = data.draw(st.booleans(), label="per-view tasks")  # as Airflow runs them
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="rows seed"))
    live: list[dict] = []
    leaves = leaving(rng, compiled, len(ops) + 1)
    for seq, op in enumerate(["insert", *ops]):
        if seq == leaves:
            text = without_view(rng, text, compiled)
            compiled = compile_text(text, path="equivalence.sql", name="equivalence")
            pipeline = new_pipeline()
        fmt = rng.choice(["csv", "jsonl", "parquet"])
        if op == "insert" or append_only or not live:
            rows = [random_row(rng) for _ in range(rng.randint(0, 14))]
            live += rows
            land(landing, seq, rows, delete=False, fmt=fmt)
        else:
            gone = set(range(len(live))) if op == "wipe" else set(
                rng.sample(range(len(live)), k=rng.randint(1, len(live))))
            land(landing, seq, [live[i] for i in sorted(gone)], delete=True, fmt=fmt)
            live = [r for i, r in enumerate(live) if i not in gone]
        event(f"{'append-only' if append_only else 'deletable'} source, {op} batch")
        event(f"views sharing state: {sum(len(s.views) for s in compiled.shares)}")
        event(f"views regrouped from a finer state: {sum(len(s.rolled) for s in compiled.shares)}")
        event(f"views restricted to their own WHERE: "
              f"{sum(len(s.restricted) for s in compiled.shares)}")
        event(f"of them by a WHERE on their GROUP BY keys: "
              f"{sum(len(s.keyed) for s in compiled.shares)}")
        event(f"views regrouping the state's rows their WHERE keeps: "
              f"{sum(len(s.sifted) for s in compiled.shares)}")
        event(f"of those two, with conjuncts off the keys too: "
              f"{sum(len(s.parted) for s in compiled.shares)}")
        event(f"of them, conjuncts that are the state's WHERE (aggregates unrestricted): "
              f"{sum(r == s.where for s in compiled.shares for _, r in s.parted)}")
        event(f"views regrouped by a function of the finer keys: "
              f"{sum(bool(p.answer.rollup and p.answer.rollup.derived) for p in compiled.plans)}")
        event(f"driver-side path for batches of at most {local_rows} rows")
        late = apply_pending(data, new_pipeline, pipeline, tasks, last=seq == len(ops))
        check_all(compiled, warehouse, live, f"after batch {seq} ({op}, {fmt})", skip=late)


# -- joins: several streaming sources, inserts and deletes on each -------------------------------

JOIN_TABLES = """CREATE TABLE a (k BIGINT, g VARCHAR, x DOUBLE);
CREATE TABLE b (k BIGINT, v BIGINT, h VARCHAR);
CREATE TABLE c (h VARCHAR, w BIGINT);"""
JOIN_SCHEMAS = {
    "a": pa.schema([("k", pa.int64()), ("g", pa.string()), ("x", pa.float64())]),
    "b": pa.schema([("k", pa.int64()), ("v", pa.int64()), ("h", pa.string())]),
    "c": pa.schema([("h", pa.string()), ("w", pa.int64())]),
}
JOIN_FROMS = [
    ("FROM a JOIN b ON a.k = b.k", ("a", "b")),
    ("FROM a AS l INNER JOIN b AS r ON l.k = r.k AND r.v > 2", ("a", "b")),
    ("FROM b JOIN a ON a.k = b.k JOIN c ON b.h = c.h", ("a", "b", "c")),
    ("FROM a JOIN b ON a.x >= b.v AND a.x < b.v + 2", ("a", "b")),  # a band join
    ("FROM a CROSS JOIN b", ("a", "b")),
    ("FROM a JOIN b ON a.k = b.k + 1 AND a.k * 2 = b.v", ("a", "b")),  # computed keys
]
JOIN_KEYS = ["g", "h", "k % 2"]
JOIN_AGGS = ["COUNT(*)", "SUM(v)", "SUM(x * v)", "AVG(x)", "MIN(v)", "MAX(x)",
             "COUNT(DISTINCT v)", "STDDEV_SAMP(v)"]
JOIN_WHERES = ["x > 1", "g <> 'q'", "v % 2 = 0"]


@st.composite
def join_programs(draw) -> str:
    from_, tables = draw(st.sampled_from(JOIN_FROMS))
    keys = [k for k in draw(st.lists(st.sampled_from(JOIN_KEYS), max_size=2, unique=True))
            if k != "h" or "c" not in tables]  # h is ambiguous in the three-way join
    aggs = list(draw(st.lists(st.sampled_from(JOIN_AGGS), min_size=1, max_size=3, unique=True)))
    if "c" in tables:
        aggs.append("SUM(w)")
    qualify = {"g": "g", "k % 2": "b.k % 2" if "AS l" not in from_ else "r.k % 2", "h": "h"}
    items = [f"{qualify[k]} AS g{i}" for i, k in enumerate(keys)]
    # Sometimes the first aggregate is named like an input column (b.v) and ordered by:
    # in ORDER BY the output name wins, as in DuckDB.
    shadow = draw(st.booleans())
    items += [f"{a} AS v" if shadow and i == 0 else a if draw(st.booleans()) else f"{a} AS a{i}"
              for i, a in enumerate(aggs)]
    sql = f"SELECT {', '.join(items)} {from_}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(st.sampled_from(JOIN_WHERES))}"
    if keys:
        sql += " GROUP BY " + ", ".join(qualify[k] for k in keys)
    if shadow:
        sql += " ORDER BY " + ", ".join(["v DESC", *(f"g{i}" for i in range(len(keys)))]) + " LIMIT 4"
    views = [f"CREATE VIEW j0 AS {sql};"]
    if draw(st.booleans()):  # the same join and grouping under other aggregates: one state
        # whose side tables keep the columns either view reads
        more = draw(st.lists(st.sampled_from(JOIN_AGGS), min_size=1, max_size=2, unique=True))
        twin = sql.split(" FROM ", 1)[1].split(" ORDER BY ")[0]
        if draw(st.booleans()):  # a WHERE of its own: it reads the state restricted to its rows
            own_where = draw(st.sampled_from(["", *JOIN_WHERES]))
            body, _, grouped = twin.partition(" GROUP BY ")
            body = body.split(" WHERE ")[0] + (f" WHERE {own_where}" if own_where else "")
            twin = body + (f" GROUP BY {grouped}" if grouped else "")
        own = keys
        if len(keys) == 2 and draw(st.booleans()):  # coarser: regrouped under share = rollup
            own = keys[1:]
            twin = twin.replace(" GROUP BY " + ", ".join(qualify[k] for k in keys),
                                " GROUP BY " + qualify[own[0]])
        listed = [f"{qualify[k]} AS g{i}" for i, k in enumerate(own)] + \
            [f"{a} AS m{i}" for i, a in enumerate(more)]
        views.append(f"CREATE VIEW j2 AS SELECT {', '.join(listed)} FROM {twin};")
    if draw(st.booleans()):
        plain_from = "FROM a JOIN b ON a.k = b.k"
        views.append(f"CREATE VIEW j1 AS SELECT g, v, x {plain_from} WHERE v > 0;")
    share = draw(st.sampled_from(["", "-- incr: share = off\n", "-- incr: share = rollup\n"]))
    return "-- incr: buckets = 2\n" + share + JOIN_TABLES + "\n" + "\n".join(views) + "\n"


def land_join_batch(rng: random.Random, landing: Path, table: str, op: str, seq: int,
                    live: dict[str, list[dict]]) -> str:
    """Lands batch ``seq`` of ``table`` as CSV and updates ``live``; returns the op landed.

    A delete removes a random non-empty subset of the live rows; a delete with nothing live,
    or an insert, lands 0-8 random rows as an insert.
    """
    deleting = op == "delete" and bool(live[table])
    folder = landing / table / ("_deletes" if deleting else "")
    folder.mkdir(parents=True, exist_ok=True)
    if deleting:
        gone = set(rng.sample(range(len(live[table])), k=rng.randint(1, len(live[table]))))
        rows = [live[table][i] for i in sorted(gone)]
        live[table] = [r for i, r in enumerate(live[table]) if i not in gone]
    else:
        rows = [random_join_row(rng, table) for _ in range(rng.randint(0, 8))]
        live[table] += rows
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=JOIN_SCHEMAS[table]),
                    folder / f"{seq:04d}.csv")
    return "delete" if deleting else "insert"


def random_join_row(rng: random.Random, table: str) -> dict:
    def maybe(value):
        return None if rng.random() < 0.1 else value

    if table == "a":
        return {"k": maybe(rng.randint(0, 4)), "g": maybe(rng.choice("pqr")),
                "x": maybe(rng.randint(-4, 12) / 4)}
    if table == "b":
        return {"k": maybe(rng.randint(0, 4)), "v": maybe(rng.randint(-3, 9)),
                "h": maybe(rng.choice(["m", "n"]))}
    return {"h": maybe(rng.choice(["m", "n", "o"])), "w": maybe(rng.randint(0, 5))}


@settings(max_examples=max(EXAMPLES // 2, 3), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(text=join_programs(), steps=st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["insert", "insert", "delete"])),
    min_size=3, max_size=7), data=st.data())
def test_join_answers_equal_oracle_after_every_batch(spark, tmp_path_factory, text, steps, data):
    compiled = compile_text(text, path="joins.sql", name="joins")
    event(f"join views regrouped from a finer state: "
          f"{sum(len(s.rolled) for s in compiled.shares)}")
    event(f"join views restricted to their own WHERE: "
          f"{sum(len(s.restricted) for s in compiled.shares)}")
    root = tmp_path_factory.mktemp("join")
    landing, warehouse = root / "landing", root / "warehouse"
    # Δ of the join on the driver (DuckDB over the side tables), in Spark, or mixed.
    local_rows = data.draw(st.sampled_from([0, 5, 200_000]), label="local rows")
    # Answers by change (a MERGE of the touched groups, a top-k from its old rows) always,
    # when it pays, or never (rewritten whole).
    config = data.draw(st.sampled_from(ANSWER_CONFIGS), label="answers")

    def new_pipeline() -> Pipeline:
        return Pipeline(compiled, landing, warehouse, spark=spark, local_rows=local_rows,
                        config=config)

    pipeline = new_pipeline()
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="rows seed"))
    live: dict[str, list[dict]] = {t: [] for t in JOIN_SCHEMAS}
    read = {s for plan in compiled.plans for s in plan.sources}
    landed: set[str] = set()
    # Batches of several tables pending at once are folded as one step (Pipeline._group):
    # sometimes a run comes after every batch, sometimes after a few.
    grouped = data.draw(st.booleans(), label="several batches per run")
    tasks = data.draw(st.booleans(), label="per-view tasks")  # as Airflow runs them
    todo = [s for s in steps if s[0] in read]
    ops: list[str] = []
    leaves = leaving(rng, compiled, len(todo))
    for seq, (table, wanted) in enumerate(todo):
        if seq == leaves:
            text = without_view(rng, text, compiled)
            compiled = compile_text(text, path="joins.sql", name="joins")
            pipeline = new_pipeline()
        op = land_join_batch(rng, landing, table, wanted, seq, live)
        ops.append(f"{op} on {table}")
        landed.add(table)
        event(f"{op} batch on {table}")
        if grouped and seq < len(todo) - 1 and rng.random() < 0.6:
            continue
        late = apply_pending(data, new_pipeline, pipeline, tasks, last=seq == len(todo) - 1)
        check_join_answers(compiled, warehouse, live, landed, f"after batch {seq} ({'; '.join(ops)})",
                           skip=late)
        ops = []


def check_join_answers(compiled, warehouse: Path, live: dict[str, list[dict]], landed: set[str],
                       when: str, skip: frozenset[str] = frozenset()) -> None:
    """Every view's answer table against DuckDB over the live rows of the join tables.

    A view none of whose tables has had a batch yet has no answer table, and is skipped.  (A
    table the view names but provably never needs, e.g. always NULL-padded, is not read.)
    """
    sources = {t: pa.Table.from_pylist(r, schema=JOIN_SCHEMAS[t]) for t, r in live.items()}
    for plan in compiled.plans:
        if plan.view in skip or not landed & {t.lower() for t in plan.sources}:
            continue
        answer, _ = read_answer(warehouse, plan)
        diff = diff_answers(oracle_answer(plan.select, sources), answer, ordered=plan.ordered)
        assert diff is None, f"{when}, view {plan.view}:\n{plan.select}\n{diff}"
