"""The batch ledger keeps its numbering through many appends and its compaction."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from incr.config import LEDGER_COMPACT_FILES as COMPACT_AFTER_FILES
from incr.runtime.landing import LandedFile
from incr.runtime.ledger import Ledger
from incr.runtime.store import DeltaStore


def _land(landing: Path, n: int) -> LandedFile:
    rel = f"t/{n:04d}.csv"
    path = landing / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"x\n{n}\n")
    st = path.stat()
    return LandedFile("t", "insert", rel, st.st_size, st.st_mtime_ns)


def test_numbering_refresh_and_skip_survive_compaction(tmp_path: Path):
    store, landing = DeltaStore(), tmp_path / "landing"
    ledger = Ledger(store, tmp_path / "ledger")
    landed = []
    for n in range(COMPACT_AFTER_FILES + 6):  # one file per register: compaction happens
        landed.append(_land(landing, n))
        [batch] = ledger.register(landed, landing)  # earlier files are known: only the new one
        assert batch.seq == n
        if n == 3:
            ledger.skip(batch)
        if n == 5:
            ledger.refresh(batch, 99, 1, "f" * 64)
    files = len(store.table(tmp_path / "ledger").file_uris())
    assert files <= COMPACT_AFTER_FILES
    fresh = Ledger(DeltaStore(), tmp_path / "ledger")  # another process reading it
    for reader in (ledger, fresh):
        batches = reader.batches()
        assert [b.seq for b in batches] == [n for n in range(COMPACT_AFTER_FILES + 6) if n != 3]
        assert next(b for b in batches if b.seq == 5).size == 99
        assert reader.register(landed, landing) == []  # nothing registered twice


def test_a_ledger_written_before_slicing_takes_sliced_files(tmp_path: Path):
    import pyarrow.parquet as pq

    from incr.runtime.slicing import parts

    store, landing = DeltaStore(), tmp_path / "landing"
    path = tmp_path / "ledger"
    old = _land(landing, 0)
    # The ledger's schema before slicing: no slice columns.
    store.write(path, pa.Table.from_pylist([{
        "seq": 0, "event": "register", "table": "t", "kind": "insert", "path": old.relpath,
        "size": old.size, "mtime_ns": old.mtime_ns, "sha256": "0" * 64, "at": "2026-01-01"}]),
        mode="append", batch=None)
    big = landing / "t" / "0001.parquet"
    pq.write_table(pa.table({"x": list(range(3000))}), big, row_group_size=1000)
    st = big.stat()
    landed = LandedFile("t", "insert", "t/0001.parquet", st.st_size, st.st_mtime_ns)
    ledger = Ledger(store, path)
    added = ledger.register([old, landed], landing, lambda p, f: parts(p, f, budget=1))
    assert [(b.seq, b.part.first, b.part.rows) for b in added] == [(1, 0, 1000), (2, 1, 1000),
                                                                  (3, 2, 1000)]
    batches = Ledger(DeltaStore(), path).batches()
    assert batches[0].part is None and [str(b) for b in batches[1:]] == [
        "batch 1 (t/0001.parquet, row group 0 of 3)", "batch 2 (t/0001.parquet, row group 1 of 3)",
        "batch 3 (t/0001.parquet, row group 2 of 3)"]


def test_slices_follow_the_budget_and_memory_settings(tmp_path: Path):
    import pyarrow.parquet as pq

    from incr.config import Settings
    from incr.runtime.slicing import memory_bytes, parts, slice_budget

    assert memory_bytes("1g") == 2**30 and memory_bytes("512m") == 2**29 and memory_bytes("4096") == 4096
    assert slice_budget(Settings(), {"spark.driver.memory": "1g"}) == 2**28
    assert slice_budget(Settings(spark_master="spark://h:7077"),
                        {"spark.driver.memory": "1g", "spark.executor.memory": "8g"}) == 2**31
    assert slice_budget(Settings(slice_bytes=1234), {"spark.driver.memory": "1g"}) == 1234
    path = tmp_path / "t" / "f.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"x": list(range(10_000))}), path, row_group_size=1000)
    groups = [pq.ParquetFile(path).metadata.row_group(i).total_byte_size for i in range(10)]
    st = path.stat()
    landed = LandedFile("t", "insert", "t/f.parquet", st.st_size, st.st_mtime_ns)
    cut = parts(path, landed, budget=max(groups) * 3)
    assert [g for p in cut for g in p.groups()] == list(range(10))
    assert all(sum(groups[g] for g in p.groups()) <= max(groups) * 3 for p in cut)
    assert parts(path, landed, budget=sum(groups)) == []  # fits: whole
    assert parts(path, LandedFile("t", "delete", "t/_deletes/f.parquet", 1, 1), budget=1) == []


def test_live_batches_are_worked_out_once_per_version_whatever_the_events(tmp_path: Path,
                                                                          monkeypatch):
    """A run asks for the batches several times: they are worked out from the events once
    per version of the ledger, and again after any append.  Refreshed, archived and
    skipped batches come out as their events leave them, whatever order the events' files
    are read in."""
    store, landing = DeltaStore(), tmp_path / "landing"
    ledger = Ledger(store, tmp_path / "ledger")
    landed = [_land(landing, n) for n in range(6)]
    batches = ledger.register(landed, landing)
    ledger.refresh(batches[1], 7, 8, "a" * 64)
    ledger.archive([(batches[2], tmp_path / "archive" / "0002.csv")])
    ledger.skip(batches[4])
    ledger.refresh(batches[1], 9, 10, "b" * 64)  # the later refresh wins
    worked = []
    real = Ledger._live_batches
    monkeypatch.setattr(Ledger, "_live_batches",
                        staticmethod(lambda events: worked.append(1) or real(events)))
    first = ledger.batches()
    assert ledger.batches() == first and len(worked) == 1
    assert [b.seq for b in first] == [0, 1, 2, 3, 5]
    assert (first[1].size, first[1].mtime_ns, first[1].sha256) == (9, 10, "b" * 64)
    assert first[2].archived == str(tmp_path / "archive" / "0002.csv") and first[0].archived is None
    first.pop()  # a caller's list is its own
    assert [b.seq for b in ledger.batches()] == [0, 1, 2, 3, 5]
    ledger.skip(batches[0])
    assert [b.seq for b in ledger.batches()] == [1, 2, 3, 5] and len(worked) == 2
    assert Ledger(DeltaStore(), tmp_path / "ledger").batches() == ledger.batches()
