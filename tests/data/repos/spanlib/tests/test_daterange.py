from datetime import date

import pytest

from spanlib import DateRange, parse_range


def test_length_is_inclusive():
    assert len(DateRange(date(2024, 3, 1), date(2024, 3, 1))) == 1
    assert len(DateRange(date(2024, 2, 1), date(2024, 2, 29))) == 29


def test_rejects_reversed_range():
    with pytest.raises(ValueError):
        DateRange(date(2024, 5, 2), date(2024, 5, 1))


def test_iteration_and_membership():
    days = DateRange(date(2024, 1, 30), date(2024, 2, 2))
    assert list(days) == [date(2024, 1, 30), date(2024, 1, 31), date(2024, 2, 1), date(2024, 2, 2)]
    assert date(2024, 2, 1) in days
    assert date(2024, 2, 3) not in days
    assert "2024-02-01" not in days


def test_weekdays():
    # Monday 2024-06-03 to Sunday 2024-06-16: two working weeks.
    assert DateRange(date(2024, 6, 3), date(2024, 6, 16)).weekdays() == 10


def test_split_by_month_within_year():
    parts = DateRange(date(2024, 1, 20), date(2024, 3, 3)).split_by_month()
    assert parts == [
        DateRange(date(2024, 1, 20), date(2024, 1, 31)),
        DateRange(date(2024, 2, 1), date(2024, 2, 29)),
        DateRange(date(2024, 3, 1), date(2024, 3, 3)),
    ]


def test_split_by_month_single_month():
    days = DateRange(date(2023, 4, 2), date(2023, 4, 9))
    assert days.split_by_month() == [days]


def test_parse_range():
    assert parse_range("2024-01-05..2024-02-10") == DateRange(date(2024, 1, 5), date(2024, 2, 10))


def test_parse_range_rejects_garbage():
    with pytest.raises(ValueError):
        parse_range("2024-01-05")
