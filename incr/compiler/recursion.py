"""Recursive views: ``WITH RECURSIVE r AS (base UNION step) SELECT ... FROM r``, kept exact.

Seed 004 maintains recursive views (reachability, paths, regions) under insertions and
deletions of the facts they read.  Here the recursive CTE ``r`` becomes a relation the
runtime keeps beside the view's state (the fixpoint R, a set, in Delta), and the query
after the CTE is compiled like any view, reading ``r`` as one more source: each batch's
change of R (ΔR, rows ±1) is folded into that query's state like a batch of ``r``, so
aggregates over a recursive view (``COUNT(*)``, ``MIN(cost)``) are maintained by the same
h, ⊗, ⊗̃ and a as every other view, deletions included.

R itself is maintained by **semi-naive evaluation** on insertion and **delete and
rederive** (DRed, Gupta, Mumick & Subrahmanian 1993, seed 004 §2) on deletion:

* insertion of rows A of a source t: the branches evaluated with one occurrence of t read
  as A (the others as t after the batch) give the first new tuples; each round then
  evaluates the recursive branches over the last round's new tuples only, until a round
  adds nothing;
* deletion of rows D of t: delete and rederive with **rank support**.  Each tuple of R
  keeps a rank: 0 for a tuple a base branch derives, else one more than the rank of the r
  tuple of the derivation that first found it, so every tuple has a derivation from tuples
  of lower rank (a well-founded proof).  The tuples derived from D, and from tuples found
  dead, are examined rank by rank: one that still has a derivation from a live tuple of
  lower rank (or from a base branch) keeps its place and propagates nothing; only the rest
  (O) are over-deleted, and their derived tuples examined in turn.  Then the tuples of O
  still derivable from R − O and the sources after the batch are derived again (with new
  ranks), and what they derive within O too.  ΔR is −(O minus what was rederived).

Plain DRed (Gupta, Mumick & Subrahmanian 1993) over-deletes every tuple with some
derivation through D, which on a connected network is nearly the whole closure; the rank
check keeps every tuple with an equally short proof left, so O is the tuples whose
shortest proof went (the part of R a deletion really moves).  Derivation counts would be
cheaper but are not exact on cyclic data (the tuples of a cycle derive each other, so their
counts never fall to zero when the cycle's entry is cut); absorption provenance (the seed's
choice) is exact but keeps a Boolean formula per tuple.  Ranks are one integer per tuple.

**Aggregate selection** (seed 004 §6).  When the query after the CTE reads R only through
MIN/MAX of some columns (grouped and filtered by the others), and every step keeps a better
tuple better (an ordered column is derived as a sum of ordered columns of r and other values;
a condition on one holds for any better value, like ``p.hops < 6`` for MIN(hops)), R keeps
only the tuples no other tuple of their group beats on every ordered column.  A beaten tuple
could change no answer, and all it derives is beaten by what its beater derives, so each round
drops what R or the round already beats.  That is what makes a cheapest-path recursion with no
hop bound finite on a cyclic network.  A tuple a new one beats leaves R, and the tuples whose
rank proof went through it are examined like a delete's.  A delete that takes the best tuples
of a group derives the group again from R − O (joined with the lost groups on the columns the
branches copy), so the next best, never kept, comes back.

Both need the recursion to be **linear** (each step branch reads r once) and **monotone**
(no aggregate, negation, outer join or subquery inside the CTE: more facts can only derive
more tuples), with **set semantics** (``UNION``, not ``UNION ALL``: a cycle would make a
bag infinite).  Sources are read as sets: a row landed twice derives nothing more.

Every SQL text the runtime runs here is built by this module, in Spark SQL over named
slots: each table occurrence of a branch is a slot the runtime fills with a registered
name (the source before or after the batch, its changed rows, R or a round's tuples).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import sqlglot
from sqlglot import exp

from incr.compiler.dialect import SPARK, WEIGHT, q, render_expression
from incr.compiler.program import Column, Program, TableDecl, ViewDecl
from incr.compiler.types import SqlType, sql_type_of
from incr.errors import Location, NotIncrementalizableError

#: How a slot is spelled in a branch's SQL until the runtime names its table.
_SLOT = "incr_slot_{}_"
#: The slot of the tuples a targeted branch derives (see :attr:`Branch.targeted`).
_TARGET = "incr_slot_target_"
#: Makes the refusal of a view's recursion, with the reason.
Refuse = Callable[[str], NotIncrementalizableError]
#: Rounds of one batch's evaluation before the recursion is taken to be unbounded.
MAX_ROUNDS = 10_000
#: What ``explain`` says of how deletions are handled, and why.
DELETIONS = ("delete and rederive (DRed) with rank support: each tuple keeps the rank of "
             "its first proof (0 from a base branch, else its r tuple's rank + 1); the tuples "
             "derived from a deleted fact are examined rank by rank, and one with a proof "
             "left from a live tuple of lower rank stays without propagating, so only the "
             "tuples whose every shorter proof went are over-deleted, then those still "
             "derivable from what is left are derived again; derivation counts are not exact "
             "on cycles, whose tuples derive each other")
#: R's column holding each tuple's rank (the module doc).
RANK = "_rank"
#: What ``explain`` says of aggregate selection when a view has it.
SELECTING = ("aggregate selection (seed 004 §6): the query after the CTE reads only the best "
             "values of {cols} per ({group}), and every step keeps a better tuple better, so R "
             "holds only the tuples no other tuple of their group beats on every one of them "
             "(the others cannot change an answer, nor derive a tuple that could); a tuple "
             "beaten by a new one leaves R like a deleted one, and a deletion that takes a best "
             "tuple derives its group again from what is left, bringing back the next best")

#: What ``explain`` says of the part of R a batch reads, when R falls apart by a column.
PARTS = ("reads of R: the parts a batch reaches. Every step copies {col} from its r tuple, so "
         "R falls apart by {col}, and a batch can move only the tuples whose {col} is that of a "
         "tuple the base branches derive from its changed rows or of an r tuple a step joins "
         "with them; on the driver it reads those (a scan that keeps them), not the closure")


@dataclass(frozen=True)
class Selection:
    """Aggregate selection: R keeps, per group, only the tuples no other tuple beats.

    The query after the CTE reads R only through MIN/MAX of the ``order`` columns, grouped
    and filtered by ``group`` columns; and each step branch keeps a better tuple better (its
    outputs of ordered columns grow with them, its conditions on them hold for any better
    value), so a tuple some other tuple of its group beats on every ordered column (NULL
    worst) can change no answer, and derives only tuples that are beaten in turn.
    """

    group: tuple[str, ...]  # R's other columns: tuples are compared within a group
    order: tuple[tuple[str, bool], ...]  # (column, True when the lowest value is best)

    def __str__(self) -> str:
        cols = ", ".join(f"{'MIN' if low else 'MAX'}({c})" for c, low in self.order)
        return SELECTING.format(cols=cols, group=", ".join(self.group) or "the whole of R")


@dataclass(frozen=True)
class Branch:
    """One SELECT of the CTE's UNION, as Spark SQL whose table occurrences are slots."""

    sql: str  # Spark SQL with _SLOT.format(i) for occurrence i, r's columns then _rank
    reads: tuple[str, ...]  # the table of each slot: a declared source, or the CTE's name
    #: (slot, its column, r's column) for each column of r the branch copies from a slot
    #: unchanged: a derivation of a given tuple can only read the slot's rows matching it.
    copies: tuple[tuple[int, str, str], ...] = ()
    #: ``sql`` joined with a table of r's tuples (slot ``_TARGET``) on the copied columns:
    #: the derivations of those tuples only (None when the branch copies no column).
    targeted: str | None = None
    #: ``sql`` joined with a table of groups (slot ``_TARGET``) on the copied group columns
    #: of a :class:`Selection`: every tuple of those groups it derives (None: no such copy).
    grouped: str | None = None
    #: (slot, its column, r's column) for each equality of the branch between a column of
    #: r and a column of another slot of the same type: an r tuple joins a row of that slot
    #: only if the two hold the same value (a step branch; :func:`reach_keys`).
    keys: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class Recursion:
    """What the runtime needs to keep the fixpoint R of a view's recursive CTE."""

    name: str  # the CTE's name: the pseudo-source the view's outer query reads
    columns: tuple[Column, ...]
    base: tuple[Branch, ...]
    step: tuple[Branch, ...]
    sources: tuple[str, ...]  # declared tables the branches read, in order of appearance
    selection: Selection | None = None
    unselected: str = ""  # why there is no aggregate selection (explain)
    #: A column of r every step copies from its r tuple unchanged (and within the groups of
    #: the selection, if any): R falls apart by its value, and a batch moves only the parts
    #: it reaches (:func:`reach_keys`).  None: no such column (explain says why).
    partition: str | None = None
    unpartitioned: str = ""  # why there is no partition column (explain)

    def reading(self) -> str:
        """What ``explain`` says of the part of R a batch reads, and why."""
        if self.partition is None:
            return f"reads of R: the whole of R ({self.unpartitioned})"
        whole = [t for t in self.sources if reach_keys(self, t) is None]
        return PARTS.format(col=self.partition) + (
            f"; but a batch of {', '.join(whole)} reads the whole of R (a step reads it "
            f"without an equality to a column of {self.name})" if whole else "")

    def reads(self, table: str) -> bool:
        """Whether a branch reads the declared table ``table``."""
        return any(s.lower() == table.lower() for s in self.sources)


