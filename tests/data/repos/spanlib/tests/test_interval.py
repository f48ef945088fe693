import pytest

from spanlib import Interval, gaps, merge, total_length


def test_rejects_reversed_bounds():
    with pytest.raises(ValueError):
        Interval(5, 1)


def test_length_and_empty():
    assert Interval(2, 7).length == 5
    assert Interval(3, 3).is_empty()


def test_contains_is_half_open():
    interval = Interval(0, 10)
    assert interval.contains(0)
    assert interval.contains(9.99)
    assert not interval.contains(10)


def test_overlapping_intervals():
    assert Interval(0, 5).overlaps(Interval(4, 8))
    assert Interval(4, 8).overlaps(Interval(0, 5))


def test_disjoint_intervals():
    assert not Interval(0, 2).overlaps(Interval(5, 6))


def test_intersection():
    assert Interval(0, 5).intersection(Interval(3, 9)) == Interval(3, 5)
    assert Interval(0, 1).intersection(Interval(2, 3)) is None


def test_hull_and_shift():
    assert Interval(0, 1).hull(Interval(4, 6)) == Interval(0, 6)
    assert Interval(1, 2).shift(3) == Interval(4, 5)


def test_merge_sorted_input():
    merged = merge([Interval(0, 2), Interval(1, 4), Interval(4, 5), Interval(7, 9)])
    assert merged == [Interval(0, 5), Interval(7, 9)]


def test_merge_drops_empty():
    assert merge([Interval(1, 1), Interval(2, 3)]) == [Interval(2, 3)]


def test_total_length_counts_overlap_once():
    assert total_length([Interval(0, 4), Interval(2, 6)]) == 6


def test_gaps():
    covered = [Interval(1, 3), Interval(5, 6)]
    assert gaps(covered, Interval(0, 8)) == [Interval(0, 1), Interval(3, 5), Interval(6, 8)]
