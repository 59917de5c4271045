"""A warehouse in an S3 bucket (``s3://bucket/prefix``), worked on through a local working copy.

Everything incr keeps in a warehouse is files: Delta tables written by delta-rs and by hand
(deletion vectors, commits), the key mirrors memory-mapped beside them, the touch log, the
ledger, the schema logs, and the locks. Those files are shaped for a local filesystem: an
``flock``, an ``mmap``, a rename that never replaces. So incr does not write a bucket file
by file. It works in a **working copy**, a local folder kept in step with the bucket:

- **pull** (when a command starts, and each time it takes a lock) downloads the objects that
  changed in the bucket since this copy last saw them, and deletes the local files whose
  objects were deleted. Data files come first and log entries after them, so a reader of the
  copy never finds a commit whose files are missing. What changed is read from the bucket's
  **journal** (``_incr_journal/<n>.json``): each push appends an entry naming what it put
  (with ETags) and deleted, numbered by a create-if-absent, so a pull costs a listing of the
  entries after the last one this copy read, not of the whole bucket. A new copy, or one
  whose unread entries were pruned, lists the bucket once.
- **push** (before a lock is let go) uploads the files that changed here, in the order they
  were written. A Delta commit is thus in the bucket only after every file it names, and
  incr's own records (the ledger, the touch log) only after the commits they describe. A run
  killed half-way leaves the bucket as a killed run leaves a folder, and is recovered the
  same way. Then push deletes the objects of files deleted here, and journals what it did.
- **leases** stand in for the locks between machines. Each lock incr takes in the working
  copy (the ledger's, a row index's, a view's) is also taken in the bucket as a lease object
  ``<lock>.lease``, created only if absent (S3's ``If-None-Match: *``). The lease names its
  working copy, host and pid, and runs out after ``INCR_LEASE_TTL_S`` seconds unless renewed.
  A thread renews it while it is held. The processes of one machine share their working
  copy's leases, as they share its ``flock``s. So Airflow's parallel ``apply_<view>`` tasks
  wait for each other only when they write the same thing, whichever machine runs them. A
  lease whose holder died is taken over once it has run out. Exactly one taker wins, through
  a second conditional create keyed by the lease's ETag. Shared (reading) locks are exclusive
  between machines.

What a working copy keeps to itself: the locks, the key mirrors, the driver's kept
translations, a bucket landing area's copies and the scratch slices, which are caches or
belong to this machine; temporary ``*.tmp`` files, Spark's staging folders and Hadoop's
``.crc`` checksums.
The bucket therefore holds plain Delta tables: any Delta-aware reader (DuckDB's ``delta``
extension, Spark with delta-spark, Trino, delta-rs) reads the answers there.

Credentials and endpoint come from the environment as for every AWS client:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from incr.config import Settings, settings
from incr.errors import StorageError
from incr.runtime.remote import is_remote

log = logging.getLogger(__name__)

#: Where a working copy keeps its own records (never synced).
SYNC_DIR = ".incr-sync"
#: Folders of a program's ``_incr/<program>/`` that stay on this machine.
LOCAL_META = frozenset({"locks", "landing", "slices", "sql"})
#: Folders anywhere in the warehouse that stay on this machine (key mirrors, a BI server's
#: own folder of links to the versions it serves).
LOCAL_DIRS = frozenset({SYNC_DIR, "_incr_mirrors", "_serving"})
#: Data files uploaded (or downloaded) at once.
THREADS = 8
#: The bucket's journal of pushes (relative to the warehouse), read by pulls instead of a
#: listing of the whole bucket.
JOURNAL = "_incr_journal"
#: Every this many entries a push drops those more than KEEP_ENTRIES behind; a copy that
#: missed them lists the whole bucket once.
PRUNE_EVERY = 1_000
KEEP_ENTRIES = 10_000
#: The largest file sent in one PUT (its ETag comes back with it); larger ones go in parts.
ONE_PUT = 64 << 20
_POLL_S = 0.2
#: A folder Spark writes a table's new files into before they are renamed into place
#: (:meth:`~incr.runtime.store.DeltaStore.staging`): nothing in it is the table's yet.
_SPARK_STAGING = re.compile(r"spark-[0-9a-f]{32}")
#: What S3 answers a create-if-absent of a key that exists (or is being created).
_TAKEN = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})


def _is_data(rel: str) -> bool:
    """Whether ``rel`` is a file a commit or a record names (a table's data file, a
    deletion vector): such files go up (and down) before any other."""
    name = rel.rsplit("/", 1)[-1]
    return "/_delta_log/" not in f"/{rel}" and name.endswith((".parquet", ".bin"))


def synced(rel: str) -> bool:
    """Whether the file at ``rel`` (relative to the warehouse, ``/``-separated) belongs in the
    bucket; see the module's docstring for what does not."""
    if rel.startswith(JOURNAL + "/"):
        return False
    parts = rel.split("/")
    name = parts[-1]
    if LOCAL_DIRS.intersection(parts) or name.endswith(".tmp") or \
            (name.startswith(".") and name.endswith(".crc")) or \
            any(_SPARK_STAGING.fullmatch(part) for part in parts[:-1]):
        return False
    return not (len(parts) > 3 and parts[0] == "_incr" and parts[2] in LOCAL_META)