# -- the SQL the runtime runs ----------------------------------------------------------------
def fill(branch: Branch, slots: Mapping[int, str], default: Mapping[str, str],
         target: str | None = None, grouped: bool = False) -> str:
    """``branch`` with slot i reading ``slots[i]``, else ``default`` of its table (lowercase).

    With ``target`` (a table of r's tuples), the branch derives those tuples only, joined
    with them on the columns it copies from its slots (the database starts from the few
    target tuples instead of reading the whole of R or a source).  ``grouped``: the target
    holds groups of the selection, and the branch derives every tuple of them.
    """
    sql = branch.sql
    form = branch.grouped if grouped else branch.targeted
    if target is not None and form is not None:
        sql = form.replace(_TARGET, target)
    for i, table in enumerate(branch.reads):
        sql = sql.replace(_SLOT.format(i), slots.get(i, default[table.lower()]))
    return sql


def changed_sql(rec: Recursion, branches: tuple[Branch, ...], source: str, changed: str,
                tables: Mapping[str, str]) -> str | None:
    """The tuples ``branches`` derive with one occurrence of ``source`` read as ``changed``.

    Every other occurrence reads ``tables`` (the source before or after the batch, and R):
    for monotone branches that is every tuple whose derivation uses a changed row.  None
    when no branch reads ``source``.
    """
    parts = [fill(b, {i: changed}, tables) for b in branches
             for i, t in enumerate(b.reads) if t.lower() == source.lower()]
    return union_sql(rec, parts)


