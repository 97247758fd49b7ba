"""disk.wipe: erase disks with a method the controller supports, verify, and return one
erasure certificate per disk (the runtime signs the whole result with the node key).

Before anything is erased, every disk is resolved (exactly one disk per hint set, no disk
twice), checked (not mounted, not holding the system, not held by RAID/LVM/dm; for an NVMe
method that acts on the whole controller, every namespace of it), and its method planned: an
explicit method the disk does not support is refused with UNSUPPORTED, and BEST_AVAILABLE
picks the strongest supported one (Purge before Clear, NIST SP 800-88). Only then do the
disks run, in parallel, each with its own progress (subject = disk name).

Methods and NIST levels:

=========================  =====  ==========================================================
NVME_SANITIZE_BLOCK        Purge  nvme sanitize --sanact=2, progress from the sanitize log
NVME_SANITIZE_CRYPTO       Purge  nvme sanitize --sanact=4
NVME_SANITIZE_OVERWRITE    Purge  nvme sanitize --sanact=3
NVME_FORMAT_CRYPTO         Purge  nvme format --ses=2 (FNA bit 2)
NVME_FORMAT_USER_DATA      Purge  nvme format --ses=1
ATA_SECURE_ERASE_ENHANCED  Purge  hdparm --security-erase-enhanced (refused when frozen)
ATA_SECURE_ERASE           Clear  hdparm --security-erase
OVERWRITE_ZEROS / RANDOM   Clear  O_DIRECT writes of zeros / AES-CTR keystream, N passes
DISCARD                    none   BLKDISCARD (NVMe deallocate); no sanitization claim
METADATA                   none   zero 1 MiB at both ends of the disk and of each partition
=========================  =====  ==========================================================

Verification reads back blocks: SAMPLED (default 1024 random 4 KiB blocks, plus the first and
last) or FULL (every byte). A method that leaves zeros must read zeros; the random overwrite
must read its keystream; the others must read something other than the old data at every
sampled block that held data before (sampled before erasing). A disk whose erase or
verification fails gets a certificate with ``error`` set and ``verified`` false; the command
still returns the other disks' certificates.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.commands.base import Context, Handler
from agent.errors import AgentError, InvalidParameters, ProtectedDevice, Reason, Unsupported
from agent.hw import ata, block, diskio, nvme, partitions
from agent.proc import Completed
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

M = agent_pb2.WipeMethod
L = agent_pb2.NistLevel
V = agent_pb2.WipeVerify

LEVEL = {
    M.NVME_SANITIZE_BLOCK: L.PURGE,
    M.NVME_SANITIZE_CRYPTO: L.PURGE,
    M.NVME_SANITIZE_OVERWRITE: L.PURGE,
    M.NVME_FORMAT_CRYPTO: L.PURGE,
    M.NVME_FORMAT_USER_DATA: L.PURGE,
    M.ATA_SECURE_ERASE_ENHANCED: L.PURGE,
    M.ATA_SECURE_ERASE: L.CLEAR,
    M.OVERWRITE_ZEROS: L.CLEAR,
    M.OVERWRITE_RANDOM: L.CLEAR,
    M.DISCARD: L.NIST_LEVEL_UNSPECIFIED,
    M.METADATA: L.NIST_LEVEL_UNSPECIFIED,
}
# BEST_AVAILABLE tries these in order.
STRENGTH = (
    M.NVME_SANITIZE_BLOCK,
    M.NVME_SANITIZE_CRYPTO,
    M.NVME_SANITIZE_OVERWRITE,
    M.NVME_FORMAT_CRYPTO,
    M.NVME_FORMAT_USER_DATA,
    M.ATA_SECURE_ERASE_ENHANCED,
    M.ATA_SECURE_ERASE,
    M.OVERWRITE_ZEROS,
)
CONTROLLER_WIDE = (M.NVME_SANITIZE_BLOCK, M.NVME_SANITIZE_CRYPTO, M.NVME_SANITIZE_OVERWRITE)
SAMPLE = 4096
MAX_PASSES = 8
_MiB = 1 << 20


@dataclass(frozen=True)
class WipeParams:
    disks: tuple[block.Hints, ...]
    method: agent_pb2.WipeMethod
    passes: int
    verify: agent_pb2.WipeVerify
    minimum_level: agent_pb2.NistLevel
    samples: int


@dataclass(frozen=True)
class Plan:
    disk: block.Disk
    method: agent_pb2.WipeMethod
    tool: str
    controller: nvme.Controller | None = None
    namespace: nvme.Namespace | None = None


@dataclass
class Capabilities:
    supported: dict[int, str]           # method -> tool label
    why_not: dict[int, str]             # method -> reason it is not supported
    controller: nvme.Controller | None = None
    namespace: nvme.Namespace | None = None


class Wipe(Handler[agent_pb2.WipeRequest, WipeParams], kind="disk.wipe"):
    def __init__(
        self,
        disks: Callable[[], list[block.Disk]] | None = None,
        runner: Callable[..., Completed] | None = None,
    ) -> None:
        self.disks = disks or block.list_disks
        self.runner = runner  # runs nvme/hdparm; default: the command context's run()

    def parse(self, payload: agent_pb2.WipeRequest) -> WipeParams:
        if not payload.disks:
            raise InvalidParameters("disk.wipe needs at least one disk")
        if len(payload.disks) > 64:
            raise InvalidParameters("disk.wipe takes at most 64 disks")
        if payload.method not in M.values():
            raise InvalidParameters(f"unknown wipe method {payload.method}")
        if payload.verify not in V.values() or payload.minimum_level not in L.values():
            raise InvalidParameters("unknown verify mode or minimum level")
        passes = payload.passes or 1
        if passes > MAX_PASSES:
            raise InvalidParameters(f"passes is at most {MAX_PASSES}")
        if passes > 1 and payload.method not in (M.OVERWRITE_ZEROS, M.OVERWRITE_RANDOM):
            raise InvalidParameters("passes only applies to the overwrite methods")
        samples = payload.samples or 1024
        if samples > 1_000_000:
            raise InvalidParameters("samples is at most 1000000")
        method = payload.method or M.BEST_AVAILABLE
        if method != M.BEST_AVAILABLE and LEVEL[method] < payload.minimum_level:
            raise InvalidParameters(
                f"{M.Name(method)} reaches {L.Name(LEVEL[method])}, below the minimum"
                f" {L.Name(payload.minimum_level)}"
            )
        return WipeParams(
            disks=tuple(block.Hints.from_proto(h) for h in payload.disks),
            method=method,
            passes=passes,
            verify=payload.verify,
            minimum_level=payload.minimum_level,
            samples=samples,
        )

    # -- planning ------------------------------------------------------------------------

    def capabilities(self, run: Callable[..., Completed], disk: block.Disk) -> Capabilities:
        caps = Capabilities(supported={}, why_not={})
        overwrite = "agent overwrite (O_DIRECT)"
        caps.supported[M.OVERWRITE_ZEROS] = overwrite
        caps.supported[M.OVERWRITE_RANDOM] = overwrite + " AES-CTR"
        caps.supported[M.METADATA] = "agent metadata wipe"
        if disk.supports_discard:
            caps.supported[M.DISCARD] = "ioctl BLKDISCARD" if not disk.is_file else "fallocate punch hole"
        else:
            caps.why_not[M.DISCARD] = "the device does not support discard"
        nvme_methods = (M.NVME_FORMAT_USER_DATA, M.NVME_FORMAT_CRYPTO, *CONTROLLER_WIDE)
        if disk.transport == "nvme" and disk.controller:
            ctrl = nvme.id_ctrl(run, disk.controller)
            ns = nvme.id_ns(run, str(disk.path), disk.nsid or 1)
            caps.controller, caps.namespace = ctrl, ns
            tool = nvme.version(run)
            for method, ok, what in (
                (M.NVME_FORMAT_USER_DATA, ctrl.can_format, "Format NVM (OACS bit 1)"),
                (M.NVME_FORMAT_CRYPTO, ctrl.can_crypto_format, "crypto erase in Format NVM (FNA bit 2)"),
                (M.NVME_SANITIZE_BLOCK, ctrl.can_sanitize_block, "Sanitize block erase (SANICAP bit 1)"),
                (M.NVME_SANITIZE_CRYPTO, ctrl.can_sanitize_crypto, "Sanitize crypto erase (SANICAP bit 0)"),
                (M.NVME_SANITIZE_OVERWRITE, ctrl.can_sanitize_overwrite, "Sanitize overwrite (SANICAP 2)"),
            ):
                if ok:
                    caps.supported[method] = tool
                else:
                    caps.why_not[method] = f"controller {ctrl.name} ({ctrl.model}) does not support {what}"
        else:
            for method in nvme_methods:
                caps.why_not[method] = f"{disk.name} is not an NVMe namespace ({disk.transport})"
        ata_methods = (M.ATA_SECURE_ERASE, M.ATA_SECURE_ERASE_ENHANCED)
        if disk.transport == "sata":
            try:
                sec = ata.identify(run, str(disk.path))
            except AgentError as exc:
                sec = None
                for method in ata_methods:
                    caps.why_not[method] = f"hdparm: {exc.message}"
            if sec is not None:
                for method, ok in ((M.ATA_SECURE_ERASE, True), (M.ATA_SECURE_ERASE_ENHANCED, sec.enhanced)):
                    if not sec.supported:
                        caps.why_not[method] = "no ATA security feature set"
                    elif sec.frozen:
                        caps.why_not[method] = "ATA security is frozen (suspend/resume or re-plug it)"
                    elif sec.locked:
                        caps.why_not[method] = "ATA security is locked"
                    elif not ok:
                        caps.why_not[method] = "enhanced security erase not supported"
                    else:
                        caps.supported[method] = "hdparm"
        else:
            for method in ata_methods:
                caps.why_not[method] = f"{disk.name} is not a SATA disk ({disk.transport})"
        return caps

    def plan(self, run: Callable[..., Completed], disk: block.Disk, params: WipeParams) -> Plan:
        caps = self.capabilities(run, disk)
        if params.method == M.BEST_AVAILABLE:
            for method in STRENGTH:
                if method in caps.supported and LEVEL[method] >= params.minimum_level:
                    return Plan(disk, method, caps.supported[method], caps.controller, caps.namespace)
            raise Unsupported(
                f"{disk.name}: no supported method reaches {L.Name(params.minimum_level)}",
                disk=disk.name,
            )
        if params.method not in caps.supported:
            why = caps.why_not.get(params.method, "")
            raise Unsupported(
                f"{disk.name}: {M.Name(params.method)} is not supported: {why}",
                disk=disk.name,
            )
        return Plan(disk, params.method, caps.supported[params.method], caps.controller, caps.namespace)

    # -- running -------------------------------------------------------------------------

    def run(self, ctx: Context, params: WipeParams) -> agent_pb2.WipeResult:
        run = self.runner or ctx.run
        all_disks = self.disks()
        targets: list[block.Disk] = []
        for hints in params.disks:
            disk = block.select(all_disks, hints)
            if any(d.name == disk.name for d in targets):
                raise InvalidParameters(f"{disk.name} is named twice")
            block.check_safe(disk)
            targets.append(disk)
        plans = [self.plan(run, d, params) for d in targets]
        wide_controllers = [p.disk.controller for p in plans if p.method in CONTROLLER_WIDE]
        if len(wide_controllers) != len(set(wide_controllers)):
            raise InvalidParameters("two namespaces of one controller with a controller-wide sanitize:"
                                    " name one of them (sanitize erases them all)")
        for p in plans:
            wide = p.method in CONTROLLER_WIDE or (
                p.method in (M.NVME_FORMAT_USER_DATA, M.NVME_FORMAT_CRYPTO)
                and p.controller is not None and p.controller.format_all_namespaces
            )
            if wide:
                for sibling in all_disks:
                    if sibling.controller == p.disk.controller and sibling.name != p.disk.name:
                        try:
                            block.check_safe(sibling)
                        except ProtectedDevice as exc:
                            raise ProtectedDevice(
                                f"{p.disk.name}: {M.Name(p.method)} erases every namespace of"
                                f" {p.disk.controller}, and {exc.message}",
                                disk=p.disk.name,
                            ) from exc
        result = agent_pb2.WipeResult()
        certs: list[agent_pb2.ErasureCertificate | None] = [None] * len(plans)
        with ctx.hold(*(f"disk:{p.disk.name}" for p in plans)):
            threads = []
            for i, p in enumerate(plans):
                def body(i: int = i, p: Plan = p) -> None:
                    certs[i] = DiskWipe(ctx, run, p, params).run()
                t = threading.Thread(target=body, name=f"wipe-{p.disk.name}", daemon=True)
                t.start()
                threads.append(t)
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        ctx.check()  # a cancel or the deadline ends the command as such
        for c in certs:
            assert c is not None
            result.certificates.append(c)
        return result


class DiskWipe:
    """Erase and verify one disk; never raises (except on cancel): errors go in the certificate."""

    def __init__(self, ctx: Context, run: Callable[..., Completed], plan: Plan, params: WipeParams) -> None:
        self.ctx, self.run_tool, self.plan, self.params = ctx, run, plan, params
        self.disk = plan.disk
        self.cert = agent_pb2.ErasureCertificate(
            node_id=ctx.config.node_id,
            disk=self.disk.identity(),
            method=plan.method,
            level=LEVEL[plan.method],
            passes=params.passes if plan.method in (M.OVERWRITE_ZEROS, M.OVERWRITE_RANDOM) else 1,
            verification=params.verify,
            tool=plan.tool,
        )
        self._meter = ctx.meter(total=self.disk.size, subject=self.disk.name)
        self._key: bytes = b""
        self._old: dict[int, bytes] = {}
        self._regions: list[tuple[int, int]] = []

    def progress(self, done: int, total: int, message: str, force: bool = False) -> None:
        self._meter.update(done, total=total, message=message, force=force)

    def run(self) -> agent_pb2.ErasureCertificate:
        self.cert.started_at_unix_ms = int(time.time() * 1000)
        try:
            if self.params.verify != V.NO_VERIFY:
                self._sample_old()
            self._erase()
            self.ctx.check()
            if self.params.verify != V.NO_VERIFY or self.plan.method == M.METADATA:
                self._verify()
            else:
                self.cert.verification_detail = "not verified (NO_VERIFY requested)"
        except AgentError as exc:  # cancel and timeout too: run() re-raises them after the join
            self.cert.error = exc.message
            self.cert.verified = False
        except OSError as exc:
            self.cert.error = f"{self.disk.name}: {exc.strerror or exc}"
            self.cert.verified = False
        except Exception as exc:
            log.exception("%s: wipe failed", self.disk.name)
            self.cert.error = f"{self.disk.name}: internal error: {type(exc).__name__}: {exc}"
            self.cert.verified = False
        finally:
            self.cert.finished_at_unix_ms = int(time.time() * 1000)
        self.progress(self.disk.size, self.disk.size, "done" if not self.cert.error else "failed", force=True)
        return self.cert

    # -- erase ---------------------------------------------------------------------------

    def _erase(self) -> None:
        m = self.plan.method
        if m in (M.OVERWRITE_ZEROS, M.OVERWRITE_RANDOM):
            for n in range(self.cert.passes):
                self._overwrite(random_data=m == M.OVERWRITE_RANDOM, label=f"pass {n + 1}/{self.cert.passes}")
        elif m == M.METADATA:
            self._metadata()
        elif m == M.DISCARD:
            with block.opened(self.disk, write=True) as fd:
                self.progress(0, self.disk.size, "discarding", force=True)
                block.discard(fd)
                os.fsync(fd)
        elif m in (M.NVME_FORMAT_USER_DATA, M.NVME_FORMAT_CRYPTO):
            assert self.plan.namespace is not None
            self.progress(0, self.disk.size, "nvme format", force=True)
            ses = 1 if m == M.NVME_FORMAT_USER_DATA else 2
            timeout_ms = int(max(60.0, self.ctx.remaining() - 30) * 1000)
            nvme.format_ns(self.run_tool, str(self.disk.path), self.plan.namespace, ses, timeout_ms)
        elif m in CONTROLLER_WIDE:
            self._sanitize(m)
        elif m in (M.ATA_SECURE_ERASE, M.ATA_SECURE_ERASE_ENHANCED):
            self.progress(0, self.disk.size, "ATA security erase", force=True)
            ata.erase(self.run_tool, str(self.disk.path), enhanced=m == M.ATA_SECURE_ERASE_ENHANCED,
                      timeout=self.ctx.remaining())
        else:  # pragma: no cover - plan() only yields the methods above
            raise Unsupported(f"{M.Name(m)} is not implemented")
        if m not in (M.OVERWRITE_ZEROS, M.OVERWRITE_RANDOM, M.METADATA, M.DISCARD):
            with block.opened(self.disk, write=False) as fd:
                block.flush_buffers(fd)  # the controller erased behind the page cache
                block.reread_partitions(fd)

    def _sanitize(self, method: agent_pb2.WipeMethod) -> None:
        action = {
            M.NVME_SANITIZE_BLOCK: nvme.SANACT_BLOCK,
            M.NVME_SANITIZE_CRYPTO: nvme.SANACT_CRYPTO,
            M.NVME_SANITIZE_OVERWRITE: nvme.SANACT_OVERWRITE,
        }[method]
        ctrl = self.disk.controller
        nvme.sanitize(self.run_tool, ctrl, action)
        while True:
            status = nvme.sanitize_log(self.run_tool, ctrl)
            if not status.running:
                break
            self.progress(int(self.disk.size * status.progress), self.disk.size, "nvme sanitize")
            self.ctx.sleep(2.0)
        if not status.succeeded:
            raise AgentError(f"{ctrl}: sanitize ended with status {status.status}", reason=Reason.TOOL_FAILED)

    def _overwrite(self, *, random_data: bool, label: str) -> None:
        size = self.disk.size
        fd = block.open_disk(self.disk, write=True)
        dfd = block.try_direct(self.disk, write=True)
        if dfd is None:
            self.cert.tool += " (buffered: O_DIRECT refused)"
        keystream = None
        if random_data:
            self._key = secrets.token_bytes(32)
            keystream = Keystream(self._key)
        try:
            # Six buffers (48 MiB) per disk, not the deploy's sixteen: a wipe runs on many disks
            # at once, and filling a buffer with zeros or keystream never holds the disk up.
            with diskio.DiskWriter(fd, dfd, size=size, cancel=self.ctx.cancel_event,
                                   block=self.disk.logical_block_size, buffers=6) as w:
                offset = 0
                while offset < size:
                    self.ctx.check()
                    buf = w.take()
                    n = min(len(buf), size - offset)
                    if keystream is not None:
                        keystream.fill(buf, offset, n)
                    w.submit(buf, offset, n)  # zero buffers stay zero: nothing else writes them
                    offset += n
                    self.progress(offset, size, f"overwrite {label}")
        finally:
            if dfd is not None:
                os.close(dfd)
            os.close(fd)

    def _metadata(self) -> None:
        size = self.disk.size
        with block.opened(self.disk, write=True) as fd:
            regions = [(0, min(_MiB, size)), (max(0, size - _MiB), size)]
            for p in partitions.read_partitions(fd, self.disk.name, self.disk.logical_block_size):
                start, end = p.start_bytes, min(size, p.start_bytes + p.size_bytes)
                regions += [(start, min(end, start + _MiB)), (max(start, end - _MiB), end)]
            regions = [(a - a % 512, b) for a, b in regions if b > a]
            for a, b in regions:
                block.zero_out(fd, a, b - a)
            os.fsync(fd)
            block.reread_partitions(fd)
        self._regions = regions

    # -- verification --------------------------------------------------------------------

    def _offsets(self) -> list[int]:
        seed = int.from_bytes(hashlib.sha256(self.disk.name.encode() + self._nonce()).digest()[:8], "big")
        return block.sample_offsets(self.disk.size, self.params.samples, SAMPLE, seed)

    def _nonce(self) -> bytes:
        if not hasattr(self, "_nonce_bytes"):
            self._nonce_bytes = secrets.token_bytes(16)
        return self._nonce_bytes

    def _sample_old(self) -> None:
        with block.opened(self.disk, write=False) as fd:
            for off in self._offsets():
                data = os.pread(fd, SAMPLE, off)
                if data.strip(b"\0"):
                    self._old[off] = hashlib.sha256(data).digest()

    def _expect(self) -> str:
        m = self.plan.method
        if m in (M.OVERWRITE_ZEROS, M.METADATA):
            return "zeros"
        if m == M.OVERWRITE_RANDOM:
            return "keystream"
        if m == M.NVME_FORMAT_USER_DATA and self.plan.namespace is not None and \
                self.plan.namespace.deallocated_reads_zeros:
            return "zeros"
        return "not-old"

    def _verify(self) -> None:
        expect = self._expect()
        self.progress(0, self.disk.size, "verifying", force=True)
        fd = block.try_direct(self.disk, write=False) if self.disk.logical_block_size <= SAMPLE else None
        direct = fd is not None
        if fd is None:
            fd = block.open_disk(self.disk, write=False)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            if self.plan.method == M.METADATA:
                bad, checked = self._check_regions(fd, self._regions, expect)
            elif self.params.verify == V.FULL:
                bad, checked = self._check_regions(fd, [(0, self.disk.size)], expect)
            else:
                bad, checked = self._check_samples(fd, expect)
        finally:
            os.close(fd)
        self.cert.bytes_verified = checked
        what = {"zeros": "all zeros", "keystream": "the written random pattern",
                "not-old": "no block equal to the old data"}[expect]
        scope = "regions" if self.plan.method == M.METADATA else (
            "full read-back" if self.params.verify == V.FULL else f"{checked // SAMPLE} samples")
        if bad:
            self.cert.verified = False
            self.cert.verification_detail = f"{scope}: {bad} block(s) are not {what}"
            self.cert.error = f"verification failed: {bad} block(s) are not {what}"
        else:
            self.cert.verified = True
            self.cert.verification_detail = f"{scope}: {what}" + ("" if direct else " (page cache dropped)")
            if expect == "not-old":
                self.cert.verification_detail += f" ({len(self._old)} sampled blocks held data before)"

    def _block_ok(self, data: bytes | memoryview, off: int, expect: str, keystream: Keystream | None) -> bool:
        if expect == "zeros":
            return not bytes(data).strip(b"\0")
        if expect == "keystream":
            assert keystream is not None
            return bytes(data) == keystream.at(off, len(data))
        old = self._old.get(off)
        return old is None or hashlib.sha256(data).digest() != old

    def _check_samples(self, fd: int, expect: str) -> tuple[int, int]:
        keystream = Keystream(self._key) if expect == "keystream" else None
        buf = mmap.mmap(-1, SAMPLE)
        view = memoryview(buf)
        bad = checked = 0
        try:
            offsets = self._offsets()
            for i, off in enumerate(offsets):
                if i % 64 == 0:
                    self.ctx.check()
                n = os.preadv(fd, [view], off)
                checked += n
                if not self._block_ok(view[:n], off, expect, keystream):
                    bad += 1
                self.progress(i, len(offsets), "verifying samples")
        finally:
            view.release()
            buf.close()
        return bad, checked

    def _check_regions(self, fd: int, regions: Sequence[tuple[int, int]], expect: str) -> tuple[int, int]:
        keystream = Keystream(self._key) if expect == "keystream" else None
        old_offsets = sorted(self._old)
        buf = mmap.mmap(-1, diskio.BUFFER)
        view = memoryview(buf)
        bad = checked = 0
        total = sum(b - a for a, b in regions)
        try:
            for a, b in regions:
                pos = a
                while pos < b:
                    self.ctx.check()
                    n = os.preadv(fd, [view[: min(len(view), b - pos)]], pos)
                    if n <= 0:
                        raise AgentError(f"{self.disk.name}: read failed at byte {pos}",
                                         reason=Reason.TOOL_FAILED)
                    if expect == "not-old":
                        for off in old_offsets:
                            if pos <= off < pos + n and not self._block_ok(
                                view[off - pos : off - pos + SAMPLE], off, expect, None
                            ):
                                bad += 1
                    elif not self._block_ok(view[:n], pos, expect, keystream):
                        bad += 1
                    pos += n
                    checked += n
                    self.progress(checked, total, "verifying")
        finally:
            view.release()
            buf.close()
        return bad, checked


class Keystream:
    """AES-256-CTR keystream addressed by byte offset: the random overwrite's data, which the
    verification regenerates at any offset instead of storing it."""

    def __init__(self, key: bytes) -> None:
        from agent.deps import need

        need("cryptography")
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        def cipher(counter: int) -> Any:  # cryptography's CipherContext
            return Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()

        self._cipher = cipher
        self._zeros = bytes(diskio.BUFFER)
        self._scratch = bytearray(diskio.BUFFER + 15)  # update_into wants block_size - 1 spare

    def fill(self, buf: memoryview, offset: int, n: int) -> None:
        assert offset % 16 == 0
        enc = self._cipher(offset // 16)
        zeros = memoryview(self._zeros)
        pos = 0
        while pos < n:
            k = min(n - pos, len(zeros))
            enc.update_into(zeros[:k], self._scratch)
            buf[pos : pos + k] = memoryview(self._scratch)[:k]
            pos += k

    def at(self, offset: int, n: int) -> bytes:
        assert offset % 16 == 0
        data: bytes = self._cipher(offset // 16).update(bytes(n))
        return data
