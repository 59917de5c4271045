"""The compiler: program file -> one :class:`~incr.compiler.plan.IncrementalPlan` per view.

Pure Python (sqlglot for parsing); it never imports Spark or Delta, so ``incr explain`` and
DAG parsing stay fast and any machine can check a program.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from incr.compiler import iterate, recursion
from incr.compiler.compilation import Compilation, build_stage
from incr.compiler.passes import run_passes
from incr.compiler.passes.share import Share, share, why_alone
from incr.compiler.plan import IncrementalPlan
from incr.compiler.program import Program, ViewDecl, load_program, parse_program
from incr.compiler.translate import StageTranslation, translate
from incr.errors import Location, NotIncrementalizableError


@dataclass(frozen=True)
class CompiledProgram:
    """A program and the plan of each of its views, in declaration order."""

    program: Program
    plans: tuple[IncrementalPlan, ...]
    shares: tuple[Share, ...] = ()  # the states several views keep as one (the share pass)
    alone: tuple[tuple[str, str], ...] = ()  # (view, why it shares no state)

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
    starts: dict[str, Compilation] = {}
    for view, plan in zip(program.views, plans):
        why = why_alone(plan, view)
        if why is not None:
            alone.append((plan.view, why))
        elif program.options.share:
            starts[plan.view] = run_passes(start(program, view), until="lineage")
    sharing = share(program, plans, starts)
    order = {p.view: i for i, p in enumerate(plans)}
    reasons = sorted([*alone, *sharing.alone], key=lambda pair: order[pair[0]])
    return CompiledProgram(program, sharing.plans, sharing.shares,
                           tuple(dict(reasons).items()))


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
