"""Answer versions with Delta deletion vectors, served exactly.

A MERGE by deletion vectors leaves the rows it deletes in their files, so every reader
served from the files (the version folders, the Spark catalog's pinned and latest
databases, the DuckDB file) must leave those rows out by file and position.  Each test
reads a version with deleted rows and one without, and compares with delta-rs's own read
(``DeltaStore.read``, which applies the vectors); each checks first that the files alone
show more rows, so it fails if the deletions were ignored.

Two answers: the shared warehouse's ``by_region`` (a real pipeline run: batches 2 and 4
changed groups, marked by deletion vectors), and a table built here with larger MERGEs
over several files, the file a MERGE added included.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_program
from incr.errors import StorageError
from incr.oracle import diff_answers
from incr.runtime.store import DeltaStore
from incr.serving.catalog import SparkCatalog, database_name, deleted_table, files_table, pinned_name
from incr.serving.duckdb_file import DELETED_SCHEMA_NAME, write_catalog, write_snapshots
from incr.serving.links import DELETED_FILE, DELETED_FOLDER, LinkFolders
from incr.serving.snapshots import AnswerVersion, ProgramLayout, ProgramSnapshot, Snapshots, answer_version
from tests.serving.program import NAME, file_rows, oracle

GONE = "_gone"
#: Program names of the snapshots pinned here: the session's catalog is shared by every test.
SHOP, HAND = "incr_test_dv_shop", "incr_test_dv_hand"


def _merge(path: Path, batch: int, deleted: list[int], inserted: list[int]) -> None:
    """A MERGE as incr publishes an answer by change: a tombstone per key it deletes, then
    the keys it inserts (with the batch in their value)."""
    tombstones = pa.table({"k": pa.array(deleted, pa.int64()), "v": pa.nulls(len(deleted), pa.string()),
                           GONE: pa.array([True] * len(deleted), pa.bool_())})
    rows = pa.table({"k": pa.array(inserted, pa.int64()),
                     "v": pa.array([f"b{batch}:{k}" for k in inserted], pa.string()),
                     GONE: pa.array([False] * len(inserted), pa.bool_())})
    (DeltaStore().merge(path, pa.concat_tables([tombstones, rows]))
     .on_groups(("k",), GONE).when_matched_delete().when_not_matched_insert_all(f"NOT s.{GONE}")
     .with_deletion_vectors().for_batch(batch, {"incr.batch": str(batch)}).execute())


@pytest.fixture(scope="module")
def hand_built(tmp_path_factory) -> dict[int, AnswerVersion]:
    """An answer table's versions by batch: 0 writes 200 keys three times (three files,
    nothing deleted); 1 replaces every 7th key and adds 20; 2 deletes every 5th key, in
    every file, the one batch 1 added included."""
    path = tmp_path_factory.mktemp("dv") / "answers" / "hand"
    store = DeltaStore()
    for part in range(3):
        keys = range(part * 200, part * 200 + 200)
        store.write(path, pa.table({"k": pa.array(keys, pa.int64()), "v": [f"b0:{k}" for k in keys]}),
                    mode="overwrite" if part == 0 else "append", batch=None)
    versions = [store.table(path).version()]
    replaced = list(range(0, 600, 7))
    _merge(path, 1, replaced, replaced + list(range(600, 620)))
    versions.append(store.table(path).version())
    _merge(path, 2, list(range(0, 620, 5)), [])
    versions.append(store.table(path).version())
    return {b: answer_version("hand", path, v, b) for b, v in enumerate(versions)}


def _snapshot(program: str, batch: int, *answers: AnswerVersion) -> ProgramSnapshot:
    return ProgramSnapshot(program, batch, answers)


def _delta_rows(answer: AnswerVersion) -> pa.Table:
    """delta-rs's rows of the version (the vectors applied): what must be served."""
    return DeltaStore().read(answer.path, version=answer.version)


def _shows_deleted_rows(answer: AnswerVersion) -> bool:
    """Whether the version's files alone hold rows it deletes (so ignoring them shows)."""
    return file_rows(answer, deletions=False).num_rows > _delta_rows(answer).num_rows


@pytest.fixture(scope="module")
def shop(base) -> tuple[ProgramSnapshot, ProgramSnapshot]:
    """The shared warehouse's snapshots at batch 4 (by_region deletes rows) and 1 (no view
    does), renamed so that their databases are this module's own."""
    program, _, warehouse = base
    snaps = Snapshots(warehouse, ProgramLayout.of(compile_program(program)))
    deleting, clean = snaps.snapshot(4), snaps.snapshot(1)
    assert _shows_deleted_rows(deleting.answer("by_region"))
    assert not any(a.has_deletions for a in clean.answers)
    return dataclasses.replace(deleting, program=SHOP), dataclasses.replace(clean, program=SHOP)