def reach_keys(rec: Recursion, source: str) -> tuple[tuple[str, str], ...] | None:
    """How a batch of ``source`` finds the parts of R it can move, or None to read R whole.

    R falls apart by :attr:`Recursion.partition` (every step copies it from its r tuple),
    so every tuple a batch derives, over-deletes, rederives or beats shares the partition
    value of a tuple the base branches derive from the changed rows, or of an r tuple a step
    joins with a changed row.  Those r tuples hold, in some column of r, the value of a
    column of the changed row (the step's equality): one (source column, r column) pair per
    occurrence of ``source`` in a step.  None when there is no partition column, or a step
    reads ``source`` without such an equality.
    """
    if rec.partition is None:
        return None
    keys = []
    for b in rec.step:
        for i, t in enumerate(b.reads):
            if t.lower() == source.lower():
                on = [(c, o) for slot, c, o in b.keys if slot == i]
                if not on:
                    return None
                keys.append(on[0])
    return tuple(keys)


def parts_sql(rec: Recursion, rows: list[str]) -> str:
    """The distinct values of R's partition column among the rows of queries ``rows``."""
    assert rec.partition is not None and rows
    col = q(rec.partition)
    return " UNION ".join(f"SELECT DISTINCT {col} FROM ({r}) AS _p" for r in rows)


def round_sql(rec: Recursion, last: str, tables: Mapping[str, str]) -> str | None:
    """The tuples the step branches derive from ``last`` (a round's new tuples) as r."""
    parts = [fill(b, {i: last}, tables) for b in rec.step
             for i, t in enumerate(b.reads) if t.lower() == rec.name.lower()]
    return union_sql(rec, parts)


def all_sql(rec: Recursion, tables: Mapping[str, str], target: str | None = None,
            grouped: bool = False) -> str | None:
    """Every tuple one application of the branches derives from ``tables`` (R as r).

    With ``target``, the derivations of its tuples (``grouped``: of its groups) only (see
    :func:`fill`).
    """
    return union_sql(rec, [fill(b, {}, tables, target, grouped)
                           for b in (*rec.base, *rec.step)])


def union_sql(rec: Recursion, parts: list[str]) -> str | None:
    """The distinct tuples of ``parts``, each with its lowest rank (None: no part)."""
    if not parts:
        return None
    cols = ", ".join(q(c.name) for c in rec.columns)
    body = "\nUNION ALL\n".join(f"SELECT {cols}, {RANK} FROM ({p}) AS _p" for p in parts)
    return (f"SELECT {cols}, CAST(MIN({RANK}) AS BIGINT) AS {RANK} FROM (\n{body}\n) AS _u "
            f"GROUP BY {cols}")


def named_sql(columns: tuple[Column, ...], table: str, rows: str) -> str:
    """The rows of ``table`` (R or part of it: its ranks kept) that query ``rows`` names."""
    return f"SELECT x.* FROM {table} AS x LEFT SEMI JOIN ({rows}) AS w ON {_match(columns, 'x', 'w')}"


def alive_sql(columns: tuple[Column, ...], table: str, dead: str | None,
              below: int | None = None) -> str:
    """The tuples of ``table`` (R: distinct already) not in ``dead``, of rank under ``below``."""
    sql = f"SELECT x.* FROM {table} AS x"
    if dead is not None:
        sql += f" LEFT ANTI JOIN {dead} AS w ON {_match(columns, 'x', 'w')}"
    return sql + (f" WHERE x.{RANK} < {int(below)}" if below is not None else "")


