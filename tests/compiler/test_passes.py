"""Golden tests for the compiler passes, in the style of sqlglot's optimizer fixtures.

``fixtures/<pass>.sql`` holds one block per case, blocks separated by blank lines::

    # title: what the case is about          (optional; names the test)
    -- incr: append_only = t                 (optional header lines of the program)
    -- program: CREATE TABLE t (...);        (optional; replaces TABLE below)
    SELECT ... FROM t ...                    (the view's SELECT, on one line)
    -- expected:
    <the pass's output, rendered by RENDER[<pass>] below; no blank lines>

Each case compiles ``<header> <table> CREATE VIEW w AS`` plus ``<select>;`` on the next
line and runs the passes up to and including the file's pass (``run_passes(c,
until=<pass>)``), then compares the rendering with the expected text.  To see what the
code produces now (for reviewing a change, never for blindly accepting it)::

    .venv/bin/python tests/compiler/test_passes.py derive_merge
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from incr.compiler import compile_text, start
from incr.compiler.compilation import Compilation
from incr.compiler.ir import Aggregate
from incr.compiler.passes import PASSES, run_passes
from incr.compiler.program import parse_program
from incr.compiler.sqlgen import render_answer, render_diffusion, render_merge

FIXTURES = Path(__file__).parent / "fixtures"
TABLE = "CREATE TABLE t (k VARCHAR, g BIGINT, v BIGINT, x DOUBLE, d DECIMAL(10,2));"


# -- renderings: the "output" of each pass, as text ---------------------------------------


def render_normalize(c: Compilation) -> str:
    return c.rel.pretty()


def render_lineage(c: Compilation) -> str:
    assert c.lineage is not None and c.key_columns is not None
    ir_key = {column: ir for ir, column in c.key_columns}
    theta = {k.name for k in c.lineage}
    lines = [f"{k.name} = {k.expr}  [{ir_key[k.name]}]" for k in c.lineage] or ["()"]
    # A window query's other keys are the columns of the rows kept per partition.
    lines += [f"row column {column}  [{ir}]" for ir, column in c.key_columns if column not in theta]
    return "\n".join(lines)


def render_infer_monoids(c: Compilation) -> str:
    assert c.aggregates is not None
    agg = next(node for node in c.rel.walk() if isinstance(node, Aggregate))
    calls = {a.name: a.call for a in agg.aggs}
    lines: list[str] = []
    for state in c.aggregates:
        lines.append(f"{state.name} = {calls[state.name]}")
        lines += [f"  value {v.describe()}" for v in state.values]
        for read in state.bags:
            what = ("the live values" if read.kind == "values" else "the exact band sums")
            lines.append(f"  reads {read.name} = {read.sql} over {what} of {read.arg}")
        lines.append(f"  finalize {state.finalize}")
    return "\n".join(lines)


def render_split_answer(c: Compilation) -> str:
    assert c.tables is not None and c.h is not None and c.answer is not None
    lines = []
    for t in c.tables:
        keep = "rows vanish at _n = 0" if t.vanishes else "row stays"
        lines.append(f"table {t.name}: key ({', '.join(t.key_columns)}) "
                     f"values ({', '.join(t.value_columns)}); {keep}")
    wheres = {str(q.where) if q.where is not None else "-" for q in c.h}
    buckets = {q.buckets for q in c.h}
    assert [q.table for q in c.h] == list(c.tables) and len(wheres) == len(buckets) == 1
    lines.append(f"h: where {wheres.pop()}; {buckets.pop()} bucket(s)")
    lines.append(render_answer(c.answer, {t.name: t.name for t in c.tables}))
    return "\n".join(lines)


def render_derive_merge(c: Compilation) -> str:
    assert c.tables is not None and c.merge is not None and c.diminish is not None
    tables = {t.name: t for t in c.tables}
    lines = []
    for spec in c.merge:
        lines += [f"-- ⊗ {spec.table}", render_merge(spec, tables[spec.table])]
    diminished = {spec.table for spec in c.diminish}
    for spec in c.diminish:
        lines += [f"-- ⊗̃ {spec.table}", render_merge(spec, tables[spec.table])]
    for t in c.tables:
        if t.name not in diminished:
            lines.append(f"-- ⊗̃ {t.name}: none (a monoid without inverse)")
    return "\n".join(lines)


RENDER = {
    "normalize": render_normalize,
    "lineage": render_lineage,
    "infer_monoids": render_infer_monoids,
    "split_answer": render_split_answer,
    "derive_merge": render_derive_merge,
}


# -- fixtures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    file: str
    line: int
    title: str
    header: tuple[str, ...]
    table: str
    select: str
    expected: str

    @property
    def program(self) -> str:
        # The SELECT starts its own line, so error columns count from its first character.
        return "\n".join([*self.header, self.table, "CREATE VIEW w AS", f"{self.select};"]) + "\n"

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")
        return f"{self.file}:{self.line}" + (f"-{slug}" if slug else "")


def load_cases(name: str) -> list[Case]:
    text = (FIXTURES / f"{name}.sql").read_text(encoding="utf-8")
    cases = []
    line = 1
    for block in re.split(r"\n[ \t]*\n", text):
        start_line = line + (len(block) - len(block.lstrip("\n")))
        line += block.count("\n") + 2
        lines = [ln.rstrip() for ln in block.strip("\n").splitlines()]
        if not lines or all(ln.startswith("#") for ln in lines):
            continue
        assert "-- expected:" in lines, f"{name}.sql:{start_line}: block without -- expected:"
        cut = lines.index("-- expected:")
        title, header, table, select = "", [], TABLE, []
        for ln in lines[:cut]:
            if ln.startswith("# title:"):
                title = ln.split(":", 1)[1].strip()
            elif ln.startswith("#"):
                continue
            elif ln.startswith("-- incr:"):
                header.append(ln)
            elif ln.startswith("-- program:"):
                table = ln.split(":", 1)[1].strip()
            else:
                select.append(ln)
        assert len(select) == 1, f"{name}.sql:{start_line}: the SELECT must be one line"
        cases.append(Case(name, start_line, title, tuple(header), table, select[0],
                          "\n".join(lines[cut + 1:])))
    assert cases, f"no cases in {name}.sql"
    return cases


def run(case: Case, until: str) -> Compilation:
    program = parse_program(case.program, f"{case.file}.sql")
    return run_passes(start(program, program.views[0]), until=until)


def cases_for(name: str):
    return [pytest.param(c, id=c.id) for c in load_cases(name)]


@pytest.mark.parametrize("case", cases_for("normalize"))
def test_normalize(case: Case):
    assert RENDER["normalize"](run(case, "normalize")) == case.expected


@pytest.mark.parametrize("case", cases_for("lineage"))
def test_lineage(case: Case):
    assert RENDER["lineage"](run(case, "lineage")) == case.expected


@pytest.mark.parametrize("case", cases_for("infer_monoids"))
def test_infer_monoids(case: Case):
    assert RENDER["infer_monoids"](run(case, "infer_monoids")) == case.expected


@pytest.mark.parametrize("case", cases_for("split_answer"))
def test_split_answer(case: Case):
    assert RENDER["split_answer"](run(case, "split_answer")) == case.expected


@pytest.mark.parametrize("case", cases_for("derive_merge"))
def test_derive_merge(case: Case):
    assert RENDER["derive_merge"](run(case, "derive_merge")) == case.expected


@pytest.mark.parametrize("name", list(RENDER))
def test_every_fixture_is_a_pass(name: str):
    assert name in [p.__name__ for p in PASSES]
    assert len(load_cases(name)) >= 5


# -- invariants over every fixture program ------------------------------------------------

ALL_CASES = [c for name in RENDER for c in load_cases(name)]


def test_run_passes_stops_after_until():
    case = load_cases("normalize")[0]
    c = run(case, "normalize")
    assert c.lineage is None and c.aggregates is None and c.tables is None
    c = run(case, "infer_monoids")
    assert c.aggregates is not None and c.tables is None and c.merge is None
    c = run(case, None)
    assert c.merge is not None and c.diminish is not None and c.diffuse is not None


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ALL_CASES])
def test_plan_invariants(case: Case):
    plan = compile_text(case.program, path="p.sql").plans[0]
    # exactly one Aggregate after normalization
    assert sum(isinstance(n, Aggregate) for n in plan.logical.walk()) == 1
    for table in plan.tables:
        columns = ["_bucket", *table.key_columns, *table.value_columns]
        assert len({c.lower() for c in columns}) == len(columns), f"{table.name}: {columns}"
        assert table.values[0].columns == ("_n",)
    # ⊗ for every table, ⊗̃ exactly for the invertible ones, ⊗̂ for every table
    assert [m.table for m in plan.merge] == [t.name for t in plan.tables]
    assert [d.table for d in plan.diminish] == [t.name for t in plan.tables if t.invertible]
    assert [d.table for d in plan.diffuse] == [t.name for t in plan.tables]
    # the global row stays; grouped rows and bag rows vanish with their last input row
    main = plan.table("main")
    assert main.vanishes == bool(plan.lineage)
    assert all(t.vanishes for t in plan.tables if t.name != "main")
    assert plan.append_only == ("append_only = t" in case.program)
    # a bag counts only non-NULL values (MIN/MAX/COUNT DISTINCT ignore NULLs)
    for table in plan.tables:
        h = plan.h_sql(table.name, "batch")
        assert ("WHERE `value` IS NOT NULL" in h) == (table.value_key is not None), h


def test_diffusion_is_the_right_outer_variant():
    case = next(c for c in load_cases("derive_merge") if "STDDEV" in c.select)
    c = run(case, "derive_merge")
    text = render_diffusion(c.diffuse[0])
    assert text.startswith("SELECT s._bucket, s.k,\n")
    assert "FROM h(ΔX) AS s LEFT JOIN main AS t ON (t._bucket IS NOT DISTINCT FROM s._bucket)" in text
    assert "CASE WHEN t._n IS NULL THEN s._n ELSE t._n + s._n END AS _n" in text


# -- the state fingerprint ------------------------------------------------------------------

BASE = ("SELECT k, COUNT(*) AS n, SUM(v) AS s, MIN(x) AS lo FROM t WHERE v > 0 GROUP BY k "
        "HAVING COUNT(*) > 1 ORDER BY k LIMIT 5")


def plan_of(select: str, header: str = ""):
    return compile_text(f"{header}{TABLE}\nCREATE VIEW w AS {select};", path="p.sql").plans[0]


def test_fingerprint_is_stable_across_compilations():
    a, b = plan_of(BASE), plan_of(BASE)
    assert a is not b
    assert a.state_fingerprint == b.state_fingerprint
    assert a.answer_fingerprint == b.answer_fingerprint
    assert re.fullmatch(r"[0-9a-f]{16}", a.state_fingerprint)
    # the file name and the spelling of the same query do not matter
    c = compile_text(f"{TABLE}\nCREATE VIEW w AS\n  {BASE.lower()};", path="other.sql").plans[0]
    assert c.state_fingerprint == a.state_fingerprint


@pytest.mark.parametrize("changed", [
    BASE.replace("WHERE v > 0", "WHERE v > 1"),
    BASE.replace("WHERE v > 0 ", ""),
    BASE.replace("GROUP BY k", "GROUP BY k, g"),
    BASE.replace("SUM(v)", "SUM(x)"),
    BASE.replace("MIN(x)", "MIN(v)"),
], ids=["where-changed", "where-dropped", "group-by-changed", "aggregate-changed",
        "bag-argument-changed"])
def test_fingerprint_changes_with_the_state(changed: str):
    assert plan_of(changed).state_fingerprint != plan_of(BASE).state_fingerprint


def test_fingerprint_of_min_and_max():
    # Under deletions MIN(x) and MAX(x) read the same value-count bag of x: same state.
    to_max = BASE.replace("MIN(x)", "MAX(x)")
    assert plan_of(to_max).state_fingerprint == plan_of(BASE).state_fingerprint
    # On an append-only source they keep different monoids: different state.
    header = "-- incr: append_only = t\n"
    assert plan_of(to_max, header).state_fingerprint != plan_of(BASE, header).state_fingerprint


@pytest.mark.parametrize("header", ["-- incr: append_only = t\n", "-- incr: buckets = 4\n"])
def test_fingerprint_changes_with_options(header: str):
    assert plan_of(BASE, header).state_fingerprint != plan_of(BASE).state_fingerprint


@pytest.mark.parametrize("changed", [
    BASE.replace("ORDER BY k", "ORDER BY s DESC"),
    BASE.replace("HAVING COUNT(*) > 1", "HAVING COUNT(*) > 7"),
    BASE.replace("HAVING COUNT(*) > 1 ", ""),
    BASE.replace("LIMIT 5", "LIMIT 50"),
    BASE.replace("AS s,", "AS total,"),
], ids=["order-by", "having", "having-dropped", "limit", "alias"])
def test_fingerprint_ignores_the_answer_only_parts(changed: str):
    base, other = plan_of(BASE), plan_of(changed)
    assert other.state_fingerprint == base.state_fingerprint
    assert other.answer_fingerprint != base.answer_fingerprint


@pytest.mark.parametrize(("select", "header", "kept"), [
    ("SELECT s, COUNT(*) AS n FROM (SELECT k, SUM(x) AS s FROM t GROUP BY k) AS q GROUP BY s",
     "", ("_theta_k", "k", "s")),
    ("SELECT MAX(v2) AS m FROM (SELECT g, VAR_POP(x) AS v2, MIN(v) AS lo FROM t GROUP BY g) AS q",
     "", ("_theta_g", "g", "v2", "lo")),
    ("SELECT k, g, AVG(x) AS a FROM t GROUP BY ROLLUP (k, g)", "", None),
    ("SELECT s, COUNT(*) AS n FROM (SELECT k, SUM(x) AS s FROM t GROUP BY k) AS q GROUP BY s",
     "-- incr: append_only = t\n", ()),
    (("SELECT s, COUNT(*) AS n FROM (SELECT k, SUM(v) AS s, MIN(x) AS lo FROM t GROUP BY k) "
      "AS q GROUP BY s"), "", ()),
    ("SELECT k, SUM(x) AS s, VAR_SAMP(x) AS vs FROM t GROUP BY k", "", ()),
], ids=["double-sum", "moments", "rollup", "append-only", "integer-sum-and-min", "top-stage"])
def test_a_nested_stage_keeps_what_it_hands_on_when_recomputing_it_drifts(select, header, kept):
    """A stage another reads keeps its output rows (θ renamed beside the output columns)
    exactly when an output comes from exact bands or moments over a bag."""
    plan = plan_of(select, header)
    tables = [s.kept for s in plan.stages if s.kept is not None]
    assert all(s.kept is None for s in plan.stages if not s.name)
    if kept is None:  # grouping sets over a source with deletes: a DOUBLE AVG is one
        # aggregation per set over the rows, each read by the union of the sets
        assert [t.key_columns for t in tables] == [
            ("_theta_k", "_theta_g", "k", "g", "a"), ("_theta_k", "k", "g", "a"), ("k", "g", "a")]
        assert all(not i.derived for s in plan.stages[:-1] for i in s.inputs)
    elif not kept:
        assert tables == []
    else:
        assert [t.key_columns for t in tables] == [kept]
        stage = next(s for s in plan.stages if s.kept is not None)
        assert stage.keep is not None and stage.keep.operator == "⊗±"
        assert stage.keep.keys == kept and plan.kept() == (stage.kept,)


if __name__ == "__main__":  # print what the code renders now, block by block, for review
    for c in load_cases(sys.argv[1]):
        lines = [f"# title: {c.title}"] if c.title else []
        lines += [*c.header, *([f"-- program: {c.table}"] if c.table != TABLE else [])]
        print(*lines, c.select, "-- expected:", RENDER[c.file](run(c, c.file)), "", sep="\n")
