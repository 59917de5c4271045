"""Refusals and compile errors: every one names the construct, the view, the file and the line.

Each case is a multi-line program: a source table, a view that compiles, then the view
``bad`` whose SELECT holds one unsupported or wrong construct.  The expected line is the
line of a marker string in the program text (searched from the start of ``bad``), so the
cases read like the SQL a user would write and the line numbers mean something.

Also covered: errors raised while reading the program itself (syntax, statements other than
CREATE TABLE / CREATE VIEW, column types, reserved names) and how ``incr explain`` reports
them (exit code 2, one ``error: <path>:<line>: ...`` line on stderr).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from incr import cli
from incr.compiler import compile_text
from incr.compiler.program import parse_program
from incr.errors import CompileError, IncrError, NotIncrementalizableError, ParseError

REPO = Path(__file__).resolve().parents[2]
SALES = REPO / "sql" / "examples" / "sales.sql"
PATH = "programs/bad.sql"

PROLOGUE = """-- incr: dialect = duckdb
-- A program for the error tests.

CREATE TABLE sales (
    region  VARCHAR,
    product VARCHAR,
    amount  DOUBLE,
    qty     BIGINT,
    sold_at TIMESTAMP
);

-- A view that compiles, so errors must name the right one.
CREATE VIEW fine AS
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY region;

CREATE VIEW bad AS """


def program(body: str) -> str:
    return PROLOGUE + body.strip() + ";\n"


def line_of(text: str, marker: str, after: str = "CREATE VIEW bad") -> int:
    """1-based line of the first ``marker`` at or after ``after`` in ``text``."""
    start = text.index(after)
    pos = text.index(marker, start)
    return text.count("\n", 0, pos) + 1


def compile_error(text: str) -> IncrError:
    with pytest.raises(IncrError) as info:
        compile_text(text, path=PATH)
    return info.value


N = NotIncrementalizableError
C = CompileError

# (id, SELECT body, error class, fragments the message must hold, marker of the error's line)
VIEW_CASES = [
    ("non-equi-correlation", """
SELECT region, amount
FROM sales AS s
WHERE EXISTS (SELECT 1 FROM sales AS u
              WHERE u.region = s.region AND u.amount - s.amount > 0
                AND u.qty < s.qty)""", N,
     ["correlated subquery whose correlation is not an AND of comparisons",
      "inner.x > outer.y + 1"], "EXISTS"),
    ("right-join-after-join", """
SELECT s.region, COUNT(*) AS n
FROM sales AS s
JOIN sales AS u ON s.region = u.region
    RIGHT JOIN sales AS w
    ON s.product = w.product
GROUP BY s.region""", N, ["RIGHT JOIN after other joins", "LEFT JOIN"], "RIGHT JOIN"),
    ("window-in-where", """
SELECT region,
       amount
FROM sales
WHERE ROW_NUMBER() OVER (PARTITION BY region ORDER BY amount) = 1""", C,
     ["window function", "SELECT item", "after WHERE"], "ROW_NUMBER"),
    ("window-distinct-aggregate", """
SELECT region,
       amount,
       COUNT(DISTINCT product) OVER (PARTITION BY region) AS products
FROM sales""", N, ["DISTINCT aggregate as a window function"], "COUNT(DISTINCT"),
    ("random", """
SELECT region, amount
FROM sales
WHERE qty > 0
  AND random() < 0.5""", N, ["non-deterministic function", "RAND"], "random()"),
    ("now", """
SELECT region, COUNT(*) AS n
FROM sales
WHERE sold_at > now() - INTERVAL 1 DAY
GROUP BY region""", N, ["non-deterministic function", "NOW"], "now()"),
    ("uuid", """
SELECT region,
       uuid() AS id
FROM sales""", N, ["non-deterministic function", "UUID"], "uuid()"),
    ("limit-in-subquery", """
SELECT region, COUNT(*) AS n
FROM (SELECT * FROM sales ORDER BY amount
      LIMIT 10) AS s
GROUP BY region""", N, ["LIMIT/OFFSET in a nested query"], "LIMIT 10"),
    ("not-in-subquery", """