def ranked_sql(table: str, op: str, rank: int) -> str:
    """The tuples of ``table`` whose rank is ``op`` (``<``, ``>``) ``rank``."""
    return f"SELECT * FROM {table} WHERE {RANK} {op} {int(rank)}"


def groups_sql(rec: Recursion, table: str) -> str:
    """The distinct groups of the selection among the tuples of ``table``."""
    assert rec.selection is not None
    cols = ", ".join(f"x.{q(c)}" for c in rec.selection.group) or "1 AS _all"
    return f"SELECT DISTINCT {cols} FROM {table} AS x"


def frontier_sql(rec: Recursion, candidates: str, *held: str) -> str:
    """The tuples of ``candidates`` no tuple of theirs or of the tables ``held`` beats.

    ``candidates`` are distinct, with ranks; "beats" is :class:`Selection`'s order.  Written
    as an anti join on every column against the candidates an inner join finds beaten, not
    as one anti join on "beats": DuckDB runs an anti (or semi) join whose condition has an
    inequality beside the group's equalities as a blockwise nested loop, every candidate
    against every rival (minutes for a round of a 10K-node graph), but an inner join on the
    group, and an anti join on equalities alone, as hash joins.
    """
    rivals = union_all_sql([candidates, *held])  # all of R's shape: tuples and ranks
    beaten = (f"SELECT DISTINCT b.* FROM {candidates} AS b JOIN ({rivals}) AS y "
              f"ON {_beats(rec, 'y', 'b')}")
    every = " AND ".join(f"x.{q(c)} <=> w.{q(c)}" for c in (*(c.name for c in rec.columns), RANK))
    return f"SELECT x.* FROM {candidates} AS x LEFT ANTI JOIN ({beaten}) AS w ON {every}"


def superseded_sql(rec: Recursion, held: tuple[str, ...], by: str) -> str:
    """The tuples of the tables ``held`` some tuple of ``by`` beats (they leave R).

    A separate query from :func:`frontier_sql`: as one (a CTE read twice) DuckDB ran the
    rounds about six times slower.  An inner join and DISTINCT, not a semi join, for the
    reason :func:`frontier_sql` gives.
    """
    return (f"SELECT DISTINCT x.* FROM ({union_all_sql(list(held))}) AS x JOIN {by} AS y "
            f"ON {_beats(rec, 'y', 'x')}")


def _beats(rec: Recursion, y: str, x: str) -> str:
    """SQL for ``y`` beats ``x``.

    Same group, at least as good on every ordered column and better on one (NULL is the worst
    value: MIN and MAX skip it).
    """
    sel = rec.selection
    assert sel is not None
    same = [f"{y}.{q(c)} <=> {x}.{q(c)}" for c in sel.group]
    good, better = [], []
    for c, low in sel.order:
        op = "<" if low else ">"
        a, b = f"{y}.{q(c)}", f"{x}.{q(c)}"
        good.append(f"({b} IS NULL OR {a} {op}= {b})")
        better.append(f"({a} IS NOT NULL AND ({b} IS NULL OR {a} {op} {b}))")
    return " AND ".join([*same, *good, f"({' OR '.join(better)})"])


def _match(columns: tuple[Column, ...], a: str, b: str) -> str:
    return " AND ".join(f"{a}.{q(c.name)} <=> {b}.{q(c.name)}" for c in columns)


def minus_sql(columns: tuple[Column, ...], rows: str, *without: str) -> str:
    """The distinct rows of query ``rows`` (``columns``) found in none of tables ``without``."""
    sql = f"SELECT DISTINCT x.* FROM ({rows}) AS x"
    for i, other in enumerate(without):
        sql += f" LEFT ANTI JOIN {other} AS w{i} ON {_match(columns, 'x', f'w{i}')}"
    return sql


def within_sql(columns: tuple[Column, ...], rows: str, within: str) -> str:
    """The distinct rows of query ``rows`` (``columns``) also in table ``within``."""
    return (f"SELECT DISTINCT x.* FROM ({rows}) AS x LEFT SEMI JOIN {within} AS w "
            f"ON {_match(columns, 'x', 'w')}")


def present_sql(columns: tuple[Column, ...], mirror: str) -> str:
    """A source's distinct rows, from its mirror of row counts (``_w`` > 0)."""
    cols = ", ".join(q(c.name) for c in columns)
    return f"SELECT DISTINCT {cols} FROM {mirror} WHERE {q(WEIGHT)} > 0"


