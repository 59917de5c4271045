"""Reading one batch file, strictly, into a Spark DataFrame with the declared schema.

A file either reads completely with every value of its declared type, or the batch is
rejected with a message naming the file, the line (or row) and the column.  Nothing is
coerced silently: a CSV value ``1.5`` in a BIGINT column is an error, not 1.

* CSV (header required) is parsed by pyarrow; when pyarrow refuses a file, the file is
  re-scanned in Python to find the first bad line and say why.  An empty unquoted field is
  NULL; a quoted empty field is the empty string.
* JSON lines are parsed with Python's json module, one object per line; a missing key is
  NULL.

Schema drift: a column (or JSON key) the file has and the table does not declare is ignored,
with a warning naming the file and the columns, so an upstream that adds a column does not
stop the pipeline (declare it in CREATE TABLE to use it).  A declared column missing from the
file, or of another type, rejects the batch: it would change the answers.
* Parquet is read by Spark directly after pyarrow checked its schema (footer only); a file
  column may be narrower than declared (INTEGER into BIGINT, FLOAT into DOUBLE).

Every DataFrame carries ``_row``, the 1-based data row, so later checks can point at rows.

A slice of a large Parquet file (:mod:`~incr.runtime.slicing`) is read alone: on the driver
its row groups are read directly; for Spark they are copied (streamed, a few record batches
at a time) into a scratch file Spark reads, since Spark cannot be told to read some row
groups of a file.  Its ``_row`` numbers are the file's, so messages point into the file.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from incr.compiler.program import Column, TableDecl
from incr.compiler.types import SqlType
from incr.errors import InputError, Location
from incr.runtime.engine import DRIVER, SPARK, per_engine
from incr.runtime.landing import file_format
from incr.runtime.lock import alive
from incr.runtime.slicing import Part
from incr.runtime.types import arrow_type, spark_type

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from incr.runtime.engine import Engines

log = logging.getLogger("incr.runtime")

ROW = "_row"
TRUE_VALUES = ["true", "True", "TRUE", "1"]
FALSE_VALUES = ["false", "False", "FALSE", "0"]
_INT_RANGES = {"TINYINT": 8, "SMALLINT": 16, "INTEGER": 32, "BIGINT": 64}
_INT_TEXT = re.compile(r"\s*[+-]?\d+\s*")


class LoadedBatch:
    """A batch file as a DataFrame (declared columns + ``_row``) and its row count.

    ``arrow`` holds the same rows on the driver (declared Arrow types, ``_row`` last) when
    the file is small enough for the driver-side path (:mod:`incr.runtime.local`); CSV and
    JSON files are parsed on the driver anyway, so they always have it.  The DataFrame is
    then only made when something asks for it: a batch the driver handles whole never
    touches Spark.
    """

    def __init__(self, df: DataFrame | Callable[[], DataFrame], rows: int,
                 arrow: pa.Table | None = None, scratch: list[Path] | None = None):
        self._df = df if not callable(df) else None
        self._make = df if callable(df) else None
        self.rows = rows
        self.arrow = arrow
        self._cache = False
        #: Files written for Spark to read this batch from (a slice's row groups), removed
        #: by :meth:`release`.
        self.scratch = scratch if scratch is not None else []

    @property
    def df(self) -> DataFrame:
        """The batch as a Spark DataFrame (cached if :meth:`cache` was asked for)."""
        if self._df is None:
            self._df = self._make()
            if self._cache:
                self._df = self._df.cache()
        return self._df

    def cache(self) -> None:
        """Keeps the DataFrame in Spark's cache once made (several readers will scan it)."""
        if not self._cache and self._df is not None:
            self._df = self._df.cache()
        self._cache = True

    def unpersist(self) -> None:
        """Drops the cached DataFrame, if one was made."""
        if self._df is not None and self._cache:
            self._df.unpersist()

    def release(self) -> None:
        """Done with the batch: drops its cached DataFrame and its scratch files."""
        self.unpersist()
        for path in self.scratch:
            path.unlink(missing_ok=True)
        self.scratch.clear()


