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

-- Each sale's share of its region's revenue, and its rank there (window functions: a batch
-- recomputes the windows of the regions it touches only).
CREATE VIEW sale_share AS
SELECT region, store, customer, amount,
       amount / SUM(amount) OVER (PARTITION BY region) AS share,
       RANK() OVER (PARTITION BY region ORDER BY amount DESC) AS amount_rank
FROM sales;

-- The two best stores of each region by revenue (top-N per group over an aggregate).
CREATE VIEW top_stores AS
SELECT region, store, revenue FROM (
    SELECT region, store, SUM(amount) AS revenue,
           ROW_NUMBER() OVER (PARTITION BY region ORDER BY SUM(amount) DESC, store) AS place
    FROM sales GROUP BY region, store
) AS ranked
WHERE place <= 2;

-- Each store's refunds as a running total over its customers, and their share of the total.
CREATE VIEW refund_running AS
SELECT store, customer, SUM(refund) AS refunds,
       SUM(SUM(refund)) OVER (PARTITION BY store ORDER BY customer) AS running_refunds,
       SUM(refund) / SUM(SUM(refund)) OVER () AS share_of_all
FROM returns
GROUP BY store, customer;