def mirror_sql(columns: tuple[Column, ...], mirror: str, batch: str, sign: int) -> str:
    """A source's mirror (each distinct row and its copies) after a batch of ``sign``.

    A row whose copies fall to zero leaves; a delete of more copies than are present
    leaves none (the rejected-delete check is ingest's, not this one's).
    """
    cols = ", ".join(q(c.name) for c in columns)
    return (f"SELECT {cols}, CAST(SUM({q(WEIGHT)}) AS BIGINT) AS {q(WEIGHT)} FROM ("
            f"SELECT {cols}, {q(WEIGHT)} FROM {mirror} UNION ALL "
            f"SELECT {cols}, CAST({sign} AS BIGINT) AS {q(WEIGHT)} FROM {batch}) AS _m "
            f"GROUP BY {cols} HAVING SUM({q(WEIGHT)}) > 0")


def union_all_sql(tables: list[str]) -> str:
    """Every row of ``tables`` (at least one)."""
    return " UNION ALL ".join(f"SELECT * FROM {t}" for t in tables)


def signed_sql(rows: str, sign: int) -> str:
    """``rows`` with a ``_w`` column of ``sign`` (a change of R as the view's query reads it)."""
    return f"SELECT *, CAST({sign} AS BIGINT) AS {q(WEIGHT)} FROM {rows}"


# -- compiling -------------------------------------------------------------------------------
def prepare(view: ViewDecl, program: Program) -> tuple[ViewDecl, Program, Recursion]:
    """Splits a view's recursive CTE from the query that reads it.

    Returns the query after the CTE as a view of its own, the program it compiles against
    (the CTE declared as a source named like it) and the recursion's description.
    """
    where = Location(program.path, view.select_line)
    dialect = program.options.dialect
    tree = sqlglot.parse_one(view.select, read=dialect)
    with_ = tree.args.get("with_")
    assert with_ is not None and with_.args.get("recursive")
    ctes = list(with_.expressions)

    def refuse(why: str) -> NotIncrementalizableError:
        return NotIncrementalizableError(f"view {view.name}: WITH RECURSIVE: {why}", where)

    recursive = [c for c in ctes if _reads(c.this, c.alias_or_name)]
    if len(recursive) != 1 or len(ctes) != 1:
        raise refuse("write exactly one CTE, the recursive one; put other subqueries inside "
                     "its branches or in the query after it")
    cte = recursive[0]
    name = cte.alias_or_name
    if program.table(name) is not None:
        raise refuse(f"the recursive CTE {name} has the name of a declared table; rename it")
    branches = _branches(cte.this, refuse)
    is_step = [_reads(b, name) for b in branches]
    base = [b for b, r in zip(branches, is_step) if not r]
    if not base:
        raise refuse(f"no branch of {name} starts the recursion: add one that does not read "
                     f"{name}, e.g. SELECT src, dst FROM links UNION SELECT ...")
    for b in branches:
        _check_monotone(b, name, refuse)
    declared_names = [c.name for c in cte.args["alias"].columns] \
        if cte.args.get("alias") is not None and cte.args["alias"].columns else []
    first = base[0]
    names = declared_names or [e.alias_or_name for e in first.expressions]
    for b in branches:
        if len(b.expressions) != len(names):
            raise refuse(f"the branches of {name} have different numbers of columns "
                         f"({len(b.expressions)} and {len(names)})")
    if len({n.lower() for n in names}) != len(names) or any(not n for n in names):
        raise refuse(f"name the columns of {name}, each once: WITH RECURSIVE {name}(a, b) AS ...")
    types = _types(first, program, dialect, refuse)
    columns = tuple(Column(n, t) for n, t in zip(names, types))
    outer = tree.copy()
    outer.set("with_", None)
    selection, unselected = _selection(outer, name, columns,
                                       [b for b, r in zip(branches, is_step) if r])
    sources: list[str] = []
    rendered = []
    for b in branches:
        branch, reads = _slotted(b, columns, program, name, refuse,
                                 selection.group if selection is not None else ())
        rendered.append(branch)
        for t in reads:
            if t.lower() != name.lower() and t not in sources:
                sources.append(t)
    steps = [r for r, s in zip(rendered, is_step) if s]
    partition, unpartitioned = _partition(name, columns, steps, selection)
    rec = Recursion(name=name, columns=columns,
                    base=tuple(r for r, s in zip(rendered, is_step) if not s),
                    step=tuple(steps), sources=tuple(sources), selection=selection,
                    unselected=unselected, partition=partition, unpartitioned=unpartitioned)
    tables = (*program.tables, TableDecl(name=name, columns=columns, location=view.location))
    return (replace(view, select=outer.sql(dialect=dialect)),
            replace(program, tables=tables), rec)


def is_recursive(view: ViewDecl, dialect: str) -> bool:
    """Whether the view's query starts with WITH RECURSIVE and a CTE reads itself.

    A CTE that does not read itself is an ordinary one, compiled as one.
    """
    try:
        tree = sqlglot.parse_one(view.select, read=dialect)
    except sqlglot.errors.ParseError:
        return False
    with_ = tree.args.get("with_")
    if with_ is None or not with_.args.get("recursive"):
        return False
    return any(_reads(cte.this, cte.alias_or_name) for cte in with_.expressions)


