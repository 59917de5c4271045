"""Derivation of ⊗, ⊗̃ and ⊗̂ from the monoids of each state table.

* ⊗ (merge, for inserts) is a full outer join on the key columns: matched rows combine each
  element with its monoid, unmatched batch rows are inserted, unmatched state rows stay.
* ⊗̃ (diminish, for deletes; seed Appendix A) is the left-outer variant with each monoid's
  inverse: matched rows are diminished, and a row whose count reaches zero is deleted, which
  is how a group vanishes when its last row goes.  It exists only if every monoid of the
  table has an inverse; a table without one belongs to an append-only source.
* ⊗̂ (diffusion, seed §8.2) is the right-outer variant: only ΔT's keys come out.
* ⊗± (signed merge) exists for tables holding only counts (side tables and value-count
  bags): a count is a group, so one MERGE folds signed changes, inserts and deletes at once.
* ⊗± also keeps a nested stage's *kept* output rows (see ``split_answer``): the signed
  output changes it hands on are folded into them.
* ⊗= (replace) writes rows already combined elsewhere (``old ⊗ h(Δ⁺) ⊗̃ h(Δ⁻)`` computed
  as a query, when a stage must also hand on its output change): matched rows take the new
  values, rows at count 0 go, new rows at count 0 are never inserted.

The global-aggregate row (empty θ) never vanishes: SQL answers a global aggregate over no
rows with one row (COUNT 0, SUM NULL), so its state keeps the identity instead.
"""

from __future__ import annotations

from dataclasses import replace

from incr.algebra.monoids import Count
from incr.compiler.compilation import Compilation
from incr.compiler.plan import ROW_COUNT, DiffusionSpec, MergeSpec, StateTable, live, vanished

TARGET, SOURCE = "t", "s"


def derive_merge(c: Compilation) -> Compilation:
    """Fills ``merge`` (⊗), ``diminish`` (⊗̃) and ``diffuse`` (⊗̂), one spec per state table."""
    assert c.tables is not None
    merge = tuple(_merge(t) for t in c.tables)
    diminish = tuple(_diminish(t) for t in c.tables if t.invertible)
    diffuse = tuple(_diffuse(t) for t in c.tables)
    signed = tuple(_signed(t) for t in c.tables if all(isinstance(v.monoid, Count) for v in t.values))
    replaced = tuple(_replace(t) for t in c.tables if t.side_of is None)
    keep = _signed(c.kept) if c.kept is not None else None
    return replace(c, merge=merge, diminish=diminish, diffuse=diffuse, signed=signed,
                   replace=replaced, keep=keep)


def _refs(table: StateTable, alias: str) -> list[tuple[str, ...]]:
    return [tuple(f"{alias}.{col}" for col in v.columns) for v in table.values]


def _combined(table: StateTable) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for v, t, s in zip(table.values, _refs(table, TARGET), _refs(table, SOURCE)):
        out += zip(v.columns, v.monoid.sql_combine(t, s))
    return tuple(out)


def _merge(table: StateTable) -> MergeSpec:
    return MergeSpec("⊗", table.name, table.key_columns, _combined(table), None, True)


def _diminish(table: StateTable) -> MergeSpec:
    updates: list[tuple[str, str]] = []
    for v, t, s in zip(table.values, _refs(table, TARGET), _refs(table, SOURCE)):
        updates += zip(v.columns, v.monoid.sql_diminish(t, s))
    vanish = vanished(f"{TARGET}.{ROW_COUNT} - {SOURCE}.{ROW_COUNT}") if table.vanishes else None
    return MergeSpec("⊗̃", table.name, table.key_columns, tuple(updates), vanish, False)


def _signed(table: StateTable) -> MergeSpec:
    updates = tuple((col, f"{TARGET}.{col} + {SOURCE}.{col}") for col in table.value_columns)
    vanish = vanished(f"{TARGET}.{ROW_COUNT} + {SOURCE}.{ROW_COUNT}") if table.vanishes else None
    return MergeSpec("⊗±", table.name, table.key_columns, updates, vanish, True)


def _replace(table: StateTable) -> MergeSpec:
    updates = tuple((col, f"{SOURCE}.{col}") for col in table.value_columns)
    count = f"{SOURCE}.{ROW_COUNT}"
    return MergeSpec("⊗=", table.name, table.key_columns, updates,
                     vanished(count) if table.vanishes else None, True,
                     live(count) if table.vanishes else None)


def _diffuse(table: StateTable) -> DiffusionSpec:
    exprs = tuple((col, f"CASE WHEN {TARGET}.{ROW_COUNT} IS NULL THEN {SOURCE}.{col} ELSE {sql} END")
                  for col, sql in _combined(table))
    return DiffusionSpec(table.name, table.key_columns, exprs)
