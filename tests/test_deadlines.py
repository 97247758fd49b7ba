"""agent/deadlines.py: many deadlines, one thread, woken only for an earlier one."""

from __future__ import annotations

import threading
import time

from agent.deadlines import DeadlineWatch
from tests.runtime.harness import wait_until


class Seen:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, keys: list[str]) -> None:
        with self.lock:
            for key in keys:
                self.keys.append(key)
                self.at[key] = time.monotonic()


def test_due_in_order_cleared_never_moved_counts_last() -> None:
    seen = Seen()
    watch: DeadlineWatch[str] = DeadlineWatch("test-deadlines", seen)
    now = time.monotonic()
    watch.set("b", now + 0.2)
    watch.set("a", now + 0.1)
    watch.set("gone", now + 0.1)
    watch.clear("gone")
    watch.set("moved", now + 0.05)
    watch.set("moved", now + 0.3)
    wait_until(lambda: len(seen.keys) == 3, 5, "three due")
    assert seen.keys == ["a", "b", "moved"]
    assert seen.at["moved"] >= now + 0.3 and seen.at["a"] >= now + 0.1
    watch.stop()


def test_only_an_earlier_deadline_wakes_the_thread() -> None:
    seen = Seen()
    watch: DeadlineWatch[str] = DeadlineWatch("test-deadlines", seen)
    wakes = []
    notify = watch._cond.notify
    watch._cond.notify = lambda n=1: (wakes.append(n), notify(n))[1]  # type: ignore[method-assign]
    now = time.monotonic()
    watch.set("first", now + 5)                  # makes the thread
    time.sleep(0.1)                              # asleep until then
    for i in range(50):
        watch.set(f"later{i}", now + 6 + i)      # later than its sleep: no wake
    assert wakes == []
    watch.set("soon", now + 0.2)                 # earlier: one wake, and it is due in time
    assert len(wakes) == 1
    wait_until(lambda: seen.keys == ["soon"], 2, "the earlier deadline met")
    watch.stop()
    assert not watch.running


def test_the_thread_ends_when_nothing_is_watched_and_comes_back() -> None:
    seen = Seen()
    watch: DeadlineWatch[str] = DeadlineWatch("test-deadlines", seen)
    watch.set("a", time.monotonic() + 0.05)
    wait_until(lambda: not watch.running, 5, "the thread ended")
    assert seen.keys == ["a"]
    watch.set("b", time.monotonic() + 0.05)
    assert watch.running
    wait_until(lambda: seen.keys == ["a", "b"] and not watch.running, 5, "again")


def test_a_tick_keeps_the_thread_and_calls_on_tick() -> None:
    ticks: list[float] = []
    watch: DeadlineWatch[str] = DeadlineWatch("test-deadlines", Seen(), tick=0.05,
                                              on_tick=lambda: ticks.append(time.monotonic()))
    watch.start()
    wait_until(lambda: len(ticks) >= 3, 5, "three ticks")
    assert watch.running
    watch.stop()
    assert not watch.running


def test_cleared_deadlines_do_not_pile_up() -> None:
    watch: DeadlineWatch[int] = DeadlineWatch("test-deadlines", Seen())  # type: ignore[arg-type]
    far = time.monotonic() + 3600
    for i in range(10_000):
        watch.set(i, far + i)
        watch.clear(i)
    assert len(watch) == 0 and len(watch._heap) <= 64 + 2
    watch.stop()


def test_a_failing_action_does_not_end_the_watch() -> None:
    calls: list[list[str]] = []

    def boom(keys: list[str]) -> None:
        calls.append(keys)
        raise RuntimeError("boom")

    watch: DeadlineWatch[str] = DeadlineWatch("test-deadlines", boom)
    watch.set("a", time.monotonic())
    watch.set("b", time.monotonic() + 0.1)
    wait_until(lambda: calls == [["a"], ["b"]], 5, "both called")
    watch.stop()
