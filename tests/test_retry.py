"""agent/retry.py: bounded tries, the deadline, the jitter's bounds, a cancel that wakes the
sleep at once, and the last error raised as it was."""

from __future__ import annotations

import random
import threading
import time

import pytest

from agent.errors import Cancelled
from agent.retry import Backoff, retry


class Flaky(Exception):
    def __init__(self, n: int) -> None:
        super().__init__(f"failure {n}")
        self.n = n


def failing(calls: list[float]) -> object:
    calls.append(time.monotonic())
    raise Flaky(len(calls))


def test_the_delays_grow_by_the_factor_up_to_the_cap() -> None:
    rule = Backoff(first=0.5, cap=8.0)
    assert [rule.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert Backoff(first=2.0, cap=15.0, factor=1.5).delay(3) == 4.5
    assert rule.delay(10_000) == 8.0              # no overflow however long it failed


def test_tries_are_bounded_and_the_last_error_is_raised_as_it_was() -> None:
    calls: list[float] = []
    with pytest.raises(Flaky) as caught:
        retry(lambda: failing(calls), Backoff(first=0.001, cap=0.001, tries=4),
              retryable=lambda exc: isinstance(exc, Flaky))
    assert len(calls) == 4
    assert caught.value.n == 4                     # the last failure, not the first nor a wrapper


def test_a_failure_not_retryable_is_raised_at_once() -> None:
    calls: list[float] = []
    with pytest.raises(Flaky):
        retry(lambda: failing(calls), Backoff(first=0.001, cap=0.001, tries=10),
              retryable=lambda exc: False)
    assert len(calls) == 1


def test_a_success_after_failures_is_returned() -> None:
    calls: list[float] = []

    def second_time() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Flaky(len(calls))
        return "done"

    assert retry(second_time, Backoff(first=0.001, cap=0.001, tries=3),
                 retryable=lambda exc: True) == "done"
    assert len(calls) == 3


def test_the_deadline_ends_the_tries_before_a_wait_would_pass_it() -> None:
    calls: list[float] = []
    deadline = time.monotonic() + 0.5
    with pytest.raises(Flaky):
        retry(lambda: failing(calls), Backoff(first=0.1, cap=0.1),   # unbounded tries
              retryable=lambda exc: True, deadline=deadline)
    assert time.monotonic() < deadline             # gave up instead of waiting past it
    assert 2 <= len(calls) <= 5
    tries = Backoff(first=10.0, cap=10.0).start(deadline=time.monotonic() + 1.0)
    assert tries.next() is None and tries.spent == "deadline"
    spent = Backoff(first=0.0, cap=0.0, tries=2).start()
    assert spent.next() == 0.0
    assert spent.next() is None and spent.spent == "tries"
    spent.reset()
    assert spent.next() == 0.0 and spent.failures == 1


def test_a_sleep_never_runs_past_the_deadline() -> None:
    start = time.monotonic()
    tries = Backoff(first=1.0, cap=1.0).start(deadline=start + 0.2)
    assert tries.sleep(30.0)
    assert time.monotonic() - start < 5.0          # cut at the deadline, not 30 s


def test_jitter_stays_within_its_bounds_and_spreads_over_them() -> None:
    rng = random.Random(7)
    for jitter in (0.25, 1.0):
        rule = Backoff(first=0.5, cap=30.0, jitter=jitter)
        for failures in range(1, 12):
            exact = min(30.0, 0.5 * 2 ** (failures - 1))
            samples = [rule.delay(failures, rng) for _ in range(300)]
            low = exact * (1 - jitter)
            assert all(low <= s <= exact for s in samples)
            span = exact - low
            assert max(samples) > exact - 0.2 * span    # the whole range, not one corner of it
            assert min(samples) < low + 0.2 * span
    assert Backoff(first=0.5, cap=30.0).delay(3, rng) == 2.0   # no jitter: exact


def test_cancel_wakes_a_sleep_at_once() -> None:
    cancel = threading.Event()
    tries = Backoff(first=60.0, cap=60.0).start(cancel=cancel)
    threading.Timer(0.1, cancel.set).start()
    start = time.monotonic()
    assert not tries.sleep(60.0)
    assert time.monotonic() - start < 10.0         # woken, not the 60 s
    assert not tries.sleep(60.0)                   # already set: no wait at all


def test_cancel_during_retry_raises_cancelled_naming_the_operation() -> None:
    cancel = threading.Event()
    calls: list[float] = []
    threading.Timer(0.1, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(Cancelled, match="reading the BMC: cancelled") as caught:
        retry(lambda: failing(calls), Backoff(first=60.0, cap=60.0), retryable=lambda exc: True,
              cancel=cancel, what="reading the BMC")
    assert time.monotonic() - start < 10.0
    assert len(calls) == 1 and isinstance(caught.value.__cause__, Flaky)
    with pytest.raises(Cancelled):                 # set before the first try: none is made
        retry(lambda: failing(calls), Backoff(first=0.0, cap=0.0), retryable=lambda exc: True,
              cancel=cancel)
    assert len(calls) == 1


@pytest.mark.parametrize("bad", [
    {"first": -1.0, "cap": 1.0}, {"first": 1.0, "cap": 1.0, "factor": 0.5},
    {"first": 1.0, "cap": 1.0, "jitter": 1.5}, {"first": 1.0, "cap": 1.0, "tries": 0},
])
def test_a_bad_rule_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**bad)  # type: ignore[arg-type]  # the parameters under test
