"""Key mirrors: a large data file's rows sorted by an integer key, kept beside it to be
memory-mapped, so a batch finds its keys' rows without decoding the file.

A batch over a state of millions of groups touches a few thousand of them, at random: every
row group of every file holds some, so reading them from Parquet decodes the key columns of
the whole table (and the other columns of every row group), which is what made an increment
over 5M groups cost three times one over 250K.  A data file of a Delta table never changes
once written (a change writes new files and marks old rows deleted), so a copy of it made
once stays right for as long as the file lives.  The copy here is an uncompressed Arrow IPC
file, sorted by one integer key column, with each row's position in the Parquet file
(:data:`ROW`).  Memory-mapped, its key column is a sorted array that a batch bisects for its
keys (O(keys · log rows), touching only the pages it reads), and only the found rows of the
other columns are taken.  Deleted rows are still told apart by the file's deletion vector.

The mirror of ``<table>/<file>`` keyed by column ``k`` is
``<table>/_incr_mirrors/<file>@k.arrow``.  Delta readers and VACUUM leave a folder whose
name starts with ``_`` alone; housekeeping and the VACUUM after a rewrite delete the mirrors
of the files they removed (:func:`prune`).  A mirror is written the first time a file of at
least ``INCR_MIRROR_ROWS`` rows is searched by an integer column no mirror of it is keyed
by; once a table has mirrors, every file incr writes to it gets them as it is written
(:func:`keys_for_new_files`), whatever its size.  Writes are atomic (aside, then renamed);
a mirror whose file size does not match the log's, or that cannot be read, is written
again.  Where a mirror cannot be written (a read-only or full disk) the file is read as
Parquet, as below that size.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from incr.runtime.bounded import Bounded

if TYPE_CHECKING:
    from incr.runtime.lookup import Wanted

log = logging.getLogger("incr.runtime")

#: The folder of a table's mirrors, inside the table's own.
DIRECTORY = "_incr_mirrors"
#: The column of a mirror holding each row's position in its Parquet file.
ROW = "__incr_row"
_KEY, _SIZE, _VALUED = b"incr.key", b"incr.size", b"incr.valued"


#: The file (in :data:`DIRECTORY`) listing the columns the table's mirrors are keyed by.
_KEYS_FILE = "keys.json"
_SEPARATOR = "@"  # between a data file's name and its mirror's key (quoted: never holds one)


def path_of(root: Path, name: str, key: str) -> Path:
    """Where the mirror keyed by ``key`` of the file ``name`` (as the log names it) of the
    table at ``root`` is."""
    return root / DIRECTORY / f"{unquote(name)}{_SEPARATOR}{quote(key, safe='')}.arrow"


def keys_of(root: Path) -> list[str]:
    """The columns the mirrors of the table at ``root`` are keyed by (none: it has none)."""
    try:
        return list(json.loads((root / DIRECTORY / _KEYS_FILE).read_text()))
    except (OSError, ValueError):
        return []


def _remember(root: Path, key: str) -> None:
    """Adds ``key`` to the table's mirror keys (written aside, then renamed)."""
    keys = keys_of(root)
    if key in keys:
        return
    folder = root / DIRECTORY
    fd, temp = tempfile.mkstemp(prefix=".incr-keys-", suffix=".tmp", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump([*keys, key], f)
    os.replace(temp, folder / _KEYS_FILE)


@dataclass(frozen=True)
class Mirror:
    """A file's rows sorted by ``key`` (NULLs last), memory-mapped.

    Attributes:
        rows: the file's columns as stored, then :data:`ROW`.
        keys: the non-NULL values of ``key``, ascending (a view of the mapped file).
    """

    key: str
    rows: pa.Table
    keys: np.ndarray

    def find(self, wanted: list[Wanted], every: bool) -> tuple[np.ndarray, np.ndarray]:
        """The mirror's rows (indices, ascending) and their positions in the file where the
        wanted values are: in ``key`` (and, with ``every``, in every other wanted column),
        live or deleted.  ``wanted`` must include ``key``; without ``every``, it alone."""
        first = next(w for w in wanted if w.column == self.key)
        index = equal_runs(self.keys, first.ordered)
        if first.has_null:
            index = np.concatenate([index, np.arange(len(self.keys), self.rows.num_rows)])
        for w in wanted if every else ():
            if w is first or not len(index):
                continue
            if w.column not in self.rows.column_names:  # NULL in every row of the file
                index = index if w.has_null else index[:0]
                continue
            index = index[w.mask(self.rows.column(w.column).take(pa.array(index)))]
        positions = self.rows.column(ROW).take(pa.array(index)).to_numpy()
        return index, positions.astype(np.int64)


def equal_runs(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where (ascending) the ascending ``values`` equal one of the ascending distinct
    ``wanted``: two bisections per wanted value within ``values``' range (the others are
    passed over by two bisections in all: a file sorted by the key holds a slice of it),
    whatever the length of ``values``."""
    if not len(values):
        return np.array([], np.int64)
    wanted = wanted[np.searchsorted(wanted, values[0], side="left"):
                    np.searchsorted(wanted, values[-1], side="right")]
    low = np.searchsorted(values, wanted, side="left")
    inside = np.flatnonzero(low < len(values))
    reached = inside[values[low[inside]] == wanted[inside]]
    if not len(reached):
        return np.array([], np.int64)
    # the right ends only of the values found (a file holds few of a batch's keys)
    low = low[reached]
    lengths = np.searchsorted(values, wanted[reached], side="right") - low
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return (np.repeat(low - before, lengths) + np.arange(int(lengths.sum()))).astype(np.int64)


def _usable(wanted: list[Wanted], every: bool) -> list[str]:
    """The wanted columns a mirror may be keyed by, best first: integer ones, and (when any
    one column's match is enough) only if there is one wanted column."""
    if not every and len(wanted) > 1:
        return []
    return [w.column for w in wanted if w.ordered is not None]


#: Mirrors opened lately, by path: (the mirror file's inode, mtime and size, its rows). A
#: batch searches the same few dozen files again; a stat then replaces reading the footer.
_opened: Bounded[str, tuple[tuple[int, int, int], pa.Table]] = Bounded(128)


def _mapped(path: Path) -> pa.Table | None:
    """The mirror file's rows, memory-mapped (kept open while its file is the same one);
    None when there is no such file or it cannot be read."""
    try:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.info("the key mirror %s is unreadable (%s); it is written again", path, e)
        return None
    kept = _opened.get(str(path))
    if kept is not None and kept[0] == stamp:
        return kept[1]
    try:
        rows = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as e:
        log.info("the key mirror %s is unreadable (%s); it is written again", path, e)
        return None
    _opened.put(str(path), (stamp, rows))
    return rows


def open_mirror(root: Path, name: str, add: Mapping[str, Any], key: str) -> Mirror | None:
    """The file's mirror keyed by ``key``, or None when it has none that matches the file
    the log names."""
    rows = _mapped(path_of(root, name, key))
    if rows is None:
        return None
    meta = rows.schema.metadata or {}
    if (meta.get(_KEY) != key.encode() or meta.get(_SIZE) != str(add.get("size")).encode()
            or not meta.get(_VALUED, b"").isdigit() or key not in rows.column_names
            or ROW not in rows.column_names or rows.column(key).num_chunks > 1):
        return None  # another file's, or not one incr wrote (it writes one record batch)
    valued = int(meta[_VALUED])
    column = rows.column(key)
    keys = (column.chunk(0).slice(0, valued).to_numpy() if column.num_chunks and valued
            else np.array([], np.int64))
    return Mirror(key, rows, keys)


def write(root: Path, name: str, add: Mapping[str, Any], key: str) -> Mirror | None:
    """Writes the mirror of the file ``name`` keyed by ``key`` (an integer column of it) and
    opens it; None where it cannot be written (the file is then read as Parquet)."""
    try:
        from incr.runtime.lookup import plain

        data = plain(pq.read_table(root / unquote(name), use_threads=True))
    except (OSError, pa.ArrowException) as e:
        log.warning("no key mirror of %s (%s); it is read as Parquet", root / name, e)
        return None
    if not write_rows(root, name, add.get("size"), data, key):
        return None
    try:
        _remember(root, key)
    except OSError as e:
        log.warning("the key mirrors of %s are not kept with new files (%s)", root, e)
    return open_mirror(root, name, add, key)


def write_rows(root: Path, name: str, size: Any, data: pa.Table, key: str) -> bool:
    """Writes ``data`` (the columns of the file ``name`` as stored, in its order; ``size``:
    its size in bytes) as its mirror keyed by ``key``; False where it cannot be written."""
    path = path_of(root, name, key)
    try:
        data = data.append_column(ROW, pa.array(np.arange(data.num_rows, dtype=np.int64)))
        column = data.column(key)
        if data.num_rows and (column.null_count or not ascending(column.to_numpy())):
            data = data.take(pc.array_sort_indices(data.column(key), null_placement="at_end"))
        data = data.combine_chunks().replace_schema_metadata({
            _KEY: key.encode(), _SIZE: str(size).encode(),
            _VALUED: str(data.num_rows - data.column(key).null_count).encode()})
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".incr-mirror-", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as sink, pa.ipc.new_file(sink, data.schema) as writer:
                writer.write_table(data, max_chunksize=max(data.num_rows, 1))
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    except (OSError, pa.ArrowException) as e:
        log.warning("no key mirror of %s (%s); it is read as Parquet", root / name, e)
        return False
    return True


def ascending(values: np.ndarray) -> bool:
    """Whether ``values`` are in ascending order: a file incr wrote sorted (a compaction's),
    whose mirror is then its rows as they are, and whose key column a search bisects."""
    return len(values) < 2 or bool(np.all(values[1:] >= values[:-1]))


def keys_for_new_files(root: Path, schema: pa.Schema) -> list[str]:
    """The keys to mirror files about to be written to the table at ``root`` by: the table's
    mirror keys (:func:`keys_of`) that are integer columns of ``schema``, the files'.  A table
    whose large files are mirrored gets mirrors of every file incr writes to it then and
    there (a batch's new rows, a compaction's files), where writing one costs a sort of rows
    in memory instead of a read of the file on its first search."""
    return [k for k in keys_of(root) if k in schema.names and pa.types.is_integer(schema.field(k).type)]


def mirror_of(root: Path, name: str, add: Mapping[str, Any], wanted: list[Wanted],
              every: bool, min_rows: int, max_rows: int = 0) -> Mirror | None:
    """The mirror to find ``wanted`` in: one the file has keyed by a column it can search
    by, else, for a file of ``min_rows`` to ``max_rows`` rows (by its log statistics; see
    :func:`_in_range`), a new one keyed by the one such column with the most distinct
    wanted values (the join key of a side table, not a value column beside it: the most
    selective search, and the one every search of the table can use).  None: read the
    file as Parquet."""
    if min_rows <= 0:
        return None
    keys = _usable(wanted, every)
    for key in keys:
        mirror = open_mirror(root, name, add, key)
        if mirror is not None:
            return mirror
    if not _in_range(add, min_rows, max_rows):
        return None
    schema = pq.read_schema(root / unquote(name))
    keys = [k for k in keys if k in schema.names and pa.types.is_integer(schema.field(k).type)]
    if not keys:
        return None
    diverse = {w.column: w.distinct for w in wanted}
    return write(root, name, add, max(keys, key=lambda k: diverse[k]))


def ensure(root: Path, name: str, add: Mapping[str, Any], key: str, min_rows: int,
           max_rows: int = 0) -> bool:
    """Writes the mirror of the file ``name`` keyed by ``key`` when it has none and its
    rows are in range (:func:`_in_range`); True when it has one after."""
    if not _in_range(add, min_rows, max_rows):
        return False
    return (open_mirror(root, name, add, key) is not None
            or write(root, name, add, key) is not None)


def _in_range(add: Mapping[str, Any], min_rows: int, max_rows: int) -> bool:
    """Whether a file of these rows gets a mirror: at least ``min_rows`` (≤ 0: none does),
    at most ``max_rows`` (≤ 0: no limit), as writing one reads the file whole."""
    rows = _records(add)
    return min_rows > 0 and rows >= min_rows and (max_rows <= 0 or rows <= max_rows)


def _records(add: Mapping[str, Any]) -> int:
    """The file's row count in its log statistics (0 when it has none)."""
    try:
        return int(json.loads(add.get("stats") or "{}").get("numRecords") or 0)
    except (ValueError, TypeError):
        return 0


#: A mirror or key list being written aside this long ago was left by a killed writer.
_STALE_S = 3600


def prune(root: Path) -> int:
    """Deletes the mirrors of the table at ``root`` whose data file is gone, and what killed
    writers left aside an hour ago or more; returns how many mirrors."""
    folder = root / DIRECTORY
    for temp in folder.rglob(".incr-*.tmp") if folder.is_dir() else ():
        try:
            if time.time() - temp.stat().st_mtime > _STALE_S:
                temp.unlink()
        except OSError:
            pass  # another process's, renamed or deleted meanwhile
    gone = 0
    for mirror in folder.rglob("*.arrow") if folder.is_dir() else ():
        data = root / mirror.relative_to(folder).as_posix().rsplit(_SEPARATOR, 1)[0]
        if not data.exists():
            mirror.unlink(missing_ok=True)
            gone += 1
    return gone
