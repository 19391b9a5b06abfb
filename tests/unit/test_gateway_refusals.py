"""The gateway's memory of refused requests (tasks/gateway/refusals.py), as pure logic: a
flood writes a bounded number of rows that add up to every refusal, and the hard budget
fails one attempt once, past its leaky count, and no other."""

from __future__ import annotations

import pytest

from tasks.constants import GATEWAY_REFUSED_EVERY_S, GATEWAY_REFUSED_MAX_EVENTS
from tasks.errors import GatewayAbuseError
from tasks.gateway.refusals import IDLE_S, SWEEP_EVERY, Count, Flush, Refusals

A, B = ("a" * 32, 1), ("b" * 32, 1)
BAD, LIMITED, LARGE = "GATEWAY_BAD_REQUEST", "GATEWAY_RATE_LIMITED", "GATEWAY_BODY_TOO_LARGE"


def flood(r: Refusals, key: tuple[str, int], codes: list[str], per_s: float,
          seconds: float, start: float = 0.0) -> list[Flush]:
    """Refusals at a steady rate, cycling through `codes`; the rows they asked for."""
    flushes = []
    for i in range(int(per_s * seconds)):
        verdict = r.note(key, codes[i % len(codes)], now=start + i / per_s)
        if verdict.flush is not None:
            flushes.append(verdict.flush)
    return flushes


def test_the_first_refusal_of_each_code_is_written_at_once_the_rest_gathered() -> None:
    r = Refusals(limit=10**6, window_s=60)
    assert r.note(A, BAD, now=0.0).flush == Flush({BAD: 1}, last=False)
    assert r.note(A, BAD, now=0.1).flush is None
    assert r.note(A, BAD, now=0.2).flush is None
    # A new code is a row of its own at once; the others wait their turn.
    assert r.note(A, LARGE, now=0.3).flush == Flush({LARGE: 1}, last=False)
    assert r.note(A, LARGE, now=0.4).flush is None
    assert r.note(A, BAD, now=GATEWAY_REFUSED_EVERY_S - 0.1).flush is None
    # One row per code a turn, each counting what it gathered since the last.
    assert r.note(A, BAD, now=GATEWAY_REFUSED_EVERY_S).flush == Flush({BAD: 4, LARGE: 1},
                                                                      last=False)
    assert r.note(A, BAD, now=GATEWAY_REFUSED_EVERY_S + 0.1).flush is None


def test_a_flood_writes_at_most_the_bound_of_rows_and_they_count_what_they_cover() -> None:
    r = Refusals(limit=10**9, window_s=60)
    codes = [BAD, LIMITED, LARGE]
    flushes = flood(r, A, codes, per_s=500, seconds=120)  # 60,000 refusals
    rows = [(code, n) for f in flushes for code, n in f.counts.items()]
    assert len(rows) == GATEWAY_REFUSED_MAX_EVENTS
    assert [f.last for f in flushes] == [False] * (len(flushes) - 1) + [True]
    assert {code for code, _ in rows} == set(codes)
    assert all(n >= 1 for _, n in rows)
    # Past the bound nothing more is asked for, however long the flood goes on.
    assert flood(r, A, codes, per_s=500, seconds=60, start=200.0) == []
    assert r.settling(A) is None


def test_rows_are_written_no_more_often_than_every_few_seconds() -> None:
    r = Refusals(limit=10**9, window_s=60, max_rows=10**6)
    flushes = flood(r, A, [BAD, LARGE], per_s=200, seconds=60)
    # The first of each code at once, then one row per code a turn: not one per request.
    for code in (BAD, LARGE):
        rows = [f.counts[code] for f in flushes if code in f.counts]
        assert rows[0] == 1 and len(rows) <= 60 / GATEWAY_REFUSED_EVERY_S + 1
        assert sum(rows) >= 100 * 60 - 100 * GATEWAY_REFUSED_EVERY_S


def test_what_is_pending_is_taken_once_before_the_terminal() -> None:
    r = Refusals(limit=10**6, window_s=60)
    r.note(A, BAD, now=0.0)
    for i in range(5):
        r.note(A, BAD, now=0.1 + i / 100)
    assert r.settling(A, now=1.0) == Flush({BAD: 5}, last=False)
    assert r.note(A, BAD, now=30.0).flush is None  # settled: no fence to write under
    assert r.settling(B) is None


