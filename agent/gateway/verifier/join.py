"""Attestation at every join, for the reference gateway's sessions (agent/gateway/server.py).

The Hello carries the node's TpmIdentity. ``on_hello`` answers it with an AttestChallenge
frame (or decides at once: no TPM, a TPM that failed, an identity refused); ``on_answer``
verifies the node's AttestAnswer and returns the AttestVerdict frame the gateway sends back.
A verdict belongs to one boot of one node with one node key: ``vouches`` says whether a
result signed by that key in that boot comes from an attested boot.

The verification runs on the session's own thread, outside the gateway's lock: a join being
verified holds up no other session.

A refused join is handed to the site daemon that booted the node (``Gateway(site_node=...)``)
as boot.cleanUp with ``join_refused`` (``site_refusal``): what the site serves that boot goes,
and its timeline names the cause ``refused`` with the gateway's reason (docs/site.md, "Why a
node did not come up"). The command kinds are the project's given table: an existing kind
carries it, the one a control plane sends a boot it will not trust anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from agent.gateway.verifier.attest import Challenge, Status, Verdict, Verifier
from agent.proto import agent_pb2, session_pb2, site_pb2
from agent.security.attest_contract import evidence_from, identity_from

log = logging.getLogger(__name__)

MAX_NODES = 100_000
# Challenges made for one source (the peer's address) a second, sustained, and in a burst: a
# challenge costs the gateway an EK chain check and a MakeCredential, and the pool of outstanding
# challenges is shared (attest.MAX_PENDING), so one source cannot fill it within a challenge's
# time to live (8 a second for 120 s is under 4,096). Sources past the rate are told to retry.
HELLO_RATE = 8.0
HELLO_BURST = 64.0
MAX_SOURCES = 4096


class SourceRate:
    """A token bucket per source. The table is bounded: past ``max_sources`` the source seen
    longest ago is forgotten (it comes back with a full burst, no more)."""

    def __init__(self, rate: float = HELLO_RATE, burst: float = HELLO_BURST, max_sources: int = MAX_SOURCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_sources, self.clock = rate, burst, max_sources, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # source -> (tokens, when)
        self._lock = threading.Lock()

    def allow(self, source: str) -> bool:
        now = self.clock()
        with self._lock:
            tokens, then = self._buckets.pop(source, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            ok = tokens >= 1.0
            self._buckets[source] = (tokens - 1.0 if ok else tokens, now)
            while len(self._buckets) > self.max_sources:
                self._buckets.popitem(last=False)
        return ok


@dataclass
class Join:
    boot_id: str
    public_key: bytes
    role: str = "ramdisk"
    challenge: Challenge | None = None
    verdict: Verdict | None = None


def file_release(attestation: JoinAttestation | None, node_id: str, boot_id: str,
                 result: Message | None) -> None:
    """A release report (inventory.refresh's ``release``) gets the verdict of the attestation of
    the boot it was taken in: the agent leaves ``attestation_verdict`` to the gateway, which holds
    the session's verdict (docs/lifecycle.md, "The release report")."""
    if not isinstance(result, agent_pb2.InventoryRefreshResult) or not result.HasField("release"):
        return
    report = result.release
    if report.boot_id != boot_id:
        report.attestation_verdict = (f"no attestation verdict: the report names boot {report.boot_id}, "
                                      f"its result was signed in {boot_id}")
    elif attestation is None:
        report.attestation_verdict = "no attestation verdict: this gateway does not attest its nodes"
    else:
        report.attestation_verdict = attestation.verdict_of_boot(node_id, boot_id)


def verdict_message(v: Verdict) -> session_pb2.AttestVerdict:
    return session_pb2.AttestVerdict(status=str(v.status), check=v.check, reason=v.reason, matched=v.matched)


class JoinAttestation:
    """Per node, this session's challenge and the verdict on it."""

    def __init__(self, verifier: Verifier, on_verdict: Callable[[str, Verdict], None] | None = None,
                 rate: SourceRate | None = None) -> None:
        self.verifier = verifier
        self.on_verdict = on_verdict
        self.rate = rate or SourceRate()
        self._joins: dict[str, Join] = {}
        self._lock = threading.Lock()

    def begin(self, node_id: str, hello: session_pb2.Hello) -> Join:
        """The node's new join, with no verdict yet: from here its previous verdict vouches for
        nothing (the gateway calls this first thing at a Hello; ``on_hello`` calls it too)."""
        join = Join(hello.boot_id, bytes(hello.public_key), hello.role or "ramdisk")
        with self._lock:
            if node_id not in self._joins and len(self._joins) >= MAX_NODES:
                dropped = next(iter(self._joins))
                self._joins.pop(dropped)
                log.warning("attestation: %d nodes' joins held; the oldest, %s's, dropped (its results "
                            "no longer count as verified)", MAX_NODES, dropped)
            self._joins[node_id] = join
        return join

    def on_hello(self, node_id: str, hello: session_pb2.Hello, source: str = "") -> session_pb2.Frame:
        """The frame to send after the Welcome: a challenge, or the verdict already reached.
        It fails closed: an exception anywhere is this boot's refusal, named ``verifier``.
        ``source`` (the peer's address) is rated: past its rate the node is told to retry."""
        join = self.begin(node_id, hello)
        try:
            out = self._at_hello(node_id, hello, source)
        except Exception as e:
            log.exception("attestation of %s: the verifier failed at the Hello", node_id)
            out = Verdict(Status.REFUSED, "verifier", f"{type(e).__name__}: {e}")
        if isinstance(out, Verdict):
            join.verdict = out
            self._decided(node_id, out)
            return session_pb2.Frame(attest_verdict=verdict_message(out))
        join.challenge = ch = out
        return session_pb2.Frame(attest_challenge=session_pb2.AttestChallenge(
            nonce=ch.nonce, credential_blob=ch.credential_blob, encrypted_secret=ch.encrypted_secret))

    def _at_hello(self, node_id: str, hello: session_pb2.Hello, source: str) -> Challenge | Verdict:
        tpm = hello.tpm
        if not hello.HasField("tpm"):
            said = "the agent presents no TPM (an agent that does not attest)"
        elif tpm.absent:
            said = tpm.absent
        elif tpm.error:
            said = f"the node's TPM failed: {tpm.error}"
        else:
            said = ""
        if said:  # the agent's word: where a TPM is bound to the node, it is no excuse
            ek = self.verifier.bound(node_id)
            if ek:
                return Verdict(Status.REFUSED, "tpm_missing", f"EK {ek[:16]} is bound to {node_id}, and the "
                               f"agent says: {said}")
            return Verdict(Status.UNATTESTED, reason=said)
        if not self.rate.allow(source):
            log.warning("attestation of %s: %s is past its rate of Hellos, told to join again later",
                        node_id, source or "its source")
            return Verdict(Status.RETRY, "busy", f"more than {self.rate.rate:g} joins a second from "
                           f"{source or 'this source'}: join again later")
        return self.verifier.try_challenge(node_id, identity_from(tpm))

    def on_answer(self, node_id: str, answer: session_pb2.AttestAnswer) -> session_pb2.Frame:
        with self._lock:
            join = self._joins.get(node_id)
        if join is None or join.challenge is None or join.challenge.nonce != answer.nonce:
            verdict = Verdict(Status.REFUSED, "nonce_reused", "an answer to no challenge of this session")
        elif join.verdict is not None:  # the same challenge answered again: the boot is not trusted
            verdict = join.verdict = Verdict(Status.REFUSED, "nonce_reused",
                                             "this session's challenge was answered twice")
        else:
            try:
                evidence = answer.error or evidence_from(answer)
                verdict = self.verifier.verify(join.challenge, evidence, boot_id=join.boot_id,
                                               node_public=join.public_key, role=join.role)
            except Exception as e:  # verify fails closed itself; this is the frame's reading
                log.exception("attestation of %s: the verifier failed at the answer", node_id)
                verdict = Verdict(Status.REFUSED, "verifier", f"{type(e).__name__}: {e}")
            join.verdict = verdict
        self._decided(node_id, verdict)
        return session_pb2.Frame(attest_verdict=verdict_message(verdict))

    def verdict(self, node_id: str) -> Verdict | None:
        with self._lock:
            join = self._joins.get(node_id)
        return join.verdict if join is not None else None

    def wait_verdict(self, node_id: str, timeout: float) -> Verdict | None:
        """The node's verdict, waiting up to ``timeout`` while its challenge is unanswered."""
        deadline = time.monotonic() + timeout
        while (verdict := self.verdict(node_id)) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return verdict

    def vouches(self, node_id: str, boot_id: str, public_key: bytes) -> tuple[bool, str]:
        """Whether the boot that signed a result attested: (yes or no, why)."""
        with self._lock:
            join = self._joins.get(node_id)
        if join is None or join.verdict is None:
            return False, "the node's boot has no attestation verdict (yet)"
        if (join.boot_id, join.public_key) != (boot_id, public_key):
            return False, "the result was signed in another boot, or by another key, than the attested one"
        return join.verdict.attested, str(join.verdict)

    def verdict_of_boot(self, node_id: str, boot_id: str) -> str:
        """The verdict on the node's boot ``boot_id``, for a person and a record."""
        with self._lock:
            join = self._joins.get(node_id)
        if join is None or join.verdict is None:
            return "no attestation verdict: the node's boot has none (yet)"
        if join.boot_id != boot_id:
            return f"no attestation verdict: boot {boot_id} is not the attested one ({join.boot_id})"
        return str(join.verdict)

    def _decided(self, node_id: str, verdict: Verdict) -> None:
        if self.on_verdict is not None:
            try:
                self.on_verdict(node_id, verdict)
            except Exception:
                log.exception("attestation: the verdict listener failed")


# The bmc.firmware operations that change what the node boots with (site.proto), once the
# site reports them done: the node's next boot measures other firmware. ``apply`` (a firmware
# set carried out) counts only where its result shows the set reached (``applied_set``).
FIRMWARE_CHANGES = frozenset({"simple_update", "push", "update", "set_bios"})


def site_report(attestation: JoinAttestation | None, kind: str, command: bytes, succeeded: bool,
                result: Message | None) -> str:
    """What a result of the site daemon (the gateway's ``site_node``) tells the verifier, and what
    it was told ("" nothing): a bmc.query's system inventory names the node's hardware profile
    (``Verifier.site_inventory``: the BMC's word, not the node's DMI strings), and a bmc.firmware
    update the site made opens the node's window for its next boot (``site_updated_firmware``:
    the firmware set is the request's "firmware_set" parameter, else its operation and image:
    its sha256, image_uri or file; for ``apply``, the profile's set and the versions the BMC's
    inventory read back, ``applied_set``).
    Only the site's own session's results come here: a node cannot report its own inventory."""
    if attestation is None or not succeeded or kind not in ("bmc.query", "bmc.firmware"):
        return ""
    body, request = session_pb2.CommandBody(), site_pb2.BmcOperationRequest()
    try:
        body.ParseFromString(command)
        request.ParseFromString(body.payload)
    except DecodeError:
        return ""
    if not request.node_id:
        return ""
    if kind == "bmc.query" and isinstance(result, site_pb2.BmcOperationResult) and result.HasField("system"):
        s = result.system
        attestation.verifier.site_inventory(request.node_id, s.manufacturer, s.model, s.bios_version)
        return f"{request.node_id}: BMC inventory {s.manufacturer}|{s.model}|{s.bios_version}"
    if kind != "bmc.firmware":
        return ""
    params = request.parameters
    if request.operation == "apply" and isinstance(result, site_pb2.BmcOperationResult):
        named = applied_set(params.get("profile", ""), result)
    elif request.operation in FIRMWARE_CHANGES:
        image = params.get("sha256") or params.get("image_uri") or params.get("file") or ""
        named = params.get("firmware_set") or " ".join(filter(None, (request.operation, image)))
    else:
        return ""
    if not named:
        return ""
    attestation.verifier.site_updated_firmware(request.node_id, named)
    return f"{request.node_id}: site updated its firmware to set {named}"


def applied_set(profile: str, result: site_pb2.BmcOperationResult) -> str:
    """The firmware set a bmc.firmware apply brought the node to, as the window names it
    ("PROFILE (ID VERSION, ...)"), or "" where the result does not show it reached: no step
    carried out (the node was at the set: nothing changed), a step not ``done``, or a component
    the BMC's inventory, read back after the steps, does not report at the set's version. The
    handler stops on each of those already; the gateway holds the result to it all the same."""
    steps = list(result.firmware_plan)
    if not profile or result.state != "applied" or not steps:
        return ""
    running: dict[str, set[str]] = {}
    for c in result.firmware_inventory:
        running.setdefault(c.id, set()).add(c.version)
    reached = []
    for step in steps:
        if step.state != "done" or not step.component_ids:
            return ""
        for cid in step.component_ids:
            if running.get(cid) != {step.expected}:
                return ""
            reached.append(f"{cid} {step.expected}")
    return f"{profile} ({', '.join(reached)})"[:200]


def site_refusal(node_id: str, frame: session_pb2.Frame) -> dict[str, str] | None:
    """boot.cleanUp's payload that tells the site a join was refused, for an AttestVerdict
    frame that refuses; None for any other frame."""
    if frame.WhichOneof("msg") != "attest_verdict" or frame.attest_verdict.status != Status.REFUSED:
        return None
    v = frame.attest_verdict
    return {"node_id": node_id,
            "join_refused": f"attestation refused ({v.check or 'no check named'}): {v.reason}"[:300]}
