"""The compiler: program file -> one :class:`~incr.compiler.plan.IncrementalPlan` per view.

Pure Python (sqlglot for parsing); it never imports Spark or Delta, so ``incr explain`` and
DAG parsing stay fast and any machine can check a program.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from incr.compiler import iterate, recursion
from incr.compiler.compilation import Compilation, build_stage
from incr.compiler.passes import run_passes
from incr.compiler.passes.share import NEW, Retained, Share, served_owner, share, why_alone
from incr.compiler.plan import IncrementalPlan
from incr.compiler.program import Program, ViewDecl, load_program, parse_program
from incr.compiler.translate import StageTranslation, translate
from incr.errors import IncrError, Location, NotIncrementalizableError


@dataclass(frozen=True)
class CompiledProgram:
    """A program and the plan of each of its views, in declaration order."""

    program: Program
    plans: tuple[IncrementalPlan, ...]
    shares: tuple[Share, ...] = ()  # the states several views keep as one (the share pass)
    alone: tuple[tuple[str, str], ...] = ()  # (view, why it shares no state)
    #: What the share pass started from, so :meth:`settled` can run it again: each view's
    #: plan before sharing, the views that may share (after ``lineage``), and why the
    #: others may not.
    unshared: tuple[tuple[IncrementalPlan, ...], tuple[tuple[str, Compilation], ...],
                    tuple[tuple[str, str], ...]] = field(default=((), (), ()), compare=False,
                                                         repr=False)

    @property
    def name(self) -> str:
        """The program's name."""
        return self.program.name

    def plan(self, view: str) -> IncrementalPlan:
        """The plan of ``view`` (case-insensitive)."""
        for p in self.plans:
            if p.view.lower() == view.lower():
                return p
        raise KeyError(view)

    def settled(self, served: Mapping[str, str], present: Collection[str] = (),
                recorded: Mapping[str, tuple[tuple[str, str], ...]] | None = None
                ) -> CompiledProgram:
        """The program as it runs against a warehouse whose views already serve answers.

        ``served`` maps a view to the state its published answer was computed from (the
        answer's ``incr.state``: ``owner/generation`` for a shared state, the generation of
        the view's own state otherwise); ``present`` names the generations the warehouse
        holds of the shared states and of the own states of views served from a shared one
        (``owner/generation``); ``recorded`` maps a shared state's generation to the views
        it was built for, ``(name, SELECT)`` in merge order.

        A view never rebuilds only because sharing would group it differently: while it
        serves from a state other than the one the share pass planned for it, and that
        state is not being built (a refresh starts it), it keeps the grouping it has (the
        views it was served with, or none), and the views new to its group share among
        themselves.  Nor because a view it shared with left the program: it keeps the
        state, which goes on holding the removed view's aggregates (see
        :mod:`~incr.compiler.passes.share`).  A view whose own definition changed rebuilds
        as it would anyway.
        """
        recorded = recorded or {}
        labels: dict[str, str] = {}
        for s in self.shares:
            fingerprint = self.plan(s.views[0]).state_fingerprint
            here = {v: served[v] for v in s.views if v in served}
            ours = [o for o in present if _generation_of(o, s.owner, fingerprint)]
            if ours or all(_generation_of(o, s.owner, fingerprint) for o in here.values()):
                continue
            labels.update({v: served_owner(here[v], v) if v in here else NEW for v in s.views})
        retained = self._retained(served, present, recorded, labels)
        if not labels:
            return self
        settled = _shared(self.program, *self.unshared, labels, retained)
        # Kept only as it is: if the views left changed (their own aggregates), the state
        # they need is built anyway, and without the removed views' aggregates.
        changed = {s.owner for s in settled.shares if s.retained and any(
            v in served and not _generation_of(served[v], s.owner,
                                               settled.plan(v).state_fingerprint)
            for v in s.views)}
        if changed:
            retained = {o: r for o, r in retained.items() if o not in changed}
            settled = _shared(self.program, *self.unshared, labels, retained)
        return settled

    def _retained(self, served: Mapping[str, str], present: Collection[str],
                  recorded: Mapping[str, tuple[tuple[str, str], ...]],
                  labels: dict[str, str]) -> Retained:
        """The shared states some of whose views left the program, kept by those that stay.

        The views still served from such a state are labelled with it (in ``labels``)
        and keep it, unless the state planned for them is present (a refresh is building
        it).  Returns, per state, its recorded views in merge order, with the compilation
        of each removed one.
        """
        names = {p.view.lower() for p in self.plans}
        eligible = {v for v, _ in self.unshared[1]}
        out: dict[str, tuple[tuple[str, Compilation | None], ...]] = {}
        for state, members in recorded.items():
            gone = [(n, q) for n, q in members if n.lower() not in names]
            owner = state.split("/", 1)[0]
            stay = [p for p in self.plans if served.get(p.view) == state and p.view in eligible]
            if not gone or not stay:
                continue
            if any(o != state and _generation_of(o, p.state_owner, p.state_fingerprint)
                   for p in stay for o in present):
                continue  # a refresh builds the state planned for them: they take it
            kept = self._removed(gone)
            if kept is None:
                continue
            labels.update({p.view: owner for p in stay})
            out[owner] = tuple((n, kept.get(n)) for n, _ in members)
        return out

    def _removed(self, gone: list[tuple[str, str]]) -> dict[str, Compilation] | None:
        """The compilation (after ``lineage``) of each removed view, from its SELECT.

        None when one no longer compiles against the program's tables.
        """
        out = {}
        for name, select in gone:
            view = ViewDecl(name=name, select=select, location=Location(self.program.path))
            try:
                out[name] = run_passes(start(self.program, view), until="lineage")
            except IncrError:
                return None
        return out