def test_a_lost_fence_stops_the_rows() -> None:
    r = Refusals(limit=10**6, window_s=60)
    assert r.note(A, BAD, now=0.0).flush is not None
    r.close(A)
    assert r.note(A, LARGE, now=1.0).flush is None


def test_past_the_hard_budget_the_attempt_fails_once_and_is_refused_after() -> None:
    r = Refusals(limit=100, window_s=10)
    verdicts = [r.note(A, BAD if i % 2 else LIMITED, now=0.0) for i in range(101)]
    assert not any(v.tripped for v in verdicts[:100])
    trip = verdicts[100]
    assert trip.tripped and trip.totals == {BAD: 50, LIMITED: 51}
    assert trip.flush is not None  # what was pending goes in with the failure
    r.check(B)  # another attempt is untouched
    with pytest.raises(GatewayAbuseError):
        r.check(A)
    again = r.note(A, BAD, now=0.2)
    assert not again.tripped and again.flush is None


def test_the_count_leaks_refusals_within_the_budget_never_fail() -> None:
    r = Refusals(limit=100, window_s=10)  # drains 10 per second
    assert not any(r.note(A, LIMITED, now=0.0).tripped for _ in range(100))  # the budget at once
    # Then just under the drain, for ten minutes: never past the budget.
    assert not any(r.note(A, LIMITED, now=1 + i * 0.11).tripped for i in range(5500))
    r.check(A)
    # Twice the budget in one window always fails.
    r2 = Refusals(limit=100, window_s=10)
    assert any(r2.note(A, LIMITED, now=i * 10 / 201).tripped for i in range(201))


def test_attempts_are_counted_apart() -> None:
    r = Refusals(limit=50, window_s=60)
    assert any(r.note(A, BAD, now=i / 1000).tripped for i in range(60))
    assert not any(r.note(B, BAD, now=i / 1000).tripped for i in range(50))
    r.check(B)


def test_idle_attempts_are_forgotten_and_failed_ones_kept_while_their_token_lives() -> None:
    r = Refusals(limit=5, window_s=60)
    for i in range(6):
        r.note(A, BAD, now=i / 100, keep_s=IDLE_S * 3)
    r.note(B, BAD, now=0.0)
    # Enough refusals of a third attempt to sweep, after B went idle.
    for i in range(SWEEP_EVERY):
        r.note(("c" * 32, i), BAD, now=IDLE_S * 2)
    assert B not in r._tallies
    with pytest.raises(GatewayAbuseError):
        r.check(A)
    for i in range(SWEEP_EVERY):
        r.note(("d" * 32, i), BAD, now=IDLE_S * 4)
    r.check(A)  # its token has expired: verify refuses it now


def test_an_attempt_the_fleet_failed_is_refused_here_too() -> None:
    """Another gateway process failed it (its count is the fleet's, in Redis): this one
    refuses it at once, and counts nothing more of it."""
    r = Refusals(limit=100, window_s=10)
    r.check(A)
    r.failed(A, keep_s=30, now=0.0)
    with pytest.raises(GatewayAbuseError):
        r.check(A)
    verdict = r.note(A, BAD, now=1.0)
    assert verdict.failed and not verdict.tripped and verdict.flush is None
    r.check(B)


def test_the_fleets_count_decides_and_its_totals_name_the_failure() -> None:
    r = Refusals(limit=1, window_s=10)  # alone, it would trip at the second refusal
    assert not r.note(A, BAD, now=0.0, count=Count()).tripped
    assert not r.note(A, BAD, now=0.0, count=Count()).tripped
    trip = r.note(A, LARGE, now=0.0, count=Count(tripped=True, totals={BAD: 7, LARGE: 3}))
    assert trip.tripped and trip.failed and trip.totals == {BAD: 7, LARGE: 3}
    assert trip.flush is not None and sum(trip.flush.counts.values()) >= 1
    with pytest.raises(GatewayAbuseError):
        r.check(A)
    told = r.note(B, BAD, now=0.0, count=Count(failed=True))  # failed by another process
    assert told.failed and not told.tripped
    with pytest.raises(GatewayAbuseError):
        r.check(B)