SELECT region, amount
FROM sales
WHERE qty > 0
  OR product NOT IN (SELECT product FROM sales AS u WHERE u.qty > 3)""", N,
     ["NOT IN (subquery)", "NOT EXISTS"], "NOT IN"),
    ("left-join-non-equi-condition", """
SELECT s.region, COUNT(u.qty) AS n
FROM sales AS s
LEFT JOIN sales AS u ON s.product = u.product
    AND s.qty > u.qty
GROUP BY s.region""", N, ["LEFT JOIN condition", "conditions on either table alone"],
     "AND s.qty > u.qty"),
    ("union-mixed", """
SELECT region FROM sales UNION SELECT product FROM sales AS u UNION ALL SELECT region FROM sales AS w""",
     N, ["UNION mixed with UNION ALL"], "SELECT region FROM sales UNION"),
    ("left-join-non-equi", """
SELECT s.region, COUNT(u.qty) AS n
FROM sales AS s
LEFT JOIN sales AS u ON s.amount < u.amount
GROUP BY s.region""", N, ["LEFT JOIN condition"], "LEFT JOIN"),
    ("select-distinct-aggregate", """SELECT DISTINCT region,
       COUNT(*) AS n
FROM sales GROUP BY region""", N, ["SELECT DISTINCT with aggregates", "GROUP BY"], "DISTINCT"),
    ("median", """
SELECT region,
       MEDIAN(amount) AS mid
FROM sales
GROUP BY region""", N, ["aggregate MEDIAN", "supported aggregates are"], "MEDIAN"),
    ("median-in-having", """
SELECT region, COUNT(*) AS n
FROM sales
GROUP BY region
HAVING MEDIAN(amount) > 10""", N, ["aggregate MEDIAN"], "MEDIAN"),
    ("mode", """
SELECT region,
       mode(product) AS usual
FROM sales
GROUP BY region""", N, ["aggregate MODE"], "mode("),
    ("sum-distinct", """
SELECT region,
       SUM(DISTINCT qty) AS s
FROM sales
GROUP BY region""", N, ["SUM(DISTINCT ...)", "only COUNT takes DISTINCT"], "SUM(DISTINCT"),
    ("filtered-median", """
SELECT region,
       MEDIAN(qty) FILTER (WHERE amount > 0) AS s
FROM sales
GROUP BY region""", N, ["aggregate MEDIAN", "BOOL_OR"], "MEDIAN"),
    ("cube-too-wide", """
SELECT region, product, qty, amount, SUM(amount) AS total
FROM sales
GROUP BY
    CUBE (region, product, qty, amount), CUBE (region, product, qty)""", N,
     ["128 grouping sets", "at most 64"], "CUBE"),
    ("with-rollup", """
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY region WITH ROLLUP""", N, ["GROUP BY ROLLUP"], "GROUP BY"),
    ("pivot", """
SELECT *
FROM sales
    PIVOT (SUM(amount) FOR region IN ('north', 'south'))""", N, ["PIVOT"], "sales\n    PIVOT"),
    ("tablesample", """
SELECT region, amount
FROM sales
    TABLESAMPLE (10 PERCENT)""", N, ["TABLESAMPLE"], "sales\n    TABLESAMPLE"),
    ("qualify", """
SELECT region, amount
FROM sales
QUALIFY amount > 1""", N, ["QUALIFY"], "QUALIFY"),
    ("unknown-table", """
SELECT region, COUNT(*) AS n
FROM returns
GROUP BY region""", C, ["unknown table returns", "declared tables: sales"], "returns"),
    ("unknown-column", """
SELECT region,
       SUM(price) AS total
FROM sales
GROUP BY region""", C, ["unknown column price", "region, product, amount, qty, sold_at"],
     "price"),
    ("unknown-column-in-where", """
SELECT region, amount
FROM sales
WHERE discount > 0""", C, ["unknown column discount"], "discount"),
    ("unknown-qualifier", """
SELECT region, amount
FROM sales AS s
WHERE x.qty > 0""", C, ["unknown table or alias x"], "x.qty"),
    ("column-not-in-group-by", """
SELECT region,
       product,
       SUM(amount) AS total
