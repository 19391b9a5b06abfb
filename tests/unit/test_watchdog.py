"""The watchdog's decision: wedged only when pings publish but none arrives, and never
while every prefetch slot is busy or the broker is down."""

from __future__ import annotations

from tasks.worker.watchdog import Judge


def test_pings_arriving_is_ok() -> None:
    judge = Judge(threshold_s=10, capacity=2)
    for t in range(0, 60, 2):
        assert judge.verdict(now=t, published=True, last_received=t - 1, reserved=0) == "ok"


def test_silence_past_the_threshold_while_publishing_is_wedged() -> None:
    judge = Judge(threshold_s=10, capacity=2)
    assert judge.verdict(now=100, published=True, last_received=0, reserved=0) == "ok"
    assert judge.verdict(now=109, published=True, last_received=0, reserved=0) == "ok"
    assert judge.verdict(now=111, published=True, last_received=0, reserved=0) == "wedged"


def test_a_broker_outage_restarts_the_clock() -> None:
    judge = Judge(threshold_s=10, capacity=2)
    judge.verdict(now=0, published=True, last_received=0, reserved=0)
    assert judge.verdict(now=50, published=False, last_received=0, reserved=0) == "broker_down"
    # Back up: the worker gets a full threshold to reconnect before it is judged.
    assert judge.verdict(now=55, published=True, last_received=0, reserved=0) == "ok"
    assert judge.verdict(now=64, published=True, last_received=0, reserved=0) == "ok"
    assert judge.verdict(now=66, published=True, last_received=0, reserved=0) == "wedged"


def test_all_slots_busy_is_never_wedged() -> None:
    judge = Judge(threshold_s=10, capacity=2)
    for t in range(0, 300, 5):
        assert judge.verdict(now=t, published=True, last_received=0, reserved=2) == "busy"
    # Slots free again: the silence is counted from now, not from the last ping.
    assert judge.verdict(now=300, published=True, last_received=0, reserved=1) == "ok"
    assert judge.verdict(now=311, published=True, last_received=0, reserved=1) == "wedged"
