"""A landing area on an object store: files landed in an S3 bucket are batches like any.

The bucket is a real S3 endpoint on 127.0.0.1 (moto's server), reached the way a user's
would be: an ``s3://`` URI and the standard ``AWS_*`` environment variables.  Each run copies
new objects into the program's landing cache and reads them there; answers equal the oracle
over every batch so far, messages name the object's URI, housekeeping drops the copies of
applied files, ``incr archive`` deletes archived objects from the bucket, and a view rebuilt
after the cache was lost reads the bucket again.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from incr import cli
from incr.compiler import compile_text
from incr.errors import InputError
from incr.oracle import diff_answers, oracle_answer
from incr.orchestration.dags import landing_asset
from incr.orchestration.triggers import landed_signatures
from incr.runtime.housekeeping import maintain
from incr.runtime.pipeline import Pipeline
from incr.runtime.remote import RemoteLanding, is_remote
from incr.runtime.report import read_answer

PROGRAM = """\
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best FROM e;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])


@pytest.fixture
def prefix(s3, request) -> str:
    """A fresh landing root in the bucket, per test."""
    return f"{s3.bucket}/{request.node.name}"


def _put(s3, key: str, rows: list[dict], fmt: str = "csv") -> None:
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    sink = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, sink)
    else:
        pacsv.write_csv(table, sink)
    with s3.fs.open_output_stream(key) as out:
        out.write(sink.getvalue())


def _check(compiled, warehouse: Path, live: list[dict]) -> None:
    table = pa.Table.from_pylist(live, schema=SCHEMA)
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, {"e": table}), answer) is None, plan.view


def test_a_uri_is_remote_and_a_path_is_not():
    assert is_remote("s3://bucket/landing") and is_remote("gs://b/x") and is_remote("abfs://c@a/x")
    assert not is_remote("/data/landing") and not is_remote("landing")
    assert not is_remote("file:///data/landing") and not is_remote(r"C:\data\landing")


def test_the_listing_follows_the_landing_rules_and_copies_each_object_once(s3, prefix, tmp_path):
    rows = [{"who": "ann", "pts": 1}]
    for key in ("e/002.csv", "e/001.parquet", "e/_deletes/003.csv", "e/.004.csv.tmp",
                "e/_SUCCESS", "other/009.csv"):
        _put(s3, f"{prefix}/{key}", rows, "parquet" if key.endswith("parquet") else "csv")
    landing = RemoteLanding(f"s3://{prefix}")
    listed = landing.files(["e"])
    assert [f.relpath for f in listed] == ["e/001.parquet", "e/002.csv", "e/_deletes/003.csv"]
    assert [f.kind for f in listed] == ["insert", "insert", "delete"]

    cache = tmp_path / "cache"
    assert len(landing.sync(cache, ["e"])) == 3
    assert sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file()) == \
        ["e/001.parquet", "e/002.csv", "e/_deletes/003.csv"]
    st = (cache / "e" / "002.csv").stat()
    assert (st.st_size, st.st_mtime_ns) == (listed[1].size, listed[1].mtime_ns)
    assert landing.sync(cache, ["e"]) == []  # nothing new
    # An object whose copy went to an archive is not copied again while it is unchanged.
    (cache / "e" / "002.csv").unlink()
    assert landing.sync(cache, ["e"], {"e/002.csv": (listed[1].size, listed[1].mtime_ns)}) == []
    assert [f.relpath for f in landing.sync(cache, ["e"])] == ["e/002.csv"]
    assert landing.fetch("e/gone.csv", cache / "e" / "gone.csv") is False  # nothing to copy
    assert not (cache / "e" / "gone.csv").exists()

    _put(s3, f"{prefix}/e/notes.txt", rows)
    with pytest.raises(InputError, match=rf"s3://{prefix}/e/notes.txt") as err:
        landing.files(["e"])
    assert "unsupported batch file type .txt" in str(err.value)
    assert sorted(landed_signatures(f"s3://{prefix}/e")) == \
        ["e/001.parquet", "e/002.csv", "e/_deletes/003.csv", "e/notes.txt"]
    assert landed_signatures(f"s3://{prefix}/missing") == {}


