-- incr: append_only = points
-- incr: buckets = 4
--
-- k-means clustering, maintained incrementally (seed paper §2 "Iteration", Algorithm 1).
-- The iterate `centroids` starts at INITIAL; each STEP groups the points by their nearest
-- centroid (the paper's `group by k: (select c from c in centroids order by distance(c,s))[0]`)
-- and moves every centroid to the average of its points.  Each new batch of points runs
-- ITERATIONS steps warm-started from the current centroids; as in Algorithm 1, points that
-- arrived in earlier batches keep the centroid they were assigned to (so the stream must be
-- insert-only: append_only above).

CREATE TABLE points (x DOUBLE, y DOUBLE);

CREATE VIEW centroids (cid BIGINT, x DOUBLE, y DOUBLE) AS ITERATE
  INITIAL (SELECT * FROM (VALUES (1, 1.0, 1.0), (2, 1.0, 9.0), (3, 9.0, 1.0), (4, 9.0, 9.0))
                         AS c(cid, x, y))
  STEP (SELECT (SELECT c.cid FROM centroids c
                ORDER BY (c.x - p.x) * (c.x - p.x) + (c.y - p.y) * (c.y - p.y), c.cid
                LIMIT 1) AS cid,
               AVG(p.x) AS x, AVG(p.y) AS y
        FROM points p
        GROUP BY 1)
  ITERATIONS 10;
