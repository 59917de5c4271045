"""Views whose WHEREs AND conjuncts on the state's keys with one on the amount (share = rollup).

``sift.py``'s stream and measures (``../sifted/sift.py``), over a view by region and product,
one of the same grouping for big tickets (``amount > 500``), and three whose WHERE ANDs
that with conjuncts on region or product: one of the same grouping, two by region.
Run from the repository: ``PYTHONPATH=. .venv/bin/python docs/bench/issue18/parted/part.py OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sifted"))

import sift  # beside this script, not a package

P = sift.P
BIG = "amount > 500"
VIEWS = (
    ("CREATE VIEW fine AS SELECT region, product, SUM(amount) AS revenue, COUNT(*) AS orders "
     "FROM sales GROUP BY region, product;"),
    (f"CREATE VIEW big AS SELECT region, product, SUM(amount) AS revenue, COUNT(*) AS orders, "
     f"MAX(amount) AS top FROM sales WHERE {BIG} GROUP BY region, product;"),
    (f"CREATE VIEW big_inland AS SELECT region, product, SUM(amount) AS revenue, "
     f"COUNT(*) AS orders FROM sales WHERE region NOT IN ('coast', 'islands') AND {BIG} "
     f"GROUP BY region, product;"),
    (f"CREATE VIEW big_top2 AS SELECT region, SUM(amount) AS revenue, MAX(amount) AS top "
     f"FROM sales WHERE product IN ('{P[0]}', '{P[1]}') AND {BIG} GROUP BY region;"),
    (f"CREATE VIEW big_one AS SELECT region, AVG(amount) AS avg_ticket, COUNT(*) AS orders "
     f"FROM sales WHERE product = '{P[2]}' AND {BIG} GROUP BY region;"),
)


if __name__ == "__main__":
    sift.main(Path(sys.argv[1]), VIEWS)