# -- answer versions ------------------------------------------------------------------------------
def test_an_answer_version_lists_what_its_deletion_vectors_delete(shop, hand_built):
    deleting, clean = shop
    by_region = deleting.answer("by_region")
    assert by_region.has_deletions and set(by_region.deleted) <= set(by_region.files)
    assert by_region.rows == oracle("by_region", 4).num_rows  # live rows, not the files' rows
    assert diff_answers(oracle("by_region", 4), file_rows(by_region)) is None
    for answer in (*deleting.answers, *clean.answers, *hand_built.values()):
        expected = _delta_rows(answer)
        assert answer.rows == expected.num_rows, (answer.view, answer.version)
        assert diff_answers(expected, file_rows(answer)) is None, (answer.view, answer.version)
    assert not hand_built[0].has_deletions
    assert _shows_deleted_rows(hand_built[1]) and _shows_deleted_rows(hand_built[2])
    assert len(hand_built[2].deleted) == len(hand_built[2].files) == 4  # every file, batch 1's too
    gone = hand_built[2].deleted_rows(lambda i, f: f"file{i}")
    assert gone.num_rows == sum(len(r) for r in hand_built[2].deleted.values())
    assert gone.column_names == ["file_name", "row_index"]


# -- version folders ------------------------------------------------------------------------------
def test_a_version_folder_holds_its_deleted_rows_beside_its_files(shop, tmp_path):
    answer = shop[0].answer("by_region")
    links = LinkFolders(tmp_path / "versions")
    folder = links.ensure(NAME, answer)
    names = sorted(Path(f).name for f in answer.files)
    assert sorted(os.listdir(folder)) == sorted([*names, DELETED_FOLDER])
    assert os.listdir(folder / DELETED_FOLDER) == [DELETED_FILE]
    assert not (folder / DELETED_FOLDER).stat().st_mode & stat.S_IWUSR
    deleted = pq.read_table(folder / DELETED_FOLDER / DELETED_FILE)
    assert deleted.equals(links.deleted_rows(answer)) and set(deleted["file_name"].to_pylist()) <= set(names)
    # A folder listing skips _deleted: the files' rows, then the deleted ones left out by name.
    assert pq.read_table(folder).num_rows == answer.rows + deleted.num_rows
    got = duckdb.sql(f"SELECT * EXCLUDE (filename, file_row_number) FROM read_parquet('{folder}/*.parquet', "
                     f"filename = true, file_row_number = true) AS f ANTI JOIN deleted AS d "
                     f"ON parse_filename(f.filename) = d.file_name AND f.file_row_number = d.row_index")
    assert diff_answers(oracle("by_region", 4), got.fetch_arrow_table()) is None
    assert links.is_intact(NAME, answer)
    # The deleted rows' file gone (or another put in its place): not intact, and rebuilt.
    (folder / DELETED_FOLDER).chmod(0o755)
    (folder / DELETED_FOLDER / DELETED_FILE).unlink()
    assert not links.is_intact(NAME, answer)
    assert links.ensure(NAME, answer) == folder and links.is_intact(NAME, answer)
    assert pq.read_table(folder / DELETED_FOLDER / DELETED_FILE).equals(deleted)
    assert links.sweep(set(), grace_s=0, now=0.0) == [folder] and not folder.exists()


# -- the Spark catalog ------------------------------------------------------------------------------
@pytest.fixture
def catalog(spark, tmp_path):
    """A catalog over fresh version folders; this module's databases dropped after."""
    served = SparkCatalog(spark, LinkFolders(tmp_path / "versions"))
    yield served
    for database in spark.catalog.listDatabases():
        if database.name.startswith("incr_test_dv"):
            served.drop(database.name)


def _spark_rows(spark, database: str, view: str) -> pa.Table:
    return spark.sql(f"SELECT * FROM `{database}`.`{view}`").toArrow()


def _assert_served(spark, database: str, snapshot: ProgramSnapshot) -> None:
    for answer in snapshot.answers:
        got = _spark_rows(spark, database, answer.view)
        assert diff_answers(_delta_rows(answer), got) is None, (database, answer.view, answer.version)


