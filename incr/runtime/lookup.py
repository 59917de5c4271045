"""Rows of a Delta table found by key, with the file and position of each.

A batch reads a large state table twice by key: the old rows of the groups it touches (to
combine them with the change) and then, to mark those rows deleted, their positions in
their files (the deletion vectors of :mod:`~incr.runtime.deletion`).  delta-rs's reader of
a table with vectors reads every column of every file and says nowhere where a row came
from.  Here the key columns alone are read first, from the files (and, for integer keys,
the row groups) whose statistics may hold a wanted value, each further key column matched
only where the ones before it did; every other column is read only of the row groups where
a live row matched.  Each row comes with its file and position, so the MERGE that deletes
it need not scan for it again (:class:`~incr.runtime.store.DeltaStore` keeps the last such
read per table for that).

Matching is SQL's ``IS NOT DISTINCT FROM``, column by column, as the MERGE's: NULL meets
NULL, NaN meets NaN, and -0.0 meets 0.0 (Arrow's hash would tell the zeros apart, so floats
are compared after adding 0.0, which turns -0.0 into 0.0).

Files are read as incr writes them: Parquet whose columns carry the table's names, the
partition columns in the ``add`` action's ``partitionValues``.  A column a file lacks (added
to the table after it was written) reads as NULL.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from incr.runtime import mirror, parallel, sparkhash


@dataclass(frozen=True)
class Found:
    """Rows found by key: ``rows`` (the table's columns, or those asked for) and, per row,
    its file (an index into ``names``, paths as the log names them) and position in it."""

    names: tuple[str, ...]
    files: np.ndarray
    positions: np.ndarray
    rows: pa.Table

    def positions_by_file(self, keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The positions of the rows (those ``keep`` marks, when given), sorted, by file."""
        files, positions = self.files, self.positions
        if keep is not None:
            files, positions = files[keep], positions[keep]
        out: dict[str, np.ndarray] = {}
        for i in np.unique(files):
            out[self.names[int(i)]] = np.sort(positions[files == i]).astype(np.int64)
        return out


def comparable(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``values`` as Arrow's hash compares them the way SQL does: floats plus 0.0."""
    if pa.types.is_floating(values.type):
        return pc.add(values, pa.scalar(0.0, values.type))
    return values


def _hashable(type_: pa.DataType) -> pa.DataType:
    """``type_``, or for a view type (delta-rs gives strings as ``string_view``) the plain
    one, which Arrow's hash kernels take."""
    if pa.types.is_string_view(type_):
        return pa.string()
    if pa.types.is_binary_view(type_):
        return pa.binary()
    return type_


class Wanted:
    """The values one column must hold: distinct, cast to the column's type, NULL apart."""

    def __init__(self, column: str, values: pa.Array, type_: pa.DataType):
        self.column = column
        values = values.cast(_hashable(values.type)).cast(_hashable(type_))
        present = pc.drop_null(values)
        self.has_null = len(present) < len(values)
        self.ordered: np.ndarray | None = None
        if pa.types.is_integer(type_) and pa.types.is_integer(present.type):
            # sorted, then each value unlike the one before it: distinct without a hash table
            ordered = np.sort(present.to_numpy(zero_copy_only=False))
            if len(ordered) > 1:
                ordered = ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]
            self.ordered = ordered
            self.values = pa.array(ordered, present.type)
        else:
            self.values = pc.unique(comparable(present))
        #: How many distinct values were wanted (a part :meth:`by_bucket` made keeps its
        #: whole's): how selective a search by this column is.
        self.distinct = len(self.values)
        self._as: dict[pa.DataType, pa.Array] = {self.values.type: self.values}

    def mask(self, column: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Which values of ``column`` are wanted, as a boolean array.

        An integer column without NULLs in ascending order (a state file as compaction
        sorts it) is searched by bisection; any other by Arrow's hash of the values.
        """
        if self.ordered is not None and column.null_count == 0:
            values = column.to_numpy() if isinstance(column, pa.Array) else \
                column.combine_chunks().to_numpy()
            if mirror.ascending(values):
                return _runs(values, self.ordered)
        column = column.cast(_hashable(column.type))
        if column.type not in self._as:  # a file's own type (large_string, say)
            self._as[column.type] = self.values.cast(column.type)
        hit = pc.is_in(comparable(column), value_set=self._as[column.type])
        if self.has_null:
            hit = pc.or_(hit, pc.is_null(column))
        return np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False), dtype=bool)

    def by_bucket(self, count: int) -> dict[str, Wanted] | None:
        """The wanted values split by the partition bucket a row holding each is written to
        (``pmod(xxhash64(column), count)``, as :mod:`~incr.runtime.sparkhash` computes it),
        keyed by the bucket's partition value; None for a column that is not an integer one
        (only those are split).  A file of one bucket then need only be searched for its
        own values: 1/count of them.  NULL stays wanted in every part."""
        if self.ordered is None:
            return None
        try:
            hashed = sparkhash.buckets([self.values], count).to_numpy()
        except sparkhash.UnsupportedType:
            return None
        parts = {}
        for b in range(count):
            part = copy.copy(self)
            part.ordered = self.ordered[hashed == b]  # still ascending
            part.values = pa.array(part.ordered, self.values.type)
            part._as = {part.values.type: part.values}
            parts[str(b)] = part
        return parts

    def within(self, low: Any, high: Any, nulls: int | None) -> bool:
        """Whether a range [low, high] (with ``nulls`` NULLs) may hold a wanted value: only
        integer ranges are trusted (float statistics leave NaN out; string ones may be
        truncated); any other, or a missing bound, may."""
        if self.has_null and (nulls is None or nulls > 0):
            return True
        if self.ordered is None or low is None or high is None:
            return True
        i = int(np.searchsorted(self.ordered, low, side="left"))
        return i < len(self.ordered) and self.ordered[i] <= high


def _runs(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where the ascending ``values`` equal one of the ascending distinct ``wanted``."""
    mask = np.zeros(len(values), dtype=bool)
    mask[mirror.equal_runs(values, wanted)] = True
    return mask


def find(root: Path, adds: Mapping[str, Mapping[str, Any]], schema: pa.Schema,
         wanted: Iterable[Wanted],
         deleted: Callable[[str, Mapping[str, Any]], np.ndarray], *,
         buckets: Iterable[int] | None = None, bucket: str | None = None,
         columns: Iterable[str] | None = None, every: bool = False,
         mirror_rows: tuple[int, int] = (0, 0), bucketed_by: tuple[str, int] | None = None) -> Found:
    """The live rows of the files ``adds`` (the table's current ``add`` actions by path)
    whose value of some ``wanted`` column (of every one, with ``every``) is one of its values.
    The files are searched side by side (:func:`~incr.runtime.parallel.each`).

    Args:
        root: the table's directory.
        schema: the table's schema (partition columns included).
        deleted: the positions (ascending) a file's deletion vector deletes, from its
            ``add``: those rows are left out.
        buckets: only files of these values of the partition column ``bucket``.
        columns: the columns of the rows returned (default: all of ``schema``).
        mirror_rows: (least, most): files of at least ``least`` and at most ``most`` rows
            (0: no limit) are searched in their key mirror (:mod:`~incr.runtime.mirror`;
            written on their first search), when a wanted column is an integer one;
            ``least`` 0: every file is read as Parquet.
        bucketed_by: (column, count) when the table's files are partitioned by ``bucket``
            = the hash of that one column into ``count`` buckets: a file is then searched
            for the wanted values of that column that hash to its bucket only.
    """
    wanted = list(wanted)
    split = _split_by_bucket(wanted, bucketed_by) if bucket is not None else None
    out_schema = pa.schema([schema.field(c) for c in columns]) if columns is not None else schema
    only = None if buckets is None else {str(int(b)) for b in buckets}
    names: list[str] = []
    parts: list[pa.Table] = []
    files: list[np.ndarray] = []
    positions: list[np.ndarray] = []

    def search(name: str) -> tuple[np.ndarray, pa.Table] | None:
        add = adds[name]
        values = add.get("partitionValues") or {}
        if only is not None and bucket is not None and values.get(bucket) not in only:
            return None
        here = wanted
        if split is not None and values.get(bucket) in split[1]:
            here = [split[1][values[bucket]] if i == split[0] else w for i, w in enumerate(wanted)]
        if not _file_may_hold(add, here, every):
            return None
        kept = mirror.mirror_of(root, name, add, here, every, *mirror_rows)
        if kept is not None:
            index, hit = kept.find(here, every)
            live = _live(hit, deleted(name, add)) if len(hit) else None
            if live is not None and not live.all():
                index, hit = index[live], hit[live]
            if not len(hit):
                return None
            stored = [f.name for f in out_schema if f.name in kept.rows.column_names
                      and f.name not in values]
            return hit, _assemble(kept.rows.select(stored).take(pa.array(index)), len(hit),
                                  out_schema, values)
        file = pq.ParquetFile(root / unquote(name))
        hit, keys = _matches(file, here, every)
        if len(hit):
            live = _live(hit, deleted(name, add))
            hit = hit[live]
            keys = keys.filter(pa.array(live)) if keys.num_columns else keys
        if not len(hit):
            return None
        return hit, _rows_at(file, hit, keys, out_schema, values)

    ordered = sorted(adds)
    for name, result in zip(ordered, parallel.each(search, ordered)):
        if result is None:
            continue
        hit, part = result
        names.append(name)
        parts.append(part)
        files.append(np.full(len(hit), len(names) - 1, dtype=np.int32))
        positions.append(hit)
    return Found(tuple(names),
                 np.concatenate(files) if files else np.array([], np.int32),
                 np.concatenate(positions) if positions else np.array([], np.int64),
                 pa.concat_tables(parts) if parts else out_schema.empty_table())


def _live(hit: np.ndarray, deleted: np.ndarray) -> np.ndarray:
    """Which of the positions ``hit`` the ascending ``deleted`` leaves, as a boolean array:
    a bisection per hit (a large file's vector holds far more positions than a batch finds
    in it, and a set test would sort them all on every search)."""
    if not len(deleted):
        return np.ones(len(hit), dtype=bool)
    at = np.minimum(np.searchsorted(deleted, hit), len(deleted) - 1)
    return deleted[at] != hit


def _split_by_bucket(wanted: list[Wanted], bucketed_by: tuple[str, int] | None
                     ) -> tuple[int, dict[str, Wanted]] | None:
    """Which of ``wanted`` is the bucket's column, and its values by bucket (see :func:`find`);
    None when no split applies."""
    if bucketed_by is None:
        return None
    column, count = bucketed_by
    at = next((i for i, w in enumerate(wanted) if w.column == column), None)
    parts = wanted[at].by_bucket(count) if at is not None and count > 1 else None
    return None if parts is None else (at, parts)


def _file_may_hold(add: Mapping[str, Any], wanted: list[Wanted], every: bool) -> bool:
    """Whether the file's log statistics leave room for a wanted value of some column (of
    every column, with ``every``)."""
    try:
        stats = json.loads(add.get("stats") or "{}")
    except ValueError:
        return True
    lows, highs = stats.get("minValues") or {}, stats.get("maxValues") or {}
    nulls = stats.get("nullCount") or {}
    room = (w.within(lows.get(w.column), highs.get(w.column), nulls.get(w.column)) for w in wanted)
    return all(room) if every else any(room)


def plain(table: pa.Table) -> pa.Table:
    """``table`` with view-typed columns (a file delta-rs wrote from string_view data)
    as plain ones, which Arrow can take and filter."""
    plain = pa.schema([f.with_type(_hashable(f.type)) for f in table.schema])
    return table if plain == table.schema else table.cast(plain)


def _group_starts(meta: pq.FileMetaData) -> np.ndarray:
    """The position of each row group's first row, and the file's row count last."""
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)


def _matches(file: pq.ParquetFile, wanted: list[Wanted],
             every: bool) -> tuple[np.ndarray, pa.Table]:
    """Positions (in the file, ascending) of the rows holding a wanted value (in some column;
    in every one, with ``every``), live or not, and those rows' wanted columns the file has.

    A column the file lacks is NULL in every row of it.
    """
    meta = file.metadata
    present = set(file.schema_arrow.names)
    looked = [w for w in wanted if w.column in present]
    # a column the file lacks matches every row when NULL is wanted, none otherwise
    nulls_wanted = [w.has_null for w in wanted if w.column not in present]
    if every and not all(nulls_wanted):
        everything, groups = False, []
    elif (every and not looked) or (not every and any(nulls_wanted)):
        everything, groups = True, list(range(meta.num_row_groups))
    else:
        everything = False
        groups = [g for g in range(meta.num_row_groups) if _group_may_hold(meta, g, looked, every)]
    data = plain(file.read_row_groups(groups, columns=[w.column for w in looked], use_threads=True))
    mask = np.full(data.num_rows, every or everything, dtype=bool)
    if not everything:
        for w in looked:
            if not every:
                mask |= w.mask(data.column(w.column))
                continue
            # each column only over the rows the columns before it left (the first, sorted
            # in a compacted file, is searched by bisection; the rest among few rows)
            left = np.flatnonzero(mask)
            if len(left) == len(mask):
                mask = w.mask(data.column(w.column))
            elif len(left):
                mask[left] = w.mask(data.column(w.column).take(pa.array(left)))
    local = np.flatnonzero(mask)
    starts = _group_starts(meta)
    chosen = np.array(groups, dtype=np.int64)
    read_starts = _read_starts(starts, chosen)
    which = np.searchsorted(read_starts, local, side="right") - 1
    return (starts[chosen][which] + local - read_starts[which]).astype(np.int64), \
        data.take(pa.array(local, pa.int64()))


def _group_may_hold(meta: pq.FileMetaData, group: int, wanted: list[Wanted], every: bool) -> bool:
    """Whether a row group's statistics leave room for a wanted value of some column (of
    every column, with ``every``)."""
    row_group = meta.row_group(group)
    names = [row_group.column(i).path_in_schema for i in range(row_group.num_columns)]
    room = []
    for w in wanted:
        stats = row_group.column(names.index(w.column)).statistics if w.column in names else None
        room.append(stats is None or not stats.has_min_max or
                    w.within(stats.min, stats.max, stats.null_count if stats.has_null_count else None))
    return all(room) if every else any(room)


def _rows_at(file: pq.ParquetFile, hit: np.ndarray, keys: pa.Table, schema: pa.Schema,
             partition_values: Mapping[str, str | None]) -> pa.Table:
    """The rows at positions ``hit`` (ascending) of the file, in ``schema``; ``keys``: their
    columns already read.  Only the row groups holding them are read, only for the other
    columns; partition columns come from the ``add`` action."""
    stored = set(file.schema_arrow.names)
    read = [f.name for f in schema if f.name in stored and f.name not in partition_values
            and f.name not in keys.column_names]
    data = keys if keys.num_columns else pa.table({})  # (a table of no columns has no length)
    if read:
        starts = _group_starts(file.metadata)
        of = np.searchsorted(starts, hit, side="right") - 1
        groups = np.unique(of)
        rest = plain(file.read_row_groups(groups.tolist(), columns=read, use_threads=True))
        rest = rest.take(pa.array(_read_starts(starts, groups)[np.searchsorted(groups, of)]
                                  + hit - starts[of]))
        if not data.num_columns:
            data = rest
        for name in rest.column_names if data is not rest else ():
            data = data.append_column(rest.field(name), rest.column(name))
    return _assemble(data, len(hit), schema, partition_values)


def partition_column(value: str | None, type_: pa.DataType, rows: int) -> pa.Array:
    """A partition column of ``rows`` rows, from its value as the log spells it."""
    if value is None:
        return pa.nulls(rows, type_)
    return pa.repeat(pa.scalar(value, pa.string()).cast(type_), rows)


def _read_starts(starts: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Where each of the row groups ``groups`` (ascending) starts among them read together."""
    return np.concatenate([[0], np.cumsum(starts[groups + 1] - starts[groups])]).astype(np.int64)


def _assemble(data: pa.Table, rows: int, schema: pa.Schema,
              partition_values: Mapping[str, str | None]) -> pa.Table:
    """``rows`` rows in ``schema`` from the columns of ``data`` (a file's, as stored): the
    partition columns from the ``add`` action's values, a column the file lacks NULL."""
    columns = []
    for f in schema:
        if f.name in partition_values:
            columns.append(partition_column(partition_values[f.name], f.type, rows))
        elif f.name in data.column_names:
            columns.append(data.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(rows, f.type))
    return pa.table(columns, schema=schema)
