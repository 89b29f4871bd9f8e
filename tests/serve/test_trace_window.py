"""The served sweep's trace window (issue 51 item 1): which consecutive review events form the
trace, and the summary that shows the mix of users and the burstiness it kept."""

from __future__ import annotations

import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.loadgen.trace import parse_window, review_trace, window_start
from rcllm.records import Dataset, HistoryEntry, Item

T0 = 880_000_000          # a MovieLens-like epoch second (not a whole day)


def _entry(item: int, t: int) -> HistoryEntry:
    return HistoryEntry(f"i{item}", 4.0, f"review of item {item}", t)


def _tail_dominated() -> Dataset:
    """40 users who each rate twice in the first ten days, then 3 users rating 20 movies each
    within an evening: the tail is 3 users' sessions, as MovieLens 100K's is."""
    users: dict[str, list[HistoryEntry]] = {}
    for u in range(40):
        t = T0 + u * 20_000
        users[f"u{u}"] = [_entry(u % 30, t), _entry((u + 7) % 30, t + 3_600)]
    for u in range(3):
        t = T0 + 30 * 86_400 + u * 600
        users[f"s{u}"] = [_entry((u * 9 + k) % 30, t + 60 * k) for k in range(21)]
    items = {f"i{k}": Item(f"i{k}", f"movie {k}", "a film") for k in range(30)}
    return Dataset("tail-dominated", items, users)


def test_the_users_window_keeps_the_mix_of_users_the_tail_loses():
    ds = _tail_dominated()
    tail = review_trace(ds, 20, 6, window="tail")
    users = review_trace(ds, 20, 6, window="users")
    assert len(set(tail.users)) <= 3 and tail.repeats() >= 17
    assert len(set(users.users)) >= 15 > len(set(tail.users))
    assert np.all(np.diff(users.times_s) >= 0)          # still in time order
    s = users.summary()
    assert s["window"] == "users" and s["requests"] == 20
    assert s["users_per_100_requests"] == pytest.approx(100 * len(set(users.users)) / 20)
    assert tail.summary()["users_per_100_requests"] < s["users_per_100_requests"]
    assert np.isfinite(s["gap_cv"]) and s["gap_cv"] > 0
    # the working set: distinct candidate items over the requests
    assert s["candidate_items"] == len({i for b in users.bodies for i in b["candidates"]})
    assert 6 <= s["candidate_items"] <= 20 * 6


def test_timestamps_with_seconds_keep_their_gaps_whole_days_are_spread():
    ds = _tail_dominated()
    tail = review_trace(ds, 20, 6, window="tail")
    raw = sorted(h.timestamp for u in ("s0", "s1", "s2") for h in ds.users[u][1:])[-20:]
    np.testing.assert_allclose(tail.times_s, raw, atol=1.0)    # spread within the second
    days = Dataset("days", ds.items, {u: [HistoryEntry(h.item_id, h.rating, h.review,
                                                       (h.timestamp // 86_400) * 86_400)
                                          for h in hist] for u, hist in ds.users.items()})
    spread = review_trace(days, 20, 6, window="tail")
    assert np.ptp(spread.times_s) > 3_600     # one day's events spread over the day


def test_the_window_choices_and_their_errors():
    users = ["a", "a", "a", "b", "c", "d", "d", "d"]
    times = np.arange(len(users), dtype=float)
    assert window_start(users, times, 3, "tail") == 5
    assert window_start(users, times, 3, "users") == 3          # b, c, d
    assert window_start(["a", "b", "a", "b"], times[:4], 2, "users") == 2   # ties: the later
    assert window_start(users, times, 3, "at:0") == 0
    assert window_start(users, times, 3, "at:1") == 5           # clipped to hold 3 events
    assert window_start(users, times, 20, "users") == 0         # shorter than n: all of it
    assert parse_window("at:0.5") == ("at", 0.5)
    for bad in ("middle", "at:", "at:1.5", "at:x"):
        with pytest.raises(RcllmError, match="users, tail or at:P"):
            parse_window(bad)


def test_visits_make_one_request_per_sitting_and_keep_repeats_across_them():
    ds = _tail_dominated()
    per_visit = review_trace(ds, 20, 6, window="users", session_gap_s=1800)
    # the 3 evening sessions of 20 ratings 60 s apart are one visit each (their first rating
    # is review 0, which makes no request, so they make none); the 40 users' second ratings,
    # an hour after the first, are visits of their own
    assert not {"s0", "s1", "s2"} & set(per_visit.users)
    assert len(set(per_visit.users)) == 20 and per_visit.summary()["session_gap_s"] == 1800
    every = review_trace(ds, 20, 6, window="users")
    assert every.summary()["session_gap_s"] == 0.0
    # a user back after the gap comes again (repeats across visits kept)
    ds.users["u0"].append(_entry(11, ds.users["u0"][-1].timestamp + 7_200))
    again = review_trace(ds, 60, 6, window="tail", session_gap_s=1800)
    assert again.users.count("u0") == 2
