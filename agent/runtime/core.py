"""The agent: admits commands, runs them on their lanes, journals them, and reports results.

``Agent.submit`` checks a command in a fixed order (body, known id, kind, role, trust, timeout,
payload, draining), writes "accepted" to the journal (fsync'ed) and only then returns Accept
and puts the command on its lane. Results are journaled before anybody hears of them; the
ones the gateway has not acknowledged travel again in every Hello. On start the journal is
replayed: a retry-safe command that had not finished runs again, one that is not retry-safe and
had started is reported INTERRUPTED (never run twice), and a self-terminating command waiting
for its rejoin is completed by its proof (a new boot id, a new agent version), or by a
``bc.rejoin=<kind>:<command id>:<old boot id>`` kernel parameter when the journal did not
survive (kexec into a new ramdisk).

Frames for subscribers (the session): progress (at most about two per second per command, the
last one always delivered), the command's own log lines (token-bucket bounded, with the count of
lines dropped), and results.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError, Message

from agent import catalog, launcher, schema, version
from agent.commands import HandlerTable
from agent.commands.base import Context, Handler, Kept, ResourceLocks, SelfTermination
from agent.config import Config
from agent.errors import (
    AgentError,
    Cancelled,
    CommandTimeout,
    Draining,
    Interrupted,
    InvalidParameters,
    Reason,
    UnknownKind,
    Unsupported,
    WrongRole,
)
from agent.hw import bootid
from agent.link import wire
from agent.proto import session_pb2
from agent.runtime import scheduler
from agent.runtime.journal import DEFAULT_COMPACT_BYTES, Entry, Journal, Known, State
from agent.runtime.streams import CommandLog, CommandStream, ThreadLogForwarder
from agent.security import erasure
from agent.security.attest import Attestor, attestor_for
from agent.security.trust import NodeKey, TrustStore, check_boot, decode_command_body

if TYPE_CHECKING:
    from agent.site.services import SiteServices

log = logging.getLogger(__name__)

BOOT_ID_PATH = bootid.BOOT_ID
CMDLINE_PATH = Path("/proc/cmdline")
MAX_COMMAND_ID = 128
HELLO_RESULTS_BYTES = 1024 * 1024  # unacked results beyond this follow the Hello as result frames
# Kept (agent/commands/base.py): BMCs whose discovered Redfish paths and idle connection are
# kept between their commands (docs/site.md, "How BMC work is scheduled"), and for how long.
KEPT_ENTRIES = 256
KEPT_IDLE_SECONDS = 60.0
MAX_ATTEMPTS = 5               # starts of one retry-safe command before it is reported interrupted

Frame = session_pb2.Frame
Sink = Callable[[session_pb2.Frame], None]
# `agent exec`'s authorisation of a command at the console (see Agent.submit); raises to refuse.
Authorize = Callable[[catalog.Kind, Message], None]

_STATE_WIRE = {
    State.ACCEPTED: session_pb2.QUEUED,
    State.STARTED: session_pb2.RUNNING,
    State.FINISHED: session_pb2.FINISHED,
    State.COMPLETED: session_pb2.FINISHED,
    State.AWAITING_REJOIN: session_pb2.AWAITING_REJOIN,
    State.ACKED: session_pb2.ACKNOWLEDGED,
}


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    found = bootid.boot_id(path)
    if not found:
        log.warning("no boot id at %s: self-terminating commands cannot be proven by a new boot", path)
    return found


def read_cmdline(path: Path = CMDLINE_PATH) -> str:
    return bootid.kernel_cmdline(path)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def status_of(error: AgentError | None) -> int:
    """The wire Status of a command that ended with ``error`` (None: it succeeded)."""
    if error is None:
        return session_pb2.SUCCEEDED
    if isinstance(error, CommandTimeout):
        return session_pb2.TIMED_OUT
    if isinstance(error, Cancelled):
        return session_pb2.CANCELLED
    if isinstance(error, Interrupted):
        return session_pb2.INTERRUPTED
    return session_pb2.FAILED


class _Rejoining:
    """What the body of a self-terminating command returns once its action has been called."""


_REJOINING = _Rejoining()


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        handlers: Mapping[str, Handler[Any, Any]] | None = None,
        boot_id: str | None = None,
        state_id: str | None = None,
        cmdline: str | None = None,
        version_string: str | None = None,
        workers: Mapping[catalog.Lane, int] | None = None,
        journal_compact_bytes: int = DEFAULT_COMPACT_BYTES,
        site: SiteServices | None = None,
        attestor: Attestor | None = None,
    ) -> None:
        self.config = config
        self.site = site  # the site role's running services, handed to each command's context
        self.role = catalog.Role(config.role)
        self.handlers: Mapping[str, Handler[Any, Any]] = (
            HandlerTable() if handlers is None else dict(handlers)
        )
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self._state_id = state_id        # None: the journal's own (agent exec: CONSOLE_STATE_ID)
        self.cmdline = read_cmdline() if cmdline is None else cmdline
        self.version = version.__version__ if version_string is None else version_string
        state_dir = Path(config.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.node_key = NodeKey.load_or_create(state_dir / "node.key")
        # Attestation (docs/attestation.md): the TPM the Hello presents and the gateway challenges.
        self.attestor = attestor if attestor is not None else \
            attestor_for(config.tpm, str(config.tpm_event_log or ""))
        self.trust = TrustStore.load(config.trusted_keys)
        self.journal = Journal(state_dir / "journal", compact_bytes=journal_compact_bytes)
        self.scheduler = scheduler.Scheduler(workers, keyed_cap=config.bmc_max_in_flight,
                                             max_queued=config.lane_max_queued,
                                             keyed_max_queued=config.bmc_max_queued)
        self.locks = ResourceLocks()
        # What a command leaves for the next on the same BMC (its Redfish paths and connection).
        self.kept = Kept(limit=KEPT_ENTRIES, idle=KEPT_IDLE_SECONDS)
        self._admit = threading.RLock()
        self._sinks: list[Sink] = []
        self._exit_hooks: list[Callable[[], None]] = []
        self._streams: dict[str, CommandStream] = {}
        self._forwarder = ThreadLogForwarder(self._streams.get)
        self._draining = False
        self._terminating: str | None = None   # id of the self-terminating command under way
        self._started = False
        self._stopped = False
        self._archive_sha256: str | None = None
        self._own_rejoins: set[str] = set()     # self-terminating commands this process ended

    @property
    def state_id(self) -> str:
        """The id of this agent's state, announced in the Hello: its journal's (new when the
        journal is new), or the one it was given (`agent exec`: trust.CONSOLE_STATE_ID)."""
        return self.journal.state_id if self._state_id is None else self._state_id

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open and replay the journal, resolve rejoins, start the lanes, re-run what must run."""
        with self._admit:
            if self._started:
                return
            self.journal.open()
            rerun: list[Entry] = []
            for entry in sorted(self.journal.entries.values(), key=lambda e: e.accepted_ms):
                if entry.state in (State.ACCEPTED, State.STARTED):
                    if self._replay_unfinished(entry):
                        rerun.append(entry)
                elif entry.state is State.AWAITING_REJOIN:
                    ok, _, message = self._completion_rule(entry.kind, entry.proof)
                    (log.info if ok else log.warning)("%s %s: %s", entry.kind, entry.id, message)
            self._cmdline_rejoins()
            logging.getLogger("agent").addHandler(self._forwarder)
            self.scheduler.start()
            self._started = True
            for entry in rerun:
                self._requeue(entry)
        log.info(
            "agent %s started: node %s, role %s, boot %s, state %s, %d command(s) re-run, "
            "%d unacked result(s)", self.version, self.config.node_id, self.role, self.boot_id,
            self.state_id, len(rerun),
            len(self.unacked_results()),
        )

    def drain(self, timeout: float | None = None) -> None:
        """Accept nothing new; return when everything accepted has finished (or at ``timeout``)."""
        with self._admit:
            self._draining = True
        self.wait_idle(timeout)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """True once no command is queued or running (False when ``timeout`` passed first)."""
        deadline = time.monotonic() + (10 * 365 * 86400 if timeout is None else timeout)
        return not self.scheduler.wait_idle(except_id=None, deadline=deadline)

    def stop(self, timeout: float = 5.0, *, kill_running: bool = True) -> None:
        """Stop the lanes and close the journal. Commands still running are not reported: the
        next start finds them in the journal (re-run when retry-safe, else INTERRUPTED). Their
        child processes are killed (``kill_running``), so none outlives the agent."""
        with self._admit:
            self._draining = True
            self._stopped = True
        if kill_running:
            self.scheduler.abort_running(timeout)
        self.scheduler.stop(timeout)
        logging.getLogger("agent").removeHandler(self._forwarder)
        self.kept.close()
        self.journal.close()
        self.attestor.close()

    # -- the session's view --------------------------------------------------------------------

    def served_kinds(self) -> list[str]:
        return sorted(
            name for name, kind in catalog.KINDS.items() if kind.serves(self.role) and name in self.handlers
        )

    def hello(self, *, results_bytes: int = HELLO_RESULTS_BYTES) -> session_pb2.Hello:
        """The session's first frame. Unacknowledged results go in it up to a byte budget
        (at most ``results_bytes`` and HELLO_RESULTS_BYTES, so the Hello stays below the frame
        limit); the others are emitted to the subscribers as result frames right away, to
        follow the Hello."""
        tpm = self.attestor.identity_message()  # attestation: who the TPM is (outside the lock)
        with self._admit:
            entries = sorted(self.journal.entries.values(), key=lambda e: e.accepted_ms)
            in_flight = [
                session_pb2.CommandStatus(command_id=e.id, kind=e.kind, state=_STATE_WIRE[e.state])
                for e in entries
                if e.state in (State.ACCEPTED, State.STARTED)
                or (e.state is State.AWAITING_REJOIN and e.id in self._own_rejoins)
            ]
            completions = self.completions()
            in_hello: list[session_pb2.SignedResult] = []
            overflow: list[session_pb2.SignedResult] = []
            budget = min(results_bytes, HELLO_RESULTS_BYTES)
            for signed in self.unacked_results():
                budget -= signed.ByteSize() + 8
                (in_hello if budget >= 0 and not overflow else overflow).append(signed)
            hello = session_pb2.Hello(
                protocol_version=wire.PROTOCOL_VERSION,
                node_id=self.config.node_id,
                role=str(self.role),
                agent_version=self.version,
                boot_id=self.boot_id,
                state_id=self.state_id,
                kinds=self.served_kinds(),
                public_key=self.node_key.public_raw,
                unacked_results=in_hello,
                completions=completions,
                in_flight=in_flight,
                agent_sha256=self._archive_digest(),
                tpm=tpm,
            )
            for signed in overflow:
                self._emit(Frame(result=signed))
            return hello

    def attest(self, challenge: session_pb2.AttestChallenge) -> session_pb2.AttestAnswer:
        """Attestation: the gateway's challenge answered by the TPM, bound to this boot and key."""
        return self.attestor.answer_message(challenge, boot_id=self.boot_id,
                                            node_public=self.node_key.public_raw)

    def completions(self) -> list[session_pb2.Completion]:
        """Self-terminating commands of an earlier agent, judged now by their proof, until acked.

        The judgement is made afresh each time (never stored): an upgraded agent that is later
        rolled back must not leave behind a "complete" that the older version would contradict.
        """
        with self._admit:
            entries = sorted(self.journal.entries.values(), key=lambda e: e.accepted_ms)
            found = []
            for e in entries:
                if e.state is State.COMPLETED and e.completion:
                    found.append(session_pb2.Completion.FromString(e.completion))
                elif e.state is State.AWAITING_REJOIN and e.id not in self._own_rejoins:
                    found.append(self._judge(e))
            return found

    def _archive_digest(self) -> str:
        if self._archive_sha256 is None:
            self._archive_sha256 = ""
            if version.ARCHIVE:
                # Here, not at the top: the image stack (HTTP, TLS, block devices) is not a
                # start's to import (an `agent exec` of a command that needs none of it).
                from agent.images.filesource import file_digest

                try:
                    self._archive_sha256 = file_digest(Path(version.ARCHIVE))
                except OSError as exc:
                    log.warning("cannot hash the running archive %s: %s", version.ARCHIVE, exc)
        return self._archive_sha256

    def unacked_results(self) -> list[session_pb2.SignedResult]:
        with self._admit:
            entries = sorted(self.journal.entries.values(), key=lambda e: e.accepted_ms)
            return [session_pb2.SignedResult.FromString(e.result)
                    for e in entries if e.state is State.FINISHED and e.result]

    def state_of(self, command_id: str) -> int:
        """The wire CommandState of a command id (COMMAND_STATE_UNSPECIFIED when unknown)."""
        found = self.journal.lookup(command_id)
        if found is None:
            return session_pb2.COMMAND_STATE_UNSPECIFIED
        return session_pb2.ACKNOWLEDGED if isinstance(found, Known) else _STATE_WIRE[found.state]

    def subscribe(self, sink: Sink) -> None:
        with self._admit:
            self._sinks.append(sink)

    def add_exit_hook(self, fn: Callable[[], None]) -> None:
        with self._admit:
            self._exit_hooks.append(fn)

    def joined(self) -> None:
        """The session was welcomed by the gateway: a pending daemon.upgrade trial of this very
        build is confirmed to the launcher (the new build reached its gateway)."""
        try:
            launcher.confirm_trial(version.ARCHIVE, version.__version__)
        except Exception:
            log.exception("daemon.upgrade: confirming the trial failed")

    def _emit(self, frame: session_pb2.Frame) -> None:
        if self._stopped or not self._started:
            return  # results decided while starting travel in the Hello, not twice
        for sink in list(self._sinks):
            try:
                sink(frame)
            except Exception:
                log.exception("a frame subscriber failed")

    # -- admission -----------------------------------------------------------------------------

    def submit(
        self, cmd: session_pb2.SignedCommand, *, console: Authorize | None = None
    ) -> session_pb2.Accept | session_pb2.Reject:
        """Admit a command: the one path for the gateway's commands and `agent exec`'s.

        ``console`` is for `agent exec` alone: the authorisation of a person at the console
        (agent/cli/app.py: every target named), checked on the validated payload in place of the
        control plane's signature; every other check is the same.
        """
        try:
            body = decode_command_body(cmd.body)
        except InvalidParameters as exc:
            return wire.reject("", exc)
        cid = body.command_id
        if not cid or len(cid) > MAX_COMMAND_ID or not cid.isprintable() or any(c.isspace() for c in cid):
            return wire.reject(cid, InvalidParameters(
                f"command id must be 1..{MAX_COMMAND_ID} printable characters without spaces"))
        with self._admit:
            if not self._started or self._stopped:
                return wire.reject(cid, Draining("the agent is not running"))
            digest = body_digest(cmd.body)
            known = self.journal.lookup(cid)
            if known is not None:
                return self._known(cid, known, digest)
            try:
                kind, params, timeout = self._admission(cmd, body, console=console)
            except AgentError as exc:
                log.info("refused %s %s: %s (%s)", body.kind, cid, exc, exc.reason)
                return wire.reject(cid, exc)
            try:
                self.journal.accepted(cid, kind.name, digest, cmd.SerializeToString(),
                                      expires_ms=body.expires_at_unix_ms)
            except (OSError, RuntimeError, ValueError) as exc:
                log.error("cannot journal %s: %s", cid, exc)
                return wire.reject(cid, AgentError(f"cannot journal the command: {exc}"))
            self._enqueue(cid, kind, params, timeout)
        log.info("accepted %s %s on lane %s", kind.name, cid, kind.lane)
        return session_pb2.Accept(command_id=cid, state=session_pb2.QUEUED)

    def _known(self, cid: str, found: Entry | Known, digest: str) -> session_pb2.Accept | session_pb2.Reject:
        if found.digest and found.digest != digest:
            return wire.reject(cid, AgentError(
                f"command id {cid} is known with different contents; a command id is never reused",
                reason=Reason.REPLAYED))
        if isinstance(found, Known):
            return session_pb2.Accept(command_id=cid, state=session_pb2.ACKNOWLEDGED)
        if found.state is State.FINISHED and found.result:
            self._emit(Frame(result=session_pb2.SignedResult.FromString(found.result)))
        return session_pb2.Accept(command_id=cid, state=_STATE_WIRE[found.state])

    def _admission(
        self, cmd: session_pb2.SignedCommand, body: session_pb2.CommandBody, *, console: Authorize | None
    ) -> tuple[catalog.Kind, Any, float]:
        kind = catalog.get(body.kind)
        if kind is None:
            raise UnknownKind(f"unknown kind {body.kind!r}; see `agent kinds`")
        if not kind.serves(self.role):
            if kind.site_only:
                raise WrongRole(f"{kind.name} belongs to the site daemon (role site), "
                                f"this agent runs as {self.role}", reason=Reason.NOT_THIS_DAEMON)
            roles = ", ".join(sorted(str(r) for r in kind.roles))
            raise WrongRole(f"{kind.name} runs in role {roles}, this agent runs as {self.role}")
        if console is None:
            self.trust.verify_command(cmd, node_id=self.config.node_id, now_ms=_now_ms(), kind=kind,
                                      boot_id=self.boot_id, state_id=self.state_id,
                                      max_lifetime_ms=int(self.config.max_signature_lifetime_seconds * 1000))
        if body.timeout_seconds > kind.timeout_seconds:
            raise InvalidParameters(
                f"{kind.name}: timeout {body.timeout_seconds}s is over the kind's {kind.timeout_seconds}s")
        timeout = float(body.timeout_seconds or kind.timeout_seconds)
        payload = schema.decode_payload(kind.name, body.payload)
        params = self._parse(kind, payload)
        if console is not None:
            console(kind, payload)
        if self._draining or self._terminating is not None:
            why = "draining" if self._draining else f"{self._terminating} is ending the agent"
            raise Draining(f"not accepting commands: {why}")
        # Its queue full: refused before it is journaled (submit holds _admit: no other command
        # enters a queue between this look and its own).
        self.scheduler.room(kind.lane, self.handlers[kind.name].serial_key(params))
        return kind, params, timeout

    def _parse(self, kind: catalog.Kind, payload: Message) -> Any:
        handler = self.handlers.get(kind.name)
        if handler is None:
            raise Unsupported(f"{kind.name}: no handler in this agent build")
        try:
            params = handler.parse(payload)
            handler.admit(self.config, params)
            return params
        except AgentError:
            raise
        except Exception as exc:
            raise InvalidParameters(f"{kind.name}: invalid payload: {exc}") from exc

    # -- running -------------------------------------------------------------------------------

    def _enqueue(self, cid: str, kind: catalog.Kind, params: Any, timeout: float) -> None:
        stream = CommandStream(cid, self._emit, self._journal_progress)
        self._streams[cid] = stream
        ctx = Context(
            command_id=cid,
            kind=kind,
            config=self.config,
            deadline=time.monotonic() + timeout,
            boot_id=self.boot_id,
            progress_sink=stream.progress,
            locks=self.locks,
            kept=self.kept,
            site_services=self.site,
            log=CommandLog(logging.getLogger(f"agent.command.{kind.name}"), cid, stream),
        )
        handler = self.handlers[kind.name]
        job = scheduler.Job(
            id=cid,
            kind=kind,
            ctx=ctx,
            timeout=timeout,
            body=lambda c: self._run(job, handler, params),
            on_done=self._done,
            on_start=self._on_start,
            key=handler.serial_key(params),
        )
        self.scheduler.submit(job)

    def _on_start(self, job: scheduler.Job) -> None:
        self.journal.started(job.id, self.boot_id)
        entry = self.journal.entries.get(job.id)
        job.ctx.log.debug("started %s %s (attempt %d)", job.kind.name, job.id, entry.attempts if entry else 1)

    def _run(self, job: scheduler.Job, handler: Handler[Any, Any], params: Any) -> Any:
        value = handler.run(job.ctx, params)
        if isinstance(value, SelfTermination):
            return self._self_terminate(job, value)
        return value

    def _done(self, job: scheduler.Job, value: Any, error: AgentError | None) -> None:
        stream = self._streams.pop(job.id, None)
        if value is _REJOINING:
            if stream is not None:
                stream.close()
            return
        if error is None and not isinstance(value, Message):
            error = AgentError(f"{job.kind.name}: handler returned {type(value).__name__}, not a result")
        self._finish(job.id, job.kind, error, value, started_ms=job.started_ms, stream=stream)

    def _finish(
        self,
        cid: str,
        kind: catalog.Kind,
        error: AgentError | None,
        value: Message | None = None,
        *,
        started_ms: int = 0,
        stream: CommandStream | None = None,
    ) -> session_pb2.SignedResult:
        signed = self._result(cid, kind, error, value, started_ms=started_ms)
        status = session_pb2.Status.Name(status_of(error))
        if self._stopped:
            # Stopping cut it short: the journal still says it ran, and the next start decides.
            log.info("%s %s ended by the agent's stop (%s); left to the journal", kind.name, cid, status)
            return signed
        try:
            self.journal.result(cid, signed.SerializeToString(), status)
        except (OSError, RuntimeError, ValueError) as exc:
            log.error("%s %s: cannot journal the result (%s)", kind.name, cid, exc)
        log.info("%s %s finished: %s%s", kind.name, cid, status, f" ({error.reason}: {error.message})"
                 if error is not None else "")
        if kind.name == erasure.KIND and error is None:
            try:  # the release report carries this boot's certificates (docs/lifecycle.md)
                erasure.keep(Path(self.config.state_dir), cid, signed)
            except OSError as exc:
                log.error("%s %s: cannot keep the certificates for the release (%s)", kind.name, cid, exc)
        if self.site is not None and started_ms:
            # bettercompute_command_duration_seconds{kind,result}: where this agent exports
            # metrics (the site daemon's /metrics).
            self.site.metrics.observe("bettercompute_command_duration_seconds",
                                      max(0.0, (_now_ms() - started_ms) / 1000), kind=kind.name,
                                      result=status.lower())
        if stream is not None:
            stream.close()
        self._emit(Frame(result=signed))
        return signed

    def _result(
        self,
        cid: str,
        kind: catalog.Kind,
        error: AgentError | None,
        value: Message | None = None,
        *,
        started_ms: int = 0,
    ) -> session_pb2.SignedResult:
        """The SignedResult of a command; signed by the node key for attested kinds."""
        body = session_pb2.ResultBody(
            command_id=cid,
            kind=kind.name,
            node_id=self.config.node_id,
            boot_id=self.boot_id,
            status=status_of(error),  # type: ignore[arg-type]  # the Status enum's number
            started_at_unix_ms=started_ms,
            finished_at_unix_ms=_now_ms(),
            agent_version=self.version,
        )
        if error is not None:
            reason, message, details = error.to_wire()
            body.reason, body.message = reason, message
            body.details.update(details)
        if value is not None:
            body.payload = value.SerializeToString()
            body.payload_type = value.DESCRIPTOR.full_name
        if kind.attested or carries_release_report(value):
            return self.node_key.sign_result(body)
        return session_pb2.SignedResult(body=body.SerializeToString(deterministic=True))

    def cancel(self, command_id: str, reason: str = "") -> None:
        if not self.scheduler.cancel(command_id, reason):
            log.info("cancel of %s: not queued or running (%s)", command_id, self.state_of(command_id))

    def ack(self, command_id: str) -> None:
        with self._admit:
            entry = self.journal.entries.get(command_id)
            if entry is None or not (
                entry.state in (State.FINISHED, State.COMPLETED)
                or (entry.state is State.AWAITING_REJOIN and entry.id not in self._own_rejoins)
            ):
                log.debug("ack of %s ignored: nothing to acknowledge", command_id)
                return
            self.journal.acked(command_id)

    def _journal_progress(self, cid: str, p: session_pb2.Progress) -> None:
        try:
            self.journal.progress(cid, {"fraction": p.fraction, "message": p.message[:200],
                                        "done": p.done, "total": p.total})
        except (OSError, RuntimeError, ValueError) as exc:
            log.debug("progress marker of %s not journaled: %s", cid, exc)

    # -- self-terminating commands -------------------------------------------------------------

    def _self_terminate(self, job: scheduler.Job, st: SelfTermination) -> _Rejoining:
        ctx = job.ctx
        with self._admit:
            if self._terminating is not None and self._terminating != job.id:
                raise Draining(f"{self._terminating} is already ending the agent")
            self._terminating = job.id
        try:
            job.phase = lambda: "waiting for " + (
                ", ".join(sorted(self.scheduler.busy(except_id=job.id))) or "the other lanes") + " to finish"
            busy = self.scheduler.wait_idle(except_id=job.id, deadline=ctx.deadline, cancel=ctx.cancel_event)
            if busy:
                if ctx.cancel_event.is_set() and not ctx.timed_out.is_set():
                    ctx.check()
                names = ", ".join(sorted(busy))
                raise CommandTimeout(
                    f"{job.kind.name}: other commands still running at the deadline: {names}", busy=names
                )
            ctx.check()
            proof = dict(st.proof)
            if not proof.get("old_boot_id") and not proof.get("new_version"):
                proof["old_boot_id"] = self.boot_id
            job.phase = "ending the agent"
            # What the handler prepared (KexecResult, DaemonUpgradeResult...) goes out as the
            # command's interim result; the Completion after the rejoin says whether it worked.
            interim = self._result(job.id, job.kind, None, st.result, started_ms=job.started_ms)
            self._own_rejoins.add(job.id)
            self.journal.awaiting_rejoin(job.id, proof, interim.SerializeToString())
            ctx.progress(message=f"{job.kind.name}: ending the agent; completion is reported on rejoin",
                         fraction=1.0)
            stream = self._streams.get(job.id)
            if stream is not None:
                stream.close()
            self._emit(Frame(result=interim))
            for hook in list(self._exit_hooks):
                try:
                    hook()
                except Exception:
                    log.exception("exit hook failed")
            if job.kind.name in ("boot.kexec", "daemon.upgrade"):
                self.attestor.leave_measured_boot()  # attestation: what runs next is not measured
            log.warning("%s %s: ending the agent now", job.kind.name, job.id)
            st.action()
        except BaseException:
            with self._admit:
                if self._terminating == job.id:
                    self._terminating = None
            raise
        # The action returned: in production it does not (the process ends); tests get here.
        log.warning("%s %s: the self-terminating action returned; awaiting rejoin", job.kind.name, job.id)
        return _REJOINING

    def _completion_rule(self, kind_name: str, proof: Mapping[str, str]) -> tuple[bool, str, str]:
        handler = self.handlers.get(kind_name)
        if handler is not None:
            try:
                decided = handler.completion(proof, boot_id=self.boot_id, version=self.version)
            except Exception as exc:
                log.exception("%s: completion hook failed", kind_name)
                return False, str(Reason.INTERNAL), f"completion check failed: {exc}"
            if decided is not None:
                return decided
        if proof.get("new_version"):
            new, old = proof["new_version"], proof.get("old_version", "")
            if self.version == new:
                return True, "", f"agent now runs version {new}"
            return False, str(Reason.INTERRUPTED), (
                f"agent runs version {self.version} after the upgrade from {old or '?'} to {new}")
        old_boot = proof.get("old_boot_id", "")
        if old_boot and self.boot_id and old_boot != self.boot_id:
            return True, "", f"new boot {self.boot_id} (was {old_boot})"
        return False, str(Reason.INTERRUPTED), (
            f"the agent restarted in the same boot ({self.boot_id or 'unknown'}): the "
            f"{kind_name} did not happen")

    def _judge(self, entry: Entry) -> session_pb2.Completion:
        ok, reason, message = self._completion_rule(entry.kind, entry.proof)
        return session_pb2.Completion(
            command_id=entry.id, kind=entry.kind, ok=ok,
            old_boot_id=entry.proof.get("old_boot_id", ""), new_boot_id=self.boot_id,
            old_version=entry.proof.get("old_version", ""), new_version=self.version,
            reason=reason, message=message,
        )

    def _cmdline_rejoins(self) -> None:
        for kind_name, cid, old_boot in bootid.rejoin_markers(self.cmdline):
            kind = catalog.get(kind_name)
            if kind is None or not kind.self_terminating:
                log.warning("ignoring %s=%s:%s: not a self-terminating kind",
                            bootid.REJOIN_PARAM, kind_name, cid)
                continue
            if self.journal.lookup(cid) is not None:
                continue  # the journal knows it (waiting for its ack, or already acknowledged)
            # Journaled like the rejoin record the previous agent wrote to a journal that did
            # not survive, so that the gateway's ack is remembered.
            self.journal.awaiting_rejoin(cid, {"old_boot_id": old_boot}, kind=kind_name)
            log.info("%s %s: rejoin marker on the kernel command line", kind_name, cid)

    # -- replay --------------------------------------------------------------------------------

    def _replay_unfinished(self, entry: Entry) -> bool:
        """True when the command must run (again); otherwise its INTERRUPTED result is journaled."""
        kind = catalog.get(entry.kind)
        if kind is None:
            return False
        damaged = self.journal.last_scan is not None and self.journal.last_scan.skipped > 0
        if entry.state is State.ACCEPTED and entry.command and (kind.retry_safe or not damaged):
            return True  # it never started (its fsync'ed "started" record would say): a first run
        if kind.retry_safe and entry.command and entry.attempts < MAX_ATTEMPTS:
            return True
        if kind.retry_safe and entry.command:
            self._finish(entry.id, kind, Interrupted(
                f"{kind.name} {entry.id} was started {entry.attempts} times and the agent stopped each "
                "time before it finished; not starting it again", attempts=entry.attempts,
            ), started_ms=entry.started_ms)
            return False
        self._clean_up_interrupted(kind, entry)
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.started_ms / 1000)) if entry.started_ms \
            else "an unknown time"
        self._finish(entry.id, kind, Interrupted(
            f"the agent stopped while {kind.name} {entry.id} ran (started {when}, boot "
            f"{entry.started_boot_id or '?'}); it is not retry-safe and was not run again",
            started_boot_id=entry.started_boot_id,
        ), started_ms=entry.started_ms)
        return False

    def _clean_up_interrupted(self, kind: catalog.Kind, entry: Entry) -> None:
        """Let the handler undo a half-done command that will not run again (its on_interrupted)."""
        if not entry.command or entry.state is not State.STARTED:
            return
        try:
            cmd = session_pb2.SignedCommand.FromString(entry.command)
            payload = schema.decode_payload(kind.name, decode_command_body(cmd.body).payload)
            params = self._parse(kind, payload)
            self.handlers[kind.name].on_interrupted(params)
        except (AgentError, DecodeError, OSError, KeyError) as exc:
            log.warning("%s %s: the clean-up after the interruption failed: %s", kind.name, entry.id, exc)

    def _requeue(self, entry: Entry) -> None:
        kind = catalog.KINDS[entry.kind]
        try:
            cmd = session_pb2.SignedCommand.FromString(entry.command)
            body = decode_command_body(cmd.body)
            check_boot(body, kind, self.boot_id)  # a journal that outlived a reboot (node role)
            timeout = float(body.timeout_seconds or kind.timeout_seconds)
            params = self._parse(kind, schema.decode_payload(kind.name, body.payload))
        except (AgentError, DecodeError) as exc:
            error = exc if isinstance(exc, AgentError) else InvalidParameters(f"journaled command: {exc}")
            self._finish(entry.id, kind, error, started_ms=entry.started_ms)
            return
        log.info("re-running %s %s (state %s at restart)", kind.name, entry.id, entry.state)
        self._enqueue(entry.id, kind, params, timeout)


def _now_ms() -> int:
    return int(time.time() * 1000)


def carries_release_report(value: Message | None) -> bool:
    """Whether a result holds a release report (inventory.refresh's or bmc.query baseline's
    ``release``): the control plane returns a node to the pool on it, so it is evidence and
    signed by the node key as an attested kind's result is, whatever its kind's flags (the
    gateway verifies every signature a result carries)."""
    if value is None or "release" not in value.DESCRIPTOR.fields_by_name:
        return False
    return value.HasField("release")
