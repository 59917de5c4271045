"""The driver-side path: the compiler's Spark SQL run by DuckDB over Arrow, for small inputs.

A 10K-row increment costs Spark several jobs of ~0.1 s each (plan, schedule, collect), far
more than the work; DuckDB computes the same h over the same rows in milliseconds.  So when
the rows involved are few (a batch of at most ``max_rows``, state and side tables of at most
``max_state_rows``), the fold of a batch (Δ of a join against the side tables, h, the side
tables' h: :class:`LocalFold`) and a(state) run here instead, and only where the result is
*provably the same*:

* The SQL is the one the compiler wrote for Spark, transpiled by sqlglot.  Only a small set of
  constructs is accepted (columns, literals, arithmetic, comparisons, CASE, COALESCE, numeric
  casts, SUM/COUNT/MIN/MAX/AVG/VAR_POP, joins, grouping, ordering); anything else (a string
  or date function, a cast to text) returns None and the caller uses Spark, whose semantics
  for those the rest of the system is built on.
* ``_bucket`` is Spark's ``pmod(xxhash64(θ), n)``; it is computed by
  :mod:`incr.runtime.sparkhash`, bit for bit, after the query.
* The result is cast to the schema Spark gave the same table (the state table, or the
  answer table already published), so types never drift between the two paths.  A value
  that does not fit (an overflowing sum) also returns None: Spark then decides.

Floating-point sums may differ from Spark's in the last bits (a different summation order,
as between two Spark runs with different partitioning).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
import sqlglot
from sqlglot import exp

from incr.runtime import sparkhash

DEFAULT_MAX_ROWS = 200_000
DEFAULT_MAX_STATE_ROWS = 1_000_000

_ALLOWED = (
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Join, exp.Subquery, exp.Table, exp.TableAlias, exp.Alias, exp.Column, exp.Identifier,
    exp.Star, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Union, exp.Distinct,
    exp.Add, exp.Sub, exp.Mul, exp.Div, exp.SafeDivide, exp.Neg, exp.Abs,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.And, exp.Or, exp.Not, exp.Is, exp.Case, exp.If, exp.Coalesce,
    exp.Sum, exp.Count, exp.Min, exp.Max, exp.Avg, exp.VariancePop, exp.Sqrt,
    exp.Cast, exp.TryCast, exp.DataType,
    # a signed change set as plain rows: LATERAL VIEW explode(sequence(1, abs(_w)))
    exp.Lateral, exp.Explode, exp.GenerateSeries, exp.Unnest,
)
_NUMERIC = {exp.DataType.Type.BIGINT, exp.DataType.Type.INT, exp.DataType.Type.SMALLINT,
            exp.DataType.Type.TINYINT, exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT,
            exp.DataType.Type.DECIMAL}


@dataclass(frozen=True)
class Prepared:
    """A Spark query as DuckDB runs it, and how to fill in ``_bucket`` afterwards."""

    sql: str
    bucket: tuple[str, tuple[str, ...], int] | None = None  # (output column, θ columns, n)


def _bucket_call(node: exp.Expression) -> tuple[tuple[str, ...], int] | None:
    """θ and n of ``CAST(pmod(xxhash64(θ…), n) AS INT)``, or None for anything else."""
    if not isinstance(node, (exp.Cast, exp.TryCast)) or not node.to.is_type(exp.DataType.Type.INT):
        return None
    pmod = node.this
    if not (isinstance(pmod, exp.Anonymous) and pmod.name.lower() == "pmod"
            and len(pmod.expressions) == 2):
        return None
    call, count = pmod.expressions
    if not (isinstance(call, exp.Anonymous) and call.name.lower() == "xxhash64"
            and isinstance(count, exp.Literal) and not count.is_string
            and all(isinstance(c, exp.Column) and not c.table for c in call.expressions)):
        return None
    return tuple(c.name for c in call.expressions), int(count.this)


@lru_cache(maxsize=512)
def prepare(spark_sql: str) -> Prepared | None:
    """The DuckDB form of ``spark_sql``, or None when it uses anything outside the safe set."""
    try:
        tree = sqlglot.parse_one(spark_sql, read="spark")
    except sqlglot.errors.ParseError:
        return None
    bucket = None
    if isinstance(tree, exp.Select):
        for i, proj in enumerate(tree.expressions):
            if isinstance(proj, exp.Alias) and (found := _bucket_call(proj.this)) is not None:
                if bucket is not None:
                    return None
                bucket = (proj.alias, *found)
                tree.expressions[i].set("this", exp.cast(exp.Literal.number(0), "INT"))
    for node in tree.walk():
        if not isinstance(node, _ALLOWED):
            return None
        if isinstance(node, (exp.Cast, exp.TryCast)) and node.to.this not in _NUMERIC:
            return None
    if bucket is not None and not all(c in tree.named_selects for c in bucket[1]):
        return None
    return Prepared(tree.sql(dialect="duckdb"), bucket)


class NotLocal(Exception):
    """A step of a driver-side fold that only Spark may run; the fold starts over in Spark."""


class LocalSql:
    """One DuckDB connection that runs prepared queries over registered Arrow tables."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS,
                 max_state_rows: int = DEFAULT_MAX_STATE_ROWS):
        import duckdb

        self.max_rows = max_rows
        self.max_state_rows = max_state_rows
        self._con = duckdb.connect()
        self._con.execute("SET threads TO 2")
        self.queries = 0  # how many ran here (tests and benchmarks read it)

    def query(self, spark_sql: str, tables: dict[str, pa.Table],
              schema: pa.Schema) -> pa.Table | None:
        """Runs ``spark_sql`` over ``tables`` (name → rows), cast to ``schema``; None: use Spark."""
        fold = self.session()
        try:
            for name, data in tables.items():
                fold.table(name, data)
            return fold.collect(spark_sql, schema)
        except NotLocal:
            return None
        finally:
            fold.close()

    def session(self) -> LocalFold:
        """A fold's worth of named tables and views on this connection (see :class:`LocalFold`)."""
        return LocalFold(self)

    def _run(self, spark_sql: str, schema: pa.Schema) -> pa.Table | None:
        import duckdb

        prepared = prepare(spark_sql)
        if prepared is None:
            return None
        try:
            result = self._con.execute(prepared.sql).to_arrow_table()
        except duckdb.Error:
            return None
        if sorted(result.column_names) != sorted(schema.names):
            return None
        try:
            out = pa.table([result[f.name].cast(f.type) for f in schema], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        if prepared.bucket is not None:
            # Hashed after the cast: Spark hashes its own types (an INT and a BIGINT of the
            # same value hash differently), and DuckDB may have widened a key expression.
            column, theta, count = prepared.bucket
            try:
                values = sparkhash.buckets([out[c] for c in theta], count)
            except sparkhash.UnsupportedType:
                return None
            index = out.schema.get_field_index(column)
            out = out.set_column(index, schema.field(index), values.cast(schema.field(index).type))
        self.queries += 1
        return out


class LocalFold:
    """The tables and views of one driver-side fold, mirroring the temp views Spark would get.

    The runtime registers the batch and the state it reads as Arrow (:meth:`table`), builds
    Δ step by step as views (:meth:`view`), and collects each result it writes cast to the
    target table's schema (:meth:`collect`).  Any step outside the driver-side set raises
    :class:`NotLocal`; :meth:`close` drops everything either way.
    """

    def __init__(self, engine: LocalSql):
        self.engine = engine
        self._tables: list[str] = []
        self._views: list[str] = []

    def table(self, name: str, data: pa.Table) -> str:
        """Registers Arrow rows as ``name``; returns the name."""
        self.engine._con.register(name, data)
        self._tables.append(name)
        return name

    def view(self, name: str, spark_sql: str) -> str:
        """Defines ``name`` as the query; a query that hashes a bucket is left to Spark (the
        bucket needs the Spark types of a result, which only :meth:`collect` knows)."""
        import duckdb

        prepared = prepare(spark_sql)
        if prepared is None or prepared.bucket is not None:
            raise NotLocal(name)
        try:
            self.engine._con.execute(f'CREATE OR REPLACE TEMP VIEW "{name}" AS {prepared.sql}')
        except duckdb.Error as e:
            raise NotLocal(name) from e
        self._views.append(name)
        return name

    def collect(self, spark_sql: str, schema: pa.Schema) -> pa.Table:
        """The query's rows cast to ``schema`` (buckets filled in as Spark would)."""
        out = self.engine._run(spark_sql, schema)
        if out is None:
            raise NotLocal(spark_sql.split("\n", 1)[0])
        return out

    def close(self) -> None:
        for name in reversed(self._views):
            self.engine._con.execute(f'DROP VIEW IF EXISTS "{name}"')
        for name in self._tables:
            self.engine._con.unregister(name)
        self._tables, self._views = [], []