def load_batch(engines: Engines, table: TableDecl, path: Path, display: str,
               absent: frozenset[str] = frozenset(), part: Part | None = None,
               scratch: Path | None = None) -> LoadedBatch:
    """Reads ``path`` as a batch of ``table``; ``display`` is how messages name the file.

    ``part``: only these row groups of a Parquet file (a slice); Spark reads them from a
    copy written under the folder ``scratch`` (default: the system's temporary folder; on a
    cluster it must be one the executors see), which :meth:`LoadedBatch.release` removes.

    A Parquet file is also read into Arrow on the driver when :meth:`Engines.choose` says
    the driver may take it (CSV and JSON are parsed there anyway).  Spark
    (``engines.spark``) is only started if something asks for the DataFrame.
    ``absent``: the (lower-case) columns declared after the file was registered
    (:mod:`~incr.runtime.schemas`): NULL in it, as they were when it was applied.

    Raises:
        InputError: the file is unreadable, has the wrong columns, or a value of the wrong
            type or a NULL in a NOT NULL column.
    """
    fmt = file_format(display)
    if not path.is_file():
        raise InputError("the batch file is gone (it was registered; restore it, or run "
                         "`incr skip` to drop the batch)", Location(display))
    lacking = _lacking(table, absent)
    if lacking:
        kept = replace(table, columns=tuple(c for c in table.columns if c not in lacking))
        return _with_nulls(load_batch(engines, kept, path, display, part=part, scratch=scratch),
                           table)
    if fmt == "parquet":
        return _parquet(engines, table, path, display, part,
                        scratch or Path(tempfile.gettempdir()) / "incr-slices")
    data = _csv(table, path, display) if fmt == "csv" else _json(table, path, display)
    _check_not_null(table, data, display)
    data = _numbered(data)
    # An empty parse may hold no chunk at all, which Spark refuses: give it an empty one.
    rows = data if data.num_rows else data.schema.empty_table()
    return LoadedBatch(lambda: _typed(engines.spark.createDataFrame(rows), table), data.num_rows,
                       data)


def _lacking(table: TableDecl, absent: frozenset[str]) -> list[Column]:
    """The ``absent`` columns: NULL in this file, whether it has them or not (it was read
    without them when it was applied, and its rows were fingerprinted so)."""
    return [c for c in table.columns if c.name.lower() in absent]


def _with_nulls(loaded: LoadedBatch, table: TableDecl) -> LoadedBatch:
    """``loaded`` with the columns of ``table`` it lacks, all NULL, in declared order."""
    arrow = _arrow_with_nulls(loaded.arrow, table) if loaded.arrow is not None else None
    return LoadedBatch(lambda: _spark_with_nulls(loaded.df, table), loaded.rows, arrow,
                       loaded.scratch)


@per_engine("columns declared after a file, NULL", DRIVER)
def _arrow_with_nulls(data: pa.Table, table: TableDecl) -> pa.Table:
    columns = [data.column(c.name) if c.name in data.column_names
               else pa.nulls(data.num_rows, arrow_type(c.type)) for c in table.columns]
    return pa.table(columns + [data.column(ROW)],
                    schema=_nullable_schema(table.columns).append(data.schema.field(ROW)))


@per_engine("columns declared after a file, NULL", SPARK)
def _spark_with_nulls(df: DataFrame, table: TableDecl) -> DataFrame:
    from pyspark.sql import functions as F

    cols = [F.col(c.name) if c.name in df.columns else
            F.lit(None).cast(spark_type(c.type)).alias(c.name) for c in table.columns]
    return df.select(*cols, F.col(ROW))


@per_engine("batch rows, types and _row", DRIVER)
def _numbered(data: pa.Table, before: int = 0) -> pa.Table:
    """The rows with ``_row``, the 1-based data row, after ``before`` rows of the file (the
    declared Arrow types are the parse's)."""
    return data.append_column(ROW, pa.array(np.arange(before + 1, before + data.num_rows + 1,
                                                      dtype=np.int64)))


@per_engine("batch rows, types and _row", SPARK)
def _typed(df: DataFrame, table: TableDecl) -> DataFrame:
    from pyspark.sql import functions as F

    cols = [F.col(c.name).cast(spark_type(c.type)).alias(c.name) for c in table.columns]
    return df.select(*cols, F.col(ROW).cast("bigint").alias(ROW))


