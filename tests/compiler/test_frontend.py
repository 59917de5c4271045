"""Golden tests for the front-end steps (``incr.compiler.frontend``), like ``test_passes.py``.

``fixtures/<step>.sql`` has the format described in ``test_passes.py`` (one block per case:
optional ``# title:``, ``-- incr:`` and ``-- program:`` lines, the view's SELECT on one line,
``-- expected:`` and the rendering).  Each case parses ``CREATE VIEW w AS <select>`` and
runs the front end up to and including the file's step, then compares the rendering of
that step's output with the expected text.  A step that raises renders as
``<ErrorClass>: <path>:<line>:<column>: <message>``, so refusals are fixtures too.

* ``name_outputs``: the query with its unaliased output items aliased by DuckDB's names.
* ``refuse_unsupported``: ``accepted``, or the refusal.
* ``spell_by_type``: the query with its typed calls rewritten.
* ``decorrelate``: the rewritten query (sqlglot's pretty DuckDB SQL) and the output names
  it recorded.
* ``split_windows``: the rewritten query (a window block over the plain block it reads).
* ``split_stages``: every stage, producers first: name, output columns, what it reads.
* ``split_joins``: the top stage's input relation: its columns, its branches (joins,
  anti-joins, padded inputs, per-branch filters) and the WHERE left to the block.
* ``resolve_names``: the view's block with its names resolved (a one-block view), and what
  each SELECT item, GROUP BY, HAVING and ORDER BY item stands for.
* ``lower_block``: the view's stage as IR (``Rel.pretty()``) and its typed output columns.

To see what the code renders now (for reviewing a change, never for blindly accepting it)::

    .venv/bin/python tests/compiler/test_frontend.py split_joins
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sqlglot import exp

from incr.compiler.frontend import FRONTEND, parse_query, run_frontend
from incr.compiler.frontend.block import BLOCK, run_block
from incr.compiler.frontend.query import Block, Query, StageTranslation
from incr.compiler.frontend.resolve_names import group_by_key, inline_aliases, order_by_target, select_items
from incr.compiler.ir import Filter, Rel, Source
from incr.compiler.program import Column, parse_program
from incr.errors import IncrError
from tests.compiler.test_passes import FIXTURES, TABLE, Case, load_cases


def query_of(case: Case) -> Query:
    program = parse_program(case.program, f"{case.file}.sql")
    return parse_query(program.views[0], program)


def top_stage(case: Case) -> StageTranslation:
    q = run_frontend(query_of(case))
    assert q.stages is not None
    return q.stages[-1]


def one_block(case: Case, until: str) -> Block:
    """The view's only block after the block steps up to ``until`` (a view with nothing nested)."""
    q = run_frontend(query_of(case), until="decorrelate")
    assert q.output_names is None, "resolve_names cases must be one SELECT with nothing nested"
    assert isinstance(q.tree, exp.Select)
    return run_block(Block(q.scope, q.tree, "", {}), until=until)


def columns(cols: Sequence[Column]) -> str:
    return ", ".join(f"{c.name} {c.type}" for c in cols)


# -- renderings: the "output" of each step, as text ---------------------------------------


def render_name_outputs(case: Case) -> str:
    q = run_frontend(query_of(case), until="name_outputs")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_refuse_unsupported(case: Case) -> str:
    run_frontend(query_of(case), until="refuse_unsupported")
    return "accepted"


def render_expand_shorthand(case: Case) -> str:
    q = run_frontend(query_of(case), until="expand_shorthand")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_spell_by_type(case: Case) -> str:
    q = run_frontend(query_of(case), until="spell_by_type")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_expand_grouping_sets(case: Case) -> str:
    q = run_frontend(query_of(case), until="expand_grouping_sets")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_compute_join_keys(case: Case) -> str:
    q = run_frontend(query_of(case), until="compute_join_keys")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_split_windows(case: Case) -> str:
    q = run_frontend(query_of(case), until="split_windows")
    return q.tree.sql(dialect="duckdb", pretty=True)


def render_decorrelate(case: Case) -> str:
    q = run_frontend(query_of(case), until="decorrelate")
    names = "(nothing nested: unchanged)" if q.output_names is None else ", ".join(q.output_names)
    return f"{q.tree.sql(dialect='duckdb', pretty=True)}\n-- output names: {names}"


def render_split_stages(case: Case) -> str:
    q = run_frontend(query_of(case), until="split_stages")
    assert q.stages is not None
    lines = []
    for st in q.stages:
        kind = ("aggregated, one row" if st.single_row else "aggregated") if st.aggregated else "plain"
        lines.append(f"stage {st.name or '(view)'}: {kind} -> {columns(st.output)}")
        lines += [f"  {branch}" for branch in st.branches]
    return "\n".join(lines)


def _where_of(rel: Rel) -> str | None:
    for node in rel.walk():
        if isinstance(node, Filter) and isinstance(node.child, Source):
            return str(node.predicate)
    return None


