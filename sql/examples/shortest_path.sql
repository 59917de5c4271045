-- incr: buckets = 4
--
-- Shortest paths (seed 004 §6): the cheapest path and the fewest hops between two nodes.
-- The recursion carries the path's cost and hop count.  The query reads it only through
-- MIN(cost) and MIN(hops), so R keeps per (src, dst) only the paths no other path beats on
-- both (aggregate selection, seed 004 §6); the hop bound is the seed's, and MIN over R is
-- maintained under deletion like any other MIN.

CREATE TABLE links (src BIGINT, dst BIGINT, cost BIGINT);

CREATE VIEW shortest_paths AS
  WITH RECURSIVE p (src, dst, cost, hops) AS (
    SELECT src, dst, cost, 1 FROM links
    UNION
    SELECT p.src, l.dst, p.cost + l.cost, p.hops + 1
    FROM p JOIN links AS l ON p.dst = l.src
    WHERE p.hops < 6)
  SELECT src, dst, MIN(cost) AS cheapest, MIN(hops) AS fewest_hops
  FROM p WHERE src <> dst GROUP BY src, dst;
