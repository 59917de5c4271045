"""The column types a source may declare, in one canonical spelling.

Sources are typed so that every engine (pyarrow at ingest, Spark for h and a, delta-rs for
the merge, DuckDB as the oracle) reads a batch the same way.  The runtime maps these to
Arrow and Spark types; the compiler only needs their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from sqlglot import exp

if TYPE_CHECKING:  # program and scalar import this module
    from incr.compiler.program import Column
    from incr.compiler.scalar import Scalar

# Declared spelling (as sqlglot normalises it) -> canonical name.
_CANONICAL = {
    exp.DataType.Type.VARCHAR: "VARCHAR",
    exp.DataType.Type.TEXT: "VARCHAR",
    exp.DataType.Type.CHAR: "VARCHAR",
    exp.DataType.Type.NVARCHAR: "VARCHAR",
    exp.DataType.Type.BIGINT: "BIGINT",
    exp.DataType.Type.INT: "INTEGER",
    exp.DataType.Type.SMALLINT: "SMALLINT",
    exp.DataType.Type.TINYINT: "TINYINT",
    exp.DataType.Type.DOUBLE: "DOUBLE",
    exp.DataType.Type.FLOAT: "FLOAT",
    exp.DataType.Type.BOOLEAN: "BOOLEAN",
    exp.DataType.Type.DATE: "DATE",
    exp.DataType.Type.TIMESTAMP: "TIMESTAMP",
    exp.DataType.Type.DATETIME: "TIMESTAMP",
    exp.DataType.Type.TIMESTAMPNTZ: "TIMESTAMP",  # how sqlglot reads DuckDB TIMESTAMP
    exp.DataType.Type.DECIMAL: "DECIMAL",
}

INTEGER_TYPES = frozenset({"BIGINT", "INTEGER", "SMALLINT", "TINYINT"})
FLOAT_TYPES = frozenset({"DOUBLE", "FLOAT"})
NUMERIC_TYPES = INTEGER_TYPES | FLOAT_TYPES | {"DECIMAL"}


@dataclass(frozen=True)
class SqlType:
    """A declared column type: canonical name plus DECIMAL precision and scale."""

    name: str
    precision: int | None = None
    scale: int | None = None

    def __str__(self) -> str:
        if self.name == "DECIMAL":
            return f"DECIMAL({self.precision},{self.scale})"
        return self.name

    @property
    def is_numeric(self) -> bool:
        """True for integer, floating and decimal types."""
        return self.name in NUMERIC_TYPES


def spark_type_name(t: SqlType) -> str:
    """Spark SQL DDL spelling of a declared type (TIMESTAMP has no time zone: TIMESTAMP_NTZ)."""
    if t.name == "DECIMAL":
        return f"DECIMAL({t.precision},{t.scale})"
    return {"VARCHAR": "STRING", "TIMESTAMP": "TIMESTAMP_NTZ"}.get(t.name, t.name)


def sql_type_of(node: exp.DataType) -> SqlType:
    """Maps a parsed column type to its canonical form.

    Raises:
        ValueError: the type is not one a source may declare (the message lists those).
    """
    name = _CANONICAL.get(node.this)
    if name is None:
        raise ValueError(
            f"type {node.sql()} is not supported for source columns; use one of VARCHAR, "
            f"BIGINT, INTEGER, SMALLINT, TINYINT, DOUBLE, FLOAT, BOOLEAN, DATE, TIMESTAMP, "
            f"DECIMAL(p,s)")
    if name != "DECIMAL":
        return SqlType(name)
    params = [p.this.this if isinstance(p.this, exp.Literal) else p.name
              for p in node.expressions]
    precision = int(params[0]) if params else 18
    scale = int(params[1]) if len(params) > 1 else 3
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise ValueError(f"DECIMAL({precision},{scale}) is out of range (precision 1..38)")
    return SqlType(name, precision, scale)


def infer_type(expr: Scalar, table: str, columns: Sequence[Column]) -> SqlType:
    """The type sqlglot infers for ``expr`` (a Scalar) over ``columns`` of ``table``.

    Used for the columns of a nested query's output (which ``incr explain`` shows) and
    for derived inputs; a type sqlglot cannot tell stays ``UNKNOWN``.  Spark decides the
    stored types at run time, so nothing here can make state wrong.
    """
    name = infer_type_name(expr.sql, table, tuple((c.name, str(c.type)) for c in columns))
    try:
        return sql_type_of(exp.DataType.build(name, dialect="duckdb"))
    except Exception:  # noqa: BLE001 - any type incr does not declare (HUGEINT, ...) is shown as is
        return SqlType(name)


@lru_cache(maxsize=2048)
def infer_type_name(sql: str, table: str, columns: tuple[tuple[str, str], ...]) -> str:
    """The DuckDB spelling of the type of ``sql`` over ``columns`` ("UNKNOWN" if unsure)."""
    import sqlglot
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    schema: dict[str, object] = {table: dict(columns)}
    try:
        select = sqlglot.parse_one(f"SELECT {sql} AS x FROM {table}", read="duckdb")
        select = qualify(select, schema=schema, dialect="duckdb")
        typed = annotate_types(select, schema=schema, dialect="duckdb")
        t: exp.DataType | None = typed.expressions[0].type
        if not t or t.this == exp.DataType.Type.UNKNOWN:
            return "UNKNOWN"
        return t.sql("duckdb").upper().replace("TEXT", "VARCHAR")
    except Exception:  # noqa: BLE001 - type inference is a courtesy; never fail on it
        return "UNKNOWN"
