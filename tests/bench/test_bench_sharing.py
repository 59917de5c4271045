"""``incr bench sharing``: the catalogue, the data, and a tiny run end to end.

Timings are never asserted (benchmarks are not timed tests).  What is checked: every view of
the catalogue compiles with every share setting (on, off, rollup), the data is deterministic and its
deletes remove live rows, and a tiny run writes every output with every setting measured and
every answer compared with the DuckDB oracle.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from incr.bench.sharing import (
    ALONE,
    BREAKDOWN,
    CATALOGUE,
    COLUMNS,
    SETTINGS,
    SHAPES,
    Row,
    _report,
    compile_views,
    land,
    live_tables,
    markdown,
    program_text,
    read_csv,
    run_sharing,
    summary,
)
from incr.cli import _parser


def test_the_catalogue_compiles_in_every_share_setting() -> None:
    assert len(CATALOGUE) == 20 and len({v.name for v in CATALOGUE}) == 20
    assert {v.shape for v in CATALOGUE} == set(SHAPES)
    states = {}
    for share in SETTINGS:
        compiled = compile_views(20, share)
        assert compiled.program.options.share is (share != "off")
        assert compiled.program.options.rollup is (share == "rollup")
        assert [p.view for p in compiled.plans] == [v.name for v in CATALOGUE]
        states[share] = len({p.state_owner for p in compiled.plans})
    # rollup answers the product and (region, product) views from one state with the region ones
    assert states["off"] == 20 and states["rollup"] < states["on"] < states["off"]
    rolled = {v for s in compile_views(20, "rollup").shares for v, _ in s.rolled}
    assert {v.name for v in CATALOGUE if v.shape in ("CMORR", "CGMRR", "CGRR")} & rolled
    assert "-- incr: share = off" in program_text(3, "off") and program_text(3, "on").count(
        "CREATE VIEW") == 3
    # a view alone: the program of that view only, sharing on
    alone = compile_views(7, ALONE)
    assert [p.view for p in alone.plans] == [CATALOGUE[6].name] and alone.program.options.share
    # Most views group sales by region; the first five already mix the shapes and the join.
    assert sum(v.select.endswith("GROUP BY region") and "WHERE" not in v.select
               for v in CATALOGUE) >= 10
    assert {v.shape for v in CATALOGUE[:5]} == {"base", "CGMRR", "CMORR", "join"}
    assert [sorted(p.sources) for p in compile_views(5, "on").plans][4] == ["customers", "sales"]


def test_data_is_deterministic_and_deletes_remove_live_rows(tmp_path: Path) -> None:
    a = land(tmp_path / "a", 300, 40, 4)
    b = land(tmp_path / "b", 300, 40, 4)
    assert [s.kind for s in a] == ["insert", "insert", "insert", "delete", "insert"]
    assert [s.rows for s in a] == [300, 40, 40, 40, 40]
    assert a[0].files["customers"] == "customers/0000.parquet"
    assert a[3].files["sales"] == "sales/_deletes/0003.parquet"
    live: Counter = Counter()
    for sa, sb in zip(a, b):
        ta = pq.read_table(tmp_path / "a" / sa.files["sales"])
        assert ta.equals(pq.read_table(tmp_path / "b" / sb.files["sales"]))
        rows = Counter(map(tuple, (r.values() for r in ta.to_pylist())))
        if sa.kind == "delete":
            assert not rows - live  # every deleted row was live
            live -= rows
        else:
            live += rows
    tables = live_tables(tmp_path / "a", a)
    assert tables["sales"].num_rows == sum(live.values()) == 300 + 3 * 40 - 40
    assert tables["customers"].num_rows == 2_000


def test_summary_gives_each_settings_ratio_to_the_fewest_views_and_the_target() -> None:
    def rows(views: int, share: str, seconds: list[float]) -> list[Row]:
        return [Row("sharing", views, share, batch, "insert", 1_000, 10, s, state_tables=views)
                for batch, s in enumerate(seconds)]

    summ = summary(rows(1, "on", [9.0, 0.2, 0.4, 0.3]) + rows(1, "off", [9.0, 0.3, 0.3, 0.3])
                   + rows(1, "rollup", [9.0, 0.4, 0.4, 0.4])
                   + rows(20, "on", [50.0, 0.5, 0.4, 0.45]) + rows(20, "off", [90, 3.0, 2.7, 2.4])
                   + rows(20, "rollup", [40.0, 0.6, 0.6, 0.6]))
    one, twenty = summ["by_views"]["1"], summ["by_views"]["20"]
    assert one["median_on_s"] == 0.3 and one["initial_on_s"] == 9.0  # batch 0 apart
    assert twenty["on_over_base"] == 1.5 and twenty["off_over_base"] == 9.0
    assert twenty["rollup_over_base"] == 1.5 and twenty["initial_rollup_s"] == 40.0
    assert twenty["off_over_on"] == 6.0 and twenty["off_over_rollup"] == 4.5
    assert twenty["within_target"] and twenty["state_tables_off"] == 20
    assert summ["baseline_views"] == 1
    assert summ["target"] == {"views": 20, "on_over_base": 1.5, "rollup_over_base": 2.0,
                              "off_over_base": 9.0, "met": True, "floor_over_base": None,
                              "floor_view": None, "reachable": None}
    missed = summary(rows(1, "on", [1, 0.2]) + rows(2, "on", [1, 0.31]))
    assert missed["target"]["met"] is False and missed["by_views"]["2"]["off_over_on"] is None
    # rollup within the target (against one view with sharing on) meets it too
    rolled = summary(rows(1, "on", [1, 0.2]) + rows(2, "on", [1, 0.5]) + rows(2, "rollup", [1, 0.3]))
    assert rolled["target"]["met"] is True and rolled["target"]["rollup_over_base"] == 1.5
    # without a program of one view there is nothing to judge the target against: 20 views
    # alone are 1.0× themselves, 2 and 20 views are no ratio to one
    for counts in ((20,), (2, 20), (1,)):
        unjudged = summary([r for n in counts for r in rows(n, "on", [1, 0.5])])
        assert unjudged["target"]["met"] is None, counts
    alone = summary(rows(20, "on", [1, 0.5]))
    assert alone["by_views"]["20"]["within_target"] is None
    said = io.StringIO()
    _report(Path("out"), {"summary": alone, "wall_s": 1.0}, said)
    assert "not judged" in said.getvalue() and "met" not in said.getvalue().replace("not judged", "")
    timed = [Row("sharing", 20, "on", b, "insert", 1_000, 10, 1.0, dict.fromkeys(BREAKDOWN, 0.0))
             for b in range(2)]
    table = markdown(timed, alone).splitlines()
    assert next(line for line in table if line.startswith("| 20 |")).endswith("| — |")
    assert summary(rows(1, "on", [1, 0.5]))["by_views"]["1"]["within_target"] is True


def test_summary_gives_the_floor_of_the_views_alone() -> None:
    def rows(views: int, share: str, seconds: list[float]) -> list[Row]:
        return [Row("sharing", views, share, batch, "insert", 1_000, 10, s)
                for batch, s in enumerate(seconds)]

    measured = (rows(1, "on", [9, 0.2]) + rows(3, "on", [9, 0.5]) + rows(3, "rollup", [9, 0.4])
                + rows(1, ALONE, [9, 0.21]) + rows(2, ALONE, [9, 0.35]) + rows(3, ALONE, [9, 0.25]))
    summ = summary(measured)
    one, three = summ["by_views"]["1"], summ["by_views"]["3"]
    assert one["floor_s"] == 0.21 and one["floor_view"] == CATALOGUE[0].name
    # the costliest of the three alone, which is the second; N programs: their sum
    assert three["floor_s"] == 0.35 and three["floor_view"] == CATALOGUE[1].name
    # against the first view alone, measured beside the others
    assert three["floor_over_base"] == 1.67 and three["separate_s"] == 0.81
    assert three["separate_over_on"] == 1.62
    assert summ["target"]["floor_over_base"] == 1.67 and summ["target"]["reachable"] is False
    assert summ["target"]["met"] is False  # the alone rows are no N of their own
    assert set(summ["by_views"]) == {"1", "3"}
    # a view not measured alone leaves the floor unknown
    partial = summary(measured[:-2])
    assert partial["by_views"]["3"]["floor_s"] is None and partial["target"]["reachable"] is None
    cheaper = measured[:-6] + rows(1, ALONE, [9, 0.21]) + rows(2, ALONE, [9, 0.25]) + rows(
        3, ALONE, [9, 0.22])
    assert summary(cheaper)["target"]["reachable"] is True  # 0.25 is 1.19× 0.21


def test_tiny_run_measures_every_setting_and_checks_every_answer(spark, tmp_path: Path) -> None:
    code = run_sharing(tmp_path, views=(1, 5), initial=2_000, increment=50, increments=3,
                       warm_up=False, spark=spark, log=None, command="test")
    assert code == 0
    with (tmp_path / "sharing.csv").open(newline="") as fh:
        assert next(csv.reader(fh)) == COLUMNS
    rows = read_csv(tmp_path / "sharing.csv")
    assert [(r.views, r.share) for r in rows if r.batch == 0] == [
        (n, s) for n in (1, 5) for s in SETTINGS] + [(i, ALONE) for i in range(1, 6)]
    runs = [(n, s) for n in (1, 5) for s in SETTINGS] + [(i, ALONE) for i in range(1, 6)]
    for n, share in runs:
        run = [r for r in rows if r.views == n and r.share == share]
        assert [(r.batch, r.kind, r.rows) for r in run] == [
            (0, "insert", 2_000), (1, "insert", 50), (2, "insert", 50), (3, "delete", 50)]
        assert all(isinstance(r.seconds, float) and r.state_tables > 0 for r in run)  # recorded
        assert [r.check for r in run] == ["", "", "", "ok"]  # the oracle, after the last step
    meta = json.loads((tmp_path / "sharing.json").read_text())
    assert meta["oracle"] == {"checked_views": 18 + 5, "mismatches": []}
    assert meta["machine"]["spark"] == spark.version and meta["command"] == "test"
    by_views = meta["summary"]["by_views"]
    assert set(by_views) == {"1", "5"} and by_views["1"]["on_over_base"] == 1.0
    assert meta["summary"]["target"]["views"] == 5
    assert meta["summary"]["target"]["floor_view"] in {v.name for v in CATALOGUE[:5]}
    assert by_views == summary(rows)["by_views"]
    assert (tmp_path / "sharing.png").stat().st_size > 10_000
    md = (tmp_path / "sharing.md").read_text()
    assert "| 5 |" in md and f"| 5 | {CATALOGUE[4].name} | join |" in md  # the fifth alone
    assert not (tmp_path / "sharing-work").exists()


def test_command_line() -> None:
    args = _parser().parse_args(["bench", "sharing", "--views", "1,3", "--increment", "50"])
    assert args.views == (1, 3) and args.increment == 50 and args.increments is None
