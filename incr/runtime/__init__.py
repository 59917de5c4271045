"""The runtime: the only code that touches Spark and Delta Lake.

* :mod:`~incr.runtime.session`: the SparkSession (local by default) and Delta reads for Spark.
* :mod:`~incr.runtime.store`: the storage adapter; every Delta write goes through it.
* :mod:`~incr.runtime.landing` and :mod:`~incr.runtime.ledger`: which files are batches,
  in which order; :mod:`~incr.runtime.remote`: a landing area on an object store.
* :mod:`~incr.runtime.ingest`: reading a batch file, strictly, into Spark.
* :mod:`~incr.runtime.rowindex`: the live rows of a source, so deletions are checked.
* :mod:`~incr.runtime.maintain`: h, ⊗/⊗̃ and a for one view and one batch.
* :mod:`~incr.runtime.pipeline`: the whole run, exactly once per batch.
"""
