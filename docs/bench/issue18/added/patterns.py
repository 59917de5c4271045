"""Views whose WHEREs are regular expressions (share = rollup), on ``sift.py``'s stream.

``like.py``'s views with DuckDB patterns instead of LIKE: a view by region and product, one
by region for ``regexp_matches(product, '^p0')`` and one by product for ``region ~ 'n.*'``
(a full match).  Run from the repository:
``PYTHONPATH=. .venv/bin/python docs/bench/issue18/added/patterns.py OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sifted"))

import sift  # beside this script's folder, not a package

VIEWS = (
    ("CREATE VIEW fine AS SELECT region, product, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales GROUP BY region, product;"),
    ("CREATE VIEW p0 AS SELECT region, SUM(amount) AS revenue, MAX(amount) AS top FROM sales "
     "WHERE regexp_matches(product, '^p0') GROUP BY region;"),
    ("CREATE VIEW north AS SELECT product, SUM(amount) AS revenue FROM sales "
     "WHERE region ~ 'n.*' GROUP BY product;"),
)


if __name__ == "__main__":
    sift.main(Path(sys.argv[1]), VIEWS)