FROM sales
GROUP BY region""", C, ["column product in SELECT must appear in GROUP BY"], "product,"),
    ("column-not-in-group-by-having", """
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY region
HAVING qty > 1""", C, ["column qty in HAVING must appear in GROUP BY"], "qty > 1"),
    ("column-not-in-group-by-order", """
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY region
ORDER BY product""", C, ["column product in ORDER BY must appear in GROUP BY"], "product"),
    ("aggregate-in-where", """
SELECT region, COUNT(*) AS n
FROM sales
WHERE SUM(qty) > 10
GROUP BY region""", C, ["aggregates are not allowed in WHERE", "HAVING"], "WHERE"),
    ("aggregate-in-where-of-plain-select", """
SELECT region, amount
FROM sales
WHERE COUNT(*) > 10""", C, ["aggregates are not allowed in WHERE"], "WHERE"),
    ("nested-aggregate", """
SELECT region,
       SUM(MAX(qty)) AS s
FROM sales
GROUP BY region""", C, ["aggregates cannot be nested"], "SUM(MAX"),
    ("star-with-group-by", """
SELECT *
FROM sales
GROUP BY region""", C, ["SELECT * cannot be combined with GROUP BY"], "*"),
    ("limit-not-literal", """
SELECT region, amount
FROM sales
LIMIT qty""", C, ["LIMIT must be a non-negative integer literal"], "LIMIT"),
    ("join-column-outside-group-by-named-as-written", """
SELECT s.region, COUNT(*) AS n
FROM sales s
JOIN sales t ON s.product = t.product
GROUP BY s.region
ORDER BY t.amount""", C, ["column t.amount in ORDER BY must appear in GROUP BY"], "ORDER BY t.amount"),
    ("cte-column-outside-group-by-named-as-written", """
WITH tmp AS (SELECT product, SUM(amount) AS ext_price FROM sales GROUP BY product)
SELECT s.region,
       tmp.ext_price,
       COUNT(*) AS n
FROM tmp JOIN sales s ON tmp.product = s.product
GROUP BY s.region""", C, ["column tmp.ext_price in SELECT"], "tmp.ext_price,"),
    ("unresolved-column-in-nested-query-located", """
WITH tmp AS (SELECT product, SUM(amount) AS ext_price FROM sales GROUP BY product)
SELECT tmp.product,
       nope
FROM tmp""", C, ["Column 'nope' could not be resolved"], "nope"),
    ("group-by-position-out-of-range", """
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY 3""", C, ["GROUP BY position 3 is out of range"], "GROUP BY 3"),
]


@pytest.mark.parametrize("body, cls, fragments, marker",
                         [pytest.param(*case[1:], id=case[0]) for case in VIEW_CASES])
def test_view_error(body: str, cls: type[IncrError], fragments: list[str], marker: str):
    text = program(body)
    err = compile_error(text)
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert err.message.startswith("view bad: "), err.message
    for fragment in fragments:
        assert fragment.lower() in err.message.lower(), f"{fragment!r} not in {err.message!r}"
    assert err.location is not None
    assert err.location.path == PATH
    assert err.location.line == line_of(text, marker), (str(err), marker)
    assert str(err).startswith(f"{PATH}:{err.location.line}")
    assert err.exit_code == 2


def test_string_agg_is_refused_as_an_unsupported_aggregate():
    # sqlglot reads STRING_AGG as GROUP_CONCAT, and the message uses sqlglot's name.
    body = """
SELECT region,
       STRING_AGG(product, ',') AS products
FROM sales
GROUP BY region"""
    text = program(body)
    err = compile_error(text)
    assert isinstance(err, NotIncrementalizableError)
    assert "view bad: aggregate" in err.message and "is not supported" in err.message
    assert "STRING_AGG" in err.message or "GROUP_CONCAT" in err.message
    assert err.location.line == line_of(text, "STRING_AGG")


def test_union_all_compiles_to_one_stage_with_a_branch_per_select():
    body = """