def _branches(body: exp.Expr, refuse: Refuse) -> list[exp.Select]:
    """The SELECTs of the CTE's UNION, in order; UNION ALL is refused (see the module doc)."""
    if isinstance(body, exp.Subquery):
        body = body.this
    if isinstance(body, exp.Union):
        if not body.args.get("distinct"):
            raise refuse("UNION ALL keeps every derivation of a tuple, which a cycle makes "
                         "infinite; write UNION (a recursive view is a set)")
        return _branches(body.this, refuse) + _branches(body.expression, refuse)
    if not isinstance(body, exp.Select):
        raise refuse(f"a branch of the recursion is {body.key.upper()}, not a SELECT")
    return [body]


def _reads(select: exp.Expr, name: str) -> bool:
    return any(t.name.lower() == name.lower() for t in select.find_all(exp.Table))


def _check_monotone(select: exp.Select, name: str, refuse: Refuse) -> None:
    """A branch must derive more from more facts: no aggregate, negation or outer join."""
    occurrences = sum(1 for t in select.find_all(exp.Table) if t.name.lower() == name.lower())
    if occurrences > 1:
        raise refuse(f"a branch reads {name} {occurrences} times; only linear recursion (each "
                     f"branch reads {name} once) is maintained")
    for key in ("group", "having", "order", "limit", "offset", "qualify", "with_"):
        if select.args.get(key):
            raise refuse(f"{key.upper().rstrip('_')} inside a branch of {name}: a branch must be "
                         f"a plain SELECT ... FROM ... JOIN ... WHERE (aggregate in the query "
                         f"after the CTE instead)")
    for node in select.find_all(exp.AggFunc, exp.Window, exp.Subquery, exp.Exists,
                                exp.Except, exp.Intersect):
        raise refuse(f"{node.sql()[:60]} inside a branch of {name}: aggregates, window "
                     f"functions, subqueries and EXCEPT are not monotone, so deletions could "
                     f"not be propagated by DRed; aggregate in the query after the CTE")
    for join in select.args.get("joins") or []:
        if join.side or join.kind in ("ANTI", "SEMI"):
            raise refuse(f"{join.side or join.kind} JOIN inside a branch of {name}: only inner "
                         f"joins are monotone")


def _types(select: exp.Select, program: Program, dialect: str, refuse: Refuse) -> list[SqlType]:
    """The column types of the first branch that starts the recursion (sqlglot infers them)."""
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify

    schema: dict[str, object] = {t.name: {c.name: str(c.type) for c in t.columns}
                                 for t in program.tables}
    try:
        typed = annotate_types(qualify(select.copy(), schema=schema, dialect=dialect),
                               schema=schema, dialect=dialect)
    except Exception as e:
        raise refuse(f"cannot type the first branch ({e})") from e
    out = []
    for column in typed.expressions:
        t = column.type
        try:
            if t is None or t.this == exp.DataType.Type.UNKNOWN:
                raise ValueError("its type is not known")
            out.append(sql_type_of(t))
        except ValueError as err:
            raise refuse(f"column {column.alias_or_name} of the first branch: {err}; CAST it "
                         f"to a declared type") from err
    return out


def _selection(outer: exp.Expr, name: str, columns: tuple[Column, ...],
               steps: list[exp.Select]) -> tuple[Selection | None, str]:
    """The aggregate selection the view allows (:class:`Selection`), or why it has none."""
    if not isinstance(outer, exp.Select) or outer.args.get("joins") \
            or [t.name.lower() for t in outer.find_all(exp.Table)] != [name.lower()] \
            or outer.find(exp.Subquery, exp.Window, exp.Union) is not None:
        return None, f"the query after the CTE is not one SELECT over {name} alone"
    known = {c.name.lower(): c.name for c in columns}
    order: dict[str, bool] = {}
    for agg in outer.find_all(exp.AggFunc):
        arg = agg.this
        if not isinstance(agg, (exp.Min, exp.Max)) or not isinstance(arg, exp.Column) \
                or arg.name.lower() not in known:
            return None, (f"{agg.sql()[:40]} after the CTE reads tuples no better one could "
                          f"stand for (only MIN and MAX of a column of {name} allow it)")
        col, low = known[arg.name.lower()], isinstance(agg, exp.Min)
        if order.setdefault(col, low) != low:
            return None, f"both MIN and MAX of {col} are read"
    if not order:
        return None, f"no MIN or MAX of a column of {name} is read"
    for ref in outer.find_all(exp.Column):
        if ref.name.lower() in {c.lower() for c in order} \
                and not isinstance(ref.parent, (exp.Min, exp.Max)):
            return None, f"{ref.name} is read outside MIN/MAX after the CTE"
    sel = Selection(group=tuple(c.name for c in columns if c.name not in order),
                    order=tuple(order.items()))
    for step in steps:
        why = _keeps_better(step, name, columns, sel)
        if why:
            return None, why
    return sel, ""