# -- CSV ---------------------------------------------------------------------------------------
def _csv(table: TableDecl, path: Path, display: str) -> pa.Table:
    header = _csv_header(path, display)
    by_name = _match_columns(table, header, display, line=1)
    file_names = [by_name[c.name] for c in table.columns]
    convert = pacsv.ConvertOptions(
        column_types={by_name[c.name]: arrow_type(c.type) for c in table.columns},
        include_columns=file_names, strings_can_be_null=True, quoted_strings_can_be_null=False,
        null_values=[""], true_values=TRUE_VALUES, false_values=FALSE_VALUES)
    try:
        data = pacsv.read_csv(path, convert_options=convert,
                              read_options=pacsv.ReadOptions(block_size=1 << 24))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise _diagnose_csv(table, path, display, header, by_name) or InputError(
            f"cannot read the CSV file: {e}", Location(display)) from e
    return data.rename_columns([c.name for c in table.columns]).cast(_nullable_schema(table.columns))


def _csv_header(path: Path, display: str) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
    except UnicodeDecodeError as e:
        raise InputError(f"the CSV file is not UTF-8 text ({e.reason})", Location(display)) from e
    if not header:
        raise InputError("the CSV file is empty; a batch needs at least the header line",
                         Location(display, 1))
    return header


def _diagnose_csv(table: TableDecl, path: Path, display: str, header: list[str],
                  by_name: dict[str, str]) -> InputError | None:
    """Finds the first line pyarrow could not convert, and says what is wrong with it."""
    index = {name: header.index(name) for name in by_name.values()}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader, None)
        for row_no, fields in enumerate(reader, start=1):
            line = reader.line_num
            if len(fields) != len(header):
                return InputError(f"row {row_no} has {len(fields)} fields but the header has "
                                  f"{len(header)}", Location(display, line))
            for col in table.columns:
                text = fields[index[by_name[col.name]]]
                if text == "":
                    continue
                problem = _text_problem(text, col.type)
                if problem:
                    return InputError(f"row {row_no}, column {col.name}: {text!r} {problem}",
                                      Location(display, line))
    return None


def _text_problem(text: str, t: SqlType) -> str | None:
    """Why ``text`` is not a CSV value of type ``t`` (None if it is)."""
    name = t.name
    try:
        if name in _INT_RANGES:
            if not _INT_TEXT.fullmatch(text):
                return f"is not a valid {name} (an integer)"
            bits = _INT_RANGES[name]
            if not -(2 ** (bits - 1)) <= int(text) < 2 ** (bits - 1):
                return f"is out of range for {name}"
        elif name in ("DOUBLE", "FLOAT"):
            float(text)
        elif name == "BOOLEAN":
            if text not in TRUE_VALUES + FALSE_VALUES:
                return "is not a valid BOOLEAN (true/false/1/0)"
        elif name == "DATE":
            dt.date.fromisoformat(text)
        elif name == "TIMESTAMP":
            dt.datetime.fromisoformat(text)
        elif name == "DECIMAL":
            return _decimal_problem(Decimal(text), t)
    except (ValueError, InvalidOperation):
        return f"is not a valid {t}"
    return None


def _decimal_problem(value: Decimal, t: SqlType) -> str | None:
    scale = t.scale or 0
    if value != value.quantize(Decimal(1).scaleb(-scale)):
        return f"has more than {scale} decimal places for {t}"
    if abs(value) >= Decimal(10) ** ((t.precision or 18) - scale):
        return f"is out of range for {t}"
    return None


# -- JSON lines --------------------------------------------------------------------------------
def _json(table: TableDecl, path: Path, display: str) -> pa.Table:
    names = {c.name.lower(): c for c in table.columns}
    columns: dict[str, list[Any]] = {c.name: [] for c in table.columns}
    extra: dict[str, None] = {}  # undeclared keys, in order of appearance
    try:
        fh = path.open(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot open the file: {e.strerror}", Location(display)) from e
    with fh:
        row_no = 0
        try:
            for line_no, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                row_no += 1
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"row {row_no} is not valid JSON: {e.msg}",
                                     Location(display, line_no, e.colno)) from e
                if not isinstance(obj, dict):
                    raise InputError(f"row {row_no} is not a JSON object", Location(display, line_no))
                seen = set()
                for key, value in obj.items():
                    col = names.get(key.lower())
                    if col is None:
                        extra.setdefault(key, None)
                        continue
                    seen.add(col.name)
                    try:
                        columns[col.name].append(_json_value(value, col.type))
                    except ValueError as e:
                        raise InputError(f"row {row_no}, column {col.name}: {json.dumps(value)} {e}",
                                         Location(display, line_no)) from e
                for col in table.columns:
                    if col.name not in seen:
                        columns[col.name].append(None)
        except UnicodeDecodeError as e:
            raise InputError(f"the file is not UTF-8 text ({e.reason})", Location(display)) from e
    _ignored(table, display, list(extra))
    return pa.table(columns, schema=_nullable_schema(table.columns))


