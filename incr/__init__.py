"""incr: ordinary analytic SQL compiled into incremental Spark + Delta pipelines.

The package is split the way data flows:

* :mod:`incr.compiler` and :mod:`incr.algebra` are pure Python. They turn a program
  file into an :class:`~incr.compiler.plan.IncrementalPlan` per view (h, ⊗, ⊗̃, ⊗̂, a
  and the state schema) and never import Spark or Delta.
* :mod:`incr.runtime` is the only code that touches Spark and Delta Lake.
* :mod:`incr.orchestration` builds the Airflow DAGs; :mod:`incr.cli` is the ``incr`` command.
"""

__version__ = "0.1.0"
