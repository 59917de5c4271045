"""The batch ledger: which landed file is batch number N, for one program.

Batch numbers are assigned when a file is first seen (registration) and never change, so a
file that lands late, with a name sorting before files already applied, becomes the next
batch instead of renumbering history.  The ledger is an append-only Delta table of events:

* ``register``: a file became batch ``seq`` (with its size, mtime and SHA-256);
* ``refresh``: a registered file that no table has applied yet was replaced (e.g. a
  rejected file the user fixed) and its fingerprint was updated;
* ``skip``: an operator dropped a batch that was never applied (``incr skip``);
* ``archive``: an applied batch's file was moved out of the landing folder (``incr
  archive``); the event's ``path`` is where it is now, and rebuilds read it there.

Whether a batch is applied is not recorded here: each Delta table records the batches it
committed (see :mod:`incr.runtime.store`), which is what makes application exactly-once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from incr.config import LEDGER_COMPACT_FILES
from incr.runtime.landing import LandedFile, sha256_of
from incr.runtime.store import DeltaStore

_SCHEMA = pa.schema([
    ("seq", pa.int64()), ("event", pa.string()), ("table", pa.string()), ("kind", pa.string()),
    ("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
    ("sha256", pa.string()), ("at", pa.string()),
])


@dataclass(frozen=True)
class Batch:
    """A registered batch: one landed file."""

    seq: int
    table: str
    kind: str
    path: str  # relative to the landing root
    size: int
    mtime_ns: int
    sha256: str
    archived: str | None = None  # where the file was moved by ``incr archive``

    def __str__(self) -> str:
        return f"batch {self.seq} ({self.path})"

    def source(self, landing: Path) -> Path:
        """Where the batch's file is read: its archive once archived (unless it is still in
        the landing folder, as after an archive interrupted before it removed the file)."""
        landed = landing / self.path
        if self.archived is None or landed.is_file():
            return landed
        return Path(self.archived)


_EVENT_ORDER = ["register", "refresh", "archive", "skip"]


class Ledger:
    """The event log of one program's batches.

    A run asks the ledger several things (known paths, next number, live batches); the
    events are read once per table version and kept.  Every append adds a file, so the log
    is rewritten as one file once it has more than ``LEDGER_COMPACT_FILES``
    (:mod:`incr.config`): a program that has run for a year reads one file, not thousands.
    """

    def __init__(self, store: DeltaStore, path: Path):
        self.store = store
        self.path = path
        self._kept: tuple[int, pa.Table] | None = None  # (table version, its events)

    def _events(self) -> pa.Table | None:
        """Every event (None: no ledger yet), read again only when the table moved on."""
        if not self.store.exists(self.path):
            self._kept = None
            return None
        version = self.store.table(self.path).version()
        if self._kept is None or self._kept[0] != version:
            self._kept = (version, self.store.read(self.path))
        return self._kept[1]

    def batches(self) -> list[Batch]:
        """Live batches (registered, not skipped), in batch-number order."""
        events = self._events()
        if events is None:
            return []
        # Files are not read back in commit order, so the order of a batch's events comes
        # from their meaning (registered, then refreshed, then skipped) and their time.
        rank = pc.index_in(events["event"], value_set=pa.array(_EVENT_ORDER))
        ordered = events.append_column("_rank", rank).sort_by(
            [("seq", "ascending"), ("_rank", "ascending"), ("at", "ascending")])
        live: dict[int, Batch] = {}
        for row in ordered.to_pylist():
            seq = row["seq"]
            if row["event"] == "register":
                live[seq] = Batch(seq, row["table"], row["kind"], row["path"], row["size"],
                                  row["mtime_ns"], row["sha256"])
            elif row["event"] == "refresh" and seq in live:
                live[seq] = replace(live[seq], size=row["size"], mtime_ns=row["mtime_ns"],
                                    sha256=row["sha256"])
            elif row["event"] == "archive" and seq in live:
                live[seq] = replace(live[seq], archived=row["path"])
            elif row["event"] == "skip":
                live.pop(seq, None)
        return [live[s] for s in sorted(live)]

    def all_paths(self) -> set[str]:
        """Every path ever registered (skipped ones included: they are not re-registered)."""
        events = self._events()
        if events is None:
            return set()
        registered = events.filter(pc.equal(events["event"], "register"))
        return set(registered.column("path").to_pylist())

    def register(self, landed: list[LandedFile], landing: Path) -> list[Batch]:
        """Registers files not seen before, numbering them after the existing batches."""
        known = self.all_paths()
        new = [f for f in landed if f.relpath not in known]
        if not new:
            return []
        start = self.next_seq()
        batches = [Batch(start + i, f.table, f.kind, f.relpath, f.size, f.mtime_ns,
                         sha256_of(landing / f.relpath)) for i, f in enumerate(new)]
        self._append([self._row(b, "register") for b in batches])
        return batches

    def refresh(self, batch: Batch, size: int, mtime_ns: int, sha256: str) -> Batch:
        """Records new content for a batch no table has applied yet."""
        updated = replace(batch, size=size, mtime_ns=mtime_ns, sha256=sha256)
        self._append([self._row(updated, "refresh")])
        return updated

    def archive(self, moved: list[tuple[Batch, Path]]) -> None:
        """Records where applied batches' files were moved (one commit)."""
        if moved:
            self._append([self._row(replace(b, path=str(to)), "archive") for b, to in moved])

    def skip(self, batch: Batch) -> None:
        """Drops a batch for good (the caller checks nothing applied it)."""
        self._append([self._row(batch, "skip")])

    def next_seq(self) -> int:
        events = self._events()
        seqs = [] if events is None else events.column("seq").to_pylist()
        return max(seqs) + 1 if seqs else 0

    def _row(self, b: Batch, event: str) -> dict:
        return {"seq": b.seq, "event": event, "table": b.table, "kind": b.kind, "path": b.path,
                "size": b.size, "mtime_ns": b.mtime_ns, "sha256": b.sha256,
                "at": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")}

    def _append(self, rows: list[dict]) -> None:
        self.store.write(self.path, pa.Table.from_pylist(rows, schema=_SCHEMA), mode="append",
                         batch=None, description="incr batch ledger (append-only event log)")
        self.store.compact(self.path, ("seq",), LEDGER_COMPACT_FILES)
