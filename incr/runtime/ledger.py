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

A large Parquet file is registered as several batches, one per slice of its row groups
(:mod:`~incr.runtime.slicing`): the slice is in the ``first_group``/``groups`` columns (NULL:
the whole file).  A file registered from a folder outside the landing area (``incr backfill
--folder``) has its absolute path as ``path``.

Whether a batch is applied is not recorded here: each Delta table records the batches it
committed (see :mod:`incr.runtime.store`), which is what makes application exactly-once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from incr.config import LEDGER_COMPACT_FILES
from incr.runtime.landing import LandedFile, sha256_of
from incr.runtime.slicing import Part
from incr.runtime.store import DeltaStore

_SCHEMA = pa.schema([
    ("seq", pa.int64()), ("event", pa.string()), ("table", pa.string()), ("kind", pa.string()),
    ("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
    ("sha256", pa.string()), ("at", pa.string()),
    # A slice of a large file (NULL: the whole file), added to ledgers written before slicing.
    ("first_group", pa.int64()), ("groups", pa.int64()), ("file_groups", pa.int64()),
    ("part_rows", pa.int64()), ("part_bytes", pa.int64()),
])
_PART_COLUMNS = ("first_group", "groups", "file_groups", "part_rows", "part_bytes")
#: Splits a landed file into the slices it is applied in ([]: whole).
Split = Callable[[Path, LandedFile], list[Part]]


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
    part: Part | None = None  # the slice of the file this batch applies (None: all of it)

    def __str__(self) -> str:
        return f"batch {self.seq} ({self.path}{f', {self.part}' if self.part else ''})"

    @property
    def bytes(self) -> int:
        """Bytes this batch reads: its slice's, or the file's."""
        return self.part.bytes if self.part is not None else self.size

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
        self._live: tuple[int, tuple[Batch, ...]] | None = None  # (version, its live batches)

    def _events(self) -> pa.Table | None:
        """Every event (None: no ledger yet), read again only when the table moved on."""
        if not self.store.exists(self.path):
            self._kept = self._live = None
            return None
        version = self.store.table(self.path).version()
        if self._kept is None or self._kept[0] != version:
            self._kept = (version, self.store.read(self.path))
        return self._kept[1]

    def batches(self) -> list[Batch]:
        """Live batches (registered, not skipped), in batch-number order.

        Worked out once per version of the ledger: a run asks several times, and at ten
        thousand batches each working-out takes about 0.1 s.
        """
        events = self._events()
        if events is None:
            return []
        assert self._kept is not None
        if self._live is None or self._live[0] != self._kept[0]:
            self._live = (self._kept[0], tuple(self._live_batches(events)))
        return list(self._live[1])

    @staticmethod
    def _live_batches(events: pa.Table) -> list[Batch]:
        """The live batches ``events`` leave, in batch-number order.

        A batch's events apply in the order of their meaning (registered, then refreshed,
        archived, skipped) and then their time: files are not read back in commit order.
        Registrations are nearly every event, so they are read column by column; the few
        others are then applied one by one.
        """
        ordered = events.append_column(
            "_rank", pc.index_in(events["event"], value_set=pa.array(_EVENT_ORDER))).sort_by(
            [("seq", "ascending"), ("_rank", "ascending"), ("at", "ascending")])
        registered = pc.equal(ordered["event"], "register")
        regs = ordered.filter(registered)
        columns = {c: regs.column(c).to_pylist() for c in (
            "seq", "table", "kind", "path", "size", "mtime_ns", "sha256", *_PART_COLUMNS)}
        live: dict[int, Batch] = {}
        for i, seq in enumerate(columns["seq"]):
            first = columns["first_group"][i]
            part = None if first is None else Part(
                first, columns["groups"][i], columns["file_groups"][i], columns["part_rows"][i],
                columns["part_bytes"][i])
            live[seq] = Batch(seq, columns["table"][i], columns["kind"][i], columns["path"][i],
                              columns["size"][i], columns["mtime_ns"][i], columns["sha256"][i],
                              part=part)
        for row in ordered.filter(pc.invert(registered)).to_pylist():
            seq = row["seq"]
            if row["event"] == "refresh" and seq in live:
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

    def register(self, landed: list[LandedFile], landing: Path,
                 split: Split | None = None) -> list[Batch]:
        """Registers files not seen before, numbering them after the existing batches;
        ``split`` cuts a large file into slices, a batch each."""
        known = self.all_paths()
        new = [f for f in landed if f.relpath not in known]
        if not new:
            return []
        batches = self._numbered(new, landing, split, self.next_seq())
        self._append([self._row(b, "register") for b in batches])
        return batches

    def register_again(self, slices: list[Batch], landed: LandedFile, landing: Path,
                       split: Split) -> list[Batch]:
        """Registers a sliced file anew after it changed before any table applied it (its
        row groups, so its slices, may differ): the old slices are skipped and the new ones
        numbered after every batch, in one commit."""
        batches = self._numbered([landed], landing, split, self.next_seq())
        self._append([self._row(b, "skip") for b in slices] +
                     [self._row(b, "register") for b in batches])
        return batches

    @staticmethod
    def _numbered(files: list[LandedFile], landing: Path, split: Split | None,
                  start: int) -> list[Batch]:
        batches: list[Batch] = []
        for f in files:
            path = landing / f.relpath
            digest = sha256_of(path)
            for part in (split(path, f) if split else []) or [None]:
                batches.append(Batch(start + len(batches), f.table, f.kind, f.relpath, f.size,
                                     f.mtime_ns, digest, part=part))
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
        part = b.part if event == "register" else None
        return {"seq": b.seq, "event": event, "table": b.table, "kind": b.kind, "path": b.path,
                "size": b.size, "mtime_ns": b.mtime_ns, "sha256": b.sha256,
                "at": dt.datetime.now(dt.UTC).isoformat(timespec="microseconds"),
                **dict(zip(_PART_COLUMNS, (part.first, part.count, part.of, part.rows, part.bytes)
                           if part else (None,) * len(_PART_COLUMNS), strict=True))}

    def _append(self, rows: list[dict]) -> None:
        # add_columns: a ledger written before slicing gets the slice columns (NULL in its
        # rows: whole files); for any other ledger the schemas are equal and nothing changes.
        self.store.write(self.path, pa.Table.from_pylist(rows, schema=_SCHEMA), mode="append",
                         batch=None, description="incr batch ledger (append-only event log)",
                         add_columns=True)
        self.store.compact(self.path, ("seq",), LEDGER_COMPACT_FILES)
