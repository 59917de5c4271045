"""How far a run is, as it goes: batches, rows, bytes, rate and time left.

A backfill of many large files runs for minutes to hours; without this, ``incr run`` prints
nothing until the end.  A :class:`Progress` counts what a run (or an Airflow task) has
applied against what it set out to apply, and hands a line to an emitter after every
batch: on a terminal one line rewritten in place (:func:`on_terminal`), elsewhere (a task
log, a file) one line per batch (:func:`as_lines`).  The time left is estimated from the
bytes still to read at the rate so far (a batch reads a file, or a slice of a large one;
row counts are not known before files are read).  When large files are applied in slices
(:mod:`~incr.runtime.slicing`), the line counts files apart from batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

#: Receives each progress line, and whether it is the run's last.
Emit = Callable[[str, bool], None]


@dataclass
class Progress:
    """What a run applied so far of ``total_batches`` files of ``total_bytes``."""

    total_batches: int
    total_bytes: int
    emit: Emit
    clock: Callable[[], float] = time.monotonic
    #: Batches to apply per file, when files are applied in slices (else one each).
    per_file: Mapping[str, int] | None = None
    batches: int = 0
    bytes: int = 0
    rows: int = 0
    started: float = field(init=False)
    _left: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._left = dict(self.per_file or {})

    @classmethod
    def over(cls, batches: Iterable[tuple[str, int]], emit: Emit) -> Progress:
        """A meter over batches given as (file, bytes read), several per sliced file."""
        per_file: dict[str, int] = {}
        total = 0
        for file, size in batches:
            per_file[file] = per_file.get(file, 0) + 1
            total += size
        return cls(sum(per_file.values()), total, emit, per_file=per_file)

    def advance(self, size: int, rows: int, file: str | None = None) -> None:
        """Counts one applied batch (the ``size`` in bytes it read, its ``rows``, and the
        ``file`` it is part of) and emits the line."""
        self.batches += 1
        self.bytes += size
        self.rows += rows
        if file in self._left:
            self._left[file] -= 1
        self.emit(self.line(), self.batches >= self.total_batches)

    def finish(self) -> None:
        """Ends a run that stopped before its last batch (a rejected one): the line so far,
        as the last."""
        if self.batches < self.total_batches:
            self.emit(self.line() + " (stopped)", True)

    def line(self) -> str:
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.rows / elapsed
        parts = [f"{self.batches}/{self.total_batches} batches"]
        if self.per_file and len(self.per_file) < self.total_batches:  # some files in slices
            done = sum(1 for n in self._left.values() if n <= 0)
            parts[0] += f" (slices) of {done}/{len(self.per_file)} files"
        parts += [f"{self.rows:,} rows",
                 f"{_count(rate)} rows/s",
                 f"{_size(self.bytes)} of {_size(self.total_bytes)}",
                 f"{_duration(elapsed)} elapsed"]
        if self.batches < self.total_batches:
            left = self.total_bytes - self.bytes
            eta = left * elapsed / self.bytes if self.bytes else None
            parts.append("ETA " + (_duration(eta) if eta is not None else "?"))
        return " · ".join(parts)


def on_terminal(stream: TextIO) -> Emit:
    """One line, rewritten in place; the last one stays."""
    def emit(line: str, last: bool) -> None:
        stream.write("\r" + line + "\x1b[K" + ("\n" if last else ""))
        stream.flush()
    return emit


def as_lines(write: Callable[[str], object]) -> Emit:
    """A line per batch, prefixed so a log search finds them."""
    def emit(line: str, last: bool) -> None:
        write(f"progress: {line}")
    return emit


def _count(n: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _size(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
