"""Views whose WHEREs are LIKE patterns (share = rollup), on ``sift.py``'s stream and measures.

A view by region and product, one by region for ``product LIKE 'p0%'`` and one by product for
``region LIKE 'n%'``; with ``one`` after OUT, the same with patterns of ``_`` (one character):
``product LIKE 'p_3'`` and ``region LIKE '_o%'``.  Run from the repository:
``PYTHONPATH=. .venv/bin/python docs/bench/issue18/added/like.py OUT [one]``.
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
     "WHERE product LIKE 'p0%' GROUP BY region;"),
    ("CREATE VIEW north AS SELECT product, SUM(amount) AS revenue FROM sales "
     "WHERE region LIKE 'n%' GROUP BY product;"),
)

ONE = (
    VIEWS[0],
    VIEWS[1].replace("p0%", "p_3"),
    VIEWS[2].replace("'n%'", "'_o%'"),
)


if __name__ == "__main__":
    sift.main(Path(sys.argv[1]), ONE if sys.argv[2:] == ["one"] else VIEWS)