def test_runs_read_batches_from_a_bucket_and_archive_clears_it(s3, prefix, spark, tmp_path,
                                                              capsys):
    warehouse, archive = tmp_path / "warehouse", tmp_path / "archive"
    uri = f"s3://{prefix}"
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    rows = [{"who": "ann", "pts": 3}, {"who": "bob", "pts": 5}, {"who": "ann", "pts": 4}]
    _put(s3, f"{prefix}/e/001.csv", rows[:2])
    _put(s3, f"{prefix}/e/002.parquet", rows[2:], "parquet")
    _put(s3, f"{prefix}/e/_deletes/003.csv", [rows[1]])
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    assert cli.main(["run", str(program), "--landing", uri, "--warehouse", str(warehouse)]) == 0
    assert len(Pipeline(compiled, uri, warehouse).ledger.batches()) == 3
    live = [rows[0], rows[2]]
    _check(compiled, warehouse, live)

    # A bad batch is rejected by its object's URI, and changes nothing.
    _put(s3, f"{prefix}/e/004.csv", [{"who": "cy", "pts": 9}])
    with s3.fs.open_output_stream(f"{prefix}/e/005.csv") as out:
        out.write(b"who,pts\ndee,lots\n")
    report = Pipeline(compiled, uri, warehouse, spark=spark).run()
    assert report.rejected is not None
    assert f"{uri}/e/005.csv" in str(report.rejected), report.rejected
    live.append({"who": "cy", "pts": 9})
    _check(compiled, warehouse, live)
    _put(s3, f"{prefix}/e/005.csv", [{"who": "dee", "pts": 2}])  # replaced: applies now
    assert Pipeline(compiled, uri, warehouse, spark=spark).run().rejected is None
    live.append({"who": "dee", "pts": 2})
    _check(compiled, warehouse, live)

    # Housekeeping drops the cached copies of applied files; they are not copied back.
    cache = warehouse / "_incr" / "p" / "landing"
    assert len([p for p in cache.rglob("*") if p.is_file()]) == 5
    maintain(Pipeline(compiled, uri, warehouse))
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    assert Pipeline(compiled, uri, warehouse, spark=spark).run().applied == []
    assert [p for p in cache.rglob("*") if p.is_file()] == []

    _put(s3, f"{prefix}/e/006.csv", [{"who": "eve", "pts": 6}])  # landed, not applied yet
    capsys.readouterr()
    assert cli.main(["status", str(program), "--landing", uri, "--warehouse", str(warehouse),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr()[0])["landed_unregistered"] == ["e/006.csv"]
    moved = Pipeline(compiled, uri, warehouse).archive(archive)
    assert [b.path for b in moved] == ["e/001.csv", "e/002.parquet", "e/_deletes/003.csv",
                                       "e/004.csv", "e/005.csv"]
    left = s3.fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
    assert sorted(i.path[len(prefix) + 1:] for i in left if i.type == pafs.FileType.File) == \
        ["e/006.csv"]
    assert sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*") if p.is_file()) == \
        ["e/001.csv", "e/002.parquet", "e/004.csv", "e/005.csv", "e/_deletes/003.csv"]
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # 006 is copied when registered
    assert Pipeline(compiled, uri, warehouse, spark=spark).run().rejected is None
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["006.csv"]

    # The cache lost: a changed view rebuilds from the archive and, for 006, the bucket.
    shutil.rmtree(cache)
    changed = compile_text(PROGRAM.replace("MAX(pts) AS best", "MAX(pts) AS best, MIN(pts) AS worst"),
                           "p.sql", name="p")
    report = Pipeline(changed, uri, warehouse, spark=spark).run()
    assert report.rejected is None, report.rejected
    live.append({"who": "eve", "pts": 6})
    _check(changed, warehouse, live)
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == ["006.csv"]


def test_the_landing_asset_of_a_bucket_is_named_by_its_uri_and_watches_it(s3, prefix):
    asset = landing_asset(f"s3://{prefix}/", "e")
    assert asset.uri == f"s3://{prefix}/e"
    trigger = asset.watchers[0].trigger
    assert trigger.folder == f"s3://{prefix}/e"
    trigger.poke_interval = 0.05

    async def first_event() -> dict:
        runner = trigger.run()
        try:
            task = asyncio.ensure_future(runner.__anext__())
            await asyncio.sleep(0.3)
            assert not task.done()  # nothing landed yet
            _put(s3, f"{prefix}/e/001.csv", [{"who": "ann", "pts": 1}])
            return (await asyncio.wait_for(task, timeout=20)).payload
        finally:
            await runner.aclose()

    assert asyncio.run(first_event()) == {"folder": f"s3://{prefix}/e", "files": ["e/001.csv"],
                                          "count": 1}


def test_a_backfill_reads_history_from_a_bucket(s3, prefix, spark, tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    landing.mkdir()
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    history = [{"who": "ann", "pts": 2}, {"who": "bob", "pts": 7}]
    _put(s3, f"{prefix}/hist/e/2024-01.parquet", history[:1], "parquet")
    _put(s3, f"{prefix}/hist/e/2024-02.csv", history[1:])
    _put(s3, f"{prefix}/hist/e/_deletes/2024-03.csv", history[:1])
    report = Pipeline(compiled, landing, warehouse, spark=spark).backfill(
        folder=f"s3://{prefix}/hist")
    assert report.rejected is None and len(report.applied) == 3
    _check(compiled, warehouse, history[1:])
    paths = [b.path for b in Pipeline(compiled, landing, warehouse).ledger.batches()]
    assert all(Path(p).is_file() for p in paths), paths  # copied down: rebuilds read them
