"""The correctness oracle: DuckDB running a view's own SQL over all rows applied so far.

It shares nothing with the incremental path but the program text: no IR, no state, no
Spark.  Tests and ``make demo`` compare every answer table with it (DESIGN §5).

Comparison follows the contract (DESIGN §2): integers, strings and decimals must be equal
exactly; floating point within 1e-9 relative; a TIMESTAMP as an instant (DuckDB's without a
zone read in UTC, the zone of incr's sessions); row order is ignored unless the view has an
ORDER BY, in which case rows must come in the same order (so views compared in order
must order by keys that make the order total, as a LIMIT needs anyway).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa

REL_TOL = 1e-9
ABS_TOL = 1e-9


def connect() -> Any:
    """A DuckDB connection that answers the SQL a view is written in, as SQL defines it.

    DuckDB 1.5.6's ``deliminator`` optimizer loses rows of a correlated ``[NOT] EXISTS``
    whose correlation holds more than one non-equality (``c.h <> b.h AND c.w > b.v``): it
    answers ``NOT EXISTS`` true where ``COUNT(*)`` of the same subquery is 2.  DuckDB 2.0
    answers it right, and so does 1.5.6 with that optimizer off (the same answers on 300
    random tables with NULLs), so the oracle runs with it off.  Only plans change, not
    semantics.

    Division by zero is NULL, as SQL and DuckDB before 1.1 have it (``SET
    ieee_floating_point_ops = false``; 1.5.6 answers ±Infinity or NaN by default), and as
    incr computes it: an infinity in a maintained SUM could not be taken back out by a
    delete (``inf - inf`` is NaN), so no incremental answer could keep one exactly.
    """
    import duckdb

    con = duckdb.connect()
    con.execute("SET disabled_optimizers = 'deliminator'")
    con.execute("SET ieee_floating_point_ops = false")
    return con


def oracle_answer(select: str, tables: Mapping[str, pa.Table]) -> pa.Table:
    """Runs ``select`` (DuckDB SQL) over the given source tables."""
    con = connect()
    try:
        for name, data in tables.items():
            con.register(f"__incr_{name}", data)
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM "__incr_{name}"')
        return con.execute(select).fetch_arrow_table()
    finally:
        con.close()


def oracle_iterate(plan, tables: Mapping[str, pa.Table], iterations: int | None = None) -> pa.Table:
    """An iterative view's answer from scratch: INITIAL, then the STEP ``iterations`` times.

    ``iterations`` defaults to the view's ITERATIONS; the step reads the previous iterate
    under the view's name.
    """
    it = plan.iteration
    n = it.iterations if iterations is None else iterations
    name = f'"{it.name}"'
    cols = ", ".join(f'"{c.name}" {c.type}' for c in it.columns)
    con = connect()
    try:
        for table, data in tables.items():
            con.register(f"__incr_{table}", data)
            con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM "__incr_{table}"')
        con.execute(f"CREATE TABLE {name} ({cols})")
        con.execute(f"INSERT INTO {name} SELECT * FROM ({it.initial_written})")
        for _ in range(n):
            con.execute(f"CREATE TABLE __incr_next ({cols})")
            con.execute(f"INSERT INTO __incr_next SELECT * FROM ({plan.select})")
            con.execute(f"DROP TABLE {name}")
            con.execute(f"ALTER TABLE __incr_next RENAME TO {name}")
        return con.execute(f"SELECT * FROM {name}").fetch_arrow_table()
    finally:
        con.close()


def live_rows(inserted: Sequence[pa.Table], deleted: Sequence[pa.Table],
              schema: pa.Schema) -> pa.Table:
    """The bag of rows inserted minus the bag deleted (each deleted row removes one copy)."""
    import duckdb

    con = duckdb.connect()
    try:
        empty = schema.empty_table()
        ins = pa.concat_tables([t.select(schema.names).cast(schema) for t in inserted] or [empty])
        dels = pa.concat_tables([t.select(schema.names).cast(schema) for t in deleted] or [empty])
        con.register("ins", ins)
        con.register("dels", dels)
        return con.execute("SELECT * FROM ins EXCEPT ALL SELECT * FROM dels").fetch_arrow_table()
    finally:
        con.close()


def _normal(v: Any) -> Any:
    if isinstance(v, Decimal):
        return v
    if isinstance(v, datetime.datetime) and v.tzinfo is not None:
        # an instant (Spark's TIMESTAMP) against DuckDB's TIMESTAMP without a zone, which
        # incr reads in UTC, the zone of its sessions (``date_trunc`` of a DATE is one)
        return v.astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return v


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        try:
            fa, fb = float(a), float(b)
        except (TypeError, ValueError):
            return False
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return math.isclose(fa, fb, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return Decimal(str(a)) == Decimal(str(b))
    return a == b


def _sort_key(row: tuple) -> tuple:
    # None sorts first; floats are rounded so that near-equal values sort together.
    out = []
    for v in row:
        if v is None:
            out.append((0, ""))
        elif isinstance(v, float):
            out.append((1, round(v, 6)))
        elif isinstance(v, (int, Decimal)):
            out.append((1, float(v)))
        else:
            out.append((2, str(v)))
    return tuple(out)


def diff_answers(expected: pa.Table, actual: pa.Table, ordered: bool = False) -> str | None:
    """None when the answers agree under the contract, else a description of the first difference."""
    if [c.lower() for c in expected.column_names] != [c.lower() for c in actual.column_names]:
        return f"columns differ: expected {expected.column_names}, got {actual.column_names}"
    if expected.num_rows != actual.num_rows:
        return (f"row counts differ: expected {expected.num_rows}, got {actual.num_rows}\n"
                f"expected: {expected.to_pylist()[:10]}\nactual:   {actual.to_pylist()[:10]}")
    exp_rows = [tuple(_normal(v) for v in r.values()) for r in expected.to_pylist()]
    act_rows = [tuple(_normal(v) for v in r.values()) for r in actual.to_pylist()]
    if not ordered:
        exp_rows.sort(key=_sort_key)
        act_rows.sort(key=_sort_key)
    for i, (e, a) in enumerate(zip(exp_rows, act_rows)):
        if len(e) != len(a) or not all(_close(x, y) for x, y in zip(e, a)):
            return f"row {i}: expected {e}, got {a}"
    return None
