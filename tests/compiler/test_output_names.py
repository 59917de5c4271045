"""Unaliased output columns are named as DuckDB names them (``count_star()``, ``sum(x)``).

Each expression is run by DuckDB as an unaliased SELECT item and named by
:func:`~incr.compiler.frontend.name_outputs.duckdb_name` from the same text; the two names
must be equal.  The list is what dashboards write unaliased: aggregates, arithmetic,
comparisons, CASE, CAST, calls spelled many ways, window functions.
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot

from incr.compiler import compile_text
from incr.compiler.frontend.name_outputs import Spelling, duckdb_name

ITEMS = [
    '-x',
    '- a',
    'NOT (a>0)',
    'a>0 and x<1',
    'a>0 or x<1 and k=1',
    'a>0 and x<1 and k=1',
    'true',
    'null',
    '1',
    '100000000000',
    '2.50',
    "'it''s'",
    'a || s',
    "s like 'a%'",
    "s not like 'a%'",
    "s ilike 'x'",
    'a not in (1,2)',
    'a in (1, 2)',
    'a between 0 and 1',
    'a not between 1 and 2',
    'x is null',
    'x is not null',
    'a <> 1',
    'a != 1',
    'a % 2',
    'a / 2',
    'a // 2',
    'cast(x as decimal(10,2))',
    'cast(a as bigint)',
    'x::int',
    'cast(a as varchar)',
    'cast(a as double)',
    'cast(a as date)',
    "date '2020-01-01'",
    'cast(a as float)',
    'cast(a as text)',
    'round(x, 2)',
    'UPPER(s)',
    'sum(a*x)',
    'count(a)',
    'count(distinct a)',
    'avg(distinct x)',
    'sum( DISTINCT\n a )',
    'min(s)',
    'max(x)',
    'stddev(x)',
    'stddev_samp(x)',
    'stddev_pop(x)',
    'variance(x)',
    'var_samp(x)',
    'var_pop(x)',
    'sum("My Col")',
    't."My Col" + 1',
    'sum("year")',
    'sum(value)',
    'case when a>0 then 1 else 2 end',
    'case a when 1 then 2 end',
    'case when a > 0 then x end',
    'coalesce(a,k,0)',
    'nullif(a,0)',
    'abs(a)',
    'year(d)',
    'month(d)',
    'extract(year from d)',
    'sum(x) filter (where a > 0)',
    'count(*) filter (where a>0)',
    'count(1)',
    'substring(s, 1, 2)',
    'greatest(a,k)',
    'least(a, k)',
    '(a)',
    '((a+1))',
    'a*(x+1)',
    '(a+1)*2',
    'a+1+2',
    'a-(1-2)',
    'sum(a)/sum(x)',
    '100.0*sum(a)',
    'cast(sum(x) as int)',
    "concat(s, 'x')",
    "lower(s) = 'a'",
    'sum(t.a)',
    'Sum(A)',
    'COUNT(*)',
    'count()',
    "date_trunc('month', d)",
    'power(x,2)',
    'sqrt(x)',
    'a & 1',
    'length(s)',
    'ln(x)',
    'floor(x)',
    'ceil(x)',
    "date_diff('day', d, d)",
    "strftime(d, '%Y')",
    'if(a>0,1,2)',
    '-1',
    '-1.5',
    'max(x) - min(x)',
    'count(*)*1.0/count(distinct k)',
    'sum(case when a>0 then x else 0 end)',
    'round(avg(x),2)',
    'x % 2 = 0',
    'row_number() over (partition by k order by x desc)',
    'rank() over (order by x)',
    'sum(x) over (partition by k)',
    'sum(x) over ()',
    'sum(x) over (partition by k, a order by x rows between 1 preceding and current row)',
    'lag(x, 1) over (order by x)',
    'count(*) over (partition by k)',
    'avg(x) over (order by d)',
    'dense_rank() over (partition by k order by x desc)',
    'ntile(4) over (order by x)',
    'sum(x) / sum(sum(x)) over (partition by k)',
    'grouping(k)',
    'a or k or x',
    'not (a=1 and k=1)',
    'left(s, 2)',
    "replace(s, 'a', 'b')",
    'first(a)',
    'any_value(a)',
    'median(x)',
    'trim(s)',
    'sum(distinct a)',
    'count(distinct a + 1)',
    'round(sum(x) / count(*), 2)',
    'coalesce(sum(x), 0)',
    'sum(coalesce(x, 0))',
    "max(case when s = 'a' then x end)",
    'sum(x * (1 - x))',
    "avg(x) filter (where s like 'a%')",
    'cast(count(*) as double) / sum(x)',
    'upper(trim(s))',
    'abs(-x)',
    '-sum(x)',
]

TABLE = ('CREATE TABLE t (a INTEGER, x DOUBLE, k INTEGER, s VARCHAR, d DATE, "year" INTEGER, '
         '"My Col" INTEGER, "value" INTEGER)')


@pytest.fixture(scope="module")
def con():
    con = duckdb.connect()
    con.execute(TABLE)
    yield con
    con.close()


def _duckdb(con, item: str) -> str:
    try:
        return con.execute(f"SELECT {item} FROM t").description[0][0]
    except duckdb.Error:
        return con.execute(f"SELECT {item} FROM t GROUP BY k, a").description[0][0]


@pytest.mark.parametrize("item", ITEMS)
def test_item_is_named_as_duckdb_names_it(con, item: str) -> None:
    query = f"SELECT {item} FROM t"
    tree = sqlglot.parse_one(query, read="duckdb")
    assert duckdb_name(tree.expressions[0], Spelling(query)) == _duckdb(con, item)


@pytest.mark.parametrize("select", [
    "SELECT k, COUNT(*), SUM(x), sum(x), AVG(x) * 2 FROM t GROUP BY k",
    "SELECT k, a, k FROM t",
    "SELECT k, SUM(x) / SUM(SUM(x)) OVER () FROM t GROUP BY k",
    "SELECT k, COUNT(DISTINCT a) FROM t GROUP BY ROLLUP (k)",
    "SELECT k FROM t EXCEPT SELECT a FROM t",
    "WITH c AS (SELECT k, SUM(x), COUNT(*) FROM t GROUP BY k) SELECT * FROM c",
    'SELECT s."sum(x)" * 2, s.k FROM (SELECT k, SUM(x) FROM t GROUP BY k) AS s',
])
def test_view_outputs_carry_the_names_of_a_duckdb_table(con, select: str) -> None:
    plan = compile_text(f"{TABLE};\nCREATE VIEW w AS {select};", "names.sql").plans[0]
    con.execute(f"CREATE OR REPLACE TABLE w AS {select}")
    expected = [row[0] for row in con.execute("SELECT * FROM w").description]
    assert list(plan.output) == expected
