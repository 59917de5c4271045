"""The benchmark harness: a tiny run end to end, and its deterministic data.

The timings themselves are not asserted (benchmarks are not timed tests); what is checked is
that a run produces every output with the documented columns, that incr's answers agree
with DuckDB and the recompute (``check``), and that the Structured Streaming peer computes
the same answer as incr, with deletions too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from incr.bench import resolve, run_bench
from incr.bench.results import COLUMNS
from incr.bench.workloads import WORKLOADS, land
from incr.cli import _parser

REQUIRED = {"size", "increment", "initial_rows", "rows", "incremental_s", "recompute_s", "peer_s",
            "floor_s", "read_s", "index_s", "h_s", "merge_s", "answer_s", "other_s"}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# The join run needs 3 increments to reach its delete batch; it skips the profiled extra
# increment (the groupBy run covers it) to keep the file under a minute.
@pytest.mark.parametrize("name, increments, profile", [("groupby", 1, True),
                                                       ("joingroupby-deletes", 3, False)])
def test_tiny_run_writes_every_output_and_the_peer_agrees(spark, tmp_path: Path, name: str,
                                                          increments: int, profile: bool) -> None:
    code = run_bench(name, tmp_path, initial=2_000, sizes=(200,), increments=increments,
                     check=True, profile=profile, warm_up=False, spark=spark, log=None)
    assert code == 0
    rows = _rows(tmp_path / f"{name}.csv")
    assert set(rows[0]) >= REQUIRED and list(rows[0]) == COLUMNS
    assert [int(r["increment"]) for r in rows] == list(range(increments + 1))
    assert all(r["check"] == "ok" and float(r["peer_s"]) > 0 for r in rows)
    streams = 2 if name.startswith("join") else 1
    assert [int(r["rows"]) for r in rows] == [2_000 * streams] + [200 * streams] * increments
    kinds = [r["kind"] for r in rows]
    assert kinds[-1] == ("delete" if name.endswith("-deletes") else "insert")
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    meta = json.loads((tmp_path / f"{name}.json").read_text())
    assert meta["peer"]["200"] == {**meta["peer"]["200"], "checked": True, "same_answer": True}
    assert meta["machine"]["nproc"] and meta["machine"]["spark"] == spark.version
    if profile:
        spent = _rows(tmp_path / f"{name}-profile.csv")
        # A small groupBy increment runs whole on the driver: DuckDB, no Spark job.
        assert any("driver SQL (DuckDB)" in r["path"] for r in spent)
        assert meta["profile"]["200"]["spark_jobs"] == 0
    assert not (tmp_path / f"{name}-work").exists()


def test_data_is_deterministic_and_deletes_remove_live_rows(tmp_path: Path) -> None:
    workload = WORKLOADS["groupby"]
    a = land(workload, tmp_path / "a", 300, 50, 6, deletes=True)
    b = land(workload, tmp_path / "b", 300, 50, 6, deletes=True)
    assert [s.kind for s in a] == ["insert", "insert", "insert", "delete", "insert", "insert",
                                   "delete"]
    assert a[3].files["s"] == "s/_deletes/0003.parquet"
    live: list[tuple[int, int]] = []
    for sa, sb in zip(a, b):
        ta = pq.read_table(tmp_path / "a" / sa.files["s"])
        assert ta.equals(pq.read_table(tmp_path / "b" / sb.files["s"]))
        pairs = list(zip(ta["x"].to_pylist(), ta["y"].to_pylist()))
        if sa.kind == "delete":
            for p in pairs:
                live.remove(p)  # raises if a deleted row is not live
        else:
            live += pairs
    values = np.array(live)
    assert values.min() >= 0 and values.max() <= 10_000 and len(live) == 300 + 4 * 50 - 2 * 50


def test_names_and_command_line() -> None:
    assert resolve("groupby-deletes", False) == ("groupby", True)
    assert resolve("joingroupby", True) == ("joingroupby", True)
    args = _parser().parse_args(["bench", "groupby", "--sizes", "10000,20000", "--increments", "2"])
    assert args.sizes == (10_000, 20_000) and args.increments == 2
    with pytest.raises(SystemExit):
        _parser().parse_args(["bench", "groupby", "--sizes", "ten"])


def test_transit_stub_is_the_seeds_topology_and_the_recursive_bench_checks_every_batch(
        spark, tmp_path):
    """One domain is 100 nodes and about 400 link rows, connected; a short run of
    ``incr bench reachability`` writes its CSV with every answer equal to DuckDB's."""
    from incr.bench.recursive import _rows, run_recursive, transit_stub

    links = transit_stub(1)
    nodes = {n for pair in links for n in pair}
    assert nodes == set(range(100)) and 300 <= 2 * len(links) <= 420
    assert _rows(links).num_rows == 2 * len(links)
    # Domains in a ring through their first transit nodes, or (--separate-domains) apart.
    ring, apart = transit_stub(3), transit_stub(3, linked=False)
    assert {(a, b) for a, b in ring if a // 100 != b // 100} == {(0, 100), (100, 200), (0, 200)}
    assert set(ring) - set(apart) == {(0, 100), (100, 200), (0, 200)}
    assert all(a // 100 == b // 100 for a, b in apart)
    assert run_recursive("reachability", tmp_path, 1, 2, 2, "test") == 0
    with open(tmp_path / "reachability.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["kind"] for r in rows] == ["insert", "delete", "insert"]
    assert rows[0]["fixpoint"] == "10000"  # connected: every node reaches every node
    assert all(r["equal"] == "True" for r in rows)
    # a first load has no R to read; later batches read the parts of R they reach (by src)
    assert rows[0]["parts"] == "" and all(0 < int(r["parts"]) <= 100 for r in rows[1:])