def _keeps_better(step: exp.Select, name: str, columns: tuple[Column, ...],
                  sel: Selection) -> str:
    """Why a step branch might derive a better tuple from a worse one ("" when it cannot).

    Its outputs of ordered columns must grow with them (sums of them and of values not from
    r), its other outputs not read them, and its conditions on them hold for any better value
    (``r.cost < 10`` for MIN); anything else reading an ordered column of r is refused.
    """
    tables = list(step.find_all(exp.Table))
    alias = next(t.alias_or_name for t in tables if t.name.lower() == name.lower()).lower()
    low = {c.lower(): v for c, v in sel.order}

    def ordered(col: exp.Column) -> bool | None:  # its direction when an ordered column of r
        if col.name.lower() not in low:
            return None
        if col.table.lower() == alias or (not col.table and len(tables) == 1):
            return low[col.name.lower()]
        return None if col.table else low[col.name.lower()]  # bare among several: r's

    def free(e: exp.Expr) -> bool:
        return all(ordered(c) is None for c in e.find_all(exp.Column))

    def grows(e: exp.Expr, direction: bool) -> bool:  # weakly, with r's columns of direction
        if free(e):
            return True
        if isinstance(e, exp.Paren):
            return grows(e.this, direction)
        if isinstance(e, exp.Column):
            return ordered(e) is direction
        if isinstance(e, exp.Add):
            return grows(e.this, direction) and grows(e.expression, direction)
        if isinstance(e, exp.Sub):
            return grows(e.this, direction) and free(e.expression)
        return False

    accounted = 0
    for e, c in zip(step.expressions, columns):
        value = e.unalias()
        n = sum(1 for col in value.find_all(exp.Column) if ordered(col) is not None)
        accounted += n
        direction = low.get(c.name.lower())
        if n and (direction is None or not grows(value, direction)):
            return (f"a step derives {c.name} as {value.sql()[:40]}, which a better tuple of "
                    f"{name} could make worse")
    for cond in _conjuncts(step):
        n = sum(1 for col in cond.find_all(exp.Column) if ordered(col) is not None)
        if not n:
            continue
        accounted += n
        if not _holds_for_better(cond, grows, free):
            return (f"the step's condition {cond.sql()[:40]} could fail for a better tuple of "
                    f"{name}")
    if accounted != sum(1 for col in step.find_all(exp.Column) if ordered(col) is not None):
        return f"a step reads an ordered column of {name} elsewhere than in its outputs or conditions"
    return ""


def _conjuncts(select: exp.Select) -> list[exp.Expr]:
    """The conditions of a branch's WHERE and ON clauses, split at AND (parentheses off)."""
    conditions = [select.args["where"].this] if select.args.get("where") is not None else []
    conditions += [j.args["on"] for j in select.args.get("joins") or [] if j.args.get("on")]
    return [c.unnest() for cond in conditions
            for c in (cond.flatten() if isinstance(cond, exp.And) else [cond])]


def _holds_for_better(cond: exp.Expr, grows: Callable[[exp.Expr, bool], bool],
                      free: Callable[[exp.Expr], bool]) -> bool:
    """``x < k`` (``<=``) with x growing with MIN columns, or ``k < x`` with MAX ones."""
    if isinstance(cond, exp.Paren):
        return _holds_for_better(cond.this, grows, free)
    if isinstance(cond, (exp.LT, exp.LTE)):
        small, big = cond.this, cond.expression
    elif isinstance(cond, (exp.GT, exp.GTE)):
        small, big = cond.expression, cond.this
    else:
        return False
    return (grows(small, True) and free(big)) or (free(small) and grows(big, False))


