"""Where an increment's time goes: an exact tracing profile of one ``Pipeline.run``.

The harness applies one extra increment (after the measured series, so it does not disturb
it) with a set of functions wrapped by timers: the pipeline's steps, the view's steps, the
Delta store's operations and the two PySpark calls every step ends in (``SparkSession.sql``,
where Spark parses and analyses, and ``DataFrame.toArrow``, where a Spark job runs and its
result is collected).  Time is attributed to the innermost active probe, so the rows of the
profile add up to the increment's wall-clock time, each under the path of probes it ran
inside (e.g. ``view > answer publish > a(state) > Spark job → Arrow``).  ``Spark file read
setup`` is ``spark.read.parquet`` (file listing, and a schema-inference job when no schema
is given).

Probes are looked up by name and skipped when missing, so the profile survives refactors of
the runtime.  Spark's fixed per-job cost is measured separately (a trivial one-stage job
and a two-stage job with a shuffle, as h is) and the number of jobs the increment ran is
read from Spark's status tracker, so job setup can be told apart from work.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# (label, module, class, method): the probes, outermost first.
PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("register files", "incr.runtime.pipeline", "Pipeline", "register"),
    ("read batch", "incr.runtime.pipeline", "Pipeline", "_load"),
    ("row index", "incr.runtime.pipeline", "Pipeline", "_index"),
    ("view", "incr.runtime.maintain", "ViewRuntime", "apply_together"),
    ("answer publish", "incr.runtime.answer", "AnswerTable", "publish"),
    ("a(state)", "incr.runtime.answer", "AnswerTable", "compute"),
    ("state read setup", "incr.runtime.session", None, "read_delta"),
    ("Delta MERGE", "incr.runtime.store", "Merge", "execute"),
    ("Delta compaction", "incr.runtime.store", "DeltaStore", "compact"),
    ("Delta write", "incr.runtime.store", "DeltaStore", "write"),
    ("Delta open (log)", "incr.runtime.store", "DeltaStore", "table"),
    ("driver SQL (DuckDB)", "incr.runtime.local", "LocalSql", "query"),
    ("driver SQL (DuckDB)", "incr.runtime.local", "DriverEngine", "view"),
    ("driver SQL (DuckDB)", "incr.runtime.local", "DriverEngine", "collect"),
    ("state read", "incr.runtime.local", "DriverEngine", "delta"),
    ("state read", "incr.runtime.session", "SparkEngine", "delta"),
)
JOB_GROUP = "incr-bench-profile"


@dataclass
class Profile:
    """One profiled increment: exclusive seconds and calls per probe path, plus Spark costs."""

    total_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    spark_jobs: int = 0
    empty_job_s: float = 0.0
    shuffle_job_s: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """The profile as rows (path, calls, seconds, share), largest first."""
        out = [{"path": p, "calls": self.calls.get(p, 0), "seconds": s,
                "share": s / self.total_s if self.total_s else 0.0}
               for p, s in self.seconds.items()]
        return sorted(out, key=lambda r: -r["seconds"])

    def by_leaf(self) -> dict[str, float]:
        """Seconds per innermost probe (``Spark job → Arrow`` summed over every step, ...)."""
        out: dict[str, float] = {}
        for path, s in self.seconds.items():
            leaf = path.rsplit(" > ", 1)[-1]
            out[leaf] = out.get(leaf, 0.0) + s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class _Tracer:
    """Attributes wall-clock time to the innermost active probe."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self.stack: list[str] = ["pipeline.run (bookkeeping)"]
        self.last = time.perf_counter()

    def _account(self) -> None:
        now = time.perf_counter()
        path = " > ".join(self.stack)
        self.profile.seconds[path] = self.profile.seconds.get(path, 0.0) + now - self.last
        self.last = now

    def enter(self, label: str) -> None:
        self._account()
        self.stack.append(label)
        path = " > ".join(self.stack)
        self.profile.calls[path] = self.profile.calls.get(path, 0) + 1

    def leave(self) -> None:
        self._account()
        self.stack.pop()

    def wrap(self, label: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            self.enter(label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()
        return traced


@contextlib.contextmanager
def _patched(owner: Any, name: str, replacement: Callable) -> Iterator[None]:
    """Replaces ``owner.name`` for the block; an inherited method is un-shadowed afterwards."""
    own = not isinstance(owner, type) or name in owner.__dict__
    original = owner.__dict__[name] if isinstance(owner, type) and own else getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


def _median_seconds(fn: Callable[[], Any], repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def spark_job_costs(spark: SparkSession) -> tuple[float, float]:
    """Median seconds of a trivial one-stage Spark job and of a small two-stage (shuffle) job."""
    from pyspark.sql import functions as F

    def one() -> object:
        return spark.range(0, 1, 1, 1).toArrow()

    def two() -> object:
        return spark.range(0, 100, 1, 2).groupBy(F.col("id") % 7).count().toArrow()

    one(), two()  # warm up
    return _median_seconds(one), _median_seconds(two)


def profile_run(spark: SparkSession, run: Callable[[], Any]) -> tuple[Any, Profile]:
    """Calls ``run()`` (one ``Pipeline.run``) under the tracing probes; returns its result."""
    profile = Profile()
    profile.empty_job_s, profile.shuffle_job_s = spark_job_costs(spark)
    tracer = _Tracer(profile)
    df_class = type(spark.range(0))
    with contextlib.ExitStack() as stack:
        for label, module, cls, method in PROBES:
            try:
                owner = importlib.import_module(module)
                owner = getattr(owner, cls) if cls else owner
                fn = getattr(owner, method)
            except (ImportError, AttributeError):
                continue
            stack.enter_context(_patched(owner, method, tracer.wrap(label, fn)))
            if not cls:  # a module function: also patch modules that imported it by name
                for other in ("incr.runtime.maintain", "incr.runtime.rowindex"):
                    mod = importlib.import_module(other)
                    if getattr(mod, method, None) is fn:
                        stack.enter_context(_patched(mod, method, tracer.wrap(label, fn)))
        stack.enter_context(_patched(type(spark), "sql",
                                     tracer.wrap("Spark SQL parse/analyse", type(spark).sql)))
        reader = type(spark.read)
        stack.enter_context(_patched(reader, "parquet",
                                     tracer.wrap("Spark file read setup", reader.parquet)))
        stack.enter_context(_patched(df_class, "toArrow",
                                     tracer.wrap("Spark job → Arrow", df_class.toArrow)))
        sc = spark.sparkContext
        group = f"{JOB_GROUP}-{time.time_ns()}"
        sc.setJobGroup(group, "incr bench profile", interruptOnCancel=False)
        try:
            t0 = time.perf_counter()
            tracer.last = t0
            result = run()
            tracer._account()
            profile.total_s = time.perf_counter() - t0
        finally:
            profile.spark_jobs = len(sc.statusTracker().getJobIdsForGroup(group))
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
    return result, profile