SELECT region, product
FROM sales
WHERE qty > 0
UNION ALL
SELECT region, product
FROM sales
WHERE qty < 0"""
    plan = compile_text(program(body), path=PATH).plan("bad")
    assert [s.name for s in plan.stages] == [""]
    assert len(plan.top.branches) == 2
    assert plan.output == ("region", "product")


@pytest.mark.parametrize(("op", "having", "explode"), [
    ("INTERSECT", "_a0 > 0 AND _a1 > 0", None),
    ("EXCEPT", "_a0 > 0 AND _a1 = 0", None),
    ("INTERSECT ALL", "LEAST(_a0, _a1) > 0", "LEAST(_a0, _a1)"),
    ("EXCEPT ALL", "_a0 - _a1 > 0", "_a0 - _a1"),
])
def test_intersect_and_except_count_each_side_per_row(op: str, having: str, explode: str | None):
    from incr.compiler.ir import Aggregate, Explode, Filter

    plan = compile_text(program(f"SELECT region FROM sales WHERE qty > 0\n{op}\n"
                                f"SELECT region FROM sales WHERE qty < 0"), path=PATH).plan("bad")
    assert [s.name for s in plan.stages] == [""] and plan.output == ("region",)
    nodes = list(plan.top.logical.walk())
    assert [n.predicate.sql for n in nodes if isinstance(n, Filter)][-1] == having
    aggs = next(n for n in nodes if isinstance(n, Aggregate)).aggs
    assert [str(a.call) for a in aggs] == [f"COUNT(CASE WHEN _incr_side = {i} THEN 1 END)"
                                          for i in (0, 1)]
    assert [n.times.sql for n in nodes if isinstance(n, Explode) and n.times] == (
        [explode] if explode else [])


def test_error_in_second_view_leaves_first_compiling():
    text = program("SELECT region, SUM(amount) AS total\nFROM sales\nGROUP BY region")
    compiled = compile_text(text, path=PATH)
    assert [p.view for p in compiled.plans] == ["fine", "bad"]


def test_timestamp_columns_are_accepted():
    # TIMESTAMP is a documented source type (sqlglot reads it as TIMESTAMPNTZ in DuckDB).
    compiled = compile_text(program("SELECT region, MAX(sold_at) AS last_sale\nFROM sales\n"
                                    "GROUP BY region"), path=PATH)
    column = compiled.program.table("sales").column("sold_at")
    assert str(column.type) == "TIMESTAMP"


# -- errors in the program itself ------------------------------------------------------------


def test_syntax_error_is_a_parse_error_with_its_line():
    text = program("""
SELECT region,
       amount
FROM sales
WHERE qty = = 1""")
    err = compile_error(text)
    assert type(err) is ParseError
    assert "SQL syntax error" in err.message
    assert err.location.path == PATH
    assert err.location.line == line_of(text, "WHERE qty = = 1")


def test_syntax_error_in_table_declaration():
    text = ("CREATE TABLE sales (\n    region VARCHAR,\n    amount DOUBLE = 1,\n    qty BIGINT\n);\n"
            "CREATE VIEW v AS SELECT region FROM sales;\n")
    err = compile_error(text)
    assert type(err) is ParseError
    assert err.location.line == 3


@pytest.mark.parametrize("statement, kind", [
    ("INSERT INTO sales\nVALUES ('north', 'tea', 1.5, 2, NULL)", "INSERT"),
    ("DROP TABLE sales", "DROP"),
    ("SELECT region\nFROM sales", "SELECT"),
    ("UPDATE sales\nSET qty = 0", "UPDATE"),
])
def test_statement_that_is_not_a_table_or_view(statement: str, kind: str):
    text = PROLOGUE.replace("CREATE VIEW bad AS ", "") + "\n" + statement + ";\n"
    err = compile_error(text)
    assert type(err) is ParseError
    assert "only hold CREATE TABLE (sources) and CREATE VIEW (queries)" in err.message
    assert f"found {kind}" in err.message
    assert err.location.path == PATH
    assert err.location.line == line_of(text, statement.split("\n", maxsplit=1)[0], after="GROUP BY region;")


TABLE_WITH = """-- incr: dialect = duckdb

CREATE TABLE sales (
    region  VARCHAR,
    {column},
    amount  DOUBLE
);

