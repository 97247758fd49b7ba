"""Lanes: control, provision and bulk, each with its own queue and its own worker threads.

No lane waits behind another: a six-hour wipe on ``provision`` holds a provision worker, never a
control one. Each job runs under a deadline (the kind's timeout from the catalog, or less if
the command asked for less); a watchdog thread enforces it. At the deadline, or when the job is
cancelled, the watchdog sets the context's cancel event, kills the whole process group of every
child the handler started, and reports the job finished (TIMED_OUT / CANCELLED) without waiting
for the handler thread: a handler that does not return is abandoned, and its lane gets a fresh
worker in its place. Whatever the abandoned thread returns later is dropped.

A job may carry a ``key`` (the site's BMC operations: "bmc:<host>:<port>"): it takes no lane
worker but runs on the keyed pool, whose workers are made on demand up to ``keyed_cap`` (the
site's cap on BMC operations in flight) and end after a while idle. Jobs of one key run one at a
time, in their order of arrival; jobs past the cap wait in the pool's queue and are told so by a
"queued" progress frame. A keyed job's deadline runs from its arrival: its
wait behind its key's earlier jobs counts (as a wait for a lock would), its wait for a place
under the cap does not (as a lane's queue wait never does), and the watchdog ends a job that
reaches its deadline still behind its key's earlier jobs. The key is released when the job is
reported finished, at its deadline or cancel at the latest: a handler abandoned there has its
cancel event set and its requests cut (agent/net/http.py), and can no longer reach the BMC. A wait
on one BMC thus never holds a lane worker, another BMC or a lock past its deadline
(docs/site.md, "How BMC work is scheduled").

Every queue has a bound: a lane's holds at most ``max_queued`` jobs waiting for a worker, the
keyed pool's at most ``keyed_max_queued`` (the settings' ``lane_max_queued`` and
``bmc_max_queued``). Past it a job is refused with Busy (reason ``busy``): ``room`` says so
before the runtime journals the command (its admission), and ``submit`` refuses it too.

The scheduler knows nothing of journals or results: it calls ``Job.on_start`` before the body
and ``Job.on_done`` exactly once with either the body's return value or the error.
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.catalog import Kind, Lane
from agent.commands.base import Context
from agent.config import Config
from agent.deadlines import DeadlineWatch
from agent.errors import AgentError, Busy, Cancelled, CommandTimeout, Draining, Reason

log = logging.getLogger(__name__)

DEFAULT_WORKERS: Mapping[Lane, int] = {Lane.CONTROL: 4, Lane.PROVISION: 4, Lane.BULK: 2}
KEYED_IDLE_SECONDS = 30.0        # a keyed worker with nothing to do for this long ends

_current = threading.local()


def current_command_id() -> str | None:
    """The id of the command the calling thread runs, if it is a lane worker running one."""
    return getattr(_current, "command_id", None)


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class Job:
    """One command on its lane. ``body(ctx)`` does the work; ``on_done`` hears how it ended."""

    id: str
    kind: Kind
    ctx: Context
    timeout: float                                      # seconds, from when it starts
    body: Callable[[Context], Any]
    on_done: Callable[[Job, Any, AgentError | None], None]
    on_start: Callable[[Job], None] | None = None
    state: JobState = JobState.QUEUED
    phase: str | Callable[[], str] = ""                 # what it is doing, for timeout messages
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float = 0.0
    started_ms: int = 0                                 # wall clock, for the result
    expiring: bool = False
    expiry: AgentError | None = None                    # why the watchdog or a cancel stopped it
    returned: threading.Event = field(default_factory=threading.Event)
    worker: _Worker | None = None
    key: str = ""                                       # "": a lane job; else the keyed pool's
    ready_at: float = 0.0                               # keyed: since when it waits for a slot only

    @property
    def lane(self) -> Lane:
        return self.kind.lane


@dataclass
class KeyedCounters:
    """The keyed pool's figures (the site's BMC operations), plain attributes for a scrape.

    ``in_flight`` and ``queued`` are now; ``peak_*`` the most seen; ``failed`` counts the jobs
    that ended otherwise than succeeding, by the wire reason of their error."""

    cap: int = Config.bmc_max_in_flight
    in_flight: int = 0
    queued: int = 0
    keys_waiting: int = 0          # keys with a queued job (bounded by the jobs queued)
    workers: int = 0               # the pool's live threads (at most ``cap``)
    started: int = 0
    finished: int = 0
    succeeded: int = 0
    expired_queued: int = 0        # ended at their deadline before they could start
    peak_in_flight: int = 0
    peak_queued: int = 0
    failed: dict[str, int] = field(default_factory=dict)


class _Worker:
    def __init__(self, scheduler: Scheduler, lane: Lane, n: int, *, keyed: bool = False) -> None:
        self.lane = lane
        self.keyed = keyed
        self.abandoned = False
        self.has_job = False
        self.thread = threading.Thread(
            target=scheduler._work, args=(self,), name=f"keyed-{n}" if keyed else f"lane-{lane}-{n}",
            daemon=True,
        )


class Scheduler:
    def __init__(
        self,
        workers: Mapping[Lane, int] | None = None,
        *,
        keyed_cap: int = Config.bmc_max_in_flight,
        keyed_idle_seconds: float = KEYED_IDLE_SECONDS,
        max_queued: int = Config.lane_max_queued,
        keyed_max_queued: int = Config.bmc_max_queued,
    ) -> None:
        self._workers_per_lane = dict(DEFAULT_WORKERS if workers is None else workers)
        for lane in Lane:
            if self._workers_per_lane.get(lane, 0) < 1:
                raise ValueError(f"lane {lane} needs at least one worker")
        if keyed_cap < 1:
            raise ValueError("the keyed pool needs at least one worker")
        if max_queued < 1 or keyed_max_queued < 1:
            raise ValueError("a queue holds at least one job")
        self.max_queued, self.keyed_max_queued = max_queued, keyed_max_queued
        # One lock, and a condition for each kind of waiter on it, each woken only for what it
        # waits for: a lane's workers for a job on that lane (one of them), the keyed pool's for
        # a key that may start, and wait_idle's callers for a job gone. The watchdog is the
        # jobs' DeadlineWatch (agent/deadlines.py), woken only for a deadline earlier than the
        # one it sleeps to. With hundreds of keyed workers, one condition
        # woken for everything had every thread take the lock (and the GIL) at every submit.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._lane_cond = {lane: threading.Condition(self._lock) for lane in Lane}
        self._keyed_cond = threading.Condition(self._lock)
        self._idle_cond = threading.Condition(self._lock)
        self._deadlines: DeadlineWatch[str] = DeadlineWatch("lane-watchdog", self._due, persistent=True)
        self._queues: dict[Lane, collections.deque[Job]] = {lane: collections.deque() for lane in Lane}
        self._jobs: dict[str, Job] = {}      # every job not yet done, queued or running
        self._workers: list[_Worker] = []
        self._names = itertools.count()
        self._stopping = False
        self._started = False
        self.abandoned_workers = 0
        # The keyed pool: each key's queued jobs in arrival order, the keys whose first job may
        # start (no job of the key running), the keys with a job running, and its workers.
        self._keyed_waiting: dict[str, collections.deque[Job]] = {}
        self._keyed_ready: collections.deque[str] = collections.deque()
        self._keyed_running: set[str] = set()
        self._keyed_free = 0          # keyed workers not running a job (idle, or just made)
        self._keyed_idle_seconds = keyed_idle_seconds
        self.keyed = KeyedCounters(cap=keyed_cap)

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._started:
                return
            self._started = True
            for lane, count in self._workers_per_lane.items():
                for _ in range(count):
                    self._add_worker(lane)
            self._keyed_workers_for(Lane.CONTROL)
            self._deadlines.start()

    def _add_worker(self, lane: Lane, *, keyed: bool = False) -> None:
        worker = _Worker(self, lane, next(self._names), keyed=keyed)
        self._workers.append(worker)
        if keyed:
            self.keyed.workers += 1
            self._keyed_free += 1
        worker.thread.start()

    def _watch_deadline(self, job: Job) -> None:
        """The watchdog ends ``job`` at its deadline (the lock held)."""
        self._deadlines.set(job.id, job.ctx.deadline)

    def _keyed_workers_for(self, lane: Lane) -> None:
        """Enough keyed workers for the keys that may start, within the cap (the lock held)."""
        while (len(self._keyed_ready) > self._keyed_free and self.keyed.workers < self.keyed.cap
               and self._started and not self._stopping):
            self._add_worker(lane, keyed=True)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking jobs from the queues; wait up to ``timeout`` for the workers to exit.

        Running handlers are not cancelled (the process is going away, or the caller cancelled
        them first); a worker busy past ``timeout`` is left behind as a daemon thread.
        """
        with self._cond:
            self._stopping = True
            for cond in (*self._lane_cond.values(), self._keyed_cond, self._idle_cond):
                cond.notify_all()
            threads = [w.thread for w in self._workers]
        end = time.monotonic() + timeout
        self._deadlines.stop(timeout)
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, end - time.monotonic()))

    def abort_running(self, timeout: float = 10.0) -> None:
        """Cancel every running job and kill its children's process groups, without reporting
        anything: the process is going away, and no child of a command may outlive it."""
        with self._cond:
            running = [j for j in self._jobs.values() if j.state is JobState.RUNNING]
        killers = []
        for job in running:
            job.ctx.cancel_event.set()
            t = threading.Thread(target=job.ctx.kill_children, name=f"abort-{job.id}", daemon=True)
            t.start()
            killers.append(t)
        end = time.monotonic() + timeout
        for t in killers:
            t.join(max(0.0, end - time.monotonic()))

    # -- submitting, cancelling, observing -----------------------------------------------------

    def room(self, lane: Lane, key: str = "") -> None:
        """Busy when a job of ``lane`` (of ``key``: the keyed pool's) would find its queue full.
        The runtime asks at admission, before it journals the command."""
        with self._cond:
            self._check_room(lane, key)

    def _check_room(self, lane: Lane, key: str) -> None:
        if key:
            if self.keyed.queued >= self.keyed_max_queued:
                raise Busy(f"{self.keyed.queued} BMC operations queued, the most this agent queues"
                           f" (bmc_max_queued; {self.keyed.in_flight} in flight): try again later",
                           queue="keyed", queued=self.keyed.queued, bound=self.keyed_max_queued)
        elif len(self._queues[lane]) >= self.max_queued:
            raise Busy(f"{len(self._queues[lane])} commands queued on lane {lane}, the most it queues"
                       f" (lane_max_queued): try again later",
                       queue=str(lane), queued=len(self._queues[lane]), bound=self.max_queued)

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise Draining("the scheduler is stopping")
            if job.id in self._jobs:
                raise AgentError(f"command {job.id} is already on a lane", reason=Reason.REPLAYED)
            self._check_room(job.lane, job.key)
            job.state = JobState.QUEUED
            self._jobs[job.id] = job
            if job.key:
                waiting = self._queue_keyed(job)
            else:
                self._queues[job.lane].append(job)
                self._lane_cond[job.lane].notify()
                waiting = ""
        if waiting:
            job.ctx.progress(message=f"queued: {waiting}", subject=job.key)

    def _queue_keyed(self, job: Job) -> str:
        """Queue a keyed job (the lock held); what it waits for, "" when it starts at once."""
        # The deadline runs from now; a wait for a slot only (its key free) is added at the start.
        job.ctx.deadline = job.queued_at + job.timeout
        counters = self.keyed
        queue = self._keyed_waiting.get(job.key)
        new = queue is None
        if queue is None:
            queue = self._keyed_waiting[job.key] = collections.deque()
        queue.append(job)
        if new and job.key not in self._keyed_running:
            self._keyed_ready.append(job.key)
            self._keyed_cond.notify()
            job.ready_at = job.queued_at
        else:
            self._watch_deadline(job)   # it may expire behind its key's earlier jobs
        counters.queued += 1
        counters.keys_waiting = len(self._keyed_waiting)
        counters.peak_queued = max(counters.peak_queued, counters.queued)
        ahead = len(queue) - 1 + (job.key in self._keyed_running)
        self._keyed_workers_for(job.lane)
        if ahead:
            return f"{ahead} operation(s) ahead on {job.key} (one at a time per BMC)"
        if counters.in_flight + len(self._keyed_ready) > counters.cap:
            return (f"{counters.in_flight} BMC operations in flight (the site's cap is "
                    f"{counters.cap}); {counters.queued - 1} queued before it")
        return ""

    def cancel(self, command_id: str, reason: str = "") -> bool:
        """Cancel a queued or running job; False when there is no such unfinished job."""
        with self._cond:
            job = self._jobs.get(command_id)
            if job is None or job.expiring:
                return job is not None
            queued = job.state is JobState.QUEUED
            if queued:
                self._unqueue(job)
        error = Cancelled(f"{job.kind.name}: cancelled" + (f" ({reason})" if reason else ""))
        if queued:
            job.ctx.cancel_event.set()
            self._finish(job, None, error)
        else:
            # Killing the children may take the SIGTERM grace: not on the caller's thread.
            threading.Thread(
                target=self._expire, args=(job, error), name=f"cancel-{job.id}", daemon=True
            ).start()
        return True

    def _unqueue(self, job: Job) -> None:
        """Take a queued job off its queue (the lock held)."""
        if not job.key:
            self._queues[job.lane].remove(job)
            return
        queue = self._keyed_waiting[job.key]
        was_first = queue[0] is job
        queue.remove(job)
        self.keyed.queued -= 1
        if not queue:
            del self._keyed_waiting[job.key]
            if job.key in self._keyed_ready:
                self._keyed_ready.remove(job.key)
            self.keyed.keys_waiting = len(self._keyed_waiting)
        elif was_first and job.key in self._keyed_ready:
            queue[0].ready_at = time.monotonic()

    def get(self, command_id: str) -> Job | None:
        with self._cond:
            return self._jobs.get(command_id)

    def busy(self, *, except_id: str | None = None) -> list[str]:
        """Ids of the jobs that are queued or running, except ``except_id``."""
        with self._cond:
            return [cid for cid in self._jobs if cid != except_id]

    def wait_idle(
        self, *, except_id: str | None, deadline: float, cancel: threading.Event | None = None
    ) -> list[str]:
        """Wait until no job other than ``except_id`` is queued or running, or until
        ``deadline`` (monotonic) or ``cancel``; return the ids still busy ([] when idle)."""
        with self._cond:
            while True:
                busy = [cid for cid in self._jobs if cid != except_id]
                left = deadline - time.monotonic()
                if not busy or left <= 0 or (cancel is not None and cancel.is_set()):
                    return busy
                self._idle_cond.wait(min(left, 0.2))

    # -- workers -------------------------------------------------------------------------------

    def _next(self, worker: _Worker) -> Job | None:
        with self._cond:
            if worker.keyed:
                return self._next_keyed(worker)
            while True:
                if self._stopping or worker.abandoned:
                    return None
                queue = self._queues[worker.lane]
                if queue:
                    job = queue.popleft()
                    job.state = JobState.RUNNING
                    job.worker = worker
                    job.started_at = time.monotonic()
                    job.started_ms = int(time.time() * 1000)
                    job.ctx.deadline = job.started_at + job.timeout
                    self._watch_deadline(job)
                    return job
                self._lane_cond[worker.lane].wait()

    def _next_keyed(self, worker: _Worker) -> Job | None:
        """The first job of the first key that may start (the lock held); None when the worker
        is to end: stopping, abandoned, or idle for ``keyed_idle_seconds``."""
        counters = self.keyed
        if worker.has_job:
            worker.has_job = False
            self._keyed_free += 1
        idle_since = time.monotonic()
        while True:
            if self._stopping or worker.abandoned:
                break
            if self._keyed_ready:
                self._keyed_free -= 1
                worker.has_job = True
                key = self._keyed_ready.popleft()
                queue = self._keyed_waiting[key]
                job = queue.popleft()
                if not queue:
                    del self._keyed_waiting[key]
                self._keyed_running.add(key)
                counters.queued -= 1
                counters.keys_waiting = len(self._keyed_waiting)
                counters.in_flight += 1
                counters.started += 1
                counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
                job.state = JobState.RUNNING
                job.worker = worker
                job.started_at = time.monotonic()
                job.started_ms = int(time.time() * 1000)
                if job.ready_at:
                    job.ctx.deadline += job.started_at - job.ready_at   # the wait for a slot
                self._watch_deadline(job)
                return job
            left = idle_since + self._keyed_idle_seconds - time.monotonic()
            if left <= 0:
                break
            self._keyed_cond.wait(left)
        counters.workers -= 1
        self._keyed_free -= 1
        self._workers.remove(worker)
        return None

    def _work(self, worker: _Worker) -> None:
        while True:
            job = self._next(worker)
            if job is None:
                return
            _current.command_id = job.id
            value: Any = None
            error: AgentError | None = None
            try:
                if job.on_start is not None:
                    job.on_start(job)
                job.ctx.check()
                value = job.body(job.ctx)
            except AgentError as exc:
                error = exc
            except Exception as exc:
                log.error("%s %s: handler crashed:\n%s", job.kind.name, job.id, traceback.format_exc())
                error = AgentError(f"{job.kind.name}: internal error: {exc!r}", reason=Reason.INTERNAL)
            finally:
                _current.command_id = None
                job.returned.set()
            # Children a handler left behind end with it.
            job.ctx.kill_children()
            if job.expiry is not None:
                value, error = None, job.expiry  # stopped from outside: say why, not how it unwound
            elif job.ctx.timed_out.is_set() and error is None:
                error = CommandTimeout(f"{job.kind.name}: deadline reached")
            self._finish(job, value, error)
            if worker.abandoned:
                log.info("%s %s: abandoned worker returned, exiting", job.kind.name, job.id)
                return

    def _finish(self, job: Job, value: Any, error: AgentError | None) -> bool:
        with self._cond:
            if job.state is JobState.DONE:
                return False
            if job.key:
                self._release_key(job, error)
            job.state = JobState.DONE
            self._deadlines.clear(job.id)
        try:
            job.on_done(job, value, error)
        except Exception:
            log.exception("%s %s: reporting the outcome failed", job.kind.name, job.id)
        finally:
            # Only now is the job gone: whoever waits for idle lanes (drain, a self-terminating
            # command) finds its result already handed to the subscribers.
            with self._cond:
                self._jobs.pop(job.id, None)
                self._idle_cond.notify_all()
        return True

    def _release_key(self, job: Job, error: AgentError | None) -> None:
        """A keyed job ends (the lock held): count it; its key's next job may start."""
        counters = self.keyed
        counters.finished += 1
        if error is None:
            counters.succeeded += 1
        else:
            reason = str(error.reason)
            counters.failed[reason] = counters.failed.get(reason, 0) + 1
        if job.state is not JobState.RUNNING:
            return              # ended while queued: taken off its queue by whoever ended it
        counters.in_flight -= 1
        self._keyed_running.discard(job.key)
        if job.key in self._keyed_waiting:
            self._keyed_ready.append(job.key)
            self._keyed_cond.notify()
            self._keyed_waiting[job.key][0].ready_at = time.monotonic()
            self._keyed_workers_for(job.lane)

    # -- deadlines and cancellation --------------------------------------------------------------

    def _due(self, ids: list[str]) -> None:
        """The watchdog's: end the jobs whose deadline came, a running one (expired: cancel,
        kill, report) and a keyed one still behind its key's earlier jobs (reported without
        touching its BMC); a keyed one waiting only for a place under the cap is left alone
        (its deadline runs again from its start)."""
        with self._cond:
            if self._stopping:
                return
            now = time.monotonic()
            due: list[Job] = []
            stale: list[Job] = []
            for job_id in ids:
                job = self._jobs.get(job_id)
                if job is None or job.expiring:
                    continue
                if job.ctx.deadline > now:          # moved since it was set: watched anew
                    self._watch_deadline(job)
                elif job.key and job.state is JobState.QUEUED:
                    if not job.ready_at:
                        stale.append(job)           # still behind its key's earlier operations
                elif job.state is JobState.RUNNING:
                    due.append(job)
            for job in due:
                timeout = job.timeout
                phase = job.phase() if callable(job.phase) else job.phase
                what = f" while {phase}" if phase else ""
                error = CommandTimeout(
                    f"{job.kind.name}: deadline of {timeout:g}s reached{what}",
                    timeout_seconds=f"{timeout:g}",
                )
                job.expiring = True
                job.expiry = error
                job.ctx.timed_out.set()
                threading.Thread(
                    target=self._expire, args=(job, error), name=f"expire-{job.id}", daemon=True
                ).start()
            if stale:
                for job in stale:
                    job.expiring = True
                    self._unqueue(job)
                threading.Thread(target=self._expire_queued, args=(stale,),
                                 name="expire-queued", daemon=True).start()

    def _expire_queued(self, jobs: list[Job]) -> None:
        """Report keyed jobs that reached their deadline before they could start."""
        for job in jobs:
            with self._cond:
                self.keyed.expired_queued += 1
            job.ctx.timed_out.set()
            job.ctx.cancel_event.set()
            self._finish(job, None, CommandTimeout(
                f"{job.kind.name}: deadline of {job.timeout:g}s reached while queued for {job.key} "
                "behind its earlier operations", timeout_seconds=f"{job.timeout:g}"))

    def _expire(self, job: Job, error: AgentError) -> None:
        """Stop a running job now: cancel, kill its process groups, report, replace the worker."""
        with self._cond:
            if job.state is JobState.DONE:
                return
            job.expiring = True
            if job.expiry is None:
                job.expiry = error
            error = job.expiry
        if isinstance(error, CommandTimeout):
            job.ctx.timed_out.set()
        job.ctx.cancel_event.set()
        job.ctx.kill_children()
        with self._cond:
            worker = job.worker
            stuck = not job.returned.is_set() and job.state is not JobState.DONE  # type: ignore[comparison-overlap]  # set by another thread since the check above
            if stuck and worker is not None and not worker.abandoned and not self._stopping:
                worker.abandoned = True
                self.abandoned_workers += 1
                if worker.keyed:
                    # Not replaced as such: the pool makes a worker when a key may start.
                    self.keyed.workers -= 1
                    self._workers.remove(worker)
                    self._keyed_workers_for(job.lane)
                else:
                    self._add_worker(job.lane)
                log.warning(
                    "%s %s: handler still running after %s; its worker is abandoned and replaced",
                    job.kind.name, job.id, "timeout" if isinstance(error, CommandTimeout) else "cancel",
                )
        self._finish(job, None, error)
