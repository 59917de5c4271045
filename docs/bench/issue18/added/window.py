"""Views whose WHEREs are time windows of TIMESTAMP literals (share = rollup).

``sift.py``'s stream and run loop (the sales of ``incr bench sharing``: 200,000 rows, then 12
increments of 1,000, every third a delete) with one more column, ``sold_at TIMESTAMP``: a moment
of November 2026 that follows from the row's other values, so a deleted row names the same
moment.  A view
by region and product, one by region of the last week (``sold_at >= TIMESTAMP '2026-11-24
00:00:00'``) and one by product of ten days; with ``daily`` after OUT, daily grains instead
(``CAST(sold_at AS DATE)``: revenue by day, and by region and day of the last week).  Prints
the oracle's verdict, the state tables and the seconds per run.  Run from the repository:
``PYTHONPATH=. .venv/bin/python docs/bench/issue18/added/window.py OUT [daily]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from incr.bench import sharing

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sifted"))

import sift  # beside this script's folder, not a package

SOURCES = sharing.SOURCES.replace("qty BIGINT);", "qty BIGINT, sold_at TIMESTAMP);")
VIEWS = (
    ("CREATE VIEW fine AS SELECT region, product, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales GROUP BY region, product;"),
    ("CREATE VIEW last_week AS SELECT region, SUM(amount) AS revenue, MAX(amount) AS top "
     "FROM sales WHERE sold_at >= TIMESTAMP '2026-11-24 00:00:00' GROUP BY region;"),
    ("CREATE VIEW ten_days AS SELECT product, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales WHERE sold_at >= TIMESTAMP '2026-11-10 00:00:00' "
     "AND sold_at < TIMESTAMP '2026-11-20 00:00:00' GROUP BY product;"),
)
DAILY = (
    VIEWS[0],
    ("CREATE VIEW by_day AS SELECT CAST(sold_at AS DATE) AS day, SUM(amount) AS revenue, "
     "COUNT(*) AS orders FROM sales GROUP BY CAST(sold_at AS DATE);"),
    ("CREATE VIEW region_days AS SELECT region, CAST(sold_at AS DATE) AS day, "
     "SUM(amount) AS revenue FROM sales WHERE sold_at >= TIMESTAMP '2026-11-24 00:00:00' "
     "GROUP BY region, CAST(sold_at AS DATE);"),
)
#: 2026-11-01 00:00:00 in microseconds since the epoch, and the seconds of November.
START_US = 1_793_491_200_000_000
MONTH_S = 30 * 24 * 3600


def with_moments(table: pa.Table) -> pa.Table:
    """``table`` with ``sold_at``: a second of November 2026 hashed from the row's other values."""
    cents = np.round(table.column("amount").to_numpy() * 100).astype(np.int64)
    mixed = (table.column("customer").to_numpy() * 7919 + table.column("qty").to_numpy() * 104729
             + cents * 31) % MONTH_S
    return table.append_column("sold_at", pc.cast(pa.array(START_US + mixed * 1_000_000),
                                             pa.timestamp("us")))


if __name__ == "__main__":
    sift.main(Path(sys.argv[1]), DAILY if sys.argv[2:] == ["daily"] else VIEWS, SOURCES,
              with_moments)