@dataclass
class SyncMetrics:
    """What this process's syncs with the bucket did so far (for ``incr bench bucket`` and
    the ``-v`` log)."""

    pulls: int = 0
    full_listings: int = 0  # pulls that listed the whole bucket instead of reading the journal
    pull_s: float = 0.0
    downloaded: int = 0
    pushes: int = 0
    push_s: float = 0.0
    uploaded: int = 0
    deleted: int = 0
    leases: int = 0
    lease_s: float = 0.0  # taking them and letting them go


@dataclass
class _Seen:
    """What the working copy knows of one object: its ETag when last pulled or pushed, and
    the local file's size and mtime just then (a change to either is a local change)."""

    etag: str
    size: int
    mtime_ns: int

    def matches(self, st: os.stat_result) -> bool:
        return (st.st_size, st.st_mtime_ns) == (self.size, self.mtime_ns)


def _client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"max_attempts": 5, "mode": "standard"},
                                            max_pool_connections=THREADS * 2))


def _aws_errors() -> tuple[type[Exception], ...]:
    """The errors of an S3 call that fails (imported when one is caught: botocore is slow to
    import, and a local warehouse never needs it)."""
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


class BucketWarehouse:
    """One working copy of a warehouse in a bucket: pull, push, and the leases of its locks.

    Args:
        uri: ``s3://bucket/prefix``.
        config: the settings (``INCR_WORKING_COPIES``, ``INCR_LEASE_TTL_S``).
    """

    def __init__(self, uri: str, config: Settings | None = None):
        config = config or settings()
        parts = urlsplit(str(uri).rstrip("/"))
        if parts.scheme != "s3" or not parts.netloc:
            raise StorageError(f"the warehouse {uri} is not an s3://bucket/prefix URI; incr keeps a "
                               f"warehouse in a local folder or in S3 (or an S3-compatible store: set "
                               f"AWS_ENDPOINT_URL), whose conditional writes its locks need")
        self.uri = f"s3://{parts.netloc}{parts.path}"
        self.bucket, self.prefix = parts.netloc, parts.path.strip("/")
        base = Path(config.working_copies or Path.home() / ".cache" / "incr" / "warehouses")
        digest = hashlib.sha256(self.uri.encode()).hexdigest()[:12]
        self.local = base.expanduser() / f"{self.bucket}-{digest}"
        self.ttl_s = config.lease_ttl_s
        self._meta = self.local / SYNC_DIR
        try:
            self._meta.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot make the working copy of {self.uri} at {self.local}: "
                               f"{e.strerror}; set INCR_WORKING_COPIES to a writable folder") from e
        self.owner = self._owner_id()
        self.s3 = _client()
        self.metrics = SyncMetrics()
        self._leases: dict[str, _Lease] = {}  # held by this process, by key
        self._guard = threading.Lock()
        self._beat: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"BucketWarehouse({self.uri!r} at {self.local})"

    def _owner_id(self) -> str:
        """This working copy's name in the leases it takes (made once, kept in the copy)."""
        path = self._meta / "id"
        if not path.exists():
            aside = self._meta / f"id.{os.getpid()}.tmp"
            aside.write_text(uuid.uuid4().hex)
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)  # the first process to name the copy names it for all
            aside.unlink()
        return path.read_text().strip()

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    # -- the bucket's listing and the copy's records -------------------------------------------
    def _listing(self) -> dict[str, tuple[str, int]]:
        """Every synced object under the prefix: relative path -> (ETag, size)."""
        found: dict[str, tuple[str, int]] = {}
        start = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
            for page in pages:
                for obj in page.get("Contents", ()):
                    rel = obj["Key"][len(start):]
                    if rel and synced(rel):
                        found[rel] = (obj["ETag"], obj["Size"])
        except Exception as e:
            raise StorageError(f"cannot list the warehouse {self.uri}: {e}; check the URI and the "
                               f"credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, "
                               f"AWS_ENDPOINT_URL)") from e
        return found

    def _read_seen(self) -> dict[str, _Seen]:
        path = self._meta / "seen.json"
        if not path.exists():
            return {}
        return {rel: _Seen(*v) for rel, v in json.loads(path.read_text()).items()}

    def _record(self, name: str, text: str) -> None:
        """Writes one of the copy's records whole (aside, then renamed over the old one)."""
        aside = self._meta / f"{name}.{os.getpid()}.tmp"
        aside.write_text(text)
        os.replace(aside, self._meta / name)

    def _write_seen(self, seen: dict[str, _Seen]) -> None:
        self._record("seen.json",
                     json.dumps({rel: [s.etag, s.size, s.mtime_ns] for rel, s in seen.items()}))

    @contextlib.contextmanager
    def _syncing(self) -> Iterator[dict[str, _Seen]]:
        """The copy's records, with the copy's sync lock held (one pull or push at a time on
        this machine), written back afterwards even when the sync failed part-way."""
        fd = os.open(self._meta / "sync.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            seen = self._read_seen()
            try:
                yield seen
            finally:
                self._write_seen(seen)
        finally:
            os.close(fd)

    def _files_here(self) -> dict[str, os.stat_result]:
        """Every synced file of the working copy: relative path -> its stat."""
        out: dict[str, os.stat_result] = {}
        for folder, dirs, files in os.walk(self.local):
            rel_dir = os.path.relpath(folder, self.local).replace(os.sep, "/")
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            dirs[:] = [d for d in dirs if d not in LOCAL_DIRS and synced(f"{rel_dir}{d}/-")]
            for name in files:
                rel = rel_dir + name
                if synced(rel):
                    with contextlib.suppress(FileNotFoundError):  # a temp file renamed meanwhile
                        out[rel] = os.stat(os.path.join(folder, name))
        return out

    # -- pull and push ----------------------------------------------------------------------
    def pull(self) -> int:
        """Brings the working copy up to the bucket; returns how many files it downloaded.

        What changed is read from the bucket's journal (:meth:`_from_journal`); a copy that
        has not read it yet, or that missed entries pruned meanwhile, lists the whole bucket.
        A file changed here since it was last synced is kept: it is this machine's work, not
        pushed yet. So is a local file the bucket no longer has but that changed here.
        """
        t0 = time.perf_counter()
        with self._syncing() as seen:
            read = self._from_journal()
            changes, position = read if read is not None else self._from_listing(seen)
            wanted = []
            for rel, etag in changes.items():
                known = seen.get(rel)
                st = self._stat(rel)
                if etag is None:  # deleted in the bucket
                    if known is not None and (st is None or known.matches(st)):
                        if st is not None:
                            (self.local / rel).unlink()
                        del seen[rel]
                    continue
                if known is not None and known.etag == etag:
                    continue
                if st is not None and (known is None or not known.matches(st)):
                    log.warning("%s/%s changed both here and in the bucket; keeping this copy's",
                                self.uri, rel)
                    continue
                wanted.append(rel)
            data = [rel for rel in wanted if _is_data(rel)]
            rest = sorted((rel for rel in wanted if not _is_data(rel)),
                          key=lambda rel: (rel.rsplit("/", 1)[-1] == "_last_checkpoint", rel))
            with ThreadPoolExecutor(THREADS) as pool:
                got = list(zip(data, pool.map(self._download, data), strict=True))
            got += [(rel, self._download(rel)) for rel in rest]
            for rel, record in got:
                if record is not None:
                    seen[rel] = record
            self._write_position(position)  # only once everything it names is here
        self.metrics.pulls += 1
        self.metrics.pull_s += time.perf_counter() - t0
        self.metrics.downloaded += len(wanted)
        log.info("pulled %s: %d files in %.2f s", self.uri, len(wanted), time.perf_counter() - t0)
        return len(wanted)

    def _stat(self, rel: str) -> os.stat_result | None:
        try:
            return os.stat(self.local / rel)
        except FileNotFoundError:
            return None

    def _from_listing(self, seen: dict[str, _Seen]) -> tuple[dict[str, str | None], int]:
        """Every object of the bucket (relative path -> ETag), and None for each file this
        copy synced that the bucket no longer has. The journal's newest entry is read first,
        so a push that lands meanwhile is read again from the journal next time."""
        newest = self._journal_after(-1, newest_only=True)
        remote = self._listing()
        self.metrics.full_listings += 1
        return ({**{rel: None for rel in seen if rel not in remote},
                 **{rel: etag for rel, (etag, _size) in remote.items()}},
                newest[-1][0] if newest else 0)

    # -- the journal ---------------------------------------------------------------------------
    def _journal_key(self, n: int) -> str:
        return self._key(f"{JOURNAL}/{n:020}.json")

    def _journal_after(self, last: int, newest_only: bool = False) -> list[tuple[int, str]]:
        """The journal's entries after number ``last``, in order: (number, key)."""
        start = self._key(f"{JOURNAL}/")
        kwargs = {"StartAfter": self._journal_key(last)} if last >= 0 else {}
        found: list[tuple[int, str]] = []
        try:
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=start, **kwargs):
                for obj in page.get("Contents", ()):
                    name = obj["Key"][len(start):].removesuffix(".json")
                    if name.isdigit():
                        found.append((int(name), obj["Key"]))
                if newest_only and found:
                    found = found[-1:]
        except _aws_errors() as e:
            raise StorageError(f"cannot list the journal of {self.uri}: {e}") from e
        return found

    def _position(self) -> int | None:
        path = self._meta / "position"
        return int(path.read_text()) if path.exists() else None

    def _write_position(self, n: int) -> None:
        self._record("position", str(n))

    def _from_journal(self) -> tuple[dict[str, str | None], int] | None:
        """What changed in the bucket since this copy last read the journal: relative path ->
        its ETag, or None where it was deleted (the last entry naming a file wins), and the
        number of the last entry read; None when the journal cannot tell (never read here, or
        entries this copy missed are gone)."""
        last = self._position()
        if last is None:
            return None
        entries = self._journal_after(last)
        if entries and entries[0][0] != last + 1:
            log.info("%s: journal entries %d-%d are gone; listing the whole bucket", self.uri,
                     last + 1, entries[0][0] - 1)
            return None
        changes: dict[str, str | None] = {}
        for _n, key in entries:
            try:
                entry = json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
            except _aws_errors() as e:
                if _code(e) in ("NoSuchKey", "404"):
                    return None  # pruned while read
                raise StorageError(f"cannot read s3://{self.bucket}/{key}: {e}") from e
            changes.update(entry.get("put", {}))
            changes.update(dict.fromkeys(entry.get("deleted", ())))
        return changes, entries[-1][0] if entries else last

    def _journal(self, put: dict[str, str], deleted: list[str]) -> None:
        """Appends an entry naming what a push put and deleted: the next number, created only
        if absent, so pushes from several machines get one number each, in the order they
        were made. Prunes entries :data:`KEEP_ENTRIES` behind every :data:`PRUNE_EVERY`."""
        last = self._position() or 0
        newer = self._journal_after(last)
        n = newer[-1][0] + 1 if newer else last + 1
        body = json.dumps({"by": self.owner, "at": time.time(), "put": put,
                           "deleted": deleted}).encode()
        while True:
            try:
                self.s3.put_object(Bucket=self.bucket, Key=self._journal_key(n), Body=body,
                                   IfNoneMatch="*")
                break
            except _aws_errors() as e:
                if _code(e) not in _TAKEN:
                    raise StorageError(f"cannot write the journal of {self.uri}: {e}") from e
                n += 1
        if n == last + 1:
            self._write_position(n)  # nothing else was pushed since this copy's last read
        if n % PRUNE_EVERY == 0:
            old = [key for number, key in self._journal_after(-1) if number <= n - KEEP_ENTRIES]
            for at in range(0, len(old), 1000):
                self.s3.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": key} for key in old[at:at + 1000]], "Quiet": True})

    def _download(self, rel: str) -> _Seen | None:
        path = self.local / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self._key(rel))
            with open(aside, "wb") as out:
                for chunk in got["Body"].iter_chunks(8 << 20):
                    out.write(chunk)
            os.replace(aside, path)
        except Exception as e:
            aside.unlink(missing_ok=True)
            if _code(e) in ("NoSuchKey", "404"):
                return None  # deleted since it was listed: a later entry says so
            raise StorageError(f"cannot download {self.uri}/{rel} into the working copy "
                               f"{self.local}: {e}") from e
        st = path.stat()
        return _Seen(got["ETag"], st.st_size, st.st_mtime_ns)

    def push(self) -> int:
        """Uploads what changed in the working copy, in the order it was written, then deletes
        the objects of files deleted here; returns how many files it uploaded."""
        with self._guard:
            lost = [lease.what for lease in self._leases.values() if lease.lost]
        if lost:
            raise StorageError(f"the lease of {lost[0]} in {self.uri} ran out and was taken by "
                               f"another machine; this run's work is not pushed (raise "
                               f"INCR_LEASE_TTL_S if renewals are late)")
        t0 = time.perf_counter()
        with self._syncing() as seen:
            local = self._files_here()
            changed = [rel for rel, st in local.items() if rel not in seen or not seen[rel].matches(st)]
            # Data files are never rewritten and nothing reads one before a commit names it:
            # they go up first, all at once. Then the commits and records, one at a time in the
            # order they were written.
            data = [rel for rel in changed if _is_data(rel)]
            rest = sorted((rel for rel in changed if not _is_data(rel)),
                          key=lambda rel: local[rel].st_mtime_ns)
            put: dict[str, _Seen] = {}
            removed: list[str] = []
            try:
                with ThreadPoolExecutor(THREADS) as pool:
                    for rel, got in zip(data, pool.map(lambda r: self._upload(r, local[r]), data),
                                        strict=True):
                        if got is not None:
                            put[rel] = got
                for rel in rest:
                    if (got := self._upload(rel, local[rel])) is not None:
                        put[rel] = got
                gone = [rel for rel in seen if rel not in local]
                for at in range(0, len(gone), 1000):  # S3 deletes at most 1,000 keys a request
                    keys = gone[at:at + 1000]
                    try:
                        out = self.s3.delete_objects(Bucket=self.bucket, Delete={
                            "Objects": [{"Key": self._key(rel)} for rel in keys], "Quiet": True})
                    except Exception as e:
                        raise StorageError(f"cannot delete {len(keys)} objects of {self.uri} (the "
                                           f"first {self.uri}/{keys[0]}): {e}") from e
                    if out.get("Errors"):
                        error = out["Errors"][0]
                        raise StorageError(f"cannot delete s3://{self.bucket}/{error['Key']}: "
                                           f"{error.get('Message', error.get('Code'))}")
                    removed += keys
            finally:
                # What went up (or went) is journaled even when the push stopped part-way, and
                # recorded as synced only once it is: what is not is sent again next time.
                if put or removed:
                    self._journal({rel: r.etag for rel, r in put.items()}, removed)
                    seen.update(put)
                    for rel in removed:
                        seen.pop(rel, None)
        self.metrics.pushes += 1
        self.metrics.push_s += time.perf_counter() - t0
        self.metrics.uploaded += len(put)
        self.metrics.deleted += len(removed)
        log.info("pushed %s: %d files up, %d deleted in %.2f s", self.uri, len(put), len(removed),
                 time.perf_counter() - t0)
        return len(put)

    def _upload(self, rel: str, st: os.stat_result) -> _Seen | None:
        """Uploads one file; its record, or None when it changed (or went) while uploading
        (the next push sends it again)."""
        path, key = self.local / rel, self._key(rel)
        try:
            if st.st_size <= ONE_PUT:
                with open(path, "rb") as f:
                    etag = self.s3.put_object(Bucket=self.bucket, Key=key, Body=f.read())["ETag"]
            else:
                self.s3.upload_file(str(path), self.bucket, key)
                etag = self.s3.head_object(Bucket=self.bucket, Key=key)["ETag"]
        except FileNotFoundError:
            return None
        except Exception as e:
            raise StorageError(f"cannot upload {path} to {self.uri}/{rel}: {e}") from e
        try:
            after = path.stat()
        except FileNotFoundError:
            return None
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            return None
        return _Seen(etag, st.st_size, st.st_mtime_ns)

    # -- leases ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, lock: Path, what: str, wait_s: float, fd: int) -> Iterator[None]:
        """Holds the lease of the local lock file ``lock`` (held on ``fd``) in the bucket.

        Waits up to ``wait_s`` seconds for another machine's lease (0: fails at once), then
        raises a StorageError naming its host and pid. On the way out the lease is deleted
        only by the last holder on this machine (the one that can take ``fd`` exclusively).
        """
        rel = os.path.relpath(lock, self.local).replace(os.sep, "/")
        key = self._key(rel.removesuffix(".lock") + ".lease")
        held = self._take(key, what, wait_s)
        try:
            yield
        finally:
            t0 = time.perf_counter()
            with self._guard:
                self._leases.pop(key, None)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                last = True
            except BlockingIOError:
                last = False  # another process of this machine holds it still
            if last and not held.lost:
                try:
                    self.s3.delete_object(Bucket=self.bucket, Key=key)
                except _aws_errors() as e:  # it runs out instead; others wait until then
                    log.warning("could not let go of the lease of %s (it runs out in %g s): %s",
                                what, self.ttl_s, e)
            self.metrics.lease_s += time.perf_counter() - t0

    def _body(self, what: str) -> bytes:
        return json.dumps({"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                           "what": what, "expires": time.time() + self.ttl_s}).encode()

    def _take(self, key: str, what: str, wait_s: float) -> _Lease:
        t0 = time.perf_counter()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                etag = self.s3.put_object(Bucket=self.bucket, Key=key, Body=self._body(what),
                                          IfNoneMatch="*")["ETag"]
                break
            except Exception as e:
                if _code(e) not in _TAKEN:
                    raise StorageError(f"cannot take the lease of {what} in {self.uri}: {e}; the "
                                       f"store must accept conditional writes (PUT with "
                                       f"If-None-Match), as S3 and recent MinIO do") from e
            holder = self._holder(key)
            if holder is None:
                continue  # let go meanwhile: try again at once
            body, etag = holder
            if body.get("owner") == self.owner:
                break  # another process of this machine holds it: its lease is ours too
            if body.get("expires", 0) < time.time() and self._break(key, etag):
                log.warning("took over the lease of %s from %s (pid %s), which ran out", what,
                            body.get("host"), body.get("pid"))
                continue
            if time.monotonic() >= deadline:
                waited = f" (waited {wait_s:g} s)" if wait_s else ""
                left = body.get("expires", 0) - time.time()
                raise StorageError(f"{what} is being updated on {body.get('host')} by pid "
                                   f"{body.get('pid')}{waited}; wait for it to finish (lease "
                                   f"s3://{self.bucket}/{key}, runs out in {max(left, 0):.0f} s "
                                   f"unless renewed)")
            time.sleep(_POLL_S)
        held = _Lease(key, what, etag)
        self.metrics.leases += 1
        self.metrics.lease_s += time.perf_counter() - t0
        with self._guard:
            self._leases[key] = held
            if self._beat is None or not self._beat.is_alive():
                self._beat = threading.Thread(target=self._renew, name="incr-leases", daemon=True)
                self._beat.start()
        return held

    def _holder(self, key: str) -> tuple[dict, str] | None:
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=key)
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise StorageError(f"cannot read the lease s3://{self.bucket}/{key}: {e}") from e
        try:
            return json.loads(got["Body"].read()), got["ETag"]
        except ValueError:
            return {}, got["ETag"]  # not ours to read: it never runs out, so it is waited for

    def _break(self, key: str, etag: str) -> bool:
        """Deletes a lease that ran out, if this process is the one taker of that very lease
        (the first to create ``<key>.taken-<etag>``)."""
        try:
            self.s3.put_object(Bucket=self.bucket, Key=f"{key}.taken-{etag.strip(chr(34))}",
                               Body=self.owner.encode(), IfNoneMatch="*")
        except _aws_errors() as e:
            if _code(e) in _TAKEN:
                return False
            raise StorageError(f"cannot take over the lease s3://{self.bucket}/{key}: {e}") from e
        still = self._holder(key)
        if still is not None and still[1] == etag:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
        return True

    def _renew(self) -> None:
        """Renews every lease this process holds, every third of their life, until none is."""
        while True:
            time.sleep(self.ttl_s / 3)
            with self._guard:
                leases = list(self._leases.values())
                if not leases:
                    self._beat = None
                    return
            for lease in leases:
                try:
                    self._renew_one(lease)
                except (StorageError, *_aws_errors()) as e:
                    log.warning("could not renew the lease of %s (trying again in %g s): %s",
                                lease.what, self.ttl_s / 3, e)

    def _renew_one(self, lease: _Lease) -> None:
        """Renews one lease if it is still this working copy's (read, then written only if it
        did not change meanwhile); marks it lost if it is not."""
        holder = self._holder(lease.key)
        if holder is not None and holder[0].get("owner") == self.owner:
            try:
                lease.etag = self.s3.put_object(Bucket=self.bucket, Key=lease.key,
                                                Body=self._body(lease.what),
                                                IfMatch=holder[1])["ETag"]
                return
            except _aws_errors() as e:
                if _code(e) not in _TAKEN:
                    raise
                holder = self._holder(lease.key)  # written meanwhile: by whom?
                if holder is not None and holder[0].get("owner") == self.owner:
                    lease.etag = holder[1]  # another process of this machine renewed it
                    return
        lease.lost = True
        log.error("lost the lease of %s in %s: it ran out and %s", lease.what, self.uri,
                  "was deleted" if holder is None else
                  f"is held on {holder[0].get('host')} by pid {holder[0].get('pid')}")


@dataclass
class _Lease:
    key: str
    what: str
    etag: str
    lost: bool = False


def working_copy(warehouse: str | Path, config: Settings | None = None) -> Path:
    """The folder to read a warehouse in: itself, or a bucket's working copy brought up to
    date (for commands that only read: ``incr answer``, ``incr explain``)."""
    if not is_remote(warehouse):
        return Path(warehouse)
    bucket = BucketWarehouse(str(warehouse), config)
    bucket.pull()
    return bucket.local