def _slotted(select: exp.Select, columns: tuple[Column, ...], program: Program, name: str,
             refuse: Refuse, group: tuple[str, ...] = ()) -> tuple[Branch, tuple[str, ...]]:
    """A branch as Spark SQL over slots, each column cast to r's type and named like it.

    Then the derivation's rank: 0 for a base branch, r's rank + 1 for a step.
    """
    tree = select.copy()
    reads: list[str] = []
    aliases: dict[str, int] = {}
    recursive_alias = None
    for t in list(tree.find_all(exp.Table)):
        if t.name.lower() != name.lower() and program.table(t.name) is None:
            raise refuse(f"a branch reads {t.name}, which is neither a declared table nor {name}")
        decl = program.table(t.name)
        reads.append(decl.name if decl is not None else name)
        if not t.alias:
            t.set("alias", exp.TableAlias(this=exp.to_identifier(t.name)))
        aliases[t.alias.lower()] = len(reads) - 1
        if decl is None:
            recursive_alias = t.alias
        t.set("this", exp.to_identifier(_SLOT.format(len(reads) - 1)))
        t.set("db", None)
        t.set("catalog", None)
    copies = []
    for e, c in zip(tree.expressions, columns):
        col = e.unalias()
        if not isinstance(col, exp.Column) or not isinstance(col.this, exp.Identifier):
            continue
        slot = aliases.get(col.table.lower()) if col.table else \
            (0 if len(reads) == 1 else None)
        if slot is None:
            continue
        decl = program.table(reads[slot])
        held = decl.columns if decl is not None else columns
        typed = next((h for h in held if h.name.lower() == col.name.lower()), None)
        if typed is not None and typed.type == c.type:  # a copy only if no cast changes it
            copies.append((slot, typed.name, c.name))
    keys = _keys(tree, aliases, recursive_alias, reads, columns, program)
    rank: exp.Expr = exp.Literal.number(0) if recursive_alias is None else exp.Add(
        this=exp.column(RANK, table=recursive_alias), expression=exp.Literal.number(1))
    tree.set("expressions", [
        *(exp.alias_(exp.cast(e.unalias(), str(c.type), dialect="duckdb"), c.name)
          for e, c in zip(tree.expressions, columns)),
        exp.alias_(exp.cast(rank, "BIGINT"), RANK)])
    unqualified = [col for col in tree.find_all(exp.Column) if not col.table]
    if len(reads) == 1:  # the target's columns must not make a bare column ambiguous
        for bare in unqualified:
            bare.set("table", exp.to_identifier(next(iter(aliases))))
        unqualified = []
    alias_of = {i: a for a, i in aliases.items()}

    def joined(on_copies: list[tuple[int, str, str]]) -> str | None:
        """The branch joined with the target on ``on_copies`` (None: it cannot be)."""
        if not on_copies or unqualified:
            return None
        on = exp.and_(*(exp.NullSafeEQ(this=exp.column(c, table=alias_of[i]),
                                       expression=exp.column(o, table="incr_k"))
                        for i, c, o in on_copies))
        return render_expression(tree.copy().join(exp.to_table(_TARGET).as_("incr_k"), on=on),
                                 SPARK)

    try:
        sql = render_expression(tree, SPARK)
        targeted = joined(copies)
        grouped = joined([c for c in copies if c[2] in group])
    except Exception as e:
        raise refuse(f"cannot write {select.sql()[:80]} for Spark: {e}") from e
    return Branch(sql=sql, reads=tuple(reads), copies=tuple(copies), targeted=targeted,
                  grouped=grouped, keys=keys), tuple(reads)


def _keys(tree: exp.Select, aliases: Mapping[str, int], recursive_alias: str | None,
          reads: list[str], columns: tuple[Column, ...],
          program: Program) -> tuple[tuple[int, str, str], ...]:
    """:attr:`Branch.keys`: the equalities ``r.c = t.d`` among the branch's conditions.

    Conditions of WHERE and ON, joined by AND, between a column of r and a column of
    another slot of the same type, as (slot, the slot's column, r's column).
    """
    if recursive_alias is None:
        return ()
    r_slot = aliases[recursive_alias.lower()]
    keys: list[tuple[int, str, str]] = []
    for cond in _conjuncts(tree):
        if not isinstance(cond, exp.EQ) or not all(
                isinstance(side, exp.Column) and side.table
                for side in (cond.this, cond.expression)):
            continue
        a, b = cond.this, cond.expression
        if aliases.get(b.table.lower()) == r_slot:
            a, b = b, a
        other = aliases.get(b.table.lower())
        if aliases.get(a.table.lower()) != r_slot or other is None or other == r_slot:
            continue
        decl = program.table(reads[other])
        r_col = next((c for c in columns if c.name.lower() == a.name.lower()), None)
        typed = next((c for c in decl.columns if c.name.lower() == b.name.lower()), None) \
            if decl is not None else None
        if r_col is not None and typed is not None and r_col.type == typed.type:
            keys.append((other, typed.name, r_col.name))
    return tuple(keys)


def _partition(name: str, columns: tuple[Column, ...], steps: list[Branch],
               selection: Selection | None) -> tuple[str | None, str]:
    """:attr:`Recursion.partition`, or why there is none."""
    carried = [c.name for c in columns]
    for b in steps:
        r_slot = next(i for i, t in enumerate(b.reads) if t.lower() == name.lower())
        kept = {o for slot, c, o in b.copies if slot == r_slot and c == o}
        carried = [c for c in carried if c in kept]
    if not carried:
        return None, (f"no column of {name} is copied unchanged from the r tuple by every "
                      f"step, so a change can reach any tuple")
    if selection is not None:
        grouped = [c for c in carried if c in selection.group]
        if not grouped:
            return None, (f"the aggregate selection compares tuples across values of "
                          f"{', '.join(carried)}")
        carried = grouped
    return carried[0], ""
