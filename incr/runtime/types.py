"""Declared source types as Arrow and Spark types."""

from __future__ import annotations

import pyarrow as pa

from incr.compiler.dialect import WEIGHT
from incr.compiler.program import Column
from incr.compiler.types import SqlType, spark_type_name
from incr.runtime.engine import DRIVER, SPARK, per_engine


@per_engine("batch rows, types and _row", DRIVER)
def arrow_type(t: SqlType) -> pa.DataType:
    """The Arrow type a column of declared type ``t`` is read as."""
    simple = {
        "VARCHAR": pa.string(), "BIGINT": pa.int64(), "INTEGER": pa.int32(),
        "SMALLINT": pa.int16(), "TINYINT": pa.int8(), "DOUBLE": pa.float64(),
        "FLOAT": pa.float32(), "BOOLEAN": pa.bool_(), "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us"),
    }
    if t.name == "DECIMAL":
        return pa.decimal128(t.precision or 18, t.scale or 0)
    return simple[t.name]


def arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema of a source's declared columns."""
    return pa.schema([pa.field(c.name, arrow_type(c.type), nullable=not c.not_null)
                      for c in columns])


@per_engine("batch rows, types and _row", SPARK)
def spark_type(t: SqlType) -> str:
    """Spark SQL DDL spelling of a declared type (TIMESTAMP has no time zone: TIMESTAMP_NTZ)."""
    return spark_type_name(t)


def nullable(schema: pa.Schema) -> pa.Schema:
    """The same schema with every field nullable (Spark marks counts NOT NULL; state may not)."""
    return pa.schema([f.with_nullable(True) for f in schema])


def signed(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the ``_w`` column of a signed change (copies, ±)."""
    return schema.append(pa.field(WEIGHT, pa.int64()))
