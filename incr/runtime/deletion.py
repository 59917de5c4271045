"""Deletion vectors: rows of a Delta table's files marked deleted without rewriting the files.

A Delta table without deletion vectors is copy-on-write: deleting one row rewrites the
whole file that holds it.  An answer table of millions of groups, of which a batch touches
forty thousand spread over the key range, is then rewritten whole by every batch.  With
deletion vectors (Delta protocol, reader 3 / writer 7, feature ``deletionVectors``) a
batch marks the old rows of its touched groups deleted in each file's vector and appends
their new rows in one small file: the cost follows the change.

delta-rs reads such tables (``DeltaTable.scan``, its MERGE, ``deletion_vectors``) but does
not write the vectors (delta-rs issue #4079), so incr writes them itself, here, in the
protocol's format:

* a vector is a *RoaringBitmapArray* of the deleted row positions of one file: the magic
  number 1681511377 (little-endian int32), the number of 32-bit bitmaps (int64), then per
  bitmap its key (the positions' high 32 bits, int32) and the bitmap of their low 32 bits
  in Roaring's portable format (``pyroaring``);
* it is stored *inline* in the commit (storage type ``i``): the bytes Z85-encoded, padded
  to a multiple of four.  An inline vector has no file of its own, so no VACUUM can lose
  it, and its descriptor follows from the positions alone.

Compaction rewrites the table without vectors once they hold a share of its rows
(:mod:`~incr.runtime.answer`), which bounds how large a vector and a commit get.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from pyroaring import BitMap

#: The protocol's magic number of a serialized RoaringBitmapArray.
MAGIC = 1681511377
#: Storage type of a vector kept inline in the commit.
INLINE = "i"
_B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_TO_Z85 = str.maketrans(_B85, _Z85)
_FROM_Z85 = str.maketrans(_Z85, _B85)


def serialize(positions: Iterable[int] | np.ndarray) -> bytes:
    """The RoaringBitmapArray of ``positions`` (row numbers in a file, from 0).

    Canonical: the same set of positions always gives the same bytes, which is what lets a
    later commit name an inline vector it must replace (a vector is identified by its text).
    """
    values = np.unique(np.asarray(list(positions) if not isinstance(positions, np.ndarray)
                                  else positions, dtype=np.uint64))
    keys = values >> np.uint64(32)
    out = [struct.pack("<iq", MAGIC, len(np.unique(keys)))]
    for key in np.unique(keys):
        low = (values[keys == key] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        out.append(struct.pack("<i", int(key)) + BitMap(low).serialize())
    return b"".join(out)


def deserialize(data: bytes) -> np.ndarray:
    """The positions of a serialized RoaringBitmapArray, sorted (int64)."""
    magic, count = struct.unpack_from("<iq", data, 0)
    if magic != MAGIC:
        raise ValueError(f"not a deletion vector (magic number {magic}, not {MAGIC})")
    offset, parts = 12, []
    for _ in range(count):
        (key,) = struct.unpack_from("<i", data, offset)
        bitmap = BitMap.deserialize(data[offset + 4:])
        offset += 4 + len(bitmap.serialize())
        parts.append(np.array(bitmap.to_array(), dtype=np.int64) + (int(key) << 32))
    return np.concatenate(parts) if parts else np.array([], dtype=np.int64)


def z85encode(data: bytes) -> str:
    """Z85 (the protocol's Base85) of ``data`` zero-padded to a multiple of 4 bytes."""
    padded = data + b"\0" * (-len(data) % 4)
    return base64.b85encode(padded).decode("ascii").translate(_TO_Z85)


def z85decode(text: str, size: int) -> bytes:
    """The first ``size`` bytes Z85 ``text`` encodes."""
    return base64.b85decode(text.translate(_FROM_Z85).encode("ascii"))[:size]


def inline(positions: Iterable[int] | np.ndarray) -> dict[str, Any]:
    """The descriptor of an inline vector deleting ``positions`` (the ``deletionVector`` of
    an ``add`` or ``remove`` action)."""
    data = serialize(positions)
    count = len(deserialize(data))
    return {"storageType": INLINE, "pathOrInlineDv": z85encode(data), "sizeInBytes": len(data),
            "cardinality": count}


def positions_of(descriptor: Mapping[str, Any]) -> np.ndarray:
    """The deleted positions of an inline vector's descriptor.

    Raises:
        ValueError: the vector is stored in a file (incr writes only inline ones; such a
            vector comes from another writer, and its rows are read through delta-rs).
    """
    if descriptor.get("storageType") != INLINE:
        raise ValueError(f"a deletion vector stored as {descriptor.get('storageType')!r}, not inline")
    return deserialize(z85decode(descriptor["pathOrInlineDv"], int(descriptor["sizeInBytes"])))
