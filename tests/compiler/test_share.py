"""The share pass: golden cases (``fixtures/share.sql``) and the properties of shared plans.

A case of ``fixtures/share.sql`` is a program's views (``CREATE VIEW`` lines over the
fixture table ``t`` of test_passes, or the tables of a ``-- program:`` line), then
``-- expected:`` and the rendering below: each group of views keeping one state (its rule,
its tables, and each view's answer over it), then each view keeping its own, and why.  To
see what the code produces now (for reviewing a change, never for blindly accepting it)::

    .venv/bin/python tests/compiler/test_share.py
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from incr.compiler import CompiledProgram, compile_text
from incr.compiler.explain import explain_program
from incr.compiler.sqlgen import render_answer

FIXTURE = Path(__file__).parent / "fixtures" / "share.sql"
TABLE = "CREATE TABLE t (k VARCHAR, g BIGINT, v BIGINT, x DOUBLE, d DECIMAL(10,2));"


def render(compiled: CompiledProgram) -> str:
    lines: list[str] = []
    for share in compiled.shares:
        lines.append(re.sub(r" state \S+:", ":", share.describe()))
        first = compiled.plan(share.views[0])
        for t in first.tables:
            lines.append(f"  table {t.name}: key ({', '.join(t.key_columns)}) "
                         f"values ({', '.join(t.value_columns)})")
        for view in share.views:
            plan = compiled.plan(view)
            assert plan.shares == share.owner and plan.tables == first.tables
            lines.append(f"  a of {view}:")
            sql = render_answer(plan.answer, {t.name: t.name for t in plan.tables})
            lines += [f"    {line}" for line in sql.splitlines()]
    lines += [f"{view} alone: {why}" for view, why in compiled.alone]
    return "\n".join(lines)


@dataclass(frozen=True)
class Case:
    line: int
    title: str
    program: str
    expected: str

    @property
    def id(self) -> str:
        return f"share:{self.line}-" + re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def load_cases() -> list[Case]:
    cases = []
    line = 1
    for block in re.split(r"\n[ \t]*\n", FIXTURE.read_text(encoding="utf-8")):
        start = line + (len(block) - len(block.lstrip("\n")))
        line += block.count("\n") + 2
        lines = [ln.rstrip() for ln in block.strip("\n").splitlines()]
        if not lines or all(ln.startswith("#") for ln in lines):
            continue
        cut = lines.index("-- expected:")
        title, header, table, views = "", [], TABLE, []
        for ln in lines[:cut]:
            if ln.startswith("# title:"):
                title = ln.split(":", 1)[1].strip()
            elif ln.startswith("-- incr:"):
                header.append(ln)
            elif ln.startswith("-- program:"):
                table = ln.split(":", 1)[1].strip()
            elif not ln.startswith("#"):
                views.append(ln)
        program = "\n".join([*header, table, *views]) + "\n"
        cases.append(Case(start, title, program, "\n".join(lines[cut + 1:])))
    return cases


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in load_cases()])
def test_share(case: Case):
    assert render(compile_text(case.program, "share.sql")) == case.expected


def test_sharing_views_have_one_state_fingerprint_and_their_own_answers():
    compiled = compile_text(TABLE + """
CREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;
CREATE VIEW b AS SELECT k, MIN(x) AS lo FROM t GROUP BY k HAVING COUNT(*) > 1;
""")
    a, b = compiled.plans
    assert a.shares == b.shares is not None and a.state_owner == b.state_owner == a.shares
    assert a.state_fingerprint == b.state_fingerprint
    assert a.answer_fingerprint != b.answer_fingerprint
    assert a.output == ("k", "s") and b.output == ("k", "lo")


def test_the_shared_state_keeps_its_name_as_views_come_and_go():
    views = ["CREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;",
             "CREATE VIEW b AS SELECT k, COUNT(*) AS n FROM t GROUP BY k;",
             "CREATE VIEW c AS SELECT k, MAX(d) AS m FROM t GROUP BY k;"]
    two = compile_text("\n".join([TABLE, *views[:2]]))
    three = compile_text("\n".join([TABLE, *views]))
    other = compile_text("\n".join([TABLE, views[1], views[2]]))
    owners = {two.shares[0].owner, three.shares[0].owner, other.shares[0].owner}
    assert len(owners) == 1
    # The state holds what its views need: another aggregate is another state fingerprint.
    assert two.plans[0].state_fingerprint != three.plans[0].state_fingerprint


def test_sharing_off_keeps_every_state_apart():
    text = TABLE + """
CREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;
CREATE VIEW b AS SELECT k, COUNT(*) AS n FROM t GROUP BY k;
"""
    on = compile_text(text)
    off = compile_text("-- incr: share = off\n" + text)
    assert on.shares and not off.shares
    assert all(p.shares is None and p.state_owner == p.view for p in off.plans)
    # A view's own state is what it was before sharing existed (its fingerprint).
    alone = compile_text(TABLE + "\nCREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;")
    assert off.plans[0].state_fingerprint == alone.plans[0].state_fingerprint


def test_explain_says_which_views_share_which_state_and_why_others_do_not():
    compiled = compile_text(TABLE + """
CREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;
CREATE VIEW b AS SELECT k, MAX(v) AS m FROM t GROUP BY k;
CREATE VIEW c AS SELECT g, SUM(v) AS s FROM t GROUP BY g;
""", name="shop")
    out = explain_program(compiled)
    owner = compiled.shares[0].owner
    assert (f"a, b share state {owner}: CGMRR (one measure, several aggregate functions) over "
            f"t, one WHERE, GROUP BY k") in out
    assert "c keeps its own state: no other view reads t with the same GROUP BY" in out
    # The shared state's tables and fold are shown once, under the first view sharing it.
    assert out.count(f"the state tables below are {owner}'s") == 1
    assert (f"{owner}'s, kept once for every view sharing it: its state tables, h, ⊗ and the "
            f"queries of its fold are shown under view a") in out
    b = out[out.index("\nview b "):out.index("\nview c ")]
    assert "state table main" not in b and "h  (Δ → main)" not in b and "a  (answer)" in b
    assert out.count("state table main") == 2  # a's (shared with b) and c's own


if __name__ == "__main__":
    for c in load_cases():
        print(f"# {c.title}\n{render(compile_text(c.program, 'share.sql'))}\n", file=sys.stdout)


def test_settled_keeps_the_grouping_views_are_served_from():
    """What a warehouse serves decides the grouping a run uses (the runtime's settle):
    served views keep their state, views new beside them share among themselves."""
    views = ["CREATE VIEW a AS SELECT k, SUM(v) AS s FROM t GROUP BY k;",
             "CREATE VIEW b AS SELECT k, COUNT(*) AS n FROM t GROUP BY k;",
             "CREATE VIEW c AS SELECT k, MAX(d) AS m FROM t GROUP BY k;",
             "CREATE VIEW e AS SELECT k, MIN(x) AS lo FROM t GROUP BY k;"]
    two = compile_text("\n".join([TABLE, *views[:2]]), name="shop")
    four = compile_text("\n".join([TABLE, *views]), name="shop")
    owner, old = two.shares[0].owner, two.plans[0].state_fingerprint
    new = four.plans[0].state_fingerprint
    # Nothing served yet, or served from the planned state (a refresh's generation too).
    assert four.settled({}) is four
    assert four.settled({"a": f"{owner}/{new}", "b": f"{owner}/{new}.r2"}) is four
    # Served from the state a and b shared: they keep it; c and e share one of their own.
    served = {"a": f"{owner}/{old}", "b": f"{owner}/{old}"}
    settled = four.settled(served)
    assert [s.views for s in settled.shares] == [("a", "b"), ("c", "e")]
    assert settled.plan("a").state_fingerprint == old and settled.plan("a").shares == owner
    fresh = settled.plan("c").shares
    assert fresh is not None and fresh.startswith(f"{owner}-") and fresh != owner
    # Once c and e serve from theirs, the same grouping, under the same names.
    again = four.settled({**served, "c": f"{fresh}/x", "e": f"{fresh}/x"})
    assert again.shares == settled.shares
    # A refresh started the planned state: everyone takes it.
    assert four.settled(served, [f"{owner}/{new}.r1"]) is four
    # A view served from a state of its own keeps it; alone, it says why.
    apart = four.settled({"a": old})
    assert apart.plan("a").shares is None and apart.plan("a").state_fingerprint == \
        compile_text("\n".join([TABLE, views[0]])).plans[0].state_fingerprint
    assert "keeps the state it is served from rather than rebuild it to share with b, c, e" in \
        dict(apart.alone)["a"]
    assert [s.views for s in apart.shares] == [("b", "c", "e")]


def test_settled_keeps_a_state_for_the_views_left_when_others_leave_the_program():
    """Views served from a shared state keep it when views it was built for leave the
    program: its aggregates (and, over a join, the side tables' columns) stay as they
    were, so its fingerprint is the one served, down to a single view."""
    tables = ("CREATE TABLE a (k BIGINT, g VARCHAR, x DOUBLE);\n"
              "CREATE TABLE b (k BIGINT, v BIGINT, h VARCHAR);")
    views = {"p": "SELECT g, SUM(v) AS s FROM a JOIN b ON a.k = b.k GROUP BY g",
             "q": "SELECT g, COUNT(*) AS n, MAX(x) AS top FROM a JOIN b ON a.k = b.k GROUP BY g",
             "r": "SELECT g, COUNT(DISTINCT h) AS hs FROM a JOIN b ON a.k = b.k GROUP BY g"}

    def program(*names: str) -> CompiledProgram:
        return compile_text(tables + "\n" + "".join(f"CREATE VIEW {n} AS {views[n]};\n"
                                                    for n in names), name="shop")

    full = program("p", "q", "r")
    (share,) = full.shares
    state = f"{share.owner}/{full.plan('p').state_fingerprint}"
    assert share.recorded == tuple(views.items()) and not share.retained
    recorded = {state: share.recorded}
    for names in (("p", "r"), ("q",), ("r",)):
        fewer = program(*names)
        served = dict.fromkeys(names, state)
        settled = fewer.settled(served, [state], recorded)
        (kept,) = settled.shares
        assert (kept.owner, kept.views) == (share.owner, names)
        assert kept.retained == tuple(n for n in views if n not in names)
        assert kept.recorded == share.recorded
        for n in names:
            plan = settled.plan(n)
            assert plan.state_fingerprint == full.plan("p").state_fingerprint
            assert plan.tables == full.plan("p").tables  # side tables with x and h too
            assert plan.answer == full.plan(n).answer  # read from the same columns
        assert "still holds the aggregates of" in explain_program(settled)
        # Not served from it (a new warehouse, or already moved on): planned as written.
        assert fewer.settled({}, [], recorded) is fewer
    # A view left that changed its own aggregates rebuilds anyway: without the removed ones.
    changed = compile_text(tables + "\n" + f"CREATE VIEW q AS {views['q']};\n" +
                           f"CREATE VIEW p AS {views['p'].replace('SUM(v)', 'SUM(v * 2)')};\n",
                           name="shop")
    rebuilt = changed.settled({"p": state, "q": state}, [state], recorded)
    assert [(s.views, s.retained) for s in rebuilt.shares] == [(("q", "p"), ())]
    assert rebuilt.plan("p").state_fingerprint == changed.plan("p").state_fingerprint
    # A refresh started the state planned for the views left: they take it.
    two = program("p", "r")
    planned = f"{two.shares[0].owner}/{two.plan('p').state_fingerprint}.r1"
    assert two.settled({"p": state, "r": state}, [state, planned], recorded) is two
    alone = program("q")
    own = f"q/{alone.plan('q').state_fingerprint}"
    assert alone.settled({"q": state}, [state, own], recorded) is alone
    # A removed view that no longer compiles (its column was dropped): planned as written.
    narrower = compile_text(tables.replace(", h VARCHAR", "") + "\n"
                            f"CREATE VIEW p AS {views['p']};\n", name="shop")
    assert narrower.settled({"p": state}, [state], recorded) is narrower
