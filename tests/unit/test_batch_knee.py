"""The batch knee: the largest batch that still gains throughput by the margin, from forward times by batch
size; the table of them per shape, its moving average of live forwards and its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_worker.batch_knee import LIVE_WEIGHT, KneeTable, knee, measured_sizes


def linear(fixed: float, per_row: float, sizes: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict[int, float]:
    """Seconds of a forward that costs ``fixed`` plus ``per_row`` a request."""
    return {size: fixed + per_row * size for size in sizes}


def test_batching_that_pays_all_the_way_takes_the_largest_size() -> None:
    assert knee(linear(1.0, 0.01), margin=0.1) == 16


def test_batching_that_pays_nothing_stays_at_one() -> None:
    assert knee(linear(0.0, 1.0), margin=0.1) == 1  # time grows with the rows: throughput flat


def test_the_knee_is_where_the_gain_falls_below_the_margin() -> None:
    times = linear(0.125, 0.0625)  # throughput 5.3, 8, 10.7, 12.8, 14.2 requests/s: x1.5, x1.33, x1.2, x1.11
    assert [knee(times, margin) for margin in (0.0, 0.1, 0.15, 0.25, 0.4, 0.6)] == [16, 16, 8, 4, 2, 1]


def test_the_first_size_short_of_the_margin_ends_the_walk() -> None:
    # 2 gains 50% over 1, 4 only 5% over 2: the knee is 2, though 8 would gain 40% over 4
    times = {1: 1.0, 2: 2 / 1.5, 4: 4 / 1.575, 8: 8 / 2.2}
    assert knee(times, margin=0.1) == 2


def test_the_first_size_measured_is_the_floor_and_bad_entries_are_ignored() -> None:
    assert knee({}, margin=0.1) is None
    assert knee({0: 1.0, 2: 1.0, 4: -1.0}, margin=0.1) == 2
    with pytest.raises(ValueError, match="margin"):
        knee({1: 1.0}, margin=-0.1)


def test_measured_sizes_are_powers_of_two_and_the_cap() -> None:
    assert measured_sizes(1) == (1,)
    assert measured_sizes(8) == (1, 2, 4, 8)
    assert measured_sizes(12) == (1, 2, 4, 8, 12)


def test_live_forwards_move_the_average_per_step(tmp_path: Path) -> None:
    table = KneeTable(tmp_path / "knees.json")
    table.set("64x64", 1, 0.5)
    table.observe("64x64", 1, seconds=10.0, steps=10)  # 1 s a step
    table.observe("64x64", 2, seconds=4.0, steps=4)  # first of its size: taken as it is
    table.observe("64x64", 4, seconds=0.0, steps=4)  # nothing learnt
    assert table.seconds("64x64") == {1: pytest.approx(0.5 * (1 - LIVE_WEIGHT) + LIVE_WEIGHT), 2: 1.0}
    assert table.knees(margin=0.1) == {"64x64": 2}


def test_the_table_survives_a_restart_and_a_bad_file_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "knees.json"
    table = KneeTable(path)
    table.set("512x512", 1, 0.03)
    table.set("512x512", 8, 0.1)
    table.save()
    assert KneeTable(path).seconds("512x512") == {1: 0.03, 8: 0.1}
    path.write_text("{not json")
    assert KneeTable(path).shapes() == []
    KneeTable(None).save()  # no file: nothing to do