def _nullable_schema(columns: tuple[Column, ...]) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in columns])


def _json_value(value: Any, t: SqlType) -> Any:
    """Converts one JSON value to the Python value of declared type ``t``."""
    if value is None:
        return None
    name = t.name
    if name in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"is not a valid {name} (an integer)")
        bits = _INT_RANGES[name]
        if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            raise ValueError(f"is out of range for {name}")
        return value
    if name in ("DOUBLE", "FLOAT"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"is not a valid {name} (a number)")
        return float(value)
    if name == "VARCHAR":
        if not isinstance(value, str):
            raise ValueError("is not a valid VARCHAR (a string)")
        return value
    if name == "BOOLEAN":
        if not isinstance(value, bool):
            raise ValueError("is not a valid BOOLEAN (true/false)")
        return value
    if name in ("DATE", "TIMESTAMP"):
        if not isinstance(value, str):
            raise ValueError(f"is not a valid {name} (an ISO-8601 string)")
        try:
            return dt.date.fromisoformat(value) if name == "DATE" else dt.datetime.fromisoformat(value)
        except ValueError as e:
            raise ValueError(f"is not a valid {name} (an ISO-8601 string)") from e
    if name == "DECIMAL":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"is not a valid {t}")
        try:
            dec = Decimal(str(value))
        except InvalidOperation as e:
            raise ValueError(f"is not a valid {t}") from e
        problem = _decimal_problem(dec, t)
        if problem:
            raise ValueError(problem)
        return dec
    raise ValueError(f"has an unsupported type {t}")  # pragma: no cover


# -- Parquet -----------------------------------------------------------------------------------
def _parquet(engines: Engines, table: TableDecl, path: Path, display: str,
             part: Part | None, scratch: Path) -> LoadedBatch:
    try:
        meta = pq.ParquetFile(path).metadata
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"not a readable Parquet file: {e}", Location(display)) from e
    by_name = _match_columns(table, schema.names, display, line=None)
    for col in table.columns:
        file_type = schema.field(by_name[col.name]).type
        if not _parquet_fits(file_type, col.type):
            raise InputError(f"column {col.name} is {file_type} in the file but declared {col.type}",
                             Location(display))
    groups = part.groups() if part is not None else None
    before = sum(meta.row_group(g).num_rows for g in range(part.first)) if part else 0
    rows = part.rows if part is not None else meta.num_rows
    if part is not None and part.first == 0:
        # The whole file's NULLs, from its footer: a slice of a file with a NULL in a NOT
        # NULL column is rejected at its first slice, before any of the file is applied
        # (so the later slices need only their own check, below).
        _footer_check_not_null(table, path, meta, by_name, display)
    scratch_files: list[Path] = []

    def make_df() -> DataFrame:
        source = path
        if groups is not None:
            source = _copy_row_groups(path, groups, [by_name[c.name] for c in table.columns],
                                      scratch)
            scratch_files.append(source)
        return _spark_parquet(engines, table, source, schema, by_name, before)

    on_driver = engines.choose("read", display, rows=rows) == DRIVER
    data = _parquet_arrow(table, path, by_name, groups) if on_driver else None
    if on_driver and data is None:
        engines.fell_back("read", display, "a column needs Spark's conversion (e.g. nanosecond "
                                           "timestamps)")
    if data is not None:
        _check_not_null(table, data, display, before)
        return LoadedBatch(make_df, rows, _numbered(data, before), scratch_files)
    df = make_df()
    _spark_check_not_null(table, df, display)
    return LoadedBatch(df, rows, scratch=scratch_files)


