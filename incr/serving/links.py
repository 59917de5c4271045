"""A read-only folder per answer version, holding exactly that version's files.

Spark (without the delta-spark JARs) and any other reader that is not Delta-aware read a
*folder* of Parquet files, and an answer's own folder holds the files of every version it
ever had.  So each served version gets a folder of its own,
``<root>/<program>/<view>/v<version>/``, holding exactly the files of that version's Delta
file list, as hard links:

* no data is copied: a hard link is a second name for the same file;
* a pinned snapshot keeps its rows even if a vacuum deletes the answer's old files: the
  data stays until the last name goes;
* the folder is built under a hidden name and renamed into place, so a reader finds it
  complete or not at all, and it is made read-only (mode 0555) once complete.

A version whose Delta deletion vectors delete rows of its files (incr marks the rows a
batch replaces deleted instead of rewriting the files that hold them) also gets
``_deleted/deleted.parquet`` in its folder: those rows as (``file_name``: the link's name,
``row_index``: the position in the file, from 0), for a reader to anti-join the files with
(Spark's ``_metadata.file_name`` and ``_metadata.row_index``; :mod:`~incr.serving.catalog`).
Spark, Hadoop and Arrow skip names starting with ``_`` when they list a folder, so a table
over the version folder reads the data files only.  The file is built, made read-only and
checked with the rest of the folder, and lies under the served root, where the read-only
guard lets clients read.

A hard link needs the root on the warehouse's filesystem, and (Linux's
``fs.protected_hardlinks``) a server user that owns the files or may write them; where
either fails the file is copied instead, which costs the answer's size once per version.

A folder no served snapshot uses any more is deleted only after a grace period, so a query
already planned over its files finishes reading them.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from incr.errors import StorageError
from incr.serving.snapshots import AnswerVersion

log = logging.getLogger("incr.serving")

#: Mode of a complete version folder: readable, not writable, by anyone (files cannot be
#: added to it or removed from it; the linked files keep their own mode).
READ_ONLY_DIR = stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
#: Mode of a file written into a version folder (a copied file, the deleted rows).
READ_ONLY_FILE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
#: The subfolder of a version folder with its deleted rows (hidden from a folder listing).
DELETED_FOLDER = "_deleted"
#: The file of the deleted rows in it.
DELETED_FILE = "deleted.parquet"


def local_path(uri: str) -> Path:
    """The local path of a file of a Delta file list (a path, or a ``file://`` URI).

    Raises:
        StorageError: the file is on a remote store, which cannot be linked.
    """
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    if len(parsed.scheme) == 1:  # a Windows drive letter, not a scheme
        return Path(uri)
    raise StorageError(f"{uri} is on a remote store; serving needs the warehouse on a local or "
                       f"mounted filesystem")


class LinkFolders:
    """The version folders under ``root`` (created on first use; the server's own).

    Args:
        root: the folder to build version folders in; on the warehouse's filesystem for
            hard links to work.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._unused_since: dict[Path, float] = {}
        self._copied = False

    def clear(self) -> None:
        """Deletes every version folder (at start: no catalog refers to them any more)."""
        if self.root.exists():
            _make_writable(self.root)
            shutil.rmtree(self.root)
        self._unused_since.clear()

    def folder_of(self, program: str, answer: AnswerVersion) -> Path:
        """Where the folder of ``answer`` is (whether built or not)."""
        return self.root / program / answer.view / f"v{answer.version}"

    def deleted_folder_of(self, program: str, answer: AnswerVersion) -> Path:
        """Where the deleted rows of ``answer`` are (only when it has some)."""
        return self.folder_of(program, answer) / DELETED_FOLDER

    def expected_names(self, answer: AnswerVersion) -> list[str]:
        """The names a complete folder of ``answer`` holds.

        Its files' links, and the folder of its deleted rows when it has some.
        """
        names = [_link_name(i, local_path(f)) for i, f in enumerate(answer.files)]
        return sorted(names + ([DELETED_FOLDER] if answer.has_deletions else []))

    def deleted_rows(self, answer: AnswerVersion) -> pa.Table:
        """The deleted rows of ``answer``, each file named as it is linked in the folder."""
        return answer.deleted_rows(lambda i, f: _link_name(i, local_path(f)))

    def is_intact(self, program: str, answer: AnswerVersion) -> bool:
        """Whether the folder of ``answer`` exists and holds exactly its files.

        When the version has deleted rows, the folder must also hold exactly one file of
        them, with as many rows as the version deletes (its footer is read, not its rows:
        this runs at every poll).
        """
        folder = self.folder_of(program, answer)
        try:
            if sorted(os.listdir(folder)) != self.expected_names(answer):
                return False
            if not answer.has_deletions:
                return True
            deleted = folder / DELETED_FOLDER
            return (os.listdir(deleted) == [DELETED_FILE]
                    and pq.read_metadata(deleted / DELETED_FILE).num_rows
                    == sum(len(r) for r in answer.deleted.values()))
        except (OSError, pa.ArrowException):
            return False

    def ensure(self, program: str, answer: AnswerVersion) -> Path:
        """The folder of ``answer``, built if missing or not intact.

        Complete or absent, never half: it is built under a hidden name, then renamed.

        Raises:
            StorageError: a file of the version is gone (a vacuum deleted it): the version
                can no longer be served.
        """
        target = self.folder_of(program, answer)
        if self.is_intact(program, answer):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        building = target.parent / f".{target.name}-{uuid.uuid4().hex}"
        building.mkdir()
        try:
            for i, uri in enumerate(answer.files):
                source = local_path(uri)
                self._place(source, building / _link_name(i, source), answer)
            if answer.has_deletions:
                self._write_deleted(building / DELETED_FOLDER, answer)
            building.chmod(READ_ONLY_DIR)
            if target.exists():  # damaged (say a BI user wrote into it as root): replaced
                _make_writable(target)
                shutil.rmtree(target)
            os.rename(building, target)
        except BaseException:
            _make_writable(building)
            shutil.rmtree(building, ignore_errors=True)
            raise
        self._unused_since.pop(target, None)
        return target

    def _place(self, source: Path, name: Path, answer: AnswerVersion) -> None:
        try:
            os.link(source, name)
            return
        except FileNotFoundError as e:
            raise StorageError(f"file {source} of version {answer.version} of the answer of view "
                               f"{answer.view} is gone (vacuumed?); that version cannot be served") from e
        except OSError as e:
            if not self._copied:
                log.warning("cannot hard-link answer files into %s (%s); copying them instead "
                            "(put the serving folder on the warehouse's filesystem, as a user "
                            "that owns the files, to link them)", self.root, e.strerror)
                self._copied = True
        try:
            shutil.copyfile(source, name)
        except FileNotFoundError as e:
            raise StorageError(f"file {source} of version {answer.version} of the answer of view "
                               f"{answer.view} is gone (vacuumed?); that version cannot be served") from e
        name.chmod(READ_ONLY_FILE)

    def _write_deleted(self, folder: Path, answer: AnswerVersion) -> None:
        """Writes the deleted rows of ``answer`` into ``folder``, read-only like the links."""
        folder.mkdir()
        pq.write_table(self.deleted_rows(answer), folder / DELETED_FILE)
        (folder / DELETED_FILE).chmod(READ_ONLY_FILE)
        folder.chmod(READ_ONLY_DIR)

    def sweep(self, in_use: set[Path], grace_s: float, now: float | None = None) -> list[Path]:
        """Deletes version folders unused for ``grace_s`` seconds; returns those deleted.

        A folder leaves ``in_use`` when no served snapshot shows it; queries planned before
        may still read its files, so it goes only once it has been unused that long.
        """
        now = time.monotonic() if now is None else now
        deleted = []
        for folder in self._version_folders():
            if folder in in_use:
                self._unused_since.pop(folder, None)
                continue
            since = self._unused_since.setdefault(folder, now)
            if now - since >= grace_s:
                _make_writable(folder)
                shutil.rmtree(folder, ignore_errors=True)
                self._unused_since.pop(folder, None)
                deleted.append(folder)
        return deleted

    def _version_folders(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [version for program in self.root.iterdir() if program.is_dir()
                for view in program.iterdir() if view.is_dir()
                for version in view.iterdir()
                if version.is_dir() and version.name.startswith("v")]


def _link_name(index: int, source: Path) -> str:
    """The file's name in a version folder.

    Its own, unless a reader would skip it: names starting with ``_`` or ``.`` are hidden
    files to Spark and Hadoop.
    """
    name = source.name
    return f"part-{index:05d}{name}" if name.startswith(("_", ".")) else name


def _make_writable(folder: Path) -> None:
    """Gives the owner write access to ``folder`` and the folders under it (to delete them)."""
    for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())] if folder.exists() else []:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