def _generation_of(state: str, owner: str, fingerprint: str) -> bool:
    """Whether ``state`` (``owner/generation``) is one of ``owner``'s generations of ``fingerprint``."""
    return state == f"{owner}/{fingerprint}" or state.startswith(f"{owner}/{fingerprint}.r")


def compile_program(path: str | Path) -> CompiledProgram:
    """Parses and compiles a program file; raises a located IncrError on any problem."""
    return compile_parsed(load_program(path))


def compile_text(text: str, path: str = "<program>", name: str | None = None) -> CompiledProgram:
    """Compiles program text (tests and tools that hold the SQL in memory)."""
    return compile_parsed(parse_program(text, path, name))


def compile_parsed(program: Program) -> CompiledProgram:
    """Compiles every view of an already parsed program.

    Then the views that can keep one state share it (:mod:`incr.compiler.passes.share`).
    """
    plans = tuple(compile_view(program, v) for v in program.views)
    alone: list[tuple[str, str]] = []
    starts: list[tuple[str, Compilation]] = []
    for view, plan in zip(program.views, plans):
        why = why_alone(plan, view)
        if why is not None:
            alone.append((plan.view, why))
        elif program.options.share:
            starts.append((plan.view, run_passes(start(program, view), until="lineage")))
    return _shared(program, plans, tuple(starts), tuple(alone))


def _shared(program: Program, plans: tuple[IncrementalPlan, ...],
            starts: tuple[tuple[str, Compilation], ...], alone: tuple[tuple[str, str], ...],
            labels: Mapping[str, str] | None = None,
            retained: Retained | None = None) -> CompiledProgram:
    """The program after the share pass (``labels``, ``retained``: see :func:`share`)."""
    sharing = share(program, plans, dict(starts), labels, retained)
    order = {p.view: i for i, p in enumerate(plans)}
    reasons = sorted([*alone, *sharing.alone], key=lambda pair: order[pair[0]])
    return CompiledProgram(program, sharing.plans, sharing.shares, tuple(dict(reasons).items()),
                           (plans, starts, alone))


def start(program: Program, view: ViewDecl) -> Compilation:
    """The compilation of ``view``'s own stage right after translation, before any pass."""
    return _compilation(program, view, translate(view, program).top)


def _compilation(program: Program, view: ViewDecl, st: StageTranslation) -> Compilation:
    return Compilation(program=program, view=view, source=st.source, rel=st.rel,
                       branches=st.branches, stage=st.name)


def compile_view(program: Program, view: ViewDecl) -> IncrementalPlan:
    """Runs translation and every pass on each stage, and assembles the plan.

    An iterative view compiles its STEP as a view that reads the previous iterate as one
    more source (see :mod:`incr.compiler.iterate`).
    """
    iteration = None
    rec = None
    written = view
    if view.iterate is not None:
        view, program, iteration = iterate.prepare(view, program)
    elif recursion.is_recursive(view, program.options.dialect):
        view, program, rec = recursion.prepare(view, program)
    t = translate(view, program)
    stages = tuple(build_stage(run_passes(_compilation(program, view, st))) for st in t.stages)
    sources: list[str] = []
    for stage in stages:
        for inp in stage.inputs:
            if not inp.derived and inp.table not in sources:
                sources.append(inp.table)
    if iteration is not None:
        iterate.check_output(iteration, stages[-1].output, Location(program.path, view.select_line))
        if not stages[-1].lineage:
            raise NotIncrementalizableError(
                f"iterative view {view.name}: the STEP must GROUP BY the iterate's key "
                f"{iteration.key}", Location(program.path, view.select_line))
    pseudo = (view.name if iteration is not None else
              rec.name if rec is not None else None)
    landed = [s for s in sources if pseudo is None or s.lower() != pseudo.lower()]
    for s in rec.sources if rec is not None else ():
        if s.lower() not in {x.lower() for x in landed}:
            landed.append(s)
    read = [*sources, *(s for s in landed if s not in sources)]
    return IncrementalPlan(program=program.name, view=view.name, select=written.select,
                           stages=stages, sources=tuple(landed),
                           source_tables=tuple(program.declared(s) for s in read),
                           iteration=iteration, recursion=rec)
