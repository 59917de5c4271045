"""Share state between the views of a program (seed 003, §3.2 and §4.2: the HIFUN rewriting rules).

A program's views each fold every batch through their own h and MERGE their own state, so
a program of many views over one stream pays once per view.  Views whose h reads the same
rows the same way differ only in the aggregates they compute: they can keep one state.

This pass finds them: views of one stage (no iteration, recursion or window) whose input
is the same (the same source or join) grouped by the same θ.  That is
CGMRR when they aggregate the same measure with different functions, CGRR when they
aggregate different measures, and a shared join when their input is one join.

Views with different WHEREs share too: a WHERE is a restriction of the measure (seed 003's
HIFUN query ``(g, m/E, op)``), so a view whose WHERE is not the state's reads its aggregates
of the rows its WHERE keeps, ``CASE WHEN where THEN arg END`` (COUNT(*) counts such a CASE
of 1), and only the groups with one such row, by a HAVING on their count
(:func:`_restricted`); a WHERE on the view's GROUP BY keys only is a HAVING on them, over
its groups of the state, and of a WHERE ANDing such conjuncts with others, only the others
restrict the aggregates (:func:`_parted`), so two views whose WHEREs differ only by
conjuncts on their keys read the same aggregates of the state.  The state reads the rows any
of its views reads: every row when one of them has no WHERE, the rows of their one WHERE
when they have the same, else those of the parts of their WHEREs that restrict their
aggregates ORed (:func:`_state_where`).  For each such group it compiles one merged
Aggregate (every distinct aggregate call of the group) through the per-view passes after
``lineage``: its state tables, h, ⊗, ⊗̃ and ⊗̂ are the group's.  Each view keeps its own
answer function a, rewritten to read its aggregates from the merged state
(:func:`~incr.compiler.passes.split_answer.answer_over_state`), so its answer is what it
was, computed from the shared state; HAVING, ORDER BY and LIMIT stay the view's.

With ``-- incr: share = rollup`` a group grouped by some of another group's keys joins it
too (seed 003's BRR; CMORR when two such groupings combine into the state's), and so does
one grouped by functions of them (``month(day)`` beside ``day``: the lineage-key algebra's
general case, each finer group falling in one coarse group): its views read the state
regrouped by their own keys, each monoid element combined by the SQL aggregate that is its ⊗
(:attr:`~incr.algebra.monoids.Monoid.sql_regroup`), each bag by value with its counts summed
(:class:`~incr.compiler.plan.Rollup`); a WHERE of such a view that reads only the state's
keys keeps the state's rows it holds before they are regrouped, adding nothing to the state,
as do such conjuncts of one that reads more (:func:`_parted`).  Only a grouping some view
keeps is a state: one made up to combine groupings no view asks for could hold far more rows
than any of them.  A regrouped answer follows by change from the rows of the coarse groups a
batch touched, but those rows are spread over the state's buckets (every bucket is scanned
for them), and a batch touching most groups rewrites it from the whole state; so this is a
choice, not the default.

Exactness is unchanged: the merged state holds every monoid element and bag each view
needs (monoid inference lays them out as for one view computing all the aggregates), and
deletions take them back exactly as they would in the view's own state.

The shared state lives under a name of its own (:attr:`Share.owner`), derived from the
group's input and θ, not from its views, so adding a view to a group or removing one
keeps the name (the state's fingerprint changes with the aggregates it holds).

A view removed from a program does not make the views it shared with rebuild: the state
records the views it was built for (:attr:`Share.recorded`), and while the others are
served from it they keep it, the removed view's aggregates included (*retained*: still
folded, read by no answer), until a refresh of one of them regroups them into a state of
their own aggregates only (``settled`` in :mod:`incr.compiler`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from sqlglot import exp

from incr.compiler.compilation import Compilation, build_stage
from incr.compiler.ir import (
    AggCall,
    Aggregate,
    Filter,
    JoinInput,
    Named,
    NamedAgg,
    Project,
    Rel,
    Source,
)
from incr.compiler.passes.derive_merge import derive_merge
from incr.compiler.passes.infer_monoids import infer_monoids
from incr.compiler.passes.split_answer import answer_over_state, split_answer
from incr.compiler.plan import IncrementalPlan, Regrouped, Rollup, StagePlan, StateTable
from incr.compiler.program import Program, ViewDecl
from incr.compiler.scalar import Scalar
from incr.errors import IncrError

#: The per-view passes the merged Aggregate goes through (those after ``lineage``: θ and
#: the input are the group's, as each member's lineage pass found them).
MERGED_PASSES = (infer_monoids, split_answer, derive_merge)

#: The seed's rewriting rules this pass applies, and what each shares.
RULES = {"CGMRR": "one measure, several aggregate functions", "CGRR": "several measures",
         "BRR": "a coarser grouping answered from a finer one's state",
         "CMORR": "one state on the combined grouping, each view a projection of it"}

#: The first characters of a shared state's name (a view's state goes by the view's name).
SHARED = "_shared_"

#: Why a view shares nothing, when sharing is off.
OFF = "sharing is off (-- incr: share = off)"

#: The label (:func:`share`) of a view that serves no answer yet.
NEW = "+new"


@dataclass(frozen=True)
class Share:
    """One state kept for several views.

    ``owner`` names the state's directory and lock; ``rule`` is the seed's name for the
    sharing (CGMRR: one measure, several aggregate functions; CGRR: several measures),
    with ``join`` True when the shared input is a join.
    """

    owner: str
    views: tuple[str, ...]
    source: str
    grouping: tuple[str, ...]
    rule: str
    join: bool
    #: Views no longer in the program whose aggregates the state still holds (they were
    #: among the views it was built for, and its views are served from it).
    retained: tuple[str, ...] = ()
    #: Every view whose aggregates the state holds, ``(name, SELECT)``, in the order their
    #: aggregates were merged: the runtime records it beside the state it creates, so a
    #: later program without some of them can keep the state (:data:`Retained`).
    recorded: tuple[tuple[str, str], ...] = ()
    #: The views answered from the state regrouped by fewer keys (``share = rollup``), each
    #: with its GROUP BY: BRR, and CMORR when their groupings combine into the state's.
    rolled: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: The views that read the state with a WHERE of their own, each with it: the state
    #: reads more rows than they do (:func:`_restricted`).
    restricted: tuple[tuple[str, str], ...] = ()
    #: The WHERE of the rows the state reads (None: every row of its input).
    where: str | None = None
    #: Those of :attr:`restricted` whose WHERE reads only their GROUP BY keys: they read
    #: their groups of the state, adding nothing to it (see :attr:`parted`).
    keyed: tuple[str, ...] = ()
    #: Those of :attr:`restricted`, answered regrouped, whose WHERE reads only the state's
    #: GROUP BY keys: they regroup the state's rows it keeps, adding nothing to it.
    sifted: tuple[str, ...] = ()
    #: Those of :attr:`keyed` and :attr:`sifted` whose WHERE does so only in part (some of
    #: its conjuncts), each with the other conjuncts, which restrict its aggregates (unless
    #: they are :attr:`where`: the state reads only their rows).
    parted: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """One line for ``incr explain``."""
        by = ", ".join(self.grouping) or "() (one global group)"
        what = "one join" if self.join else self.source
        how = RULES[self.rule]
        views = ", ".join(self.views)
        rows = ("one WHERE" if not self.restricted else
                "every row" if self.where is None else f"the rows of WHERE {self.where}")
        line = (f"{views} {'share' if len(self.views) > 1 else 'keeps'} state {self.owner}: "
                f"{self.rule} ({how}) over {what}, {rows}, GROUP BY {by}")
        groups = ", and only the groups with such a row" if self.grouping else ""
        plain = set(self.keyed) | set(self.sifted)
        parted = dict(self.parted)
        line += self._readers(lambda v: v not in plain, lambda whose: (
            f"it restricted to the rows of {whose} WHERE (CASE WHEN in each aggregate{groups})"))
        line += self._readers(lambda v: v in self.keyed and v not in parted, lambda whose: (
            f"only {whose} groups of it (a WHERE on the GROUP BY keys, answered as a HAVING: "
            f"nothing added to the state)"))
        line += self._readers(lambda v: v in self.sifted and v not in parted, lambda whose: (
            f"only the rows of it {whose} WHERE keeps, regrouped (a WHERE on the state's "
            f"GROUP BY keys: nothing added to the state)"))
        wheres = dict(self.restricted)
        for view, rest in self.parted:
            kept = ("only its groups of it the rest of its WHERE keeps (conjuncts on the GROUP BY "
                    "keys, answered as a HAVING)" if view in self.keyed else
                    "only the rows of it the rest of its WHERE keeps, regrouped (conjuncts on the "
                    "state's GROUP BY keys)")
            reads = (f"reads its aggregates unrestricted (its other conjuncts, {rest}, are the "
                     f"state's WHERE)" if rest == self.where else
                     f"reads it restricted to the rows of {rest} (CASE WHEN in each aggregate{groups})")
            line += f"; {view} (WHERE {wheres[view]}) {reads} and {kept}"
        if self.rolled:
            each = ", ".join(f"{v} (GROUP BY {', '.join(keys)})" for v, keys in self.rolled)
            verb = "is" if len(self.rolled) == 1 else "are"
            line += f"; {each} {verb} answered from it regrouped: BRR ({RULES['BRR']})"
            if _combined(tuple(keys for _, keys in self.rolled)):
                line += f", and CMORR ({RULES['CMORR']})"
        if self.retained:
            line += (f"; it still holds the aggregates of {', '.join(self.retained)}, no longer "
                     f"in the program, so {views} need no rebuild (a refresh of "
                     f"{'any of them' if len(self.views) > 1 else views} drops them)")
        return line

    def _readers(self, which: Callable[[str], bool], how: Callable[[str], str]) -> str:
        """The clause of :meth:`describe` on the views restricted to their own WHERE.

        ``which`` of them (by name); ``how`` they read the state, given "its" or "their".
        Empty when there are none.
        """
        chosen = [(v, w) for v, w in self.restricted if which(v)]
        if not chosen:
            return ""
        verb, whose = ("reads", "its") if len(chosen) == 1 else ("read", "their")
        return f"; {', '.join(f'{v} (WHERE {w})' for v, w in chosen)} {verb} {how(whose)}"


#: Per state name (a label, :func:`share`), the views its state was built for, in merge
#: order: ``(name, None)`` for a view of the program, ``(name, its compilation after
#: lineage)`` for one the program no longer has, whose aggregates the state keeps.
Retained = Mapping[str, tuple[tuple[str, "Compilation | None"], ...]]


@dataclass(frozen=True)
class Sharing:
    """The share pass's result.

    The plans (sharing views read their group's state), the groups, and for each view
    that shares nothing, why.
    """

    plans: tuple[IncrementalPlan, ...]
    shares: tuple[Share, ...] = ()
    alone: tuple[tuple[str, str], ...] = ()


def share(program: Program, plans: tuple[IncrementalPlan, ...],
          start: dict[str, Compilation], labels: Mapping[str, str] | None = None,
          retained: Retained | None = None) -> Sharing:
    """Plans one state per group of views that can share it.

    ``start`` holds, per view that may share, its compilation after the ``lineage`` pass
    (the views not in it share nothing: the caller says why in ``alone``).  ``labels``
    (from :meth:`~incr.compiler.CompiledProgram.settled`) keeps apart views the warehouse
    serves from different states: only views of one label share, under the state named
    by the label when it is this group's (:func:`served_owner`); views labelled :data:`NEW`
    share a state of their own; a view labelled with its own name keeps its own state.
    ``retained``: per label, the views its state was built for; the aggregates of those no
    longer in the program are merged in too, in the recorded order, so the views keep the
    state as it is (one view alone included).
    """
    if not program.options.share:
        return Sharing(plans, (), tuple((p.view, OFF) for p in plans))
    labels = labels or {}
    retained = retained or {}
    groups: dict[tuple[object, str], list[str]] = {}
    for view, c in start.items():
        groups.setdefault((_signature(c), labels.get(view, "")), []).append(view)
    kin = {v: [w for (sig, _), vs in groups.items() if sig == key[0] for w in vs]
           for key, views in groups.items() for v in views}
    into = _rollups(groups, start) if program.options.rollup else {}
    for label, recorded_views in retained.items():
        # The views of a state kept as it is stay together, whatever grouping its removed
        # views gave it (their groupings may each be a coarser one of it).
        kept = [k for k in groups if k[1] == label and k not in into]
        if any(c is not None for _, c in recorded_views):
            into.update(dict.fromkeys(kept[1:], kept[0]))
    rolled: dict[tuple[object, str], list[str]] = {}
    for from_key in into:
        to_key = into[from_key]
        while to_key in into:
            to_key = into[to_key]
        rolled.setdefault(to_key, []).extend(groups[from_key])
    for from_key in into:
        del groups[from_key]
    by_view = {p.view: p for p in plans}
    shares: list[Share] = []
    alone: list[tuple[str, str]] = []
    for (sig, label), views in groups.items():
        recorded = _recorded(retained.get(label, ()), start[views[0]])
        coarse = rolled.get((sig, label), [])
        if len(views) + len(coarse) < 2 and not any(c is not None for _, c in recorded):
            alone.append((views[0], _why_alone(program, start, groups, kin, views[0], label)))
            continue
        members = views + coarse
        try:
            group, planned = _merge(program, [start[v] for v in members],
                                    [by_view[v] for v in members], label, recorded)
        except IncrError as e:  # each view compiled alone: it keeps its own state, as it can
            alone += [(v, f"the state of {', '.join(members)} cannot be merged ({e})")
                      for v in members]
            continue
        shares.append(group)
        by_view.update(planned)
    return Sharing(tuple(by_view[p.view] for p in plans), tuple(shares), tuple(alone))


def _why_alone(program: Program, start: dict[str, Compilation],
               groups: dict[tuple[object, str], list[str]], kin: dict[str, list[str]],
               view: str, label: str) -> str:
    """Why ``view`` keeps a state of its own, for ``incr explain``."""
    c = start[view]
    others = [w for w in kin[view] if w != view]
    if others:
        return (f"it keeps the state it is served from rather than rebuild it to share "
                f"with {', '.join(others)} (a refresh of the views regroups them)"
                if label != NEW else
                f"it is new beside {', '.join(others)}, which keep the state they are "
                f"served from")
    finer = [vs[0] for (_, lab), vs in groups.items()
             if vs[0] != view and lab == label and _refines(start[vs[0]], c)]
    if program.options.rollup and label:  # grouped apart by what the warehouse serves
        apart = [vs[0] for (_, lab), vs in groups.items() if lab != label and (
            _refines(start[vs[0]], c) or _refines(c, start[vs[0]]))]
        if apart:
            keep = "keeps the state it is" if len(apart) == 1 else "keep the state they are"
            return (f"it is new beside {', '.join(apart)}, which {keep} served from (a "
                    f"refresh of the views regroups them)" if label == NEW else
                    f"it keeps the state it is served from rather than rebuild it to share "
                    f"with {', '.join(apart)} (a refresh of the views regroups them)")
    if not c.lineage and program.options.rollup and any(
            _input(start[vs[0]]) == _input(c) for vs in groups.values() if vs[0] != view):
        return ("a global aggregate keeps its one-row state rather than read a grouped "
                "state whole after every batch")
    if finer and not program.options.rollup:
        has = ("has every key of its GROUP BY" if set(_theta(c)) < set(_theta(start[finer[0]]))
               else "groups by what its GROUP BY is computed from")
        return (f"no other view reads {c.source.name} with the same GROUP BY; "
                f"{finer[0]}'s state {has} (BRR: -- incr: share = rollup answers it from "
                f"there, rewriting its answer each batch)")
    if finer:
        return (f"no other view reads {c.source.name} with the same GROUP BY, and "
                f"its aggregates cannot be regrouped from {finer[0]}'s state (variance kept "
                f"as moments, or a view served from a state of its own)")
    return f"no other view reads {c.source.name} with the same GROUP BY"


def _input(c: Compilation) -> object:
    """The part of :func:`_signature` that is not the grouping: the input before its WHERE."""
    return _signature(c)[:3]


def _theta(c: Compilation) -> dict[str, str]:
    """θ's columns by the expression each groups by."""
    return {k.expr.sql: k.name for k in c.lineage or ()}


def _refines(fine: Compilation, coarse: Compilation) -> bool:
    """Whether ``fine`` groups the same input more finely than ``coarse``.

    That is, by every key of ``coarse`` and more, or by keys every key of ``coarse`` is a
    function of (seed 003's lineage-key algebra: a group of ``fine`` then falls in one
    group of ``coarse``) that are not all functions of ``coarse``'s keys in turn.

    ``coarse`` must have keys: a global aggregate keeps its one row rather than read the
    whole of a finer state after every batch.
    """
    small, big = _theta(coarse), _theta(fine)
    if not small or _input(fine) != _input(coarse) or set(small) == set(big):
        return False
    if set(small) < set(big):
        return True
    return (all(_over_state(Scalar(e), big) is not None for e in small)
            and not all(_over_state(Scalar(e), small) is not None for e in big))


def _over_state(expr: Scalar, theta: Mapping[str, str]) -> Scalar | None:
    """``expr``, a grouping key, as an expression over a state's θ columns (None: it can't be).

    ``theta`` holds θ's columns by the expression each groups by: each part of ``expr``
    that is one of those expressions is read from its column.  None when ``expr`` reads a
    column θ does not determine.

    Every function of a program is deterministic (``refuse_unsupported``), so rows with
    the same θ give the key the same value.
    """
    replaced: list[exp.Expr] = []

    def swap(node: exp.Expr) -> exp.Expr:
        column = theta.get(Scalar.of(node).sql)
        if column is None:
            return node
        replaced.append(Scalar.column(column).tree())
        return replaced[-1]

    tree = expr.tree().transform(swap, copy=False)
    if any(all(c is not r for r in replaced) for c in tree.find_all(exp.Column)):
        return None
    return Scalar.of(tree)


def _regroupable(c: Compilation) -> bool:
    """Whether every state value ``c``'s aggregates keep combines by one SQL aggregate."""
    inferred = infer_monoids(c)
    return all(v.monoid.sql_regroup is not None
               for a in inferred.aggregates or () for v in a.values)


def _rollups(groups: dict[tuple[object, str], list[str]], start: dict[str, Compilation]
             ) -> dict[tuple[object, str], tuple[object, str]]:
    """Which groups are answered from another's state (BRR and CMORR), and from whose.

    A group joins a group of the same input (WHEREs aside) and label grouped more finely
    (:func:`_refines`: by all its keys and more, or by what its keys are computed from), one
    no other group refines (so views regroup from one state however their
    groupings nest), and of those the one with the fewest keys (the fewest state rows per
    group of its own).  Its views' aggregates must combine by one SQL aggregate each.
    """
    first = {key: start[views[0]] for key, views in groups.items()}
    top = [k for k in groups if not any(
        o != k and o[1] == k[1] and _refines(first[o], first[k]) for o in groups)]
    into: dict[tuple[object, str], tuple[object, str]] = {}
    for key, views in groups.items():
        if key in top or not all(_regroupable(start[v]) for v in views):
            continue
        finer = [t for t in top if t[1] == key[1] and _refines(first[t], first[key])]
        if finer:
            into[key] = min(finer, key=lambda t: len(_theta(first[t])))
    return into


def _combined(groupings: tuple[tuple[str, ...], ...]) -> bool:
    """Whether two of ``groupings`` are not one within the other (CMORR rather than BRR)."""
    sets = [set(g) for g in groupings]
    return any(not (a <= b or b <= a) for i, a in enumerate(sets) for b in sets[i + 1:])


def _recorded(recorded: tuple[tuple[str, Compilation | None], ...],
              first: Compilation) -> tuple[tuple[str, Compilation | None], ...]:
    """The views a state was built for, if it can be kept as it is.

    It can when the removed ones among them (those with a compilation) read the group's
    input as its views do (``first`` is one of them), grouped alike, or one grouping within
    the other (views it answered regrouped, or the view whose grouping it kept); else none.
    """
    signature = _signature(first)
    if any(c is not None and _signature(c) != signature and not _refines(first, c)
           and not _refines(c, first) for _, c in recorded):
        return ()
    return recorded


def served_owner(served: str, view: str) -> str:
    """The name of the state an answer's ``incr.state`` names.

    It is ``owner/generation`` for a shared state, a generation of ``view``'s own otherwise.
    """
    return served.split("/", 1)[0] if "/" in served else view


def why_alone(plan: IncrementalPlan, view: ViewDecl) -> str | None:
    """Why ``plan`` cannot share its state whatever the other views are (None: it may)."""
    if plan.iteration is not None or view.iterate is not None:
        return "an iterative view keeps its own state (its iterate moves it)"
    if plan.recursion is not None:
        return "a recursive view keeps its own state (the fixpoint beside it)"
    if any(s.answer.rows is not None for s in plan.stages):
        return "a window query keeps the rows of its partitions in its own state"
    if len(plan.stages) > 1:
        return "a view of several stages (a subquery, CTE or grouping set) keeps its own state"
    top = plan.top
    if top.kept is not None:
        return "a stage that hands rows on keeps them in its own state"
    return None


def _signature(c: Compilation, where: bool = False) -> tuple[object, ...]:
    """What views must have in common to share a state.

    The input (branches), the rows the Aggregate reads before its WHERE (views with
    different WHEREs share: :func:`_restricted`) and θ, with its names.  ``where``: with
    the WHERE, as a state's name is made of (:func:`_owner`).  Over an inner join, views
    may read different columns of its inputs: the shared state reads them all
    (:func:`_widened`).
    """
    agg = _aggregate(c)
    branches, child = c.branches, agg.child if where else _unfiltered(agg.child)
    if _widens(c):
        branches = tuple(replace(b, join=replace(b.join, inputs=tuple(
            replace(i, columns=()) for i in b.join.inputs))) for b in branches)
        child = _read(child, ())
    return (c.source.name.lower(), branches, child, agg.keys, c.lineage, c.key_columns)


def _widens(c: Compilation) -> bool:
    """Whether views over ``c``'s input may read different columns of it and still share.

    They may over an inner join of sources: its side tables then keep the columns every
    view reads.
    """
    return not c.direct and all(
        b.project is None and not b.padded and not b.join.anti
        and not any(i.derived for i in b.join.inputs) for b in c.branches)


def _read(rel: Rel, columns: tuple[str, ...]) -> Rel:
    """``rel`` (a chain of one-input operators down to its Source) reading ``columns``."""
    if isinstance(rel, Source):
        return replace(rel, columns=columns)
    children = rel.children()
    return rel.with_child(_read(children[0], columns)) if len(children) == 1 else rel


def _widened(program: Program, members: list[Compilation]) -> Compilation:
    """The first member, reading every column of the join any member reads.

    The columns keep the order translation gives them: inputs in join order, each
    input's columns in its table's declared order.
    """
    first = members[0]
    if len(members) < 2 or not _widens(first):
        return first
    read: dict[str, set[str]] = {}
    for c in members:
        for b in c.branches:
            for i in b.join.inputs:
                read.setdefault(i.alias, set()).update(i.columns)

    def columns(i: JoinInput) -> tuple[str, ...]:
        declared = [col.name for col in program.declared(i.table).columns]
        return tuple(sorted(read[i.alias], key=declared.index))

    branches = tuple(replace(b, join=replace(b.join, inputs=tuple(
        replace(i, columns=columns(i)) for i in b.join.inputs))) for b in first.branches)
    flat = [f for i in branches[0].join.inputs for f in i.flat_columns]
    typed = {col.name: col for c in members for col in c.source.columns}
    source = replace(first.source, columns=tuple(typed[f] for f in flat))
    agg = _aggregate(first)
    rel = _replace_node(first.rel, agg, replace(agg, child=_read(agg.child, tuple(flat))))
    return replace(first, branches=branches, source=source, rel=rel)


def _replace_node(rel: Rel, old: Rel, new: Rel) -> Rel:
    """``rel`` with its node ``old`` (on its chain of one-input operators) replaced by ``new``."""
    if rel is old:
        return new
    return rel.with_child(_replace_node(rel.children()[0], old, new))


def _aggregate(c: Compilation) -> Aggregate:
    return next(node for node in c.rel.walk() if isinstance(node, Aggregate))


def _unfiltered(rel: Rel) -> Rel:
    """The rows under an Aggregate before its WHERE."""
    return rel.child if isinstance(rel, Filter) else rel


def _where(c: Compilation) -> Scalar | None:
    """The WHERE under ``c``'s Aggregate (None: it reads every row of its input)."""
    child = _aggregate(c).child
    return child.predicate if isinstance(child, Filter) else None


def _state_where(wheres: list[tuple[Scalar | None, Scalar | None]]) -> Scalar | None:
    """The WHERE of the rows a state reads (None: every row).

    ``wheres``: for each of its views, its WHERE and the part of it that restricts its
    aggregates (:func:`_parts`).  None when one of them has none; their one WHERE when they
    have the same (its text whole, so such a state keeps its name and fingerprint); else the
    parts ORed, in the order of their text, so the state's name does not depend on the order
    of the views.  A WHERE's conjuncts on the state's keys keep every row of a group or none,
    so they are left out of the OR: the state keeps every group's rows of the other
    conjuncts, and a view added with other such conjuncts finds its rows there (a view added
    with ``k = 'east' AND amount > 500`` beside ``k = 'west' AND amount > 500`` reads the
    state as it is, where ORing the whole WHEREs would change it).  A WHERE all on the keys
    stays in the OR whole: the groups it keeps are all it reads.
    """
    if any(whole is None for whole, _ in wheres):
        return None
    distinct = sorted({w for w, _ in wheres if w is not None})
    if len(distinct) > 1:
        distinct = sorted({part or whole for whole, part in wheres if whole is not None})
    if len(distinct) == 1:
        return distinct[0]
    return Scalar.of(exp.or_(*(w.tree() for w in distinct)))


def _reading(c: Compilation, where: Scalar | None) -> Compilation:
    """``c`` with its Aggregate reading the rows of its input ``where`` keeps (None: all)."""
    agg = _aggregate(c)
    base = _unfiltered(agg.child)
    child = base if where is None else Filter(base, where)
    return replace(c, rel=_replace_node(c.rel, agg, replace(agg, child=child)))


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The conjuncts of a WHERE, ANDs nested in parentheses flattened too."""
    node = node.unnest()
    if isinstance(node, exp.And):
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


def _on_keys(c: Compilation) -> Scalar | None:
    """``c``'s WHERE over its GROUP BY keys (their names in the IR), if it reads nothing else.

    None when it does, when it has none, and for a global aggregate, whose one row is
    answered whatever its WHERE keeps.
    """
    agg, where = _aggregate(c), _where(c)
    if where is None or not agg.keys:
        return None
    return _over_state(where, {k.expr.sql: k.name for k in agg.keys})


def _parted(c: Compilation, theta: Mapping[str, str]) -> tuple[Scalar | None, Scalar | None]:
    """``c``'s WHERE, answered from a state keyed by ``theta``: what it keeps of the state.

    That is ``(over the state, over the input)``, None for no such part.  The first part is
    the conjuncts that read only what the state's keys are, over its columns: for a view of
    the state's own grouping, its GROUP BY keys (a HAVING on its groups of the state,
    :func:`_restricted`); for a view regrouped from a finer state, θ's columns (each finer
    group kept whole or not at all before it is regrouped,
    :attr:`~incr.compiler.plan.Rollup.where`).  Either keeps every row of a group of the
    state or none, so it adds nothing to the state.  The rest restricts the view's aggregates
    (CASE WHEN), which adds to the state.

    A WHERE all of one part keeps its text whole, as before WHEREs were split (so do the
    fingerprints of the states and answers built then).  A global aggregate answers its
    one row whatever its WHERE keeps: all of its WHERE is the rest.  ``theta`` holds θ's
    columns by expression (:func:`_theta`).
    """
    where = _where(c)
    if where is None:
        return None, None
    agg = _aggregate(c)
    if set(_theta(c)) != set(theta):
        names: Mapping[str, str] = theta
    elif agg.keys:
        names = {k.expr.sql: k.name for k in agg.keys}
    else:
        return None, where
    whole = _over_state(where, names)
    if whole is not None:
        return whole, None
    kept: list[exp.Expr] = []
    rest: list[exp.Expr] = []
    for part in _conjuncts(where.tree()):
        over = _over_state(Scalar.of(part), names)
        if over is None:
            rest.append(part)
        else:
            kept.append(over.tree())
    if not kept:
        return None, where
    return Scalar.of(exp.and_(*kept)), Scalar.of(exp.and_(*rest))


def _parts(c: Compilation, theta: Mapping[str, str]) -> tuple[Scalar | None, Scalar | None]:
    """``c``'s WHERE read from a state keyed by ``theta``: ``(over the state's keys, the rest)``.

    All of it is a HAVING on the view's own GROUP BY keys when it reads only them
    (:func:`_on_keys`); else it is split as :func:`_parted` splits it.
    """
    whole = _on_keys(c)
    return (whole, None) if whole is not None else _parted(c, theta)


def _restricted(c: Compilation, keys: Scalar | None = None) -> Compilation:
    """``c`` over its input without its WHERE, each aggregate restricted to its WHERE's rows.

    That is seed 003's measure restricted, ``m/E``.

    An aggregate's argument becomes ``CASE WHEN where THEN arg END``, NULL on the other
    rows, and every aggregate (:data:`~incr.compiler.ir.AGGREGATES`) skips NULLs; COUNT(*)
    counts such a CASE of 1.  A grouped view answers only the groups with a row its WHERE
    keeps: the count of those rows is one more aggregate, and a HAVING that it is above
    0, ANDed with the view's own.  A global aggregate answers its one row however many
    rows its WHERE keeps, as it did.

    ``keys``: the conjuncts of the view's WHERE that read only its GROUP BY keys, over
    them (:func:`_parted`; ``c`` then reads the rows of the other conjuncts, or all).
    They keep every row of a group or none: a HAVING on the keys, before the count's, over
    its groups of the state, which adds nothing to the state.  With neither (a view whose
    WHERE keeps finer groups it regroups, :attr:`~incr.compiler.plan.Rollup.where`), ``c``
    is returned as it is.
    """
    where = _where(c)
    agg = _aggregate(c)
    having = keys
    if where is None:  # every row of a group is kept, or none: its groups of the state
        restricted = agg
    else:
        def kept(arg: exp.Expr) -> Scalar:
            return Scalar.of(exp.Case().when(where.tree(), arg))

        one = exp.Literal.number(1)
        aggs = tuple(NamedAgg(a.name, AggCall("count", kept(one)) if a.call.arg is None
                              else AggCall(a.call.func, kept(a.call.arg.tree())))
                     for a in agg.aggs)
        if agg.keys:
            taken = {a.name for a in agg.aggs}
            rows = next(f"_a{i}" for i in range(len(taken) + 1) if f"_a{i}" not in taken)
            aggs += (NamedAgg(rows, AggCall("count", kept(one))),)
            some = Scalar(f"{rows} > 0")
            having = some if keys is None else Scalar.of(exp.and_(keys.tree(), some.tree()))
        restricted = replace(agg, child=_unfiltered(agg.child), aggs=aggs)

    def above(rel: Rel) -> Rel:
        if rel is agg:
            return restricted if having is None else Filter(restricted, having)
        child = rel.children()[0]
        if child is agg and having is not None and isinstance(rel, Filter):  # a HAVING
            return Filter(restricted, Scalar.of(exp.and_(having.tree(), rel.predicate.tree())))
        return rel.with_child(above(child))

    return replace(c, rel=above(c.rel))


def _merge(program: Program, members: list[Compilation], plans: list[IncrementalPlan],
           label: str = "", recorded: tuple[tuple[str, Compilation | None], ...] = ()
           ) -> tuple[Share, dict[str, IncrementalPlan]]:
    """The group's state, compiled once, and each member's plan reading it.

    The state is named by the group's input and θ; by ``label`` when it is such a name
    (views served from it keep it); by both and the views' names for a group of views
    new beside others (:data:`NEW`).  ``recorded``: the views the state was built for,
    in the order their aggregates were merged (:data:`Retained`); those not among the
    members (with a compilation) are merged in too, so the state is the one they built.
    """
    by_name = {p.view: c for p, c in zip(plans, members)}
    merging = [(n, c if c is not None else by_name[n]) for n, c in recorded
               if c is not None or n in by_name]
    merging += [(p.view, c) for p, c in zip(plans, members) if p.view not in dict(merging)]
    # The finest grouping first: the state is keyed by it (a stable sort: views grouped
    # alike keep their order, and so the state its layout).  Fewer keys may be finer when
    # they are what the others' keys are computed from (day beside year(day), month(day)).
    finest = next((set(_theta(c)) for _, c in merging if all(
        set(_theta(o)) == set(_theta(c)) or _refines(c, o) for _, o in merging)), None)
    merging.sort(key=lambda m: (set(_theta(m[1])) != finest, -len(_theta(m[1]))))
    theta = _theta(merging[0][1])
    parts = {n: _parts(c, theta) for n, c in merging}
    where = _state_where([(_where(c), parts[n][1]) for n, c in merging])
    restricted = tuple((p.view, str(w)) for p, c in zip(plans, members)
                       for w in [_where(c)] if w != where and w is not None)
    # Of the views restricted to their WHERE, those read by their groups of the state
    # (keyed: a HAVING on their keys) or by its rows their WHERE keeps before they are
    # regrouped (sifted), whole or in part; the rest of each WHERE restricts the
    # aggregates, unless it is the state's WHERE.
    keyed: dict[str, Scalar] = {}
    sifted: dict[str, Scalar] = {}
    rests: dict[str, Scalar | None] = {}
    for n, c in merging:
        if _where(c) == where:
            continue
        kept, rest = parts[n]
        rests[n] = None if rest == where else rest
        if kept is not None:
            regrouped = _on_keys(c) is None and set(_theta(c)) != set(theta)
            (sifted if regrouped else keyed)[n] = kept
    merging = [(n, _restricted(_reading(c, rests[n]), keyed.get(n)) if n in rests else c)
               for n, c in merging]
    by_merged = dict(merging)
    members = [by_merged[p.view] for p in plans]
    first = _reading(_widened(program, [c for _, c in merging]), where)
    agg = _aggregate(first)
    calls: list[AggCall] = []
    renamed_by: dict[str, dict[str, str]] = {}  # per view: its aggregate's IR name -> the merged one
    for view, c in merging:
        renamed = {}
        for named in _aggregate(c).aggs:
            if named.call not in calls:
                calls.append(named.call)
            renamed[named.name] = f"_s{calls.index(named.call)}"
        renamed_by[view] = renamed
    names = [renamed_by[p.view] for p in plans]
    merged_aggs = tuple(NamedAgg(f"_s{i}", call) for i, call in enumerate(calls))
    out = tuple(Named(k.name, Scalar.column(k.name)) for k in agg.keys) + tuple(
        Named(a.name, Scalar.column(a.name)) for a in merged_aggs)
    merged = replace(first, rel=Project(replace(agg, aggs=merged_aggs), out))
    for p in MERGED_PASSES:
        merged = p(merged)
    assert merged.aggregates is not None and merged.answer is not None
    stage = build_stage(merged)
    states = {a.name: a for a in merged.aggregates}
    owner = _owner(first)
    if label and label != owner and not label.startswith(f"{owner}-"):
        # New beside views that keep their state, or served from a state of another input.
        salt = ",".join(sorted(p.view.lower() for p in plans))
        owner = f"{owner}-{hashlib.sha256(salt.encode()).hexdigest()[:6]}"
    elif label:
        owner = label
    planned: dict[str, IncrementalPlan] = {}
    assert _theta(first) == theta, "the state is keyed by the finest grouping's θ"
    grouping = tuple(str(k.expr) for k in first.lineage or ())
    rolled: list[tuple[str, tuple[str, ...]]] = []
    for c, plan, renamed in zip(members, plans, names):
        aggregates = tuple(replace(states[renamed[a.name]], name=a.name)
                           for a in _aggregate(c).aggs)
        finals = " ".join(a.finalize.sql for a in aggregates)
        bags = tuple(b for b in merged.answer.bags
                     if re.search(rf"\b{re.escape(b.alias)}\.", finals))
        answer = answer_over_state(c, c.rel, aggregates, bags, merged.answer.main, None)
        if set(_theta(c)) != set(theta):  # a coarser grouping: BRR/CMORR
            read = {answer.main, *(b.table for b in bags)}
            keys = _theta(c)
            derived = {expr: _over_state(Scalar(expr), theta) for expr in keys if expr not in theta}
            answer = replace(answer, rollup=Rollup(
                keys=tuple((theta[expr], name) for expr, name in keys.items() if expr in theta),
                tables=tuple(_regrouped(t) for t in merged.tables or () if t.name in read),
                of=grouping,
                derived=tuple((d, keys[expr]) for expr, d in derived.items() if d is not None),
                where=sifted.get(plan.view)))
            rolled.append((plan.view, tuple(str(k.expr) for k in c.lineage or ())))
        own: StagePlan = replace(stage, answer=answer, logical=c.rel,
                                 output=tuple(e.name for e in answer.exprs))
        planned[plan.view] = replace(plan, stages=(own,), shares=owner)
    measures = {call.arg for call in calls if call.arg is not None}  # COUNT(*) reads none
    rule = "CGMRR" if len(measures) <= 1 else "CGRR"
    selects = {v.name: v.select for v in program.views}
    selects.update({n: c.view.select for n, c in recorded if c is not None})
    return Share(owner=owner, views=tuple(p.view for p in plans), source=first.source.name,
                 grouping=grouping, rule=rule, join=not first.direct,
                 retained=tuple(n for n, c in recorded if c is not None),
                 recorded=tuple((n, selects[n]) for n, _ in merging),
                 rolled=tuple(rolled), restricted=restricted,
                 where=None if where is None else str(where),
                 keyed=tuple(p.view for p in plans if p.view in keyed),
                 sifted=tuple(p.view for p in plans if p.view in sifted),
                 parted=tuple((v, str(parts[v][1])) for v in (p.view for p in plans)
                              if (v in keyed or v in sifted) and parts[v][1] is not None)
                 ), planned


def _regrouped(table: StateTable) -> Regrouped:
    """How a coarser grouping reads ``table``.

    By its keys beside θ, each value combined by its monoid's SQL aggregate; the values no
    aggregate combines (another view's moments, say) are left out: that view is not the
    one regrouped.
    """
    by = (table.value_key.name,) if table.value_key is not None else ()
    combined = tuple((col, v.monoid.sql_regroup) for v in table.values
                     if v.monoid.sql_regroup is not None for col in v.columns)
    return Regrouped(table.name, by, combined)


def owner_prefix(program: str) -> str:
    """What the names of a program's shared states begin with (:func:`is_owned_by`)."""
    return f"{SHARED}{program}."


def is_owned_by(name: str, program: str) -> bool:
    """Whether ``name`` is a shared state's name of ``program``.

    Programs may share a warehouse, and one program's name may begin another's.
    """
    return name.startswith(SHARED) and name.rsplit(".", 2)[0] == SHARED + program


def _owner(c: Compilation) -> str:
    """The shared state's name, the same whichever views share it.

    It is ``_shared_<program>.<source>.<hash of the input and θ>``.
    """
    text = repr(_signature(c, where=True))
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{owner_prefix(c.program.name)}{c.source.name.lower()}.{digest}"
