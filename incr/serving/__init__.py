"""BI access: a program's answer tables, served by name, one consistent snapshot per query.

* :mod:`~incr.serving.snapshots`: which program-level snapshots a warehouse holds (for batch
  N, each view's answer version and its exact Parquet files); delta-rs only, no Spark.
* :mod:`~incr.serving.links`: a read-only folder per answer version holding exactly its
  files (hard links), and the rows its deletion vectors delete, what a reader that is not
  Delta-aware may be pointed at.
* :mod:`~incr.serving.catalog`: those snapshots registered in a Spark catalog: a database
  per pinned snapshot and one for the latest.
* :mod:`~incr.serving.thrift`: Spark's Thrift JDBC/ODBC server (HiveServer2 protocol) over
  that catalog, kept current by a refresh loop (``incr serve``).
* :mod:`~incr.serving.duckdb_file`: the same snapshots as a DuckDB database file
  (``incr catalog``).
"""
