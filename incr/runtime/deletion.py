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

import array
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from pyroaring import BitMap

from incr.runtime.bounded import Bounded

#: The protocol's magic number of a serialized RoaringBitmapArray.
MAGIC = 1681511377
#: Storage type of a vector kept inline in the commit.
INLINE = "i"
_Z85 = np.frombuffer(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#", np.uint8)
#: Each byte's digit in Z85 (255: not a Z85 character).
_Z85_DIGIT = np.full(256, 255, np.uint8)
_Z85_DIGIT[_Z85] = np.arange(85, dtype=np.uint8)
#: 85^4 .. 85^0: a group of five digits, most significant first, is one big-endian word.
_POWERS = 85 ** np.arange(4, -1, -1, dtype=np.uint64)


def _distinct(positions: Iterable[int] | np.ndarray) -> np.ndarray:
    """``positions`` as ascending distinct uint64 (no sort when they already are)."""
    values = np.asarray(positions if isinstance(positions, np.ndarray) else list(positions),
                        dtype=np.uint64)
    if len(values) > 1 and not bool(np.all(values[1:] > values[:-1])):
        values = np.unique(values)
    return values


def serialize(positions: Iterable[int] | np.ndarray) -> bytes:
    """The RoaringBitmapArray of ``positions`` (row numbers in a file, from 0).

    Canonical: the same set of positions always gives the same bytes, which is what lets a
    later commit name an inline vector it must replace (a vector is identified by its text).
    """
    return _serialize(_distinct(positions))


def _serialize(values: np.ndarray) -> bytes:
    """:func:`serialize` of ascending distinct uint64 positions."""
    keys = values >> np.uint64(32)
    # the positions are ascending, so each high word's positions are one run
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], int)
    ends = np.r_[starts[1:], len(keys)].astype(int) if len(keys) else np.array([], int)
    out = [struct.pack("<iq", MAGIC, len(starts))]
    for start, end in zip(starts, ends, strict=True):
        low = (values[start:end] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        # from an array.array: pyroaring then copies the buffer (a numpy array it iterates)
        out.append(struct.pack("<i", int(keys[start]))
                   + BitMap(array.array("I", low.tobytes())).serialize())
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
        parts.append(np.frombuffer(bitmap.to_array(), dtype=np.uint32).astype(np.int64)
                     + (int(key) << 32))
    return np.concatenate(parts) if parts else np.array([], dtype=np.int64)


def z85encode(data: bytes) -> str:
    """Z85 (the protocol's Base85) of ``data`` zero-padded to a multiple of 4 bytes: each
    big-endian 32-bit word as five base-85 digits, most significant first (vectorized: a
    vector of a million positions is a few hundred KiB of text, read on every batch)."""
    padded = data + b"\0" * (-len(data) % 4)
    words = np.frombuffer(padded, dtype=">u4").astype(np.uint64)
    digits = (words[:, None] // _POWERS) % np.uint64(85)
    return _Z85[digits.astype(np.intp)].tobytes().decode("ascii")


def z85decode(text: str, size: int) -> bytes:
    """The first ``size`` bytes Z85 ``text`` encodes.

    Raises:
        ValueError: ``text`` is not Z85 (a character outside its alphabet, a length not a
            multiple of five, or a group above 2^32 - 1).
    """
    digits = _Z85_DIGIT[np.frombuffer(text.encode("ascii"), np.uint8)]
    if len(digits) % 5 or (digits == 255).any():
        raise ValueError("not a Z85 text (a length that is not a multiple of 5, or a character "
                         "outside the alphabet)")
    words = (digits.reshape(-1, 5).astype(np.uint64) * _POWERS).sum(axis=1)
    if (words > np.uint64(0xFFFFFFFF)).any():
        raise ValueError("not a Z85 text (a group of five characters above 2^32 - 1)")
    return words.astype(">u4").tobytes()[:size]


def inline(positions: Iterable[int] | np.ndarray) -> dict[str, Any]:
    """The descriptor of an inline vector deleting ``positions`` (the ``deletionVector`` of
    an ``add`` or ``remove`` action)."""
    values = _distinct(positions)
    data = _serialize(values)
    count = len(values)
    return {"storageType": INLINE, "pathOrInlineDv": z85encode(data), "sizeInBytes": len(data),
            "cardinality": count}


#: Vectors decoded lately, read-only, by their text: a vector never changes (a new one is a
#: new text), and a batch reads the vectors of the same files more than once.  At most
#: about 64 MiB are kept.
_decoded: Bounded[tuple[str, int], np.ndarray] = Bounded(
    64 * 1024 * 1024, lambda key, positions: positions.nbytes + len(key[0]))


def positions_of(descriptor: Mapping[str, Any]) -> np.ndarray:
    """The deleted positions of an inline vector's descriptor.

    Raises:
        ValueError: the vector is stored in a file (incr writes only inline ones; such a
            vector comes from another writer, and its rows are read through delta-rs).
    """
    if descriptor.get("storageType") != INLINE:
        raise ValueError(f"a deletion vector stored as {descriptor.get('storageType')!r}, not inline")
    key = (descriptor["pathOrInlineDv"], int(descriptor["sizeInBytes"]))
    positions = _decoded.get(key)
    if positions is None:
        positions = deserialize(z85decode(*key))
        positions.setflags(write=False)
        _decoded.put(key, positions)
    return positions