def test_the_spark_catalog_serves_the_live_rows_of_each_version(spark, catalog, shop, hand_built):
    deleting, clean = shop
    for snapshot in (clean, deleting):
        catalog.pin(snapshot)
    hand = [_snapshot(HAND, b, hand_built[b]) for b in (0, 1, 2)]
    for snapshot in hand:
        catalog.pin(snapshot)
    for snapshot in (clean, deleting, *hand):
        assert catalog.pinned_intact(snapshot)
        _assert_served(spark, pinned_name(snapshot.program, snapshot.batch), snapshot)
    # A version with deleted rows is a view over its files' and its deleted rows' tables.
    # (the session's temporary views, other tests' among them, are listed in every database)
    tables = {r.tableName for r in spark.sql(f"SHOW TABLES IN {pinned_name(SHOP, 4)}").collect()
              if not r.isTemporary}
    assert tables == {"by_region", "top_regions", "returned", files_table("by_region"),
                      deleted_table("by_region")}
    views = {t.name: t.tableType for t in spark.catalog.listTables(pinned_name(SHOP, 4))
             if not t.isTemporary}
    assert views["by_region"] == "VIEW" and views["returned"] == "EXTERNAL"
    assert {t.tableType for t in spark.catalog.listTables(pinned_name(SHOP, 1))
            if not t.isTemporary} == {"EXTERNAL"}
    # The latest database: from a version without deletions to one with them, and back.
    for snapshot in (clean, deleting, clean):
        catalog.point_latest(snapshot)
        assert catalog.latest_intact(snapshot)
        _assert_served(spark, database_name(SHOP), snapshot)
    catalog.point_latest(hand[-1])
    _assert_served(spark, database_name(HAND), hand[-1])


def test_the_spark_catalog_puts_back_a_pinned_version_with_deletions(spark, catalog, hand_built):
    snapshot = _snapshot(HAND, 2, hand_built[2])
    database = pinned_name(HAND, 2)
    catalog.pin(snapshot)
    folder = catalog.links.deleted_folder_of(database_name(HAND), hand_built[2])
    changes = [
        f"DROP TABLE `{database}`.`{deleted_table('hand')}`",
        f"ALTER VIEW `{database}`.hand AS SELECT * FROM `{database}`.`{files_table('hand')}`",
        f"DROP VIEW `{database}`.hand",
        f"DROP TABLE `{database}`.`{files_table('hand')}`",
    ]
    for change in changes:
        spark.sql(change)
        assert not catalog.pinned_intact(snapshot), change
        catalog.pin(snapshot)
        assert catalog.pinned_intact(snapshot), change
        _assert_served(spark, database, snapshot)
    folder.chmod(0o755)
    shutil.rmtree(folder)  # the deleted rows' folder gone: the version folder is rebuilt
    assert not catalog.pinned_intact(snapshot)
    catalog.pin(snapshot)
    assert catalog.pinned_intact(snapshot)
    _assert_served(spark, database, snapshot)


# -- the DuckDB file --------------------------------------------------------------------------------
def _duckdb_rows(out: Path, schema: str, view: str) -> pa.Table:
    with duckdb.connect(str(out), read_only=True) as con:
        return con.execute(f'SELECT * FROM "{schema}"."{view}"').fetch_arrow_table()


def test_the_duckdb_file_serves_the_live_rows_of_each_version(base, tmp_path):
    program, _, warehouse = base
    out = tmp_path / "bi.duckdb"
    written = write_catalog(out, warehouse, [ProgramLayout.of(compile_program(program))], keep=4)
    assert [schema for schema, _ in written] == ["shop_b4", "shop_b3", "shop_b2", "shop_b1", "shop"]
    assert written[0][1].answer("by_region").has_deletions
    assert not written[3][1].answer("by_region").has_deletions
    for schema, snapshot in written:
        for answer in snapshot.answers:
            got = _duckdb_rows(out, schema, answer.view)
            assert diff_answers(_delta_rows(answer), got) is None, (schema, answer.view)
            assert diff_answers(oracle(answer.view, snapshot.batch), got) is None, (schema, answer.view)
    with duckdb.connect(str(out), read_only=True) as con:  # one table per version that deletes rows
        tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = ?",
                             [DELETED_SCHEMA_NAME]).fetchall()
    versions = {a.version for _, s in written for a in s.answers if a.view == "by_region" and a.has_deletions}
    assert sorted(t for (t,) in tables) == sorted(f"by_region_v{v}" for v in versions)


def test_the_duckdb_file_serves_a_hand_built_answer(hand_built, tmp_path):
    out = tmp_path / "hand.duckdb"
    snapshots = [_snapshot(HAND, b, hand_built[b]) for b in (2, 1, 0)]
    written = write_snapshots(out, {HAND: snapshots})
    for schema, snapshot in written:
        got = _duckdb_rows(out, schema, "hand")
        assert diff_answers(_delta_rows(snapshot.answers[0]), got) is None, schema


def test_the_duckdb_file_refuses_a_column_it_needs_for_row_positions(hand_built, tmp_path):
    # DuckDB cannot number a file's rows when the file has a column of that name.  (incr's
    # own MERGE by deletion vectors fails on such an answer too, so the version is faked.)
    answer = dataclasses.replace(hand_built[2], schema=hand_built[2].schema.append(
        pa.field("file_row_number", pa.int64())))
    with pytest.raises(StorageError, match="file_row_number"):
        write_snapshots(tmp_path / "clash.duckdb", {HAND: [_snapshot(HAND, 2, answer)]})
    assert not (tmp_path / "clash.duckdb").exists()
