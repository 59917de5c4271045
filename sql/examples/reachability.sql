-- incr: buckets = 4
--
-- Reachability (seed 004 §2): which nodes each node reaches over the links, kept exact as
-- links are inserted and deleted.  Inserts propagate by semi-naive evaluation; deletes by
-- delete-and-rederive, so a cut cycle or a lost alternative path is handled exactly.

CREATE TABLE links (src BIGINT, dst BIGINT);

CREATE VIEW reachable AS
  WITH RECURSIVE r (src, dst) AS (
    SELECT src, dst FROM links
    UNION
    SELECT r.src, l.dst FROM r JOIN links AS l ON r.dst = l.src)
  SELECT src, dst FROM r;

CREATE VIEW reach_counts AS
  WITH RECURSIVE r (src, dst) AS (
    SELECT src, dst FROM links
    UNION
    SELECT r.src, l.dst FROM r JOIN links AS l ON r.dst = l.src)
  SELECT src, COUNT(*) AS reachable FROM r GROUP BY src;
