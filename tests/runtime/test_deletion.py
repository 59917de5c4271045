"""Deletion vectors incr writes: the format against delta-rs's reader, and the MERGE that
writes them (``Merge.with_deletion_vectors``) against the copy-on-write MERGE."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from incr.errors import StorageError
from incr.runtime import deletion, deltalog
from incr.runtime.bounded import Bounded
from incr.runtime.session import read_delta
from incr.runtime.store import DeltaStore, has_deletion_vectors

GONE = "_gone"
SCHEMA = pa.schema([("k", pa.string()), ("g", pa.int64()), ("v", pa.float64())])


@settings(max_examples=60, deadline=None)
@given(st.sets(st.one_of(st.integers(0, 70_000), st.integers(0, 2**33)), max_size=300))
def test_a_vector_reads_back_as_the_positions_it_was_written_from(positions):
    data = deletion.serialize(positions)
    assert deletion.serialize(sorted(positions, reverse=True)) == data  # canonical
    assert deletion.deserialize(data).tolist() == sorted(positions)
    descriptor = deletion.inline(positions)
    assert descriptor["cardinality"] == len(positions)
    assert len(descriptor["pathOrInlineDv"]) % 5 == 0
    assert deletion.positions_of(descriptor).tolist() == sorted(positions)


def test_decoded_vectors_are_kept_read_only_within_a_byte_budget(monkeypatch):
    """A vector read again is not decoded again; what is kept is read-only (callers share
    it) and about ``_DECODED_BYTES`` at most, the most recently read kept."""
    monkeypatch.setattr(deletion, "_decoded", Bounded(
        3 * 8 * 1000 + 3 * 2000, lambda key, positions: positions.nbytes + len(key[0])))
    vectors = [deletion.inline(range(i, i + 1000)) for i in range(0, 5000, 1000)]
    first = deletion.positions_of(vectors[0])
    assert deletion.positions_of(vectors[0]) is first and not first.flags.writeable
    for start, v in zip(range(1000, 5000, 1000), vectors[1:], strict=True):
        assert deletion.positions_of(v).tolist() == list(range(start, start + 1000))
    kept = list(deletion._decoded.values())
    assert 1 <= len(kept) <= 3 and kept[-1][0] == 4000
    assert deletion.positions_of(vectors[0]).tolist() == list(range(1000))


def test_a_vector_stored_elsewhere_is_not_read_as_inline():
    with pytest.raises(ValueError, match="not inline"):
        deletion.positions_of({"storageType": "u", "pathOrInlineDv": "x", "sizeInBytes": 1})


def _table(path: Path, rows: list[dict], store: DeltaStore) -> None:
    store.write(path, pa.Table.from_pylist(rows, SCHEMA), mode="overwrite", batch=0,
                target_file_size=2048)


def _merge(store: DeltaStore, path: Path, gone: list[tuple], new: list[dict], batch: int,
           vectors: bool = True):
    rows = [{"k": k, "g": g, "v": None, GONE: True} for k, g in gone]
    rows += [{**r, GONE: False} for r in new]
    source = pa.Table.from_pylist(rows, SCHEMA.append(pa.field(GONE, pa.bool_())))
    merge = (store.merge(path, source).on_groups(("k", "g"), GONE).when_matched_delete()
             .when_not_matched_insert_all(f"NOT s.{GONE}"))
    if vectors:
        merge = merge.with_deletion_vectors()
    return merge.for_batch(batch, {"incr.batch": str(batch)}).execute()


def _rows(table: pa.Table) -> list[tuple]:
    return sorted((r["k"] or "", r["g"] if r["g"] is not None else -1, r["v"])
                  for r in table.to_pylist())


def test_a_merge_by_deletion_vectors_equals_the_copy_on_write_merge(spark, tmp_path):
    """Random tombstones and new rows, NULL keys among them, over a table of many files, batch
    after batch: both MERGEs leave the same rows; the vectors' MERGE rewrites no file, and
    Spark (through the file list) and delta-rs (its own reader) read the same rows."""
    rng = np.random.default_rng(5)
    store = DeltaStore()
    keys = [(f"k{i:04d}" if i % 97 else None, int(i % 3)) for i in range(3000)]
    first = [{"k": k, "g": g, "v": float(i)} for i, (k, g) in enumerate(keys)]
    a, b = tmp_path / "vectors", tmp_path / "copies"
    _table(a, first, store)
    _table(b, first, store)
    files = set(DeltaTable(str(a)).file_uris())
    assert len(files) > 2
    live = list(first)  # a bag: a group may have several rows (NULL keys here), all deleted
    written = len(first)
    for batch in range(1, 5):
        touched = [keys[i] for i in rng.choice(len(keys), 200, replace=False)]
        touched += [(f"new{batch}-{i}", 1) for i in range(5)] + [(None, 7)]  # absent: no match
        new = [{"k": k, "g": g, "v": float(batch)} for k, g in touched[::2]]
        ma = _merge(store, a, touched, new, batch)
        written += len(new)
        _merge(store, b, touched, new, batch, vectors=False)
        live = [r for r in live if (r["k"], r["g"]) not in set(touched)] + new
        assert ma.inserted == len(new) and ma.files_added == 1
        expected = _rows(pa.Table.from_pylist(live, SCHEMA))
        assert _rows(store.read(a)) == _rows(store.read(b)) == expected, batch
        assert _rows(pa.table(DeltaTable(str(a)).scan())) == expected
        assert _rows(read_delta(spark, store, str(a)).toArrow()) == expected
        assert store.applied_through(a) == batch
    assert files <= set(DeltaTable(str(a)).file_uris())  # no file of the first version went
    deleted, held = store.deleted_rows(a)
    assert held == written and held - deleted == len(live)  # rows stay in their files
    assert has_deletion_vectors(DeltaTable(str(a)))
    # each batch is one commit, naming its batch, with one vector per file it deleted from
    info = json.loads((a / "_delta_log" / f"{DeltaTable(str(a)).version():020d}.json")
                      .read_text().splitlines()[0])["commitInfo"]
    assert info["incr.batch"] == "4"


def test_a_table_with_vectors_stays_a_table_delta_rs_writes_and_travels(tmp_path):
    """After a MERGE by vectors: delta-rs's own MERGE, compaction, time travel to each version
    and a full vacuum (incr maintain) keep exactly the rows, and the log read here finds the
    vectors delta-rs reads."""
    store = DeltaStore()
    path = tmp_path / "t"
    _table(path, [{"k": f"k{i}", "g": 0, "v": 1.0} for i in range(500)], store)
    _merge(store, path, [("k1", 0), ("k2", 0), ("k300", 0)], [{"k": "k1", "g": 0, "v": 2.0}], 1)
    after_one = _rows(store.read(path))
    assert len(after_one) == 498 and ("k1", 0, 2.0) in after_one
    masks = {k: np.flatnonzero(~np.array(m)) for k, m in
             zip(*pa.table(DeltaTable(str(path)).deletion_vectors()).to_pydict().values(), strict=True)}
    logged = {str(path / p): deletion.positions_of(a["deletionVector"])
              for p, a in store.live_adds(path).items() if "deletionVector" in a}
    assert {k[len("file://"):]: v.tolist() for k, v in masks.items()} == \
        {k: v.tolist() for k, v in logged.items()}
    _merge(store, path, [("k3", 0)], [], 2, vectors=False)  # delta-rs's MERGE over vectors
    assert len(store.read(path)) == 497
    version = DeltaTable(str(path)).version()
    store.housekeep(path, keep_hours=0, keep_versions=[version - 1])
    assert _rows(store.read(path, version=version - 1)) == after_one
    assert store.compact(path, ("k",), 0)
    assert len(store.read(path)) == 497 and store.deleted_rows(path) == (0, 497)


def test_a_merge_by_vectors_refuses_other_shapes_and_a_lost_race(tmp_path, monkeypatch):
    store = DeltaStore()
    path = tmp_path / "t"
    _table(path, [{"k": "a", "g": 0, "v": 1.0}], store)
    source = pa.table({"k": ["a"], "g": [0], "v": [2.0]})
    with pytest.raises(ValueError, match="deletion vectors"):
        store.merge(path, source).on(("k", "g")).when_matched_update_all() \
            .with_deletion_vectors().execute()
    version = DeltaTable(str(path)).version()

    def taken(root, v, actions):
        raise deltalog.LogConflict(f"version {v} of {root} was committed by another writer")

    monkeypatch.setattr(deltalog, "commit", taken)
    with pytest.raises(StorageError, match="another writer committed"):
        _merge(store, path, [("a", 0)], [{"k": "a", "g": 0, "v": 3.0}], 1)
    assert _rows(store.read(path)) == [("a", 0, 1.0)] and store.applied_through(path) == 0
    assert DeltaTable(str(path)).version() == version + 1  # the feature's own commit only


def test_a_commit_is_put_if_absent(tmp_path):
    store = DeltaStore()
    path = tmp_path / "t"
    _table(path, [{"k": "a", "g": 0, "v": 1.0}], store)
    version = DeltaTable(str(path)).version()
    with pytest.raises(deltalog.LogConflict):
        deltalog.commit(path, version, [{"commitInfo": {"operation": "X"}}])
    assert [p.name for p in (path / "_delta_log").iterdir() if p.name.startswith(".incr")] == []


def test_key_columns_named_like_the_matchs_own_columns_are_matched(tmp_path):
    """The match names each row by file and position in columns of its own: a table whose
    columns are called so (or like DuckDB's ``file_row_number``) is matched all the same."""
    store = DeltaStore()
    path = tmp_path / "t"
    schema = pa.schema([("incr_file__", pa.string()), ("file_row_number", pa.int64()),
                        ("incr_row__", pa.float64())])
    store.write(path, pa.Table.from_pylist([{"incr_file__": f"k{i}", "file_row_number": i % 2,
                                             "incr_row__": 1.0} for i in range(10)], schema),
                mode="overwrite", batch=0)
    source = pa.Table.from_pylist(
        [{"incr_file__": "k3", "file_row_number": 1, "incr_row__": None, GONE: True},
         {"incr_file__": "k3", "file_row_number": 1, "incr_row__": 2.0, GONE: False}],
        schema.append(pa.field(GONE, pa.bool_())))
    result = (store.merge(path, source).on_groups(("incr_file__", "file_row_number"), GONE)
              .when_matched_delete().when_not_matched_insert_all(f"NOT s.{GONE}")
              .with_deletion_vectors().for_batch(1).execute())
    assert (result.deleted, result.inserted) == (1, 1)
    rows = store.read(path).to_pylist()
    assert len(rows) == 10 and {"incr_file__": "k3", "file_row_number": 1, "incr_row__": 2.0} in rows


def test_compaction_rewrites_only_the_files_that_need_it(spark, tmp_path):
    """File by file: a bucket's small files (the MERGEs' new rows) become one, a file whose
    vector deletes a quarter of it is rewritten without those rows, and every other file
    stays with its vector; the rows are the same, to delta-rs and to Spark."""
    store = DeltaStore()
    path = tmp_path / "t"
    schema = pa.schema([("_bucket", pa.int32()), ("k", pa.string()), ("v", pa.float64())])
    rows = [{"_bucket": i % 2, "k": f"k{i:04d}", "v": 1.0} for i in range(4000)]
    store.write(path, pa.Table.from_pylist(rows, schema), mode="overwrite", batch=0,
                partition_by=["_bucket"], target_file_size=8000)
    first = set(DeltaTable(str(path)).file_uris())
    live = {r["k"]: r for r in rows}
    for batch in range(1, 6):  # a few keys changed per batch: small new files in both buckets
        keys = [f"k{i:04d}" for i in range(batch, 4000, 397)]
        new = [{"_bucket": int(k[1:]) % 2, "k": k, "v": float(batch)} for k in keys]
        source = pa.Table.from_pylist([{**r, GONE: True} for r in new] + [{**r, GONE: False} for r in new],
                                      schema.append(pa.field(GONE, pa.bool_())))
        (store.merge(path, source).on_groups(("_bucket", "k"), GONE).when_matched_delete()
         .when_not_matched_insert_all(f"NOT s.{GONE}").with_deletion_vectors().for_batch(batch)
         .execute())
        live.update({r["k"]: r for r in new})
    # a file of the first version with a quarter of its rows deleted
    victim = max(first, key=lambda f: Path(f).stat().st_size)  # a large file
    name = Path(victim).relative_to(path).as_posix()
    already = store.live_adds(path)[name].get("deletionVector")
    positions = np.setdiff1d(np.arange(0, pq_rows(victim), 3),
                             deletion.positions_of(already) if already else [])
    _delete_positions(store, path, name, positions)
    for k in _file_keys(victim).to_numpy(zero_copy_only=False)[positions]:
        del live[k]
    assert store.read(path).num_rows == len(live)
    before = set(DeltaTable(str(path)).file_uris())
    small = {f for f in before if Path(f).stat().st_size < 2000}
    assert victim not in small and len(small) > 4 and len(before - small) >= 2
    assert store.compact_files(path, ("_bucket", "k"), 4, small_bytes=2000, deleted_rows=1,
                               deleted_share=0.25) == len(small) + 1
    after = set(DeltaTable(str(path)).file_uris())
    assert not (small | {victim}) & after  # rewritten
    assert (before - small - {victim}) <= after  # the others kept, vectors and all
    expected = sorted((r["_bucket"], r["k"], r["v"]) for r in live.values())
    got = sorted(tuple(r.values()) for r in store.read(path).select(["_bucket", "k", "v"]).to_pylist())
    assert got == expected
    spark_rows = read_delta(spark, store, str(path)).select("_bucket", "k", "v").toArrow()
    assert sorted(tuple(r.values()) for r in spark_rows.to_pylist()) == expected
    assert store.applied_through(path) == 5


def pq_rows(file: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(file).num_rows


def _file_keys(file: str) -> pa.Array:
    import pyarrow.parquet as pq

    return pq.read_table(file, columns=["k"]).column("k")


def _delete_positions(store: DeltaStore, path: Path, name: str, positions: np.ndarray) -> None:
    """Marks ``positions`` of file ``name`` deleted, as a MERGE by vectors would (one commit)."""
    add = store.live_adds(path)[name]
    before = (deletion.positions_of(add["deletionVector"]) if "deletionVector" in add
              else np.array([], np.int64))
    vector = {k: v for k, v in add.items() if k in ("path", "partitionValues", "size", "stats")}
    version = DeltaTable(str(path)).version()
    deltalog.commit(path, version + 1, [
        {"commitInfo": {"operation": "DELETE"}},
        {"remove": {"path": name, "dataChange": True, "partitionValues": add["partitionValues"],
                    "size": add["size"], **({"deletionVector": add["deletionVector"]}
                                             if "deletionVector" in add else {})}},
        {"add": {**vector, "modificationTime": add["modificationTime"], "dataChange": True,
                 "deletionVector": deletion.inline(np.union1d(before, positions))}}])


def test_a_vector_another_writer_stored_in_a_file_is_kept(tmp_path, monkeypatch):
    """A vector in a file of its own (storage type ``u``, as Spark's Delta writes them) is read
    through delta-rs, and a MERGE by vectors over it keeps its deletions (the table's path
    given relative, as a user may)."""
    import base64
    import struct
    import uuid
    import zlib

    store = DeltaStore()
    monkeypatch.chdir(tmp_path)
    path = Path("t")
    _table(path, [{"k": f"k{i}", "g": 0, "v": 1.0} for i in range(6)], store)
    store.enable_deletion_vectors(path)
    name, add = next(iter(store.live_adds(path).items()))
    data = deletion.serialize([1, 4])  # k1 and k4, by another writer
    token = uuid.uuid4()
    with open(path / f"deletion_vector_{token}.bin", "wb") as f:
        f.write(bytes([1]) + struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data)))
    z85 = base64.b85encode(token.bytes).decode().translate(str.maketrans(
        "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~",
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"))
    vector = {"storageType": "u", "pathOrInlineDv": z85, "offset": 1, "sizeInBytes": len(data),
              "cardinality": 2}
    version = DeltaTable(str(path)).version()
    deltalog.commit(path, version + 1, [
        {"commitInfo": {"operation": "DELETE"}},
        {"remove": {"path": name, "dataChange": True, "partitionValues": {}, "size": add["size"]}},
        {"add": {**{k: add[k] for k in ("path", "partitionValues", "size", "modificationTime", "stats")},
                 "dataChange": True, "deletionVector": vector}}])
    assert sorted(store.read(path).column("k").to_pylist()) == ["k0", "k2", "k3", "k5"]
    _merge(store, path, [("k2", 0)], [{"k": "k2", "g": 0, "v": 2.0}], 1)
    rows = _rows(store.read(path))
    assert rows == [("k0", 0, 1.0), ("k2", 0, 2.0), ("k3", 0, 1.0), ("k5", 0, 1.0)]
    assert store.compact_files(path, ("k",), 0, small_bytes=1 << 20, deleted_share=0.25) > 0
    assert _rows(store.read(path)) == rows


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=400))
def test_z85_is_the_protocols_base85(data):
    """Z85 as ZeroMQ's spec defines it (the vectorized coder against the standard library's
    Base85 with Z85's alphabet), and its own test vector."""
    import base64

    b85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
    z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    padded = data + b"\0" * (-len(data) % 4)
    text = deletion.z85encode(data)
    assert text == base64.b85encode(padded).decode().translate(str.maketrans(b85, z85))
    assert deletion.z85decode(text, len(data)) == data
    assert deletion.z85encode(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    for bad in ("abcd", "abc d", "%%%%%"):
        with pytest.raises(ValueError, match="Z85"):
            deletion.z85decode(bad, 4)


def test_commits_written_by_hand_checkpoint_when_due_and_the_checkpoint_keeps_the_vectors(tmp_path):
    """A table incr writes by vectors every batch gets a checkpoint every
    ``delta.checkpointInterval`` commits, as delta-rs's own writers give it; read from that
    checkpoint, the files and their vectors are those the whole log replays to."""
    store = DeltaStore()
    path = tmp_path / "t"
    _table(path, [{"k": f"k{i}", "g": 0, "v": 1.0} for i in range(300)], store)
    DeltaTable(str(path)).alter.set_table_properties({"delta.checkpointInterval": "3"})
    expected = {f"k{i}" for i in range(300)}
    for batch in range(1, 8):
        gone = [f"k{batch * 7 + j}" for j in range(3)]
        _merge(store, path, [(k, 0) for k in gone], [{"k": f"n{batch}", "g": 0, "v": 2.0}], batch)
        expected = (expected - set(gone)) | {f"n{batch}"}
    version = DeltaTable(str(path)).version()
    log = path / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    assert checkpoints and all((v + 1) % 3 == 0 for v in checkpoints)
    assert checkpoints[-1] > version - 3  # the newest due one was written
    from_checkpoint = deltalog.live_adds(path, version)
    replayed = deltalog.live_adds(path, version, known=(-1, {}))
    assert {p: a.get("deletionVector") for p, a in from_checkpoint.items()} == \
        {p: a.get("deletionVector") for p, a in replayed.items()}
    assert any(a.get("deletionVector") for a in from_checkpoint.values())
    for old in sorted(log.glob("*.json"))[:checkpoints[-1]]:
        old.unlink()  # readers must now start from the checkpoint
    store.forget(path)
    assert {r["k"] for r in store.read(path).to_pylist()} == expected
    _merge(store, path, [("k100", 0), ("n1", 0)], [], 8)  # positions found from the checkpoint
    assert {r["k"] for r in store.read(path).to_pylist()} == expected - {"k100", "n1"}


def test_compaction_rewrites_a_row_a_few_times_not_once_per_compaction():
    """A partition taking one small file per batch, compacted whenever it holds more than 4
    files: the files merged are chosen so that bytes rewritten grow as n log n, not n²,
    and the partition keeps few files."""
    from incr.runtime.store import _merged

    adds: dict[str, dict] = {f"big{i}": {"size": 10**9} for i in range(4)}  # never merged
    rewritten, small_bytes = 0, 10**6
    for batch in range(1, 1025):
        adds[f"b{batch:05d}"] = {"size": 1_000}
        small = [n for n in adds if adds[n]["size"] < small_bytes]
        if len(adds) > 4 and len(small) > 1:
            merged = _merged(small, adds)
            if merged:
                size = sum(adds.pop(n)["size"] for n in merged)
                rewritten += size
                adds[f"m{batch:05d}"] = {"size": size}
        assert len(adds) <= 4 + 10
    written = 1024 * 1_000
    assert rewritten <= written * 11  # log2(1024) + 1 rewrites a row at most
