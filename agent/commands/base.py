"""What a command handler is, and what it is given while it runs.

A handler serves one kind: ``class DeployImage(Handler[agent_pb2.DeployImageRequest,
DeployParams], kind="deploy.image")``. The request type is declared there, once, and checked
against the kind's catalog row when the class is made; the class is registered in
``Handler.registry`` under the kind's name. ``parse`` turns the request into a typed,
validated parameter object before any work starts (bad input is refused cleanly), and ``run``
does the work with a ``Context``.

``run`` returns the kind's result message, or for a self-terminating kind a
``SelfTermination``: the runtime then waits for the other lanes to go idle, writes the proof
to the journal, flushes it, sends a last progress frame and only then calls ``action``. A
self-terminating kind may also judge its own rejoin (``completion``); by default the runtime
compares boot ids (kexec, reboot) or versions (upgrade).
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import threading
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from google.protobuf.message import Message

from agent import catalog, proc
from agent.config import Config
from agent.deadlines import DeadlineWatch
from agent.errors import Cancelled, CommandTimeout, Unsupported
from agent.hw import bootid
from agent.proto import session_pb2

if TYPE_CHECKING:
    from agent.site.services import SiteServices

Request = TypeVar("Request", bound=Message)
Params = TypeVar("Params")

ProgressSink = Callable[[session_pb2.Progress], None]

# How often a Meter reports progress (the runtime bounds the frames to the gateway as well).
PROGRESS_EVERY_SECONDS = 1.0


class ResourceLocks:
    """Named locks shared by all lanes: "disk:<serial or name>", "gpu:<index>"...

    ``hold`` takes several names in sorted order, so two commands can never deadlock.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._slots: dict[str, threading.BoundedSemaphore] = {}

    def slots(self, name: str, count: int) -> threading.BoundedSemaphore:
        """The one counted lock called ``name``, of ``count`` slots (fixed by its first use):
        what many commands share a bounded number of ("ipmi-sessions")."""
        with self._guard:
            return self._slots.setdefault(name, threading.BoundedSemaphore(count))

    def _lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    @contextlib.contextmanager
    def hold(self, names: Sequence[str], cancel: threading.Event, deadline: float) -> Iterator[None]:
        held: list[threading.Lock] = []
        try:
            for name in sorted(set(names)):
                lock = self._lock(name)
                while not lock.acquire(timeout=0.05):
                    if cancel.is_set():
                        raise Cancelled(f"cancelled while waiting for {name}")
                    if time.monotonic() >= deadline:
                        raise CommandTimeout(f"deadline reached while waiting for {name}")
                held.append(lock)
            yield
        finally:
            for lock in reversed(held):
                lock.release()


class Closeable(typing.Protocol):
    def close(self) -> None: ...


Kept_T = TypeVar("Kept_T", bound=Closeable)


class Kept:
    """What a command leaves for the next one on the same key: a Redfish BMC's discovered
    paths and its kept-alive connection (under "bmc:<address>"). ``take`` hands an entry to one
    command alone (two commands never share one); ``put`` gives it back when the command ends.

    Bounded: at most ``limit`` entries (the least recently used is closed to make room), each
    closed once unused for ``idle`` seconds (a sweeper thread, there only while entries are):
    nothing grows with the number of keys ever seen. ``limit`` 0 keeps nothing (put closes).
    """

    def __init__(self, limit: int = 0, idle: float = 60.0) -> None:
        self.limit, self.idle = limit, idle
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Closeable, float]] = {}   # oldest first
        # Each entry's end of idleness (agent/deadlines.py: a thread there only while entries are).
        self._deadlines: DeadlineWatch[str] = DeadlineWatch("kept-sweeper", self._expired)
        self._closed = False

    def take(self, key: str, kind: type[Kept_T]) -> Kept_T | None:
        """The entry kept under ``key`` (removed: the caller's alone), or None; one of another
        type is closed."""
        with self._lock:
            entry = self._entries.pop(key, None)
            self._deadlines.clear(key)
        if entry is None:
            return None
        if isinstance(entry[0], kind):
            return entry[0]
        entry[0].close()
        return None

    def put(self, key: str, value: Closeable) -> None:
        """Keep ``value`` under ``key`` for the next command (closing the one it replaces and,
        past ``limit``, the least recently used)."""
        out: list[Closeable] = []
        with self._lock:
            if self._closed or self.limit <= 0:
                out.append(value)
            else:
                old = self._entries.pop(key, None)
                if old is not None:
                    out.append(old[0])
                now = time.monotonic()
                self._entries[key] = (value, now)
                self._deadlines.set(key, now + self.idle)
                while len(self._entries) > self.limit:
                    oldest = next(iter(self._entries))
                    out.append(self._entries.pop(oldest)[0])
                    self._deadlines.clear(oldest)
        for value in out:
            value.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        """Close every entry; nothing is kept afterwards."""
        with self._lock:
            self._closed = True
            out, self._entries = [v for v, _ in self._entries.values()], {}
        self._deadlines.stop()
        for value in out:
            value.close()

    @property
    def sweeping(self) -> bool:
        """Whether the sweeper's thread is there (only while entries are)."""
        return self._deadlines.running

    def _expired(self, keys: list[str]) -> None:
        """The sweeper's: close the entries unused for ``idle`` seconds."""
        out: list[Closeable] = []
        now = time.monotonic()
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None and now - entry[1] >= self.idle:
                    out.append(entry[0])
                    del self._entries[key]
        for value in out:
            value.close()


