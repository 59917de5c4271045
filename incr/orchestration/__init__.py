"""Airflow integration: one DAG per program file, each task one call into incr."""
