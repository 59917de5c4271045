"""Key mirrors (:mod:`incr.runtime.mirror`): written once per data file, read instead of the
file, written again when they do not match it, pruned with the files VACUUM deletes, and
never needed for a right answer (a mirror that cannot be written leaves the file read as
Parquet).  Whether rows found through mirrors equal delta-rs's reading of the table is drawn
in ``test_lookup.py``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from incr.runtime import lookup, mirror
from incr.runtime.store import DeltaStore

GONE = "_gone"
SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.int32()), ("v", pa.float64())])


def _table(store: DeltaStore, path: Path, files: int = 3, rows: int = 500) -> None:
    """``files`` files of shuffled keys (k NULL in some rows), deletion vectors enabled."""
    rng = np.random.default_rng(7)
    for part in range(files):
        k = rng.permutation(np.arange(part * rows, (part + 1) * rows))
        data = pa.table({"k": pa.array(k, pa.int64(), mask=k % 97 == 0),
                         "g": pa.array(k % 5, pa.int32()), "v": pa.array(k * 0.5)}, SCHEMA)
        store.write(path, data, mode="append", batch=part)
    store.enable_deletion_vectors(path)


def _delete(store: DeltaStore, path: Path, keys: list[tuple[int | None, int]], batch: int):
    source = pa.Table.from_pylist([{"k": k, "g": g, "v": None, GONE: True} for k, g in keys],
                                  SCHEMA.append(pa.field(GONE, pa.bool_())))
    return (store.merge(path, source).on_groups(("k", "g"), GONE).when_matched_delete()
            .when_not_matched_insert_all(f"NOT s.{GONE}").with_deletion_vectors()
            .for_batch(batch).execute())


def _mirrors(path: Path) -> list[Path]:
    return sorted((path / mirror.DIRECTORY).rglob("*.arrow"))


def test_a_file_is_mirrored_once_and_then_read_in_its_mirror_only(tmp_path, monkeypatch):
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path)
    wanted = pa.array([3, 600, 1499, None, 2_000_000], pa.int64())
    plain = DeltaStore(mirror_rows=0).read_matching(path, {"k": wanted})
    first = store.read_matching(path, {"k": wanted})
    assert len(_mirrors(path)) == 3
    opened: list = []
    real_file, real_read = lookup.pq.ParquetFile, mirror.pq.read_table
    monkeypatch.setattr(lookup.pq, "ParquetFile", lambda p: opened.append(p) or real_file(p))
    monkeypatch.setattr(mirror.pq, "read_table", lambda *a, **k: opened.append(a) or real_read(*a, **k))
    again = DeltaStore(mirror_rows=100).read_matching(path, {"k": wanted})
    assert opened == []
    rows = sorted(r["v"] for r in plain.to_pylist())
    assert sorted(r["v"] for r in first.to_pylist()) == rows == sorted(r["v"] for r in again.to_pylist())
    assert 1499 * 0.5 in rows and 97 * 0.5 in rows  # 97: its k is NULL, which is wanted


def test_positions_found_in_mirrors_delete_the_rows_a_scan_finds(tmp_path):
    mirrored, scanned = tmp_path / "m", tmp_path / "s"
    for path, rows in ((mirrored, 100), (scanned, 0)):
        store = DeltaStore(mirror_rows=rows)
        _table(store, path)
        _delete(store, path, [(5, 0), (6, 1), (None, 0), (1200, 0), (1201, 1), (77, 0)], 4)
        _delete(store, path, [(6, 1), (8, 3), (1202, 2)], 5)  # (6, 1) again: gone already
    live = [sorted(r["v"] for r in DeltaStore(mirror_rows=0).read(p).to_pylist())
            for p in (mirrored, scanned)]
    assert live[0] == live[1] and len(live[0]) == 1500 - 10  # 4 rows of (NULL, 0)
    assert _mirrors(mirrored) and not _mirrors(scanned)


def test_a_mirror_that_does_not_match_its_file_is_written_again(tmp_path):
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path, files=1)
    store.read_matching(path, {"k": pa.array([10], pa.int64())})
    (one,) = _mirrors(path)
    one.write_bytes(b"not arrow")  # a broken copy (a crash between write and rename cannot
    got = store.read_matching(path, {"k": pa.array([10, 11], pa.int64())})  # leave one)
    assert sorted(got.column("k").to_pylist()) == [10, 11]
    (name, add), = store.live_adds(path).items()
    stale = pq.read_table(path / name)
    meta = {b"incr.key": b"k", b"incr.size": b"1", b"incr.valued": b"0"}  # another file's size
    with pa.ipc.new_file(str(one), stale.schema.with_metadata(meta)) as writer:
        writer.write_table(stale.replace_schema_metadata(meta))
    assert mirror.open_mirror(path, name, add, "k") is None
    got = store.read_matching(path, {"k": pa.array([12], pa.int64())})
    assert got.column("k").to_pylist() == [12]
    assert mirror.open_mirror(path, name, add, "k") is not None


def test_housekeeping_keeps_live_mirrors_and_prunes_those_of_vacuumed_files(tmp_path):
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path)
    store.read_matching(path, {"k": pa.array([1, 501, 1001], pa.int64())})
    before = _mirrors(path)
    assert len(before) == 3
    left, fresh = (before[0].parent / ".incr-mirror-old.tmp", before[0].parent / ".incr-mirror-new.tmp")
    left.write_bytes(b"half a mirror a killed writer left")
    fresh.write_bytes(b"half a mirror being written now")
    os.utime(left, (time.time() - 7200, time.time() - 7200))
    store.housekeep(path, keep_hours=0)  # VACUUM (full listing) must leave them
    assert _mirrors(path) == before
    assert not left.exists() and fresh.exists()
    assert store.compact(path, ("k",), 0, vacuum=False)  # three files become one
    assert _mirrors(path) == before  # the old files are still there (time travel)
    store.housekeep(path, keep_hours=0)
    assert _mirrors(path) == []
    store.read_matching(path, {"k": pa.array([1], pa.int64())})
    assert store.compact(path, ("k",), 0, vacuum=True)  # and a VACUUM right after compaction
    assert _mirrors(path) == []
    got = store.read_matching(path, {"k": pa.array([1, 501, 1001], pa.int64())})
    assert sorted(got.column("k").to_pylist()) == [1, 501, 1001]
    assert len(_mirrors(path)) == 1


def test_a_mirror_that_cannot_be_written_leaves_the_file_read_as_parquet(tmp_path):
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path)
    (path / mirror.DIRECTORY).write_text("a file where the folder would be")
    got = store.read_matching(path, {"k": pa.array([2, 502], pa.int64())})
    assert sorted(got.column("k").to_pylist()) == [2, 502]


def test_only_integer_keys_of_large_enough_files_are_mirrored(tmp_path):
    store = DeltaStore(mirror_rows=501)
    path = tmp_path / "t"
    _table(store, path)
    store.read_matching(path, {"k": pa.array([2], pa.int64())})  # files of 500 rows
    assert _mirrors(path) == []
    store = DeltaStore(mirror_rows=100)
    store.read_matching(path, {"v": pa.array([1.0])})  # a float column
    store.read_matching(path, {"k": pa.array([2], pa.int64()), "g": pa.array([2], pa.int32())})
    assert _mirrors(path) == []  # either column may match: each file is read whole anyway
    store.read_matching(path, {"g": pa.array([2, 3, 4], pa.int32()),
                               "k": pa.array([2, 503, 1004], pa.int64())}, every=True)
    adds = store.live_adds(path)
    assert len(_mirrors(path)) == 3 and mirror.keys_of(path) == ["g"]
    assert all(mirror.open_mirror(path, n, a, "g") for n, a in adds.items())
    # a search by k alone cannot use them: each file gets a second mirror, keyed by k
    got = store.read_matching(path, {"k": pa.array([2, 503, 1004], pa.int64())})
    assert sorted(got.column("k").to_pylist()) == [2, 503, 1004]
    assert len(_mirrors(path)) == 6 and mirror.keys_of(path) == ["g", "k"]
    assert all(mirror.open_mirror(path, n, a, "k").key == "k" for n, a in adds.items())


def test_once_a_table_has_mirrors_every_file_incr_writes_to_it_gets_one(tmp_path, monkeypatch):
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path)
    source = pa.Table.from_pylist(
        [{"k": 3, "g": 3, "v": None, GONE: True}, {"k": 9_000, "g": 0, "v": 1.0, GONE: False},
         {"k": None, "g": 0, "v": 2.0, GONE: False}], SCHEMA.append(pa.field(GONE, pa.bool_())))

    def merge(batch: int, store: DeltaStore = store) -> None:
        (store.merge(path, source).on_groups(("k", "g"), GONE).when_matched_delete()
         .when_not_matched_insert_all(f"NOT s.{GONE}").with_deletion_vectors()
         .for_batch(batch).execute())

    def mirrored() -> set[str]:
        return {n for n in store.live_adds(path) if mirror.path_of(path, n, "k").exists()}

    merge(4, DeltaStore(mirror_rows=0))  # the table has no mirrors: the new file none either
    assert _mirrors(path) == []
    store.read_matching(path, {"k": pa.array([1, 501, 1001], pa.int64())})
    assert len(mirrored()) == 3  # the three files of 500 rows, not the batch's of 2
    merge(5)
    assert len(mirrored()) == 4  # and the batch's new file, written with its mirror
    merge(6, DeltaStore(mirror_rows=0))  # mirrors turned off: none written
    assert len(mirrored()) == 4 and len(store.live_adds(path)) == 6
    opened: list = []
    real = lookup.pq.ParquetFile
    monkeypatch.setattr(lookup.pq, "ParquetFile", lambda p: opened.append(p) or real(p))
    wanted = {"k": pa.array([9_000, 4, None], pa.int64())}
    assert sorted(store.read_matching(path, wanted).column("v").to_pylist()) == \
        sorted(DeltaStore(mirror_rows=0).read_matching(path, wanted).column("v").to_pylist())
    assert len(opened) == 2 + 6  # the two files without mirrors; every file, unmirrored
    monkeypatch.undo()
    assert store.compact_files(path, ("k",), 0, small_bytes=1 << 30) == 3  # the small ones
    assert len(store.live_adds(path)) == 4 and len(mirrored()) == 4  # the new one has its own
    rows = store.read_matching(path, wanted)
    assert sorted(rows.column("v").to_pylist()) == \
        sorted(DeltaStore(mirror_rows=0).read_matching(path, wanted).column("v").to_pylist())
    assert rows.num_rows == 3 + 1 + 16 + 3  # 9000 thrice, 4, NULL k: 16 loaded, 3 inserted


def test_a_file_is_mirrored_by_its_most_selective_wanted_column(tmp_path):
    """A search by (g, k) where k's wanted values are the more diverse: the mirror is keyed by
    k, whichever column comes first (a side table's join key, not its value column), and a
    later search by k alone finds it."""
    store = DeltaStore(mirror_rows=100)
    path = tmp_path / "t"
    _table(store, path)
    keys = pa.table({"g": pa.array([0, 1, 2, 1], pa.int32()), "k": pa.array([5, 6, 1202, 11])})
    store.matched_rows(path, keys)
    assert {p.name.rsplit("@", 1)[1] for p in _mirrors(path)} == {"k.arrow"}
    store.read_matching(path, {"k": pa.array([5, 1202])})
    assert {p.name.rsplit("@", 1)[1] for p in _mirrors(path)} == {"k.arrow"}


def test_a_file_beyond_the_rows_the_driver_may_hold_is_not_mirrored(tmp_path):
    """Writing a mirror reads its file whole: a file of more rows than ``mirror_max_rows``
    (``INCR_LOCAL_STATE_ROWS``) is searched as Parquet, by row groups, with the same rows."""
    store = DeltaStore(mirror_rows=100, mirror_max_rows=499)
    path = tmp_path / "t"
    _table(store, path)  # three files of 500 rows
    wanted = {"k": pa.array([3, 600, 1499], pa.int64())}
    rows = store.read_matching(path, wanted)
    assert _mirrors(path) == [] and store.mirror_files(path, "k") == 0
    assert sorted(rows.column("v").to_pylist()) == [1.5, 300.0, 749.5]
    assert DeltaStore(mirror_rows=100, mirror_max_rows=500).mirror_files(path, "k") == 3
    assert len(_mirrors(path)) == 3


@given(st.lists(st.integers(-20, 20), max_size=40), st.sets(st.integers(-30, 30), max_size=20))
@settings(max_examples=300, deadline=None)
def test_equal_runs_finds_every_position_holding_a_wanted_value(values, wanted):
    """Wanted values outside the sorted values' range (a file sorted by the key holds a slice
    of it) are passed over, the others found at every position holding them."""
    ordered = np.array(sorted(values), dtype=np.int64)
    keys = np.array(sorted(wanted), dtype=np.int64)
    expected = [i for i, v in enumerate(ordered) if v in wanted]
    assert mirror.equal_runs(ordered, keys).tolist() == expected
