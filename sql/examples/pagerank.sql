-- incr: buckets = 4
--
-- PageRank, maintained incrementally (seed paper §2 "Iteration", §8.2 diffusion).
-- rank(n) = 0.15 + 0.85 * Σ rank(m) / outdeg(m) over the edges m → n; a node exists once
-- an edge names it.  The iterate `ranks` carries each node's out-degree, counted in the
-- same step, so the step reads each edge on its own and stays a homomorphism in `edges`.
-- When a batch of edges lands, the step's state is updated exactly and the ranks that
-- change propagate along the edges leaving them, one hop per step (diffusion); changes
-- below TOLERANCE (relative) are not propagated further.  Edges may be deleted.

CREATE TABLE edges (src BIGINT, dst BIGINT);

CREATE VIEW ranks (node BIGINT, rank DOUBLE, outdeg BIGINT) AS ITERATE
  INITIAL (SELECT node, 1.0 AS rank, SUM(deg) AS outdeg
           FROM (SELECT src AS node, 1 AS deg FROM edges
                 UNION ALL
                 SELECT dst AS node, 0 AS deg FROM edges) AS n
           GROUP BY node)
  STEP (SELECT node, 0.15 + 0.85 * SUM(contrib) AS rank, SUM(deg) AS outdeg
        FROM (SELECT e.dst AS node, r.rank / r.outdeg AS contrib, 0 AS deg
              FROM edges e JOIN ranks r ON e.src = r.node
              UNION ALL
              SELECT e.src AS node, 0.0 AS contrib, 1 AS deg FROM edges e
              UNION ALL
              SELECT e.dst AS node, 0.0 AS contrib, 0 AS deg FROM edges e) AS c
        GROUP BY node)
  ITERATIONS 10 TOLERANCE 1e-6;
