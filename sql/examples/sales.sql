-- incr: dialect = duckdb
-- incr: buckets = 8
-- incr: schedule = @hourly
--
-- Sales analytics: the demo program (`make demo`).  Files land in
-- LANDING/sales/ (inserts) and LANDING/sales/_deletes/ (returns and corrections).

CREATE TABLE sales (
    region  VARCHAR,
    product VARCHAR,
    amount  DOUBLE,
    qty     BIGINT
);

-- Average ticket and volume per region, for regions with more than one sale.
CREATE VIEW region_summary AS
SELECT region,
       AVG(amount)             AS avg_amount,
       COUNT(*)                AS n,
       SUM(qty)                AS units,
       MIN(amount)             AS smallest,
       MAX(amount)             AS largest,
       COUNT(DISTINCT product) AS products
FROM sales
WHERE qty > 0
GROUP BY region
HAVING COUNT(*) > 1
ORDER BY region;

-- Revenue per region, largest first.  It reads what region_summary reads (sales with
-- qty > 0, by region), so the two views keep one state: each batch is folded once
-- (`incr explain` shows the sharing).
CREATE VIEW region_revenue AS
SELECT region, SUM(amount * qty) AS revenue, MAX(amount) AS largest_sale
FROM sales
WHERE qty > 0
GROUP BY region
ORDER BY revenue DESC, region;

-- The ten best-selling products by revenue.
CREATE VIEW top_products AS
SELECT product, SUM(amount * qty) AS revenue, COUNT(*) AS orders
FROM sales
WHERE qty > 0
GROUP BY product
ORDER BY revenue DESC, product
LIMIT 10;

-- Whole-stream statistics (a global aggregate: one row, even when empty).
CREATE VIEW overall AS
SELECT COUNT(*) AS rows_seen, SUM(amount) AS total_amount, STDDEV_SAMP(amount) AS sd_amount,
       VAR_SAMP(qty) AS var_qty, COUNT(DISTINCT region) AS regions
FROM sales;