def _copy_row_groups(path: Path, groups: list[int], columns: list[str], folder: Path) -> Path:
    """The row groups ``groups`` of ``path`` (its ``columns``) as a Parquet file of their own
    in ``folder``, streamed a record batch at a time (the driver never holds a row group)."""
    folder.mkdir(parents=True, exist_ok=True)
    # Not named with a leading '_' or '.': Spark skips such files even when named directly.
    target = folder / f"slice-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"
    source = pq.ParquetFile(path)
    schema = source.schema_arrow
    schema = pa.schema([schema.field(c) for c in columns])
    with pq.ParquetWriter(target, schema) as writer:
        for group in groups:  # one at a time: asked for several, pyarrow reads them all first
            for batch in source.iter_batches(batch_size=1 << 16, row_groups=[group],
                                             columns=columns):
                writer.write_batch(batch)
    return target


def sweep_slices(folder: Path) -> int:
    """Removes the slice copies in ``folder`` left by processes that died (killed mid-batch:
    no :meth:`LoadedBatch.release` ran); returns how many."""
    removed = 0
    for path in folder.glob("slice-*.parquet") if folder.is_dir() else ():
        pid = path.name.split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _footer_check_not_null(table: TableDecl, path: Path, meta: pq.FileMetaData,
                           by_name: dict[str, str], display: str) -> None:
    """Rejects a file with a NULL in a NOT NULL column, found by the footer's per-row-group
    NULL counts (a row group without them is read), naming the file's row."""
    index = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
    reader = pq.ParquetFile(path)
    before = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for col in table.columns:
            if not col.not_null:
                continue
            stats = group.column(index[by_name[col.name]]).statistics
            if stats is not None and stats.has_null_count and stats.null_count == 0:
                continue
            values = reader.read_row_group(g, columns=[by_name[col.name]]).column(0)
            if values.null_count:
                row = pc.index(pc.is_null(values), True).as_py()
                raise _not_null_error(before + row + 1, col.name, display)
        before += group.num_rows


@per_engine("batch rows, types and _row", SPARK)
def _spark_parquet(engines: Engines, table: TableDecl, path: Path, schema: pa.Schema,
                   by_name: dict[str, str], before: int = 0) -> DataFrame:
    """The Parquet file's declared columns cast to their Spark types, with ``_row`` (after
    ``before`` rows: a slice's copy counts from the file's row)."""
    from pyspark.sql import functions as F

    from incr.runtime.session import literal_path

    reader = engines.spark.read
    file_schema = _spark_schema(schema, [by_name[c.name] for c in table.columns])
    if file_schema is not None:  # the footer is read already: spare Spark a job inferring it
        reader = reader.schema(file_schema)
    cols = [F.col(f"`{by_name[c.name]}`").cast(spark_type(c.type)).alias(c.name)
            for c in table.columns]
    return reader.parquet(literal_path(str(path))).select(
        *cols, (F.col("_metadata.row_index") + 1 + before).alias(ROW))


@per_engine("NOT NULL check", SPARK)
def _spark_check_not_null(table: TableDecl, df: DataFrame, display: str) -> None:
    """:func:`_check_not_null` in Spark, for a batch too large for the driver."""
    from pyspark.sql import functions as F

    required = [c.name for c in table.columns if c.not_null]
    if not required:
        return
    cond = F.lit(False)
    for name in required:
        cond = cond | F.col(name).isNull()
    bad = df.where(cond).orderBy(ROW).select(ROW, *required).limit(1).collect()
    if bad:
        raise _not_null_error(bad[0][ROW], next(n for n in required if bad[0][n] is None), display)


def _parquet_arrow(table: TableDecl, path: Path, by_name: dict[str, str],
                   groups: list[int] | None = None) -> pa.Table | None:
    """The file's declared columns (of row groups ``groups``: all when None) as Arrow, or
    None when a value would need Spark's conversion (e.g. nanosecond timestamps, which
    Spark truncates and a safe cast refuses)."""
    columns = [by_name[c.name] for c in table.columns]
    data = pq.read_table(path, columns=columns) if groups is None else \
        pq.ParquetFile(path).read_row_groups(groups, columns=columns)
    try:
        return data.rename_columns([c.name for c in table.columns]).cast(
            _nullable_schema(table.columns))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


