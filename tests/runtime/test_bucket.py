"""A warehouse in an S3 bucket, worked on by several machines through their working copies.

The bucket is a real S3 endpoint on 127.0.0.1 (moto's server). Each "machine" is a working copy
of its own (``INCR_WORKING_COPIES``), as two Airflow workers would have. They share the
bucket and a landing folder. Runs, Airflow's prepare and per-view steps alternate between
machines, and after every batch each view's answer equals DuckDB's over every batch so far:
read in the machine that ran it, in a fresh working copy (what the bucket holds), and straight
from the bucket by delta-rs. Locks are leases in the bucket, which the machines wait on.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from deltalake import DeltaTable, write_deltalake

from incr import cli
from incr.compiler import compile_text
from incr.config import Settings
from incr.errors import StorageError
from incr.oracle import diff_answers, oracle_answer
from incr.runtime.bucket import JOURNAL, BucketWarehouse, synced, working_copy
from incr.runtime.housekeeping import maintain
from incr.runtime.pipeline import Pipeline
from incr.runtime.report import read_answer

PROGRAM = """\
CREATE TABLE e (who VARCHAR, pts BIGINT);
CREATE VIEW totals AS SELECT who, SUM(pts) AS total, COUNT(*) AS n FROM e GROUP BY who;
CREATE VIEW means AS SELECT who, AVG(pts) AS mean FROM e GROUP BY who;
CREATE VIEW best AS SELECT MAX(pts) AS best FROM e;
"""
SCHEMA = pa.schema([("who", pa.string()), ("pts", pa.int64())])


@pytest.fixture
def uri(s3, request) -> str:
    """A fresh warehouse in the bucket, per test."""
    return f"s3://{s3.bucket}/warehouses/{request.node.name}"


def _machine(tmp_path: Path, name: str) -> Settings:
    """The settings of one machine: its own folder of working copies."""
    return replace(Settings.from_env(), working_copies=str(tmp_path / name))


def _land(landing: Path, name: str, rows: list[dict], delete: bool = False) -> None:
    folder = landing / "e" / ("_deletes" if delete else "")
    folder.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(pa.Table.from_pylist(rows, schema=SCHEMA), folder / name)


def _storage(s3) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": s3.env["AWS_ENDPOINT_URL"], "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "incr-test", "AWS_SECRET_ACCESS_KEY": "incr-test",
            "AWS_REGION": "us-east-1"}


def _check(compiled, warehouse: Path, live: list[dict], where: str) -> None:
    data = {"e": pa.Table.from_pylist(live, schema=SCHEMA)}
    for plan in compiled.plans:
        answer, _ = read_answer(warehouse, plan)
        assert diff_answers(oracle_answer(plan.select, data), answer) is None, (where, plan.view)


def _objects(s3, uri: str) -> list[str]:
    import pyarrow.fs as pafs

    root = uri.removeprefix("s3://")
    infos = s3.fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return [i.path[len(root) + 1:] for i in infos if i.type == pafs.FileType.File]


@pytest.mark.parametrize(("rel", "kept"), [
    ("answers/v/_delta_log/00000000000000000001.json", True),
    ("answers/v/part-00000-a.snappy.parquet", True),
    ("answers/v/deletion_vector_1.bin", True),
    ("state/v/f/.members.json", True),
    ("state/v/f/.touched/000000000007.arrow", True),
    ("_incr/p/ledger/_delta_log/00000000000000000000.json", True),
    ("_incr/p/runs.jsonl", True),
    ("_incr/p/locks/view-v.lock", False),  # this machine's locks (leases stand for them)
    ("_incr/p/landing/e/001.csv", False),  # copies of a bucket landing area
    ("_incr/p/sql/60117c23e8784092", False),  # the driver's kept translations
    ("_incr/p/slices/x.parquet", False),
    ("state/v/f/main/_incr_mirrors/part-0.parquet@k.arrow", False),  # key mirrors
    ("_serving/10000/versions/x", False),  # a BI server's own folder
    ("state/v/f/main/spark-0123456789abcdef0123456789abcdef/part-0.parquet", False),  # staging
    ("state/v/f/main/.part-0.parquet.crc", False),
    ("answers/v/_delta_log/.incr-commit-x.tmp", False),
    ("_incr_journal/00000000000000000001.json", False),  # the bucket's, not a file of a copy
])
def test_what_a_working_copy_keeps_to_itself(rel, kept):
    assert synced(rel) is kept


def test_machines_take_turns_on_one_bucket_warehouse(s3, uri, spark, tmp_path):
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    landing = tmp_path / "landing"
    machines = [_machine(tmp_path, "a"), _machine(tmp_path, "b")]
    rng = random.Random(7)
    live: list[dict] = []
    for seq in range(1, 9):
        if seq % 3 == 0 and live:  # every third batch deletes some rows
            gone = rng.sample(live, k=min(2, len(live)))
            _land(landing, f"{seq:03}.csv", gone, delete=True)
            for row in gone:
                live.remove(row)
        else:
            rows = [{"who": rng.choice("abcd"), "pts": rng.randint(-5, 50)} for _ in range(4)]
            _land(landing, f"{seq:03}.csv", rows)
            live += rows
        config = machines[seq % 2]
        if seq % 4 == 1:  # as Airflow runs it: prepare, then each view, on either machine
            pipeline = Pipeline(compiled, landing, uri, spark=spark, config=config)
            through = pipeline.prepare().ready_through
            for i, view in enumerate(("totals", "means", "best")):
                Pipeline(compiled, landing, uri, spark=spark,
                         config=machines[(seq + i) % 2]).apply_view(view, through)
        else:  # batches 4 and 5 in Spark (its files beside delta-rs's), the others on the driver
            report = Pipeline(compiled, landing, uri, spark=spark, config=config,
                              local_rows=0 if seq in (4, 5) else None).run()
            assert report.rejected is None and report.applied
        if seq == 6:  # housekeeping's deletions go to the bucket too
            before = set(_objects(s3, uri))
            done = maintain(Pipeline(compiled, landing, uri, spark=spark, config=config),
                            replace(config, keep_batches=1, keep_hours=0))
            freed = sum(u.files_before - u.files_after for u in done)
            assert freed > 0 and len(before - set(_objects(s3, uri))) >= freed
        here = Pipeline(compiled, landing, uri, spark=spark, config=config)
        assert here.warehouse == BucketWarehouse(uri, config).local
        _check(compiled, here.warehouse, live, f"machine {seq % 2} after batch {seq}")
        fresh = _machine(tmp_path, f"fresh{seq}")  # what the bucket holds, read anew
        _check(compiled, working_copy(uri, fresh), live, f"the bucket after batch {seq}")
        objects = set(_objects(s3, uri))
        for plan in compiled.plans:  # a Delta reader of the bucket finds the same version whole
            local = DeltaTable(str(here.warehouse / "answers" / plan.view))
            remote = DeltaTable(f"{uri}/answers/{plan.view}", storage_options=_storage(s3))
            assert remote.version() == local.version(), (seq, plan.view)
            files = remote.file_uris()
            assert files and {f.removeprefix(f"{uri}/") for f in files} <= objects, (seq, plan.view)

    # A task that started before another machine ran (as one waiting for a lock) sees that
    # run's work once it holds the locks: taking them brings its working copy up to date.
    waiting = Pipeline(compiled, landing, uri, spark=spark, config=machines[1])
    for seq in (9, 10):
        rows = [{"who": "e", "pts": seq}]
        _land(landing, f"{seq:03}.csv", rows)
        live += rows
        if seq == 9:
            assert Pipeline(compiled, landing, uri, spark=spark, config=machines[0]).run().applied
    assert [b.path for b in waiting.run().applied] == ["e/010.csv"]
    _check(compiled, waiting.warehouse, live, "the waiting machine")
    _check(compiled, working_copy(uri, _machine(tmp_path, "last")), live, "the bucket at the end")

    # The bucket holds the warehouse and nothing of a machine's own.
    kept = _objects(s3, uri)
    assert any(k.startswith("answers/totals/_delta_log/") for k in kept)
    assert any(k.startswith("_incr/p/ledger/_delta_log/") for k in kept)
    assert not [k for k in kept if (not synced(k) and not k.startswith(f"{JOURNAL}/"))
                or k.endswith(".lock")], kept
    assert any(k.startswith(f"{JOURNAL}/") for k in kept)
    # The machine that ran last pushed everything it did: its pull brings nothing; the other
    # one's brings what it has not seen, once.
    assert BucketWarehouse(uri, machines[1]).pull() == 0
    behind = BucketWarehouse(uri, machines[0])
    assert behind.pull() > 0 and behind.pull() == 0
    assert behind.metrics.full_listings == 0  # what changed was read from the journal


def test_a_machine_waits_for_the_lease_of_another(s3, uri, spark, tmp_path, caplog):
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    landing = tmp_path / "landing"
    _land(landing, "001.csv", [{"who": "a", "pts": 1}])
    a = Pipeline(compiled, landing, uri, spark=spark, config=_machine(tmp_path, "a"))
    b = Pipeline(compiled, landing, uri, spark=spark, config=_machine(tmp_path, "b"))
    lease = "_incr/p/locks/view-best.lease"
    with a.locks.hold(views=("best",)):
        assert lease in _objects(s3, uri)
        with pytest.raises(StorageError, match=r"view best \(program p\) is being updated on .* by "
                                               r"pid \d+.*wait for it to finish"), \
                b.locks.hold(views=("best",)):
            pass
        with b.locks.hold(views=("totals",)):  # another view's lease: at once
            pass
        with pytest.raises(StorageError, match="view best"):  # a whole run needs every lease
            b.run()
    assert lease not in _objects(s3, uri)  # let go with the lock
    assert b.run().applied  # now it runs

    # A lease whose holder died runs out, and is taken over (by one taker: the first to mark it).
    bucket = BucketWarehouse(uri, _machine(tmp_path, "a"))
    stale = b'{"owner": "gone", "host": "elsewhere", "pid": 1, "what": "x", "expires": 0}'
    with s3.fs.open_output_stream(f"{uri.removeprefix('s3://')}/{lease}") as out:
        out.write(stale)
    with caplog.at_level(logging.WARNING, "incr.runtime.bucket"), b.locks.hold(views=("best",)):
        pass
    assert "took over the lease of view best (program p) from elsewhere" in caplog.text
    live = b'{"owner": "alive", "host": "elsewhere", "pid": 2, "what": "x", "expires": 4e9}'
    with s3.fs.open_output_stream(f"{uri.removeprefix('s3://')}/{lease}") as out:
        out.write(live)
    with pytest.raises(StorageError, match="on elsewhere by pid 2"), b.locks.hold(views=("best",)):
        pass
    assert bucket.owner != b.bucket.owner


def test_processes_of_one_machine_share_its_leases(s3, uri, spark, tmp_path):
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    config = _machine(tmp_path, "a")
    # Two pipelines of one machine hold the same lock file on two descriptors, as two
    # processes do: shared holders of one state both hold its lease.
    one = Pipeline(compiled, tmp_path / "landing", uri, spark=spark, config=config)
    two = Pipeline(compiled, tmp_path / "landing", uri, spark=spark, config=config)
    owner = one.compiled.plans[0].state_owner
    lease = f"_incr/p/locks/view-{owner}.lease"
    with one.locks.hold(reading=(owner,)):
        with two.locks.hold(reading=(owner,)):
            assert lease in _objects(s3, uri)
        assert lease in _objects(s3, uri)  # the other holder still holds it
    assert lease not in _objects(s3, uri)  # the last one let it go


def test_push_sends_a_commit_after_its_files_and_pull_keeps_work_not_pushed(s3, uri, tmp_path):
    bucket = BucketWarehouse(uri, _machine(tmp_path, "a"))
    sent: list[str] = []
    put = bucket.s3.put_object

    def recording(**kw):
        sent.append(kw["Key"].removeprefix(bucket.prefix + "/"))
        return put(**kw)

    bucket.s3.put_object = recording
    table = bucket.local / "answers" / "t"
    for i in range(3):
        write_deltalake(str(table), pa.table({"x": list(range(i * 10, i * 10 + 10))}), mode="append")
    (bucket.local / "_incr" / "p" / "locks").mkdir(parents=True)
    (bucket.local / "_incr" / "p" / "locks" / "ledger.lock").write_text("pid 1")
    assert bucket.push() == 6
    for n in range(3):
        commit = sent.index(f"answers/t/_delta_log/{n:020}.json")
        files = [f"answers/t/{Path(u.removeprefix('file://')).name}"
                 for u in DeltaTable(str(table), version=n).file_uris()]
        assert all(sent.index(f) < commit for f in files), (n, sent)
    assert not [k for k in sent if k.endswith(".lock")]
    assert DeltaTable(f"{uri}/answers/t", storage_options=_storage(s3)).version() == 2

    other = BucketWarehouse(uri, _machine(tmp_path, "b"))
    assert other.pull() == 6
    # A file changed here and in the bucket is kept as changed here (pushed by the next push).
    note = "_incr/p/schema/e.json"
    (bucket.local / note).parent.mkdir(parents=True)
    (bucket.local / note).write_text("one")
    bucket.push()
    (other.local / note).parent.mkdir(parents=True, exist_ok=True)
    (other.local / note).write_text("two, not pushed")
    (bucket.local / note).write_text("three")
    bucket.push()
    assert other.pull() == 0
    assert (other.local / note).read_text() == "two, not pushed"
    # A file deleted in the bucket goes from a copy that did not change it.
    (bucket.local / note).unlink()
    bucket.push()
    other.pull()
    assert (other.local / note).exists()  # it changed there
    third = BucketWarehouse(uri, _machine(tmp_path, "c"))
    third.pull()
    assert not (third.local / note).exists()
    assert third.metrics.full_listings == 1  # a new copy lists the bucket once

    # A copy that missed journal entries pruned meanwhile lists the whole bucket instead.
    for i in range(3):
        write_deltalake(str(table), pa.table({"x": [100 + i]}), mode="append")
        bucket.push()
    assert third.pull() == 6 and third.metrics.full_listings == 1  # 3 entries read
    for i in range(2):
        write_deltalake(str(table), pa.table({"x": [200 + i]}), mode="append")
        bucket.push()
    root = uri.removeprefix("s3://")
    journal = sorted(k for k in _objects(s3, uri) if k.startswith(f"{JOURNAL}/"))
    for key in journal[:-1]:
        s3.fs.delete_file(f"{root}/{key}")
    assert third.pull() == 4 and third.metrics.full_listings == 2
    assert DeltaTable(str(third.local / "answers" / "t")).to_pyarrow_table().num_rows == 35


def test_the_cli_runs_and_answers_on_a_bucket_warehouse(s3, uri, tmp_path, capsys):
    program = tmp_path / "p.sql"
    program.write_text(PROGRAM)
    landing = tmp_path / "landing"
    _land(landing, "001.csv", [{"who": "a", "pts": 4}, {"who": "b", "pts": 6}])
    assert cli.main(["run", str(program), "--landing", str(landing), "--warehouse", uri]) == 0
    capsys.readouterr()
    assert cli.main(["answer", str(program), "--view", "best", "--warehouse", uri, "--format", "json"]) == 0
    assert '"best": 6' in capsys.readouterr().out
    assert cli.main(["status", str(program), "--landing", str(landing), "--warehouse", uri,
                     "--json"]) == 0
    with pytest.raises(StorageError, match="not an s3://bucket/prefix URI"):
        BucketWarehouse("gs://bucket/w")


def test_a_lease_lost_to_another_machine_stops_the_push(s3, uri, spark, tmp_path):
    compiled = compile_text(PROGRAM, "p.sql", name="p")
    config = replace(_machine(tmp_path, "a"), lease_ttl_s=0.3)  # renewed every 0.1 s
    pipeline = Pipeline(compiled, tmp_path / "landing", uri, spark=spark, config=config)
    key = f"{uri.removeprefix('s3://')}/_incr/p/locks/view-best.lease"
    taker = b'{"owner": "other", "host": "elsewhere", "pid": 3, "what": "x", "expires": 4e9}'
    with pytest.raises(StorageError, match="ran out and was taken by another machine; this "
                                           "run's work is not pushed"), \
            pipeline.locks.hold(views=("best",)):
        with s3.fs.open_input_stream(key) as got:
            first = json.loads(got.read())["expires"]
        time.sleep(0.6)  # twice its life: renewed meanwhile, not run out
        with s3.fs.open_input_stream(key) as got:
            assert json.loads(got.read())["expires"] > max(first, time.time())
        (pipeline.warehouse / "answers" / "best").mkdir(parents=True)
        (pipeline.warehouse / "answers" / "best" / "note.json").write_text("{}")
        with s3.fs.open_output_stream(key) as out:  # as a machine that took it over would
            out.write(taker)
        time.sleep(1.0)
    assert "answers/best/note.json" not in _objects(s3, uri)  # nothing of it went up
    with s3.fs.open_input_stream(key) as got:
        assert got.read() == taker  # and the taker's lease is left alone