def render_split_joins(case: Case) -> str:
    st = top_stage(case)
    columns = ", ".join(c.name + ("" if c.not_null else "?") for c in st.source.columns)
    lines = [f"source {st.source.name}: {columns}"]
    lines += [f"branch {branch}" for branch in st.branches]
    where = _where_of(st.rel)
    lines.append(f"where {where}" if where is not None else "where -")
    return "\n".join(lines)


def render_resolve_names(case: Case) -> str:
    b = one_block(case, "resolve_names")
    tree, table = b.tree, b.table
    items = select_items(tree, table)
    lines = [tree.sql(dialect="duckdb")]
    lines += [f"select {name} = {node.sql(dialect='duckdb')}" for name, node in items]
    group = tree.args.get("group")
    for node in group.expressions if group is not None else []:
        key = group_by_key(b.scope, node, items, table)
        lines.append(f"group by {node.sql(dialect='duckdb')} -> {key.sql(dialect='duckdb')}")
    having = tree.args.get("having")
    if having is not None:
        lines.append(f"having -> {inline_aliases(having.this, items, table).sql(dialect='duckdb')}")
    order = tree.args.get("order")
    for ordered in order.expressions if order is not None else []:
        target = order_by_target(b.scope, ordered.this, [name for name, _ in items])
        shown = f"item {target + 1} ({items[target][0]})" if isinstance(target, int) \
            else target.sql(dialect="duckdb")
        lines.append(f"order by {ordered.this.sql(dialect='duckdb')} -> {shown}")
    return "\n".join(lines)


def render_lower_block(case: Case) -> str:
    st = top_stage(case)
    return f"{st.rel.pretty()}\n-> {columns(st.output)}"


RENDER: dict[str, Callable[[Case], str]] = {
    "name_outputs": render_name_outputs,
    "refuse_unsupported": render_refuse_unsupported,
    "expand_shorthand": render_expand_shorthand,
    "spell_by_type": render_spell_by_type,
    "expand_grouping_sets": render_expand_grouping_sets,
    "compute_join_keys": render_compute_join_keys,
    "decorrelate": render_decorrelate,
    "split_windows": render_split_windows,
    "split_stages": render_split_stages,
    "split_joins": render_split_joins,
    "resolve_names": render_resolve_names,
    "lower_block": render_lower_block,
}


def rendered(case: Case) -> str:
    try:
        return RENDER[case.file](case)
    except IncrError as e:
        return f"{type(e).__name__}: {e}"


# -- fixtures ------------------------------------------------------------------------------


def cases_for(name: str) -> list[object]:
    return [pytest.param(c, id=c.id) for c in load_cases(name)]


@pytest.mark.parametrize("case", cases_for("name_outputs"))
def test_name_outputs(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("refuse_unsupported"))
def test_refuse_unsupported(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("expand_shorthand"))
def test_expand_shorthand(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("spell_by_type"))
def test_spell_by_type(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("expand_grouping_sets"))
def test_expand_grouping_sets(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("compute_join_keys"))
def test_compute_join_keys(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("decorrelate"))
def test_decorrelate(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("split_windows"))
def test_split_windows(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("split_stages"))
def test_split_stages(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("split_joins"))
def test_split_joins(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("resolve_names"))
def test_resolve_names(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("case", cases_for("lower_block"))
def test_lower_block(case: Case) -> None:
    assert rendered(case) == case.expected


@pytest.mark.parametrize("name", list(RENDER))
def test_every_fixture_is_a_step(name: str) -> None:
    assert f"def test_{name}(" in Path(__file__).read_text(), f"fixtures/{name}.sql is never tested"
    assert name in [s.__name__ for s in (*FRONTEND, *BLOCK)]
    assert len(load_cases(name)) >= 5


def test_every_step_and_pass_has_a_fixture() -> None:
    from incr.compiler.passes import PROGRAM_PASSES
    from tests.compiler.test_passes import RENDER as PASS_RENDER

    files = {p.stem for p in Path(FIXTURES).glob("*.sql")}
    assert files == set(RENDER) | set(PASS_RENDER) | set(PROGRAM_PASSES)
    assert {s.__name__ for s in (*FRONTEND, *BLOCK)} == set(RENDER)


def test_run_frontend_stops_after_until() -> None:
    case = next(c for c in load_cases("decorrelate") if "EXISTS" in c.select)
    q = run_frontend(query_of(case), until="refuse_unsupported")
    assert q.output_names is None and q.stages is None
    q = run_frontend(query_of(case), until="decorrelate")
    assert q.output_names is not None and q.stages is None
    q = run_frontend(query_of(case))
    assert q.stages is not None and q.stages[-1].name == ""


if __name__ == "__main__":  # print what the code renders now, block by block, for review
    for c in load_cases(sys.argv[1]):
        lines = [f"# title: {c.title}"] if c.title else []
        lines += [*c.header, *([f"-- program: {c.table}"] if c.table != TABLE else [])]
        print(*lines, c.select, "-- expected:", rendered(c), "", sep="\n")
