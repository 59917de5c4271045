"""Spark's ``xxhash64`` over Arrow columns, bit for bit, without Spark.

Two things incr stores are defined by Spark's hash: the ``_bucket`` of every state row
(``pmod(xxhash64(θ), buckets)``, the partition a MERGE prunes by) and the row index's
fingerprints (two ``xxhash64`` chains over every column and its NULL flag).  The driver-side
path for small batches (:mod:`incr.runtime.local`) must produce the same numbers, or a state
row would land in the wrong partition and a deleted row would not find its fingerprint.

Spark hashes a row by chaining: the seed (42) is hashed with the first non-NULL value, that
result is the seed for the next value, and a NULL leaves the seed as it is.  Per value
(Spark's ``HashExpression`` and ``XXH64``):

* BOOLEAN, TINYINT, SMALLINT, INTEGER, DATE: ``hashInt`` of the value as a 32-bit int;
* BIGINT, TIMESTAMP: ``hashLong``;
* FLOAT: ``hashInt`` of its bits, DOUBLE: ``hashLong`` of its bits (-0.0 as 0.0, NaN
  canonical);
* DECIMAL with precision ≤ 18: ``hashLong`` of the unscaled value; wider: the bytes of the
  unscaled value as Java's ``BigInteger.toByteArray`` writes them;
* VARCHAR: XXH64 of the UTF-8 bytes.

Fixed-width values are hashed vectorised in numpy (uint64 arithmetic wraps like Java's);
strings and wide decimals go through the ``xxhash`` library one value at a time, which is
fine for the small batches this path serves.  ``tests/runtime/test_sparkhash.py`` checks
every type against Spark itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from incr.compiler.sqlgen import bucket_expression
from incr.runtime.engine import DRIVER, SPARK, per_engine

# Spark's side of the rule is the compiler's SQL expression; it is marked here, beside the
# driver's, since the compiler knows nothing of engines.
per_engine("state bucket", SPARK)(bucket_expression)

SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_MASK = (1 << 64) - 1


class UnsupportedType(TypeError):
    """A column type this module does not hash the way Spark does (the caller uses Spark)."""


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark ``XXH64.hashInt``: ``values`` int32 (as any integer dtype), ``seed`` uint64."""
    h = seed + _P5 + np.uint64(4)
    h = h ^ ((values.astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)) * _P1)
    h = _rotl(h, 23) * _P2 + _P3
    return _fmix(h)


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Spark ``XXH64.hashLong``: ``values`` int64, ``seed`` uint64."""
    h = seed + _P5 + np.uint64(8)
    k = values.astype(np.int64).view(np.uint64) * _P2
    k = _rotl(k, 31) * _P1
    h = h ^ k
    h = _rotl(h, 27) * _P1 + _P4
    return _fmix(h)


def _hash_bytes(values: Sequence[bytes | None], seed: np.ndarray) -> np.ndarray:
    out = seed.copy()
    for i, v in enumerate(values):
        if v is not None:
            out[i] = xxhash.xxh64_intdigest(v, seed=int(seed[i]))
    return out


def _java_bytes(unscaled: int) -> bytes:
    """``BigInteger.toByteArray``: big-endian two's complement, minimal length."""
    length = (unscaled + (unscaled < 0)).bit_length() // 8 + 1
    return unscaled.to_bytes(length, "big", signed=True)


def _column_hash(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    """One step of the chain: ``col`` hashed with the running seed; NULLs keep the seed."""
    t = col.type
    valid = (np.ones(len(col), bool) if col.null_count == 0
             else col.is_valid().to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(t):
        h = _hash_int(pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(np.int32), seed)
    elif pa.types.is_integer(t) and t.bit_width <= 32 and pa.types.is_signed_integer(t):
        h = _hash_int(pc.fill_null(col, 0).to_numpy(), seed)
    elif pa.types.is_date32(t):
        h = _hash_int(pc.fill_null(col.cast(pa.int32()), 0).to_numpy(), seed)
    elif pa.types.is_int64(t):
        h = _hash_long(pc.fill_null(col, 0).to_numpy(), seed)
    elif pa.types.is_timestamp(t) and t.unit == "us":
        h = _hash_long(pc.fill_null(col.cast(pa.int64()), 0).to_numpy(), seed)
    elif pa.types.is_float64(t) or pa.types.is_float32(t):
        h = _float_hash(col, seed)
    elif pa.types.is_decimal(t):
        h = _decimal_hash(col, seed)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        h = _hash_bytes([None if v is None else v.encode() for v in col.to_pylist()], seed)
    else:
        raise UnsupportedType(f"no Spark-compatible hash for Arrow type {t}")
    return np.where(valid, h, seed)


def _float_hash(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    wide = col.type == pa.float64()
    values = pc.fill_null(col, 0.0).to_numpy(zero_copy_only=False).astype(
        np.float64 if wide else np.float32)
    values = np.where(values == 0, np.zeros_like(values), values)  # -0.0 hashes as 0.0
    nan = np.isnan(values)
    if wide:
        bits = values.view(np.int64).copy()
        bits[nan] = 0x7FF8000000000000
        return _hash_long(bits, seed)
    bits = values.view(np.int32).copy()
    bits[nan] = 0x7FC00000
    return _hash_int(bits, seed)


def _decimal_hash(col: pa.Array, seed: np.ndarray) -> np.ndarray:
    scale = col.type.scale
    unscaled = [None if v is None else int(v.scaleb(scale)) for v in col.to_pylist()]
    if col.type.precision <= 18:
        return _hash_long(np.array([0 if v is None else v for v in unscaled], np.int64), seed)
    return _hash_bytes([None if v is None else _java_bytes(v) for v in unscaled], seed)


def xxhash64(columns: Sequence[pa.Array | pa.ChunkedArray], seed: int = SEED) -> np.ndarray:
    """Spark's ``xxhash64(c1, c2, …)`` per row, as int64.

    Raises:
        UnsupportedType: a column of a type Spark's hash is not reproduced for.
    """
    n = len(columns[0]) if columns else 0
    h = np.full(n, seed & _MASK, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for given in columns:
            col = given.combine_chunks() if isinstance(given, pa.ChunkedArray) else given
            h = _column_hash(col, h)
    return h.view(np.int64)


@per_engine("state bucket", DRIVER)
def buckets(columns: Sequence[pa.Array | pa.ChunkedArray], count: int) -> pa.Array:
    """``CAST(pmod(xxhash64(columns), count) AS INT)``: the ``_bucket`` of each row."""
    if not columns or count == 1:
        n = len(columns[0]) if columns else 0
        return pa.array(np.zeros(n, np.int32))
    return pa.array((xxhash64(columns) % count).astype(np.int32))


def string_hash(text: str, seed: int = SEED) -> int:
    """The seed after hashing a non-NULL string literal (Spark: ``xxhash64('…')``)."""
    v = xxhash.xxh64_intdigest(text.encode(), seed=seed & _MASK)
    return v - (1 << 64) if v >= 1 << 63 else v
