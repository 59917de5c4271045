"""A landing area on an object store (``s3://``, ``gs://``, ``abfs://``, ...).

Files usually land in a bucket: an upstream export, a Kafka sink connector, a partner's
drop.  incr lists such a landing area through Arrow's filesystems (:mod:`pyarrow.fs`),
configured the way every AWS, GCS and Azure client is, from the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``;
``GOOGLE_APPLICATION_CREDENTIALS``; ``AZURE_STORAGE_ACCOUNT_NAME``, ...) or from the
URI's own query (``s3://bucket/landing?endpoint_override=host:9000&scheme=http``).

Each registration copies the objects it has not seen into a cache folder beside the
program's ledger and the run reads them there, so everything downstream of the landing
area (Parquet sliced by row group, a large file read by Spark, a rebuild reading history
again, the ledger naming files by their path under the landing root) is the same for a
bucket as for a folder.  An object is copied once: the cache keeps its size and
modification time, and one rewritten in place is copied again, so the run that reads it
sees the change as it would in a folder.  Housekeeping drops the copies of files every view
has applied (the bucket keeps the objects; a rebuild copies what it reads again), and
``incr archive`` moves the cached copy to the archive and then deletes the object from the
bucket.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from incr.errors import StorageError
from incr.runtime.landing import DELETE, DELETES_DIR, INSERT, LandedFile, file_format, in_order, is_batch_name

#: Bytes per read while copying an object into the cache.
CHUNK = 8 << 20


def is_remote(location: str | Path) -> bool:
    """True for a URI with a scheme other than ``file`` (a Windows drive letter is a path)."""
    scheme = urlsplit(str(location)).scheme
    return len(scheme) > 1 and scheme != "file"


class RemoteLanding:
    """A landing area behind a URI: listed, copied into a local cache, cleared on archive.

    Args:
        uri: the landing root, e.g. ``s3://bucket/landing``; tables are its sub-folders
            (``<uri>/<table>/`` and ``<uri>/<table>/_deletes/``) as in a local landing area.
    """

    def __init__(self, uri: str):
        import pyarrow.fs as pafs

        self.uri = str(uri).rstrip("/")
        try:
            self.fs, self.root = pafs.FileSystem.from_uri(self.uri)
        except Exception as e:  # Arrow's errors name neither the URI nor the fix
            raise StorageError(f"cannot open the landing area {self.uri}: {e}; check the URI and "
                               f"the credentials in the environment (for S3: AWS_ACCESS_KEY_ID, "
                               f"AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL)") from e
        self.root = self.root.rstrip("/")

    def uri_of(self, relpath: str) -> str:
        """The object's URI, for messages: ``<landing uri>/<relpath>``."""
        return f"{self.uri}/{relpath}"

    def files(self, tables: Iterable[str], *, check_types: bool = True) -> list[LandedFile]:
        """Every batch object currently landed for ``tables``, in apply order; the rules of
        :func:`~incr.runtime.landing.discover` (names starting with ``.`` or ``_`` are not
        batches; with ``check_types`` a file of a type incr cannot read is an InputError
        naming its URI)."""
        import pyarrow.fs as pafs

        found: list[LandedFile] = []
        for table in tables:
            for kind, sub in ((INSERT, table), (DELETE, f"{table}/{DELETES_DIR}")):
                selector = pafs.FileSelector(f"{self.root}/{sub}", allow_not_found=True)
                for info in self._listing(selector, sub):
                    if info.type != pafs.FileType.File or not is_batch_name(info.base_name):
                        continue
                    rel = f"{sub}/{info.base_name}"
                    if check_types:
                        file_format(self.uri_of(rel))
                    found.append(LandedFile(table, kind, rel, info.size, info.mtime_ns))
        return in_order(found)

    def _listing(self, selector: object, sub: str) -> list:
        try:
            return self.fs.get_file_info(selector)
        except Exception as e:  # the store's error, said with the URI
            raise StorageError(f"cannot list {self.uri_of(sub)}: {e}") from e

    def sync(self, cache: Path, tables: Iterable[str],
             registered: Mapping[str, tuple[int, int]] | None = None) -> list[LandedFile]:
        """Copies every landed object the cache does not hold as it is now into ``cache``
        (same relative path, the object's modification time); returns what was copied.

        ``registered``: the (size, mtime) the ledger holds per path; an object still so
        whose copy is gone (moved to an archive) is not copied again.  A copy is written
        under a temporary ``.``-name and renamed, so a reader never sees half of it.
        """
        registered = registered or {}
        copied = []
        for landed in self.files(tables):
            local = cache / landed.relpath
            signature = (landed.size, landed.mtime_ns)
            if local.is_file():
                st = local.stat()
                if (st.st_size, st.st_mtime_ns) == signature:
                    continue
            elif registered.get(landed.relpath) == signature:
                continue
            self.fetch(landed.relpath, local, landed.mtime_ns)
            copied.append(landed)
        return copied

    def fetch(self, relpath: str, local: Path, mtime_ns: int | None = None) -> bool:
        """Copies one object to ``local`` (atomically), stamped with ``mtime_ns`` (default:
        the object's); False if there is no such object (the reader then says it is gone)."""
        import pyarrow.fs as pafs

        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.incr-part")
        source = f"{self.root}/{relpath}"
        try:
            if mtime_ns is None:
                info = self.fs.get_file_info(source)
                if info.type != pafs.FileType.File:
                    return False
                mtime_ns = info.mtime_ns
            with self.fs.open_input_stream(source) as src, tmp.open("wb") as dst:
                while chunk := src.read(CHUNK):
                    dst.write(chunk)
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            tmp.replace(local)
            return True
        except OSError as e:
            raise StorageError(f"cannot copy {self.uri_of(relpath)} to {local}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    def remove(self, relpath: str, size: int, mtime_ns: int) -> bool:
        """Deletes the object if it is still the file a batch read (same size and modification
        time: not one landed since under the same name); returns whether it did."""
        import pyarrow.fs as pafs

        source = f"{self.root}/{relpath}"
        try:
            info = self.fs.get_file_info(source)
            if info.type != pafs.FileType.File or (info.size, info.mtime_ns) != (size, mtime_ns):
                return False
            self.fs.delete_file(source)
        except OSError as e:
            raise StorageError(f"cannot delete {self.uri_of(relpath)} from the landing area after "
                               f"archiving it: {e}; allow incr to delete objects there, or clear "
                               f"archived objects with the store's own lifecycle rules") from e
        return True
