"""``incr bench regroup``: the program, the data, and a tiny run end to end.

Timings are never asserted.  What is checked: the program regroups the coarser views under
rollup and keeps a state per grouping under ``on``, the data's deletes remove live rows, and
a tiny run writes every output, answers the regrouped customer views by change where the
defaults allow it and by rewrite where the bench forbids it, and compares every answer
with the DuckDB oracle.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq

from incr.bench.regroup import SETTINGS, VIEWS, land, program_text, run_regroup
from incr.cli import _parser
from incr.compiler import compile_text


def test_rollup_regroups_the_coarser_views_and_on_keeps_a_state_per_grouping() -> None:
    rollup = compile_text(program_text("rollup"), name="regroup")
    (share,) = rollup.shares
    assert sorted(v for v, _ in share.rolled) == ["by_customer", "by_customer_top", "by_product"]
    assert all(p.publish.by_change for p in rollup.plans)
    on = compile_text(program_text("on"), name="regroup")
    assert len({p.state_owner for p in on.plans}) == 3  # by_customer and its top share one
    assert len(VIEWS) == len(rollup.plans) == 4 and set(SETTINGS) == {"change", "rewrite", "on"}


def test_the_data_is_deterministic_and_its_deletes_remove_live_rows(tmp_path: Path) -> None:
    steps, live = land(tmp_path / "a", 50, 300, 20, 3)
    again, _ = land(tmp_path / "b", 50, 300, 20, 3)
    assert [s.kind for s in steps] == ["insert", "insert", "insert", "delete"]
    assert [s.files for s in steps] == [s.files for s in again]
    read = {s.index: pq.read_table(tmp_path / "a" / s.files["sales"]) for s in steps}
    assert read[0].equals(pq.read_table(tmp_path / "b" / steps[0].files["sales"]))
    assert live.num_rows == 300 + 20 + 20 - 20
    assert max(read[0].column("customer").to_pylist()) < 50


def test_a_tiny_run_writes_every_output_and_checks_every_answer(spark, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = run_regroup(out, groups=40, initial=400, increment=3, increments=3, spark=spark,
                       log=None)
    assert code == 0
    meta = json.loads((out / "regroup.json").read_text())
    assert meta["oracle"] == {"checked_views": 12, "mismatches": []}
    summ = meta["summary"]
    assert set(summ) == set(SETTINGS)
    # 3 rows touch at most 3 of 40 customers: by change by default, rewritten when forbidden
    assert summ["change"]["modes"]["by_customer"] == {"change": 3}
    assert summ["change"]["modes"]["by_customer_top"] == {"change": 3}
    assert summ["rewrite"]["modes"]["by_customer"] == {"rewrite": 3}
    assert summ["on"]["state_tables"] > summ["change"]["state_tables"]
    with (out / "regroup.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 4 and {r["share"] for r in rows} == set(SETTINGS)
    assert {r["check"] for r in rows if r["batch"] == "3"} == {"ok"}
    assert "| change |" in (out / "regroup.md").read_text()
    assert not (out / "regroup-work").exists()


def test_the_cli_takes_the_regroup_bench() -> None:
    args = _parser().parse_args(["bench", "regroup", "--groups", "100", "--increment", "5"])
    assert (args.name, args.groups, args.increment) == ("regroup", 100, 5)
