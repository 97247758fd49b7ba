"""Trying again: the agent's one way to wait between tries of something that failed.

A ``Backoff`` is the rule (frozen, a module constant or built from settings): the first delay,
the factor each failure multiplies it by, the longest delay, how much of it is random
(``jitter``), and how many tries at most (``tries``; None: as many as the deadline or the
caller allows). ``Backoff.start`` gives one operation's ``Tries``: the failures counted so
far, the delay before the next try (None when none is left: ``spent`` says why, "tries" or
"deadline"), and a sleep that ``cancel`` (a threading.Event: a command's ``cancel_event``, a
service's stop event) wakes at once.

    RULE = Backoff(first=0.5, cap=8.0, tries=6)

    tries = RULE.start(cancel=ctx.cancel_event, deadline=ctx.deadline)   # a loop of its own shape
    while True:
        try:
            return attempt()
        except TransientError as exc:
            delay = tries.next()            # counts the failure
            if delay is None:               # tries spent, or the delay would reach the deadline
                raise
            if not tries.sleep(delay):      # False: cancel came (at once, not after the delay)
                raise Cancelled("... cancelled") from exc

    value = retry(attempt, RULE, retryable=lambda exc: ..., cancel=..., deadline=..., what="...")
        # the same loop for a call retried whole: the last error is raised as it was when the
        # tries end, Cancelled when cancel comes

The delay after the n-th failure is ``min(cap, first * factor ** (n - 1))``, then, with
``jitter`` j, drawn uniformly from ``[delay * (1 - j), delay]``: 0 (the default) keeps it
exact, 1 is "full jitter" (anywhere from 0), which spreads many clients that failed together
(the nodes of a site when their gateway restarts). A success that should start the rule over
calls ``Tries.reset``.

What is retried stays the caller's business: the HTTP client never sends a write twice on an
ambiguous answer, the IPMI client never retries a refused login; this module only counts and
waits.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from agent.errors import Cancelled

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_EXPONENT = 64   # factor ** 64 is past any cap; a longer count would overflow a float


@dataclass(frozen=True)
class Backoff:
    """How to wait between tries (see the module docstring)."""

    first: float                 # the delay after the first failure, in seconds
    cap: float                   # no delay longer
    factor: float = 2.0          # each failure multiplies the delay by this
    jitter: float = 0.0          # the random part: 0 exact, 1 uniform in [0, delay]
    tries: int | None = None     # at most this many tries in all; None: unbounded

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0 or self.factor < 1:
            raise ValueError(f"backoff: bad delays (first {self.first}, cap {self.cap}, "
                             f"factor {self.factor})")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff: jitter {self.jitter} is not within [0, 1]")
        if self.tries is not None and self.tries < 1:
            raise ValueError(f"backoff: {self.tries} tries")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The delay after the ``failures``-th failure (1 for the first)."""
        exact = min(self.cap, self.first * self.factor ** min(max(failures - 1, 0), MAX_EXPONENT))
        if not self.jitter:
            return exact
        return (rng or random).uniform(exact * (1 - self.jitter), exact)

    def start(self, *, cancel: threading.Event | None = None, deadline: float | None = None,
              rng: random.Random | None = None) -> Tries:
        """One operation's tries: ``deadline`` a time.monotonic() value, ``cancel`` what wakes
        its sleeps, ``rng`` the jitter's source (a seeded one in tests)."""
        return Tries(self, cancel=cancel, deadline=deadline, rng=rng)


class Tries:
    """The failures of one operation so far, and its waits (see the module docstring)."""

    def __init__(self, backoff: Backoff, *, cancel: threading.Event | None = None,
                 deadline: float | None = None, rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self.cancel = cancel
        self.deadline = deadline
        self.failures = 0
        self.spent = ""          # why ``next`` returned None: "tries" or "deadline"
        self._rng = rng

    def reset(self) -> None:
        """A success: the next failure waits the first delay again."""
        self.failures = 0
        self.spent = ""

    def next(self) -> float | None:
        """Count a failure; the delay before the next try, or None when there is none: the
        tries are spent, or the delay would end at or past the deadline."""
        self.failures += 1
        delay = self.backoff.delay(self.failures, self._rng)
        if self.deadline is not None and time.monotonic() + delay >= self.deadline:
            self.spent = "deadline"
            return None
        if self.backoff.tries is not None and self.failures >= self.backoff.tries:
            self.spent = "tries"
            return None
        return delay

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` (never past the deadline); False when ``cancel`` was set or comes
        meanwhile (it wakes the sleep at once), True when the wait ran its course."""
        if self.deadline is not None:
            seconds = min(seconds, self.deadline - time.monotonic())
        seconds = max(seconds, 0.0)
        if self.cancel is None:
            time.sleep(seconds)
            return True
        return not self.cancel.wait(seconds)


def retry(fn: Callable[[], T], backoff: Backoff, *, retryable: Callable[[Exception], bool],
          cancel: threading.Event | None = None, deadline: float | None = None,
          what: str = "", rng: random.Random | None = None) -> T:
    """``fn()``, tried again after a failure ``retryable`` accepts, by ``backoff``'s rule. A
    failure it does not accept, or the last one when the tries or the time are spent, is
    raised as it was; Cancelled (naming ``what``) when ``cancel`` is set before a try or
    during a wait."""
    tries = backoff.start(cancel=cancel, deadline=deadline, rng=rng)
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"{what or 'retry'}: cancelled")
        try:
            return fn()
        except Exception as exc:
            if not retryable(exc):
                raise
            delay = tries.next()
            if delay is None:
                raise
            log.debug("%s: %s (try %d); again in %.2f s", what or "retry", exc, tries.failures, delay)
            if not tries.sleep(delay):
                raise Cancelled(f"{what or 'retry'}: cancelled") from exc