CREATE VIEW v AS
SELECT region, SUM(amount) AS total
FROM sales
GROUP BY region;
"""


@pytest.mark.parametrize("column, name", [
    ("tags    VARCHAR[]", "tags"),
    ("payload JSON", "payload"),
    ("blob    BLOB", "blob"),
    ("nested  STRUCT(a INT)", "nested"),
])
def test_unsupported_column_type(column: str, name: str):
    err = compile_error(TABLE_WITH.format(column=column))
    assert isinstance(err, CompileError)
    assert err.message.startswith(f"table sales: column {name}: type ")
    assert "is not supported for source columns" in err.message
    assert "VARCHAR, BIGINT" in err.message  # lists what is supported
    assert err.location.path == PATH
    assert err.location.line == 5


@pytest.mark.parametrize("column", ["_n BIGINT", "_bucket INTEGER", "_hidden VARCHAR"])
def test_reserved_column_name(column: str):
    err = compile_error(TABLE_WITH.format(column=column))
    assert type(err) is ParseError
    name = column.split(maxsplit=1)[0]
    assert "table sales: column names starting with '_' are reserved" in err.message
    assert f"rename {name}" in err.message
    assert err.location.line == 5


def test_column_declared_twice():
    err = compile_error(TABLE_WITH.format(column="REGION VARCHAR"))
    assert type(err) is ParseError
    assert "column REGION is declared twice" in err.message
    assert err.location.line == 5


def test_unsupported_column_constraint():
    err = compile_error(TABLE_WITH.format(column="qty BIGINT PRIMARY KEY"))
    assert type(err) is ParseError
    assert "column constraint" in err.message and "only NOT NULL" in err.message
    assert err.location.line == 5


def test_program_without_views():
    err = compile_error("CREATE TABLE sales (region VARCHAR);\n")
    assert type(err) is ParseError
    assert "declares no views" in err.message


def test_append_only_must_name_a_declared_table():
    err = compile_error("-- incr: append_only = salez\n" + TABLE_WITH.format(column="qty BIGINT"))
    assert type(err) is ParseError
    assert "append_only names undeclared table(s): salez" in err.message
    assert err.location.line == 1


def test_unknown_header_option():
    err = compile_error("-- incr: dialect = duckdb\n-- incr: bukets = 4\n"
                        + TABLE_WITH.format(column="qty BIGINT"))
    assert type(err) is ParseError
    assert "unknown header option 'bukets'" in err.message
    assert err.location.line == 2


def test_on_failure_hook_must_name_a_function():
    err = compile_error("-- incr: on_failure = page me\n" + TABLE_WITH.format(column="qty BIGINT"))
    assert type(err) is ParseError
    assert "on_failure must name a function as package.module:function" in err.message
    header = "-- incr: on_failure = alerts.incr:page\n"
    program = parse_program(header + TABLE_WITH.format(column="qty BIGINT"), "p.sql")
    assert program.options.on_failure == "alerts.incr:page"


def test_error_classes_and_exit_codes():
    assert issubclass(NotIncrementalizableError, CompileError)
    assert issubclass(CompileError, IncrError) and issubclass(ParseError, IncrError)
    assert NotIncrementalizableError.exit_code == CompileError.exit_code == ParseError.exit_code == 2


# -- the CLI -----------------------------------------------------------------------------


@pytest.mark.parametrize("body, marker", [
    ("SELECT region, amount\nFROM sales\nWHERE random() < 0.5", "random()"),
    ("SELECT region,\n       product,\n       SUM(amount) AS total\nFROM sales\nGROUP BY region",
     "product,"),
    ("SELECT region\nFROM sales\nWHERE qty = = 1", "WHERE qty"),
], ids=["not-incrementalizable", "compile-error", "parse-error"])
def test_cli_explain_reports_a_bad_program(tmp_path: Path, capsys, body: str, marker: str):
    text = program(body)
    path = tmp_path / "bad.sql"
    path.write_text(text, encoding="utf-8")
    assert cli.main(["explain", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {path}:{line_of(text, marker)}"), lines[0]


def test_cli_explain_missing_file(tmp_path: Path, capsys):
    path = tmp_path / "nope.sql"
    assert cli.main(["explain", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"error: {path}: cannot read program file")


def test_cli_explain_sales(capsys):
    assert cli.main(["explain", str(SALES)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    for view in ("region_summary", "top_products", "overall"):
        assert f"view {view}  (state " in out


def test_cli_explain_one_view(capsys):
    assert cli.main(["explain", str(SALES), "--view", "overall"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith("view overall")
    assert "view region_summary" not in out
