"""The oracle's comparison under the contract (DESIGN §2), without Spark."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa

from incr.oracle import diff_answers, oracle_answer


def test_a_timestamp_is_compared_as_an_instant_in_utc():
    """DuckDB's ``date_trunc`` of a DATE is a TIMESTAMP without a zone; incr's answer holds
    Spark's TIMESTAMP, an instant: the same midnight in UTC is the same value, another
    instant is not."""
    expected = oracle_answer(
        "SELECT date_trunc('month', day) AS m, COUNT(*) AS n FROM t GROUP BY 1",
        {"t": pa.table({"day": pa.array([dt.date(2025, 3, 9), dt.date(2025, 3, 1)])})})
    assert expected.schema.field("m").type == pa.timestamp("us")  # no zone

    def answer(*instants: dt.datetime) -> pa.Table:
        return pa.table({"m": pa.array(instants, pa.timestamp("us", tz="UTC")),
                         "n": pa.array([2] * len(instants), pa.int64())})

    utc = dt.UTC
    assert diff_answers(expected, answer(dt.datetime(2025, 3, 1, tzinfo=utc))) is None
    east = dt.timezone(dt.timedelta(hours=2))  # the same instant written in another zone
    shown = answer(dt.datetime(2025, 3, 1, tzinfo=utc)).cast(
        pa.schema([("m", pa.timestamp("us", tz="+02:00")), ("n", pa.int64())]))
    assert shown.column("m")[0].as_py() == dt.datetime(2025, 3, 1, 2, tzinfo=east)
    assert diff_answers(expected, shown) is None
    assert diff_answers(expected, answer(dt.datetime(2025, 3, 1, 1, tzinfo=utc))) is not None


def test_floats_are_close_decimals_exact():
    def one(v: object, t: pa.DataType) -> pa.Table:
        return pa.table({"v": pa.array([v], t)})

    assert diff_answers(one(0.1 + 0.2, pa.float64()), one(0.3, pa.float64())) is None
    assert diff_answers(one(0.3, pa.float64()), one(0.3001, pa.float64())) is not None
    dec = pa.decimal128(10, 2)
    assert diff_answers(one(Decimal("1.10"), dec), one(Decimal("1.1"), dec)) is None
    assert diff_answers(one(Decimal("1.10"), dec), one(Decimal("1.11"), dec)) is not None
