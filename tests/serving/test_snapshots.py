"""Program-level snapshots read from a real warehouse (incr.serving.snapshots), the version
folders built from them (incr.serving.links), and the DuckDB catalog file (incr catalog)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from incr.compiler import compile_program
from incr.errors import StorageError
from incr.oracle import diff_answers
from incr.runtime.pipeline import Pipeline
from incr.runtime.store import trusted_commits
from incr.serving.links import LinkFolders
from incr.serving.snapshots import ProgramLayout, Snapshots
from tests.serving.program import APPLIED, NAME, VIEWS, file_rows, land, oracle, write_program


@pytest.fixture
def copy(base, tmp_path):
    """A copy of the base warehouse and landing a test may apply more batches to."""
    program, landing, warehouse = base
    shutil.copytree(landing, tmp_path / "landing")
    shutil.copytree(warehouse, tmp_path / "warehouse")
    return program, tmp_path / "landing", tmp_path / "warehouse"


def _snapshots(program: Path, warehouse: Path) -> Snapshots:
    return Snapshots(warehouse, ProgramLayout.of(compile_program(program)))


def test_each_snapshot_is_every_view_at_its_batch(base):
    program, _, warehouse = base
    snaps = _snapshots(program, warehouse)
    assert snaps.batches() == tuple(range(APPLIED))
    assert snaps.latest_batch() == APPLIED - 1
    # Batch 0 has no snapshot: `returned` had no batch of its own yet, so no answer.
    with pytest.raises(StorageError, match=r"returned .* no answer at batch 0"):
        snaps.snapshot(0)
    for batch in range(1, APPLIED):
        snapshot = snaps.snapshot(batch)
        assert snapshot.batch == batch and snapshot.program == NAME
        assert [a.view for a in snapshot.answers] == list(VIEWS)
        for answer in snapshot.answers:
            assert answer.batch <= batch
            assert all(os.path.isabs(f) for f in answer.files)
            got = file_rows(answer)
            assert got.num_rows == answer.rows
            assert diff_answers(oracle(answer.view, batch), got) is None, (answer.view, batch)


def test_a_batch_of_one_table_changes_only_the_views_that_read_it(base):
    program, _, warehouse = base
    snaps = _snapshots(program, warehouse)
    before, after = snaps.snapshot(2).versions(), snaps.snapshot(3).versions()  # 3: returns
    assert after["returned"] == before["returned"] + 1
    assert after["by_region"] == before["by_region"]
    assert after["top_regions"] == before["top_regions"]
    # The sales views have no commit at batch 3; their answer there is the one of batch 2.
    assert snaps.snapshot(3).answer("by_region").batch == 2
    assert snaps.applied_through("by_region") == 4 and snaps.applied_through("returned") == 3
    assert snaps.covered_through("returned") == APPLIED - 1


def test_recent_keeps_the_last_snapshots_newest_first(base):
    program, _, warehouse = base
    snaps = _snapshots(program, warehouse)
    assert [s.batch for s in snaps.recent(3)] == [4, 3, 2]
    assert [s.batch for s in snaps.recent(10)] == [4, 3, 2, 1]  # batch 0 has none
    assert snaps.latest() == snaps.recent(1)[0]


def test_the_latest_batch_waits_for_every_view_that_reads_it(copy):
    program, landing, warehouse = copy
    compiled = compile_program(program)
    land(landing, 5)  # sales: read by by_region and top_regions
    pipeline = Pipeline(compiled, landing, warehouse)
    assert pipeline.prepare().ready_through == 5
    pipeline.apply_view("by_region", 5)
    snaps = _snapshots(program, warehouse)
    assert snaps.batches()[-1] == 5
    assert snaps.covered_through("by_region") == 5 and snaps.covered_through("top_regions") == 4
    assert snaps.latest_batch() == 4  # top_regions has not applied batch 5
    with pytest.raises(StorageError, match="not every view has applied batch 5"):
        snaps.snapshot(5)
    pipeline.apply_view("top_regions", 5)
    snaps.refresh()
    assert snaps.latest_batch() == 5
    for answer in snaps.snapshot(5).answers:
        assert diff_answers(oracle(answer.view, 5), file_rows(answer)) is None


def test_a_view_is_current_past_its_last_commit(copy):
    program, landing, warehouse = copy
    compiled = compile_program(program)
    for batch in (5, 6):  # sales, then returns
        land(landing, batch)
    pipeline = Pipeline(compiled, landing, warehouse)
    pipeline.prepare()
    pipeline.apply_view("returned", 6)
    snaps = _snapshots(program, warehouse)
    assert snaps.latest_batch() == 4  # the sales views still owe batch 5
    pipeline.apply_view("by_region", 6)
    pipeline.apply_view("top_regions", 6)
    snaps.refresh()
    # Batch 6 is of returns: the sales views' last commit is at 5, and they are current at 6.
    assert snaps.applied_through("by_region") == 5
    assert snaps.latest_batch() == 6
    snapshot = snaps.snapshot(6)
    assert snapshot.answer("by_region").batch == 5 and snapshot.answer("returned").batch == 6
    for answer in snapshot.answers:
        assert diff_answers(oracle(answer.view, 6), file_rows(answer)) is None


def test_a_skipped_batch_is_no_snapshot(copy):
    program, landing, warehouse = copy
    compiled = compile_program(program)
    land(landing, 5)
    pipeline = Pipeline(compiled, landing, warehouse)
    pipeline.register()
    pipeline.skip(5)
    snaps = _snapshots(program, warehouse)
    assert snaps.batches() == tuple(range(APPLIED))
    assert snaps.latest_batch() == 4


def test_an_empty_warehouse_has_no_snapshot(tmp_path):
    program = write_program(tmp_path)
    snaps = _snapshots(program, tmp_path / "warehouse")
    assert snaps.batches() == () and snaps.latest_batch() is None and snaps.recent(5) == []


def test_republished_commits_are_not_trusted_for_the_batch_they_name():
    # Versions 0..4 name batches 0..4; the answer query changed, and versions 5..9 republish
    # batches 0..4 from the current state: only the one naming batch 4 shows batch 4.
    commits = [(v, v) for v in range(5)] + [(5 + b, b) for b in range(5)] + [(10, 5), (11, 5)]
    assert trusted_commits(commits) == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (9, 4), (10, 5),
                                        (11, 5)]
    assert trusted_commits(reversed(commits)) == trusted_commits(commits)


def test_a_plain_parquet_glob_over_an_answer_reads_every_version(base):
    program, _, warehouse = base
    latest = _snapshots(program, warehouse).latest()
    assert latest is not None
    answer = latest.answer("by_region")
    globbed = duckdb.sql(f"SELECT count(*) FROM read_parquet('{warehouse}/answers/by_region/*.parquet')")
    assert globbed.fetchone()[0] > answer.rows == oracle("by_region", latest.batch).num_rows


def test_version_folders_hold_exactly_a_versions_files_as_read_only_links(base, tmp_path):
    program, _, warehouse = base
    snapshot = _snapshots(program, warehouse).snapshot(1)
    links = LinkFolders(tmp_path / "versions")
    answer = snapshot.answer("by_region")
    assert not answer.has_deletions  # (test_deletion_vectors has a version folder with some)
    folder = links.ensure(NAME, answer)
    assert links.ensure(NAME, answer) == folder  # built once
    assert sorted(os.listdir(folder)) == sorted(Path(f).name for f in answer.files)
    for f in answer.files:
        assert (folder / Path(f).name).stat().st_ino == Path(f).stat().st_ino  # a link, no copy
    assert not folder.stat().st_mode & stat.S_IWUSR
    assert links.is_intact(NAME, answer)
    assert diff_answers(oracle("by_region", 1), pq.read_table(folder)) is None
    # Unused folders go only after the grace period (queries planned over them finish).
    assert links.sweep(set(), grace_s=60, now=0.0) == []
    assert links.sweep(set(), grace_s=60, now=59.0) == []
    assert links.sweep(set(), grace_s=60, now=60.0) == [folder]
    assert not folder.exists()
    assert all(Path(f).exists() for f in answer.files)  # the answer's own files stay


def test_the_duckdb_catalog_has_the_latest_and_pinned_snapshots(base, tmp_path):
    from incr.cli import main

    program, _, warehouse = base
    out = tmp_path / "bi.duckdb"
    assert main(["catalog", str(program), "--warehouse", str(warehouse), "--out", str(out),
                 "--keep", "2"]) == 0
    con = duckdb.connect(str(out), read_only=True)
    try:
        schemas = {r[0] for r in con.execute("SELECT schema_name FROM information_schema.schemata "
                                             "WHERE catalog_name = 'bi'").fetchall()}
        assert {"shop", "shop_b4", "shop_b3"} <= schemas and "shop_b2" not in schemas
        for schema, batch in (("shop", 4), ("shop_b4", 4), ("shop_b3", 3)):
            for view in VIEWS:
                got = con.execute(f"SELECT * FROM {schema}.{view}").fetch_arrow_table()
                assert diff_answers(oracle(view, batch), got) is None, (schema, view)
    finally:
        con.close()
