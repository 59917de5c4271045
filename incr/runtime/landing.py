"""The landing area: where batch files arrive.

Layout (one folder per source table)::

    LANDING/<table>/<file>              inserts
    LANDING/<table>/_deletes/<file>     deletions

Files are Parquet (``.parquet``), CSV with a header (``.csv``) or JSON lines (``.json``,
``.jsonl``, ``.ndjson``).  Names starting with ``.`` or ``_`` are ignored, so writers can land
a file atomically by writing ``.name.tmp`` and renaming it.  incr reads only inside the
landing folder: a symbolic link that leads outside it is refused like a file of a type it
cannot read (the batch is rejected, naming the link and where it leads).  The landing area
may also be an object store URI (``s3://bucket/landing``): :mod:`incr.runtime.remote`.
Batches apply in order of file name, inserts and deletes interleaved by name (ties: table
name, then inserts first).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from incr.errors import InputError, Location

FORMATS = {".parquet": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
           ".ndjson": "json"}
INSERT, DELETE = "insert", "delete"
DELETES_DIR = "_deletes"


@dataclass(frozen=True)
class LandedFile:
    """A batch file found in the landing area."""

    table: str
    kind: str
    relpath: str  # relative to the landing root, with forward slashes
    size: int
    mtime_ns: int

    @property
    def name(self) -> str:
        return self.relpath.rsplit("/", 1)[-1]


def file_format(path: str) -> str:
    """``parquet``, ``csv`` or ``json`` from the file name."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InputError(f"unsupported batch file type {suffix or '(none)'}; land .parquet, .csv "
                         f"(with a header) or .json/.jsonl (JSON lines), or start the name with "
                         f"'.' or '_' to have incr ignore it", Location(path))
    return FORMATS[suffix]


def discover(landing: Path, tables: Iterable[str], *, check_types: bool = True) -> list[LandedFile]:
    """Every batch file currently landed for ``tables``, in apply order.

    With ``check_types`` a file of a type incr cannot read, or a link leading outside the
    landing folder, is an :class:`InputError`; without it (a watcher only announcing files)
    it is listed, so the run that reads it says why.
    """
    found: list[LandedFile] = []
    root = landing.resolve()
    for table in tables:
        for kind, folder in ((INSERT, landing / table), (DELETE, landing / table / DELETES_DIR)):
            if not folder.is_dir():
                continue
            for entry in folder.iterdir():
                if not is_batch_name(entry.name) or not entry.is_file():
                    continue
                rel = entry.relative_to(landing).as_posix()
                if check_types:
                    file_format(str(entry))
                    _check_inside(entry, root)
                st = entry.stat()
                found.append(LandedFile(table, kind, rel, st.st_size, st.st_mtime_ns))
    return in_order(found)


def is_batch_name(name: str) -> bool:
    """Whether a file of this name is a batch (``.``- and ``_``-names are a writer's own)."""
    return not name.startswith((".", "_"))


def in_order(found: list[LandedFile]) -> list[LandedFile]:
    """Files in apply order: by name, then table, inserts before deletes."""
    return sorted(found, key=lambda f: (f.name, f.table, f.kind != INSERT))


def _check_inside(entry: Path, root: Path) -> None:
    """Refuses a file whose real path (links followed) is outside the landing folder."""
    target = entry.resolve()
    if not target.is_relative_to(root):
        raise InputError(f"{entry.name} leads to {target}, outside the landing folder {root}; incr "
                         f"reads only files inside it: copy the file in instead of linking it",
                         Location(str(entry)))


def sha256_of(path: Path) -> str:
    """Content hash of a file (registration fingerprint)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
