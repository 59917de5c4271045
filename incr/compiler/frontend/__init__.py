"""The compiler's front end: from a view's parsed SELECT to the relational IR of its stages.

This is the compiler's front door: every construct outside the supported class stops here
with a :class:`~incr.errors.NotIncrementalizableError` that names the construct, the file
and line, and why.  Names are resolved here too, so the IR passes
(:mod:`incr.compiler.passes`) see one canonical form.

The front end is organised like the IR passes and like sqlglot's optimizer: one step per
module, named after its function, run in the order of a tuple.  Its steps work on sqlglot
trees; two tuples run them:

* :data:`FRONTEND`, over the whole view (a :class:`~incr.compiler.frontend.query.Query`):
  name the unaliased output columns as DuckDB does, refuse what has no incremental form,
  write DuckDB's aggregate shorthand out, write the calls whose meaning depends on their
  operand's type as DuckDB computes them, expand grouping sets, decorrelate nested queries,
  make expression join keys columns, split window functions from the query they read,
  split into stages;
* :data:`~incr.compiler.frontend.block.BLOCK`, over each query block (one SELECT, a
  :class:`~incr.compiler.frontend.query.Block`), run by ``split_stages`` for each stage it
  splits off: read the inputs and split the joins, resolve names, lower to IR.

Ordering constraints of :data:`FRONTEND`:

* ``name_outputs`` first: it reads the function names as spelled from the view's text, by
  the positions the parser gave them, and every later step (which may rewrite the output
  items) sees the output names settled.  It moves no node, so refusals still point at
  the construct.
* ``refuse_unsupported`` next: it reads the tree as the user wrote it, so a refusal names
  the construct as written and points at it; the rewrites below lose positions and
  spellings.
* ``expand_shorthand`` right after ``refuse_unsupported`` (which refuses what is inside a
  FILTER, a ``bool_or`` or a ``GROUP BY ALL`` as written) and before ``spell_by_type``, so
  that the CASEs and counts it writes are typed with the rest of the view and every later
  step sees only the long forms.
* ``spell_by_type`` after ``refuse_unsupported`` (whose refusals name calls as written) and
  before every rewrite: sqlglot types the view as written, from the declared sources, and
  each rewrite after it copies the calls it rewrote (a grouping set's branches, a
  decorrelated subquery's) as they are.
* ``expand_grouping_sets`` before ``decorrelate``: the UNION ALL it writes for a ROLLUP,
  CUBE or GROUPING SETS is a set operation like any other from there on (its branches
  may hold subqueries for ``decorrelate`` to unnest).
* ``decorrelate`` before ``split_stages``: the subqueries it turns into joins with derived
  tables are what ``split_stages`` splits off as stages.  It also records the view's
  output names, which its rules change, for ``split_stages`` to put back.
* ``compute_join_keys`` after ``decorrelate`` (whose subquery merging would fold its FROM
  subqueries back in, and whose unnested joins may have expression keys too) and before
  ``split_stages``, which splits those subqueries off as stages that store nothing.
* ``split_windows`` after ``decorrelate`` (whose subquery merging would fold the plain
  block it splits off back into the window block) and right before ``split_stages``, which
  makes that block a stage the window stage reads.
* ``split_stages`` last: it translates every block (running ``BLOCK``) and fills
  ``Query.stages``.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlglot
from sqlglot.errors import ParseError as SqlglotParseError

from incr.compiler.frontend.compute_join_keys import compute_join_keys
from incr.compiler.frontend.decorrelate import decorrelate
from incr.compiler.frontend.expand_grouping_sets import expand_grouping_sets
from incr.compiler.frontend.expand_shorthand import expand_shorthand
from incr.compiler.frontend.name_outputs import name_outputs
from incr.compiler.frontend.query import Query, Scope, Translation
from incr.compiler.frontend.refuse_unsupported import refuse_unsupported
from incr.compiler.frontend.spell_by_type import spell_by_type
from incr.compiler.frontend.split_stages import split_stages
from incr.compiler.frontend.split_windows import split_windows
from incr.compiler.program import Program, ViewDecl, shift_lines
from incr.errors import Location, ParseError

Step = Callable[[Query], Query]

FRONTEND: tuple[Step, ...] = (name_outputs, refuse_unsupported, expand_shorthand,
                              spell_by_type, expand_grouping_sets, decorrelate, compute_join_keys,
                              split_windows, split_stages)


def parse_query(view: ViewDecl, program: Program) -> Query:
    """The view's SELECT parsed in the program's dialect, positioned in the program file.

    Raises:
        ParseError: for a syntax error, at its line in the program file.
    """
    try:
        tree = sqlglot.parse_one(view.select, read=program.options.dialect)
    except SqlglotParseError as e:
        err = e.errors[0] if e.errors else {}
        line = view.select_line + (err.get("line") or 1) - 1
        raise ParseError(f"view {view.name}: SQL syntax error: "
                         f"{err.get('description') or e}", Location(program.path, line)) from e
    before = view.select_offset - (program.text.rfind("\n", 0, view.select_offset) + 1)
    shift_lines(tree, view.select_line - 1, view.select_offset, before)
    return Query(Scope(view, program), tree)


def run_frontend(q: Query, until: str | None = None) -> Query:
    """Runs the front-end steps in order; with ``until``, stops after the step of that name."""
    for step in FRONTEND:
        q = step(q)
        if step.__name__ == until:
            break
    return q


def translate(view: ViewDecl, program: Program) -> Translation:
    """Translates one view's SELECT into the IR of its stages, or raises a located compile error."""
    q = run_frontend(parse_query(view, program))
    assert q.stages is not None
    return Translation(q.stages)
