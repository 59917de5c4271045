"""The batch ledger keeps its numbering through many appends and its compaction."""

from __future__ import annotations

from pathlib import Path

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
