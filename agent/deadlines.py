"""One watcher of many deadlines: a heap and a condition, its thread woken only for an earlier
deadline.

The scheduler's jobs, the HTTP client's attempts, the site's connections awaiting a request
head and the kept BMC connections each have a time past which something must be done to them,
by a thread that is not the one waiting. Hundreds of them come and go each second on a busy
site: a thread woken at each one would walk them all at every request. ``DeadlineWatch`` keeps
them in a heap and its thread asleep until the earliest; setting a deadline wakes it only when
that deadline comes before the one it sleeps to.

    watch = DeadlineWatch("site-http-deadlines", on_due=shut)   # on_due(keys), no lock held
    watch.set(key, time.monotonic() + 10)   # (re)arm: the latest set of a key counts
    watch.clear(key)                         # done in time: never due
    watch.stop()                             # the thread ends; nothing is due afterwards

The thread is made at the first ``set`` (or ``start``) and ends when nothing is left to watch
(made again at the next), unless it is ``persistent`` (it lives until ``stop``) or ``tick`` is
given: then it also wakes every ``tick`` seconds to call ``on_tick`` (what must be looked at
now and then: a cancel event, a log line held back) and lives until ``stop``. ``on_due`` is
called without the watch's lock, so it may take the caller's: it must check that what it is
given is still due (a deadline cleared or moved since is not its business), and may ``set``
again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class DeadlineWatch(Generic[K]):
    """Deadlines by key (time.monotonic() values), watched by one thread; see the module
    docstring."""

    def __init__(self, name: str, on_due: Callable[[list[K]], None], *,
                 tick: float | None = None, on_tick: Callable[[], None] | None = None,
                 persistent: bool = False) -> None:
        self.name = name
        self._persistent = persistent or tick is not None
        self._on_due = on_due
        self._tick = tick
        self._on_tick = on_tick
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, K]] = []
        self._at: dict[K, float] = {}       # each key's deadline; heap entries not here are stale
        self._order = itertools.count()
        self._wakes_at = -math.inf          # when the sleeping thread wakes; -inf: it is awake
        self._thread: threading.Thread | None = None
        self._stopped = False

    def set(self, key: K, when: float) -> None:
        """``key`` is due at ``when`` (replacing an earlier ``set`` of it)."""
        with self._cond:
            if self._stopped:
                return
            self._at[key] = when
            heapq.heappush(self._heap, (when, next(self._order), key))
            if len(self._heap) > 2 * len(self._at) + 64:
                self._compact()
            if self._thread is None:
                self._start()
            elif when < self._wakes_at:     # only then: the thread sleeps past it
                self._cond.notify()

    def clear(self, key: K) -> None:
        """``key`` is not due (its heap entry is dropped when it comes up)."""
        with self._cond:
            self._at.pop(key, None)

    def start(self) -> None:
        """Start the thread now (it starts at the first ``set`` otherwise)."""
        with self._cond:
            if self._thread is None and not self._stopped:
                self._start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopped = True
            self._at.clear()
            self._heap.clear()
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the thread is there (it ends when nothing is left to watch, unless persistent)."""
        with self._cond:
            return self._thread is not None

    def __len__(self) -> int:
        with self._cond:
            return len(self._at)

    # -- the thread ----------------------------------------------------------------------

    def _start(self) -> None:
        self._wakes_at = -math.inf
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _compact(self) -> None:
        """Drop the heap's stale entries (cleared or moved keys), so it stays within twice the
        live deadlines however many come and go before they are due."""
        self._heap = [(when, n, key) for when, n, key in self._heap if self._at.get(key) == when]
        heapq.heapify(self._heap)

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick if self._tick is not None else math.inf
        while True:
            with self._cond:
                due, ticked = self._wait(next_tick)
                if due is None:
                    return
            if ticked:
                next_tick = time.monotonic() + (self._tick or 0.0)
                if self._on_tick is not None:
                    self._call(self._on_tick)
            if due:
                self._call(self._on_due, due)

    def _wait(self, next_tick: float) -> tuple[list[K] | None, bool]:
        """With the lock held: sleep until keys are due (returned) or the tick comes (True);
        None when the thread is to end (stopped, or nothing left to watch without a tick)."""
        while not self._stopped:
            now = time.monotonic()
            due: list[K] = []
            while self._heap:
                when, _n, key = self._heap[0]
                if self._at.get(key) != when:
                    heapq.heappop(self._heap)         # cleared or moved: nothing to do
                elif when <= now:
                    heapq.heappop(self._heap)
                    del self._at[key]
                    due.append(key)
                else:
                    break
            ticked = now >= next_tick
            if due or ticked:
                return due, ticked
            if not self._heap and not self._persistent:
                break
            until = min(self._heap[0][0] if self._heap else math.inf, next_tick)
            self._wakes_at = until
            self._cond.wait(None if until == math.inf else max(until - now, 0.001))
            self._wakes_at = -math.inf
        self._thread = None
        return None, False

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: a deadline's action failed", self.name)