@dataclass
class Context:
    """Everything a handler may touch of the runtime.

    The runtime builds one per command; tests build one with ``Context.local(...)``.
    """

    command_id: str
    kind: catalog.Kind
    config: Config
    deadline: float                          # time.monotonic() value
    boot_id: str = ""                        # the boot the command runs in (a rejoin's proof)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    timed_out: threading.Event = field(default_factory=threading.Event)
    progress_sink: ProgressSink | None = None
    locks: ResourceLocks = field(default_factory=ResourceLocks)
    kept: Kept = field(default_factory=Kept)  # the runtime's, shared by its commands; keeps nothing here
    site_services: SiteServices | None = None  # the site daemon's boot service and routes
    log: logging.Logger | logging.LoggerAdapter[Any] = field(
        default_factory=lambda: logging.getLogger("agent.command")
    )
    _children: set[subprocess.Popen[bytes]] = field(default_factory=set)
    _children_guard: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def local(
        cls,
        kind: str,
        config: Config | None = None,
        *,
        timeout: float | None = None,
        progress_sink: ProgressSink | None = None,
        command_id: str = "local",
        boot_id: str | None = None,
        site: SiteServices | None = None,
    ) -> Context:
        k = catalog.KINDS[kind]
        limit = k.timeout_seconds if timeout is None else min(timeout, k.timeout_seconds)
        return cls(
            command_id=command_id,
            kind=k,
            config=config or Config(),
            deadline=time.monotonic() + limit,
            boot_id=bootid.boot_id() if boot_id is None else boot_id,
            progress_sink=progress_sink,
            site_services=site,
        )

    # -- the site role's services ---------------------------------------------------------

    def site(self) -> SiteServices:
        """The site daemon's running services, for the boot and proxy kinds; Unsupported
        when this agent runs none."""
        if self.site_services is None:
            raise Unsupported(
                "the site's boot service and proxy routes are not running on this daemon "
                "(run `agent run --role site` with --site-address)"
            )
        return self.site_services

    # -- time and cancellation ----------------------------------------------------------

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def check(self) -> None:
        """Raise Cancelled or CommandTimeout when the command must stop. Call it in loops."""
        if self.timed_out.is_set() or time.monotonic() >= self.deadline:
            self.timed_out.set()
            self.cancel_event.set()
            raise CommandTimeout(f"{self.kind.name}: deadline reached")
        if self.cancel_event.is_set():
            raise Cancelled(f"{self.kind.name}: cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake up and raise as soon as the command is cancelled."""
        self.cancel_event.wait(min(seconds, self.remaining()))
        self.check()

    # -- progress -----------------------------------------------------------------------

    def progress(
        self,
        *,
        done: int = 0,
        total: int = 0,
        message: str = "",
        subject: str = "",
        rate: float = 0.0,
        eta_seconds: float = -1.0,
        fraction: float | None = None,
    ) -> None:
        """Report progress. The runtime bounds how often it reaches the gateway."""
        if self.progress_sink is None:
            return
        if fraction is None:
            fraction = done / total if total else -1.0
        self.progress_sink(
            session_pb2.Progress(
                command_id=self.command_id,
                fraction=fraction,
                message=message,
                done=done,
                total=total,
                rate=rate,
                eta_seconds=eta_seconds,
                time_unix_ms=int(time.time() * 1000),
                subject=subject,
            )
        )

    def meter(self, *, total: int = 0, subject: str = "",
              every: float = PROGRESS_EVERY_SECONDS) -> Meter:
        """A progress meter for one piece of work: rate, ETA and at most a report a second."""
        return Meter(self, total=total, subject=subject, every=every)

    # -- child processes ----------------------------------------------------------------

    def _track(self, child: subprocess.Popen[bytes]) -> None:
        with self._children_guard:
            self._children.add(child)

    def run(self, argv: Sequence[str], **kwargs: Any) -> proc.Completed:
        """proc.run bounded by this command's deadline and cancel (whole group killed)."""
        kwargs.setdefault("timeout", self.remaining())
        try:
            return proc.run(argv, cancel=self.cancel_event, on_spawn=self._track, **kwargs)
        except Cancelled:
            self.check()  # a deadline shows up as Cancelled from proc.run; say which
            raise

    @contextlib.contextmanager
    def running(self, argv: Sequence[str], **kwargs: Any) -> Iterator[proc.Child]:
        """proc.running, tracked: the runtime kills its process group on timeout or cancel,
        and a deadline or cancel met while it ran is raised as such."""
        child: proc.Child | None = None
        try:
            with proc.running(argv, on_spawn=self._track, **kwargs) as child:
                yield child
        except Exception:
            self.check()  # the child was killed because the command must stop: say so
            raise
        finally:
            if child is not None:
                with self._children_guard:
                    self._children.discard(child.popen)

    def kill_children(self) -> None:
        """Kill the process group of every child this command started (runtime calls it)."""
        with self._children_guard:
            children = list(self._children)
        for child in children:
            if child.poll() is None:
                proc.kill_group(child)

    # -- resources ----------------------------------------------------------------------

    def hold(self, *resources: str) -> contextlib.AbstractContextManager[None]:
        """Serialize with any command on another lane that touches the same resource."""
        return self.locks.hold(resources, self.cancel_event, self.deadline)


class Meter:
    """Progress of one piece of work (a disk's wipe, an upload): the rate since it began,
    the ETA from it, and at most one report every ``every`` seconds (the first, and a forced
    one, always go). ``Context.meter`` makes one."""

    def __init__(self, ctx: Context, *, total: int = 0, subject: str = "",
                 every: float = PROGRESS_EVERY_SECONDS) -> None:
        self.ctx, self.total, self.subject, self.every = ctx, total, subject, every
        self.started = time.monotonic()
        self._last: float | None = None

    def due(self) -> bool:
        """Whether a report now would go (for a caller whose message is costly to build)."""
        return self._last is None or time.monotonic() - self._last >= self.every

    def update(self, done: int, *, message: str = "", total: int | None = None,
               force: bool = False) -> bool:
        """Report ``done`` (of ``total``, default the meter's) when one is due or ``force``;
        True when it went."""
        if not force and not self.due():
            return False
        now = time.monotonic()
        self._last = now
        if total is not None:
            self.total = total
        rate = done / max(now - self.started, 1e-6)
        eta = (self.total - done) / rate if rate and self.total else -1.0
        self.ctx.progress(done=done, total=self.total, rate=rate, eta_seconds=eta,
                          subject=self.subject, message=message)
        return True


@dataclass
class SelfTermination:
    """Returned by a self-terminating handler once everything that can fail has been done.

    ``proof`` is what the next agent (after the kexec, reboot or re-exec) checks to report
    the command complete, e.g. {"old_boot_id": ...} or {"old_version": ..., "new_version": ...}.
    ``action`` ends this agent (it does not return when it works); the runtime calls it only
    after the other lanes are idle and the journal is flushed.
    """

    proof: dict[str, str]
    action: Callable[[], None]
    result: Message | None = None


# What a self-terminating kind's ``completion`` decides: (complete?, reason code, message).
Verdict = tuple[bool, str, str]


class Handler(Generic[Request, Params]):
    """Base of every command handler; see the module's docstring."""

    registry: ClassVar[dict[str, type[Handler[Any, Any]]]] = {}
    kind: ClassVar[str]
    request_type: ClassVar[type[Message]] = Message

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Handler:
                declared = typing.get_args(base)[0]
                if isinstance(declared, type) and issubclass(declared, Message):
                    cls.request_type = declared
        if kind is None:
            return
        row = catalog.get(kind)
        if row is None:
            raise TypeError(f"{cls.__name__}: {kind!r} is not a kind of the catalog")
        # A concrete request type must be the catalog's; test handlers declare Message itself.
        declared_name = getattr(cls.request_type, "DESCRIPTOR", None)
        if declared_name is not None and declared_name.full_name != row.payload:
            raise TypeError(f"{cls.__name__}: {kind} takes {row.payload}, "
                            f"not {declared_name.full_name}")
        cls.kind = kind
        Handler.registry[kind] = cls

    def parse(self, request: Request) -> Params:
        """Validate the request into typed parameters; raise InvalidParameters."""
        raise NotImplementedError

    def serial_key(self, params: Params) -> str:
        """The resource this command's kind works through one command at a time, in order of
        arrival ("bmc:<host>:<port>"), or "" for none. A command with a key is run by the
        scheduler's keyed pool, not a lane worker, so that its waits (on a BMC) hold no worker
        that other commands need (agent/runtime/scheduler.py)."""
        return ""

    def admit(self, config: Config, params: Params) -> None:
        """Checks at admission that need this agent's settings (logs.collect's allow-list);
        raise to refuse. ``parse`` has already run."""

    def run(self, ctx: Context, params: Params) -> Message | SelfTermination:
        raise NotImplementedError

    def on_interrupted(self, params: Params) -> None:
        """The agent stopped while this command ran and it is not run again (not retry-safe):
        undo what must not stay half done (deploy.image clears its target's partition tables).
        Called once, at the restart that reports it interrupted; it must not raise for a target
        that is gone."""

    def completion(self, proof: Mapping[str, str], *, boot_id: str, version: str) -> Verdict | None:
        """A self-terminating kind's own verdict on its rejoin, or None for the runtime's."""
        return None
