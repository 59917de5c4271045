"""The compiler: program file -> one :class:`~incr.compiler.plan.IncrementalPlan` per view.

Pure Python (sqlglot for parsing); it never imports Spark or Delta, so ``incr explain`` and
DAG parsing stay fast and any machine can check a program.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from incr.compiler.compilation import Compilation
from incr.compiler.passes import run_passes
from incr.compiler.plan import IncrementalPlan
from incr.compiler.program import Program, ViewDecl, load_program, parse_program
from incr.compiler.translate import translate


@dataclass(frozen=True)
class CompiledProgram:
    """A program and the plan of each of its views, in declaration order."""

    program: Program
    plans: tuple[IncrementalPlan, ...]

    @property
    def name(self) -> str:
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
    """Compiles every view of an already parsed program."""
    return CompiledProgram(program, tuple(compile_view(program, v) for v in program.views))


def start(program: Program, view: ViewDecl) -> Compilation:
    """The compilation of ``view`` right after translation, before any pass."""
    t = translate(view, program)
    return Compilation(program=program, view=view, source=t.source, rel=t.rel, join=t.join)


def compile_view(program: Program, view: ViewDecl) -> IncrementalPlan:
    """Runs translation and every pass, and assembles the plan."""
    return build_plan(run_passes(start(program, view)))


def build_plan(c: Compilation) -> IncrementalPlan:
    """Assembles the final plan from a compilation that went through every pass."""
    assert c.answer is not None and c.tables is not None and c.h is not None
    assert c.merge is not None and c.diminish is not None and c.diffuse is not None
    return IncrementalPlan(
        program=c.program.name, view=c.view.name, select=c.view.select, source=c.source.name,
        sources=tuple(i.table for i in c.join.inputs) if c.join else (c.source.name,), join=c.join,
        source_columns=c.source.columns, append_only=c.source.append_only, logical=c.rel,
        lineage=c.lineage or (), tables=c.tables, h=c.h, merge=c.merge, diminish=c.diminish,
        diffuse=c.diffuse, answer=c.answer, buckets=c.h[0].buckets,
        output=tuple(e.name for e in c.answer.exprs))
