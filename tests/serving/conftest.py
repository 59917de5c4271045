"""The serving tests' shared warehouse: the program of ``program.py`` with batches applied."""

from __future__ import annotations

import pytest

from tests.serving.program import APPLIED, applied_warehouse


@pytest.fixture(scope="session")
def base(spark, tmp_path_factory):
    """A warehouse with batches 0..APPLIED-1 applied, one at a time (the first publish needs
    Spark); read-only for the tests (``copy`` in test_snapshots gives one to change)."""
    return applied_warehouse(spark, tmp_path_factory.mktemp("snapshots"), APPLIED)
