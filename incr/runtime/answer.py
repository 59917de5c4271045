"""A view's answer table: a(state), published as one Delta version per applied batch.

Layout in the warehouse::

    WAREHOUSE/answers/<view>                             Delta, one version per batch

The answer query comes from the compiler (:meth:`~incr.compiler.plan.IncrementalPlan.answer_sql`).
It runs on the driver when the answer has been published before (its table's schema is
then the target the driver's result is cast to) and every state table it reads is small;
otherwise in Spark.  Each version carries the answer query's fingerprint, so a changed
answer query (say ``LIMIT 10`` → ``LIMIT 5``) is republished rather than mistaken for
current.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from incr.compiler.plan import IncrementalPlan
from incr.runtime.engine import DRIVER, SPARK, Engines, NotLocal
from incr.runtime.state import ViewState
from incr.runtime.store import DeltaStore
from incr.runtime.types import nullable

ANSWER_FP = "incr.answer_fingerprint"


class AnswerTable:
    """The published answer of one view."""

    def __init__(self, plan: IncrementalPlan, store: DeltaStore, state: ViewState,
                 engines: Engines, warehouse: Path):
        self.plan = plan
        self.store = store
        self.state = state
        self.engines = engines
        self.path = warehouse / "answers" / plan.view

    def through(self) -> int:
        """The batch the answer table reflects (-1: none, or written by another answer query)."""
        if self.store.last_commit_metadata(self.path, ANSWER_FP) != self.plan.answer_fingerprint:
            return -1
        return self.store.applied_through(self.path)

    def compute(self, published: bool | None = None) -> pa.Table:
        """a(state) from the current state tables, on the engine :meth:`Engines.choose` picks.

        ``published``: whether this answer query has published before; None reads it from
        the answer table.
        """
        if published is None:
            published = self.through() >= 0
        subject = f"view {self.plan.view}"
        blocker = None if published else "its first publish takes its types from Spark"
        if self.engines.choose("answer", subject, rows=0, blocker=blocker) == DRIVER:
            try:
                return self._run(DRIVER, self.store.schema(self.path))
            except NotLocal as e:
                self.engines.fell_back("answer", subject, str(e))
        return self._run(SPARK, None)

    def _run(self, name: str, schema: pa.Schema | None) -> pa.Table:
        engine = self.engines.engine(name, self.store)
        try:
            views = {t.name: engine.delta(f"incr_{self.plan.view}_state_{t.name}",
                                          self.state.path(t.name))
                     for t in self.plan.main_tables}
            return engine.collect(self.plan.answer_sql(views), schema)
        finally:
            engine.close()

    def publish(self, batch: int) -> int:
        """Writes a(state) as the answer table's version for ``batch`` (once); returns its
        rows (-1: already published)."""
        through = self.through()
        if through >= batch:
            return -1
        answer = self.compute(published=through >= 0)
        self.store.write(self.path, answer.cast(nullable(answer.schema)), mode="overwrite",
                         batch=batch, replace_schema=True,
                         description=f"incr answer of view {self.plan.view} (program "
                                     f"{self.plan.program})",
                         metadata={ANSWER_FP: self.plan.answer_fingerprint,
                                   "incr.state_fingerprint": self.plan.state_fingerprint,
                                   "incr.program": self.plan.program, "incr.batch": str(batch)})
        return answer.num_rows
