-- incr: dialect = duckdb
-- incr: buckets = 4
--
-- Retail reporting with subtotals and set differences.  Files land in LANDING/sales/,
-- LANDING/returns/ (and their _deletes/ folders for corrections).

CREATE TABLE sales (
    region   VARCHAR,
    store    BIGINT,
    customer BIGINT,
    amount   DOUBLE
);

CREATE TABLE returns (
    store    BIGINT,
    customer BIGINT,
    refund   DOUBLE
);

-- Revenue by region and store, with a subtotal per region and a grand total
-- (level 0 = store, 1 = region subtotal, 3 = grand total).
CREATE VIEW revenue_rollup AS
SELECT region, store, SUM(amount) AS revenue, COUNT(*) AS sales,
       GROUPING(region, store) AS level
FROM sales
GROUP BY ROLLUP (region, store)
ORDER BY level, region, store;

-- Customers who bought at a store and never returned anything there.
CREATE VIEW loyal_customers AS
SELECT store, customer FROM sales
EXCEPT
SELECT store, customer FROM returns;

-- How many (store, customer) pairs both bought and returned, per store.
CREATE VIEW returning_pairs AS
SELECT store, COUNT(*) AS pairs
FROM (SELECT store, customer FROM sales INTERSECT SELECT store, customer FROM returns) AS both_sides
GROUP BY store;