@per_engine("batch rows, types and _row", SPARK)
def _spark_schema(schema: pa.Schema, names: list[str]):
    """The Spark schema of a Parquet file's ``names`` columns, or None to let Spark infer it.

    Only plain Arrow types are mapped (strings of every layout read as Spark strings);
    anything else (unsigned or nested types, dictionaries) falls back to Spark's inference,
    which knows Parquet's physical types better than a mapping here would.
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = []
    for name in names:
        t = schema.field(name).type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        if pa.types.is_unsigned_integer(t) or pa.types.is_dictionary(t) or pa.types.is_nested(t):
            return None
        try:
            fields.append(StructField(name, from_arrow_type(t), True))
        except (TypeError, ValueError, NotImplementedError):
            return None
    return StructType(fields)


def _parquet_fits(file_type: pa.DataType, t: SqlType) -> bool:
    """Whether a Parquet column of ``file_type`` converts losslessly to declared ``t``."""
    name = t.name
    if name in _INT_RANGES:
        bits = _INT_RANGES[name]
        return (pa.types.is_signed_integer(file_type) and file_type.bit_width <= bits) or (
            pa.types.is_unsigned_integer(file_type) and file_type.bit_width < bits)
    if name == "DOUBLE":
        return pa.types.is_floating(file_type) or (
            pa.types.is_integer(file_type) and file_type.bit_width <= 32)
    if name == "FLOAT":
        return pa.types.is_float32(file_type) or pa.types.is_float16(file_type)
    if name == "VARCHAR":
        return (pa.types.is_string(file_type) or pa.types.is_large_string(file_type)
                or pa.types.is_string_view(file_type))
    if name == "BOOLEAN":
        return pa.types.is_boolean(file_type)
    if name == "DATE":
        return pa.types.is_date(file_type)
    if name == "TIMESTAMP":
        return pa.types.is_timestamp(file_type) and file_type.tz is None
    if name == "DECIMAL":
        if pa.types.is_decimal(file_type):
            return (file_type.scale <= (t.scale or 0) and
                    file_type.precision - file_type.scale <= (t.precision or 18) - (t.scale or 0))
        return pa.types.is_integer(file_type) and file_type.bit_width <= 32
    return False


# -- shared -------------------------------------------------------------------------------------
def _match_columns(table: TableDecl, names: list[str], display: str,
                   line: int | None) -> dict[str, str]:
    """Maps declared column -> file column (case-insensitive), or says what does not match."""
    lower = {}
    for n in names:
        if n.lower() in lower:
            raise InputError(f"column {n} appears twice in the file", Location(display, line))
        lower[n.lower()] = n
    declared = {c.name.lower() for c in table.columns}
    missing = [c.name for c in table.columns if c.name.lower() not in lower]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)}: {table.name} is declared as "
                         f"({', '.join(f'{c.name} {c.type}' for c in table.columns)})",
                         Location(display, line))
    _ignored(table, display, [n for n in names if n.lower() not in declared])
    return {c.name: lower[c.name.lower()] for c in table.columns}


def _ignored(table: TableDecl, display: str, extra: list[str]) -> None:
    """Warns that a file's undeclared columns are left out (schema drift upstream)."""
    if extra:
        log.warning("%s: column(s) %s are not declared for %s and are ignored; declare them in "
                    "CREATE TABLE %s to use them", display, ", ".join(extra), table.name, table.name)


@per_engine("NOT NULL check", DRIVER)
def _check_not_null(table: TableDecl, data: pa.Table, display: str, before: int = 0) -> None:
    """The first row with a NULL in a NOT NULL column (and its first such column) is an error
    (``before``: rows of the file before ``data``'s first)."""
    firsts = [(pc.index(pc.is_null(data.column(col.name)), True).as_py(), n, col.name)
              for n, col in enumerate(table.columns)
              if col.not_null and data.column(col.name).null_count]
    if firsts:
        row, _, name = min(firsts)
        raise _not_null_error(before + row + 1, name, display)


def _not_null_error(row: int, column: str, display: str) -> InputError:
    """The one message for a NULL in a NOT NULL column, whichever engine found it."""
    return InputError(f"row {row}, column {column}: NULL in a NOT NULL column", Location(display))
