-- incr: buckets = 4
--
-- Largest active region (seed 004 §7): sensors that are active and linked form regions;
-- each active sensor's region is named by the smallest sensor it reaches through active
-- ones, and the view keeps every region's size.  Sensors switch on and off (inserts and
-- deletes of `active`) and links come and go.

CREATE TABLE near (src BIGINT, dst BIGINT);
CREATE TABLE active (sensor BIGINT);

CREATE VIEW region_sizes AS
  WITH RECURSIVE c (sensor, other) AS (
    SELECT sensor, sensor FROM active
    UNION
    SELECT c.sensor, n.dst FROM c JOIN near AS n ON c.other = n.src
    JOIN active AS a ON a.sensor = n.dst)
  SELECT region, COUNT(*) AS sensors
  FROM (SELECT sensor, MIN(other) AS region FROM c GROUP BY sensor) AS m
  GROUP BY region
  ORDER BY sensors DESC, region
  LIMIT 5;
