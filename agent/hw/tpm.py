"""TPM 2.0 over its character device or a socket: the commands attestation needs, standard
library only.

The wire format is TPM 2.0 Library Part 3 (commands) and Part 2 (structures), big-endian:
a command is a header (tag, size, code), its handles, an authorization area where the command
takes sessions, and its parameters; a response is a header (tag, size, response code), the
handles it returns, the parameter size where sessions were used, the parameters, and the
sessions' answers. Only what attestation and the release gate use is here: capabilities (the
properties, the handles of NV indices and persistent objects), primary keys (the EK from the TCG
default template, the attestation key), public areas, NV public areas and reads (the EK
certificate), policy sessions with PolicySecret (the EK's policy), ActivateCredential, PCR_Read
and Quote.

Every error the TPM answers is a ``TpmFailed`` naming the response code. No TPM is a fact:
``open_default()`` returns None where the kernel offers no /dev/tpmrm0.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.errors import InvalidParameters, TpmFailed
from agent.retry import Backoff, retry

DEVICE = Path("/dev/tpmrm0")
MAX_RESPONSE = 8192  # a TPM's largest response (TPM_PT_MAX_RESPONSE_SIZE) is 4096 on every part seen

ST_NO_SESSIONS = 0x8001
ST_SESSIONS = 0x8002
ST_ATTEST_QUOTE = 0x8018
GENERATED_VALUE = 0xFF544347  # TPM_GENERATED: "\xffTCG", the magic of TPM-made structures

RETRY_CODES = (0x908, 0x90A, 0x922)  # TPM_RC_YIELDED, TPM_RC_TESTING, TPM_RC_RETRY: ask again
# A busy TPM (self test, a yield) is asked again: 20 tries, about 2.5 s of waits in all.
BUSY = Backoff(first=0.01, cap=0.16, tries=20)
RS_PW = 0x40000009  # the password session
RH_OWNER = 0x40000001
RH_LOCKOUT = 0x4000000A
RH_NULL = 0x40000007
RH_ENDORSEMENT = 0x4000000B

EK_HANDLE = 0x81010001  # where the TCG's provisioning guidance persists the RSA EK
EK_ECC_HANDLE = 0x81010002  # ... and the ECC P-256 EK
EK_CERT_RSA_INDEX = 0x01C00002  # the RSA 2048 EK certificate (TCG EK Credential Profile)
EK_CERT_ECC_INDEX = 0x01C0000A  # the ECC NIST P-256 EK certificate
# The TCG's registry of reserved handles: NV indices 0x01C00000-0x01C07FFF hold the TPM maker's
# EK certificates and templates.
EK_NV_RANGE = range(0x01C00000, 0x01C08000)

CAP_HANDLES = 0x1
CAP_PCRS = 0x5
CAP_TPM_PROPERTIES = 0x6
CAP_AUTH_POLICIES = 0x9  # TPM 2.0 rev 1.38: the hierarchies' policies (TPM2_SetPrimaryPolicy)
HR_PCR = 0x00000000
HR_NV_INDEX = 0x01000000  # the first handle of each range, as TPM_CAP_HANDLES takes it
HR_LOADED_SESSION = 0x02000000
HR_SAVED_SESSION = 0x03000000
HR_PERMANENT = 0x40000000
HR_TRANSIENT = 0x80000000
HR_PERSISTENT = 0x81000000
# Every kind of handle TPM_CAP_HANDLES lists, by the name the golden state gives it.
HANDLE_KINDS = {"pcr": HR_PCR, "nv": HR_NV_INDEX, "loaded_session": HR_LOADED_SESSION,
                "saved_session": HR_SAVED_SESSION, "permanent": HR_PERMANENT,
                "transient": HR_TRANSIENT, "persistent": HR_PERSISTENT}
PT_PERMANENT = 0x200  # TPMA_PERMANENT
PT_LOCKOUT_COUNTER = 0x20E  # authorization failures since the last reset of the counter
PT_LOCKOUT_INTERVAL = 0x210  # seconds for the counter to fall by one
PT_STARTUP_CLEAR = 0x201  # TPMA_STARTUP_CLEAR
PT_MAX_AUTH_FAIL = 0x20F  # failures before lockout (maxTries)
PT_LOCKOUT_RECOVERY = 0x211  # seconds before the lockout hierarchy may be tried after a failure
NV_PLATFORMCREATE = 1 << 30  # TPMA_NV: defined by the platform hierarchy (firmware), not the owner


class Permanent(enum.IntFlag):
    """TPMA_PERMANENT bits: what survives a reboot and only a clear takes back."""

    OWNER_AUTH_SET = 1 << 0
    ENDORSEMENT_AUTH_SET = 1 << 1
    LOCKOUT_AUTH_SET = 1 << 2
    DISABLE_CLEAR = 1 << 8
    IN_LOCKOUT = 1 << 9


class Alg(enum.IntEnum):
    RSA = 0x0001
    SHA256 = 0x000B
    NULL = 0x0010
    AES = 0x0006
    RSASSA = 0x0014
    ECDSA = 0x0018
    ECC = 0x0023
    CFB = 0x0043


# The PCR banks' hash algorithms by their TPM_ALG_ID, as tpm2-tools names them.
BANKS = {0x0004: "sha1", 0x000B: "sha256", 0x000C: "sha384", 0x000D: "sha512", 0x0012: "sm3_256"}


class Cc(enum.IntEnum):
    """The command codes used here."""

    EVICT_CONTROL = 0x120
    NV_UNDEFINE_SPACE = 0x122
    DICTIONARY_ATTACK_LOCK_RESET = 0x139
    DICTIONARY_ATTACK_PARAMETERS = 0x13A
    CREATE_PRIMARY = 0x131
    ACTIVATE_CREDENTIAL = 0x147
    NV_READ = 0x14E
    POLICY_SECRET = 0x151
    QUOTE = 0x158
    FLUSH_CONTEXT = 0x165
    NV_READ_PUBLIC = 0x169
    READ_PUBLIC = 0x173
    START_AUTH_SESSION = 0x176
    GET_CAPABILITY = 0x17A
    PCR_READ = 0x17E
    PCR_EXTEND = 0x182


class Attr(enum.IntFlag):
    """TPMA_OBJECT bits."""

    FIXED_TPM = 1 << 1
    FIXED_PARENT = 1 << 4
    SENSITIVE_DATA_ORIGIN = 1 << 5
    USER_WITH_AUTH = 1 << 6
    ADMIN_WITH_POLICY = 1 << 7
    RESTRICTED = 1 << 16
    DECRYPT = 1 << 17
    SIGN = 1 << 18


# PolicySecret(TPM_RH_ENDORSEMENT): the authPolicy of the TCG default EK templates.
EK_POLICY = bytes.fromhex("837197674484b3f81a90cc8d46a5d724fd52d76e06520b64f2a1da1b331469aa")
EK_ATTRS = (Attr.FIXED_TPM | Attr.FIXED_PARENT | Attr.SENSITIVE_DATA_ORIGIN | Attr.ADMIN_WITH_POLICY
            | Attr.RESTRICTED | Attr.DECRYPT)
AK_ATTRS = (Attr.FIXED_TPM | Attr.FIXED_PARENT | Attr.SENSITIVE_DATA_ORIGIN | Attr.USER_WITH_AUTH
            | Attr.RESTRICTED | Attr.SIGN)

# Response codes by name (Part 2, 6.6): format-1 codes by their error number, the rest whole.
_RC1 = {0x01: "ASYMMETRIC", 0x02: "ATTRIBUTES", 0x03: "HASH", 0x04: "VALUE", 0x05: "HIERARCHY",
        0x07: "KEY_SIZE", 0x08: "MGF", 0x09: "MODE", 0x0A: "TYPE", 0x0B: "HANDLE", 0x0C: "KDF",
        0x0D: "RANGE", 0x0E: "AUTH_FAIL", 0x0F: "NONCE", 0x10: "PP", 0x12: "SCHEME",
        0x15: "SIZE", 0x16: "SYMMETRIC", 0x17: "TAG", 0x18: "SELECTOR", 0x1A: "INSUFFICIENT",
        0x1B: "SIGNATURE", 0x1C: "KEY", 0x1D: "POLICY_FAIL", 0x1F: "INTEGRITY", 0x20: "TICKET",
        0x21: "RESERVED_BITS", 0x22: "BAD_AUTH", 0x23: "EXPIRED", 0x24: "POLICY_CC",
        0x25: "BINDING", 0x26: "CURVE", 0x27: "ECC_POINT"}
_RC = {0x100: "INITIALIZE", 0x101: "FAILURE", 0x103: "SEQUENCE", 0x10B: "PRIVATE", 0x119: "HMAC",
       0x120: "DISABLED", 0x121: "EXCLUSIVE", 0x124: "AUTH_TYPE", 0x125: "AUTH_MISSING",
       0x126: "POLICY", 0x127: "PCR", 0x128: "PCR_CHANGED", 0x12D: "UPGRADE",
       0x12E: "TOO_MANY_CONTEXTS", 0x12F: "AUTH_UNAVAILABLE", 0x130: "REBOOT", 0x131: "UNBALANCED",
       0x142: "COMMAND_SIZE", 0x143: "COMMAND_CODE", 0x144: "AUTHSIZE", 0x145: "AUTH_CONTEXT",
       0x146: "NV_RANGE", 0x147: "NV_SIZE", 0x148: "NV_LOCKED", 0x149: "NV_AUTHORIZATION",
       0x14A: "NV_UNINITIALIZED", 0x14B: "NV_SPACE", 0x14C: "NV_DEFINED", 0x150: "BAD_CONTEXT",
       0x151: "CPHASH", 0x152: "PARENT", 0x153: "NEEDS_TEST", 0x154: "NO_RESULT", 0x155: "SENSITIVE",
       0x901: "CONTEXT_GAP", 0x902: "OBJECT_MEMORY", 0x903: "SESSION_MEMORY", 0x904: "MEMORY",
       0x905: "SESSION_HANDLES", 0x906: "OBJECT_HANDLES", 0x907: "LOCALITY", 0x908: "YIELDED",
       0x909: "CANCELED", 0x90A: "TESTING", 0x920: "NV_RATE", 0x921: "LOCKOUT", 0x922: "RETRY",
       0x923: "NV_UNAVAILABLE"}


def rc_name(rc: int) -> str:
    """``TPM_RC_POLICY_FAIL (session 1)``-style text for a response code."""
    if rc & 0x80:  # format 1: an error number and where it applies
        name = "TPM_RC_" + _RC1.get(rc & 0x3F, f"{rc & 0x3F:#x}")
        n = (rc >> 8) & 0xF
        if rc & 0x40:
            return f"{name} (parameter {n})"
        return f"{name} ({'session' if n & 0x8 else 'handle'} {n & 0x7})" if n else name
    if rc & 0x900 == 0x900:
        return "TPM_RC_" + _RC.get(rc & 0x97F, f"warning {rc:#x}")
    return "TPM_RC_" + _RC.get(rc & 0x17F, f"{rc:#x}")


class Transport(Protocol):
    def transact(self, command: bytes) -> bytes: ...

    def close(self) -> None: ...


class DeviceTransport:
    """/dev/tpmrm0: one write, one read (the kernel's resource manager keeps sessions apart)."""

    def __init__(self, path: Path = DEVICE) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def transact(self, command: bytes) -> bytes:
        os.write(self._fd, command)
        return os.read(self._fd, MAX_RESPONSE)

    def close(self) -> None:
        os.close(self._fd)


class SocketTransport:
    """A TPM simulator's command socket (swtpm ``--server``): raw commands and responses.

    Tests and development only; the address is loopback or a unix socket, checked here."""

    def __init__(self, address: tuple[str, int] | Path, timeout: float = 30.0) -> None:
        self.check(address)
        if isinstance(address, tuple):
            self._sock = socket.create_connection(address, timeout=timeout)
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(timeout)
            self._sock.connect(str(address))

    @staticmethod
    def check(address: tuple[str, int] | Path) -> None:
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1"):
            raise InvalidParameters(f"a TPM socket must be on loopback, not {address[0]}")

    def transact(self, command: bytes) -> bytes:
        self._sock.sendall(command)
        head = self._read(10)
        size = struct.unpack(">I", head[2:6])[0]
        if not 10 <= size <= MAX_RESPONSE:
            raise TpmFailed(f"the TPM's response claims {size} bytes")
        return head + self._read(size - 10)

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise TpmFailed("the TPM socket closed mid-response")
            out += chunk
        return bytes(out)

    def close(self) -> None:
        self._sock.close()


# Marshalling -------------------------------------------------------------------------------

def u8(v: int) -> bytes:
    return struct.pack(">B", v)


def u16(v: int) -> bytes:
    return struct.pack(">H", v)


def u32(v: int) -> bytes:
    return struct.pack(">I", v)


def b2(data: bytes) -> bytes:
    """A TPM2B: a 16-bit size, then the bytes."""
    if len(data) > 0xFFFF:
        raise InvalidParameters(f"{len(data)} bytes do not fit a TPM2B")
    return u16(len(data)) + data


def name_of(public: bytes) -> bytes:
    """An object's name from its TPMT_PUBLIC: nameAlg (SHA-256) || H(public area)."""
    return u16(Alg.SHA256) + hashlib.sha256(public).digest()


def qualified_name_of_primary(hierarchy: int, name: bytes) -> bytes:
    """The qualified name of a primary key: H(the hierarchy's handle || its name)."""
    return u16(Alg.SHA256) + hashlib.sha256(u32(hierarchy) + name).digest()


class Reader:
    """Reads a TPM structure front to back, big-endian; running off its end is a TpmFailed.

    ``little`` reads the TCG event log's little-endian records with the same reader, and
    ``error`` names the exception its callers tell apart (the event log's BadEventLog)."""

    def __init__(self, data: bytes, what: str = "TPM response", *, little: bool = False,
                 error: Callable[[str], Exception] = TpmFailed) -> None:
        self.data = data
        self.pos = 0
        self.what = what
        self._order = "<" if little else ">"
        self._error = error

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self._error(f"{self.what} is truncated (wanted {n} bytes at {self.pos})")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def u8(self) -> int:
        return int(self.take(1)[0])

    def u16(self) -> int:
        return int(struct.unpack(self._order + "H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(self._order + "I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(self._order + "Q", self.take(8))[0])

    def b2(self) -> bytes:
        return self.take(self.u16())

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.pos)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise self._error(f"{self.what} has {len(self.data) - self.pos} bytes left over")


def pcr_selection(pcrs: Iterable[int], alg: int = Alg.SHA256) -> bytes:
    """TPML_PCR_SELECTION of one bank."""
    bitmap = bytearray(3)
    for pcr in pcrs:
        if not 0 <= pcr < 24:
            raise InvalidParameters(f"PCR {pcr} is not 0-23")
        bitmap[pcr // 8] |= 1 << (pcr % 8)
    return u32(1) + u16(alg) + u8(3) + bytes(bitmap)


def read_pcr_selection(r: Reader) -> dict[int, list[int]]:
    """A TPML_PCR_SELECTION as {hash algorithm: [PCR, ...]}."""
    out: dict[int, list[int]] = {}
    for _ in range(r.u32()):
        alg = r.u16()
        bitmap = r.take(r.u8())
        out[alg] = [i * 8 + b for i, byte in enumerate(bitmap) for b in range(8) if byte >> b & 1]
    return out


def rsa_template(attrs: int, *, policy: bytes = b"", restricted_decrypt: bool = False,
                 scheme: int = Alg.NULL, unique_size: int = 0) -> bytes:
    """A TPMT_PUBLIC for an RSA 2048 key."""
    symmetric = u16(Alg.AES) + u16(128) + u16(Alg.CFB) if restricted_decrypt else u16(Alg.NULL)
    scheme_part = u16(scheme) + (u16(Alg.SHA256) if scheme != Alg.NULL else b"")
    return (u16(Alg.RSA) + u16(Alg.SHA256) + u32(attrs) + b2(policy) + symmetric + scheme_part
            + u16(2048) + u32(0) + b2(bytes(unique_size)))


def ecc_template(attrs: int, *, policy: bytes = b"", restricted_decrypt: bool = False,
                 scheme: int = Alg.ECDSA, unique_size: int = 0) -> bytes:
    """A TPMT_PUBLIC for a NIST P-256 key."""
    symmetric = u16(Alg.AES) + u16(128) + u16(Alg.CFB) if restricted_decrypt else u16(Alg.NULL)
    scheme_part = u16(scheme) + (u16(Alg.SHA256) if scheme != Alg.NULL else b"")
    return (u16(Alg.ECC) + u16(Alg.SHA256) + u32(attrs) + b2(policy) + symmetric + scheme_part
            + u16(0x0003) + u16(Alg.NULL) + b2(bytes(unique_size)) + b2(bytes(unique_size)))


# The TCG EK Credential Profile's default RSA 2048 template (L-1): its unique is 256 zeros.
EK_RSA_TEMPLATE = rsa_template(EK_ATTRS, policy=EK_POLICY, restricted_decrypt=True, unique_size=256)
# ... and its ECC NIST P-256 template (L-2): x and y of 32 zeros each.
EK_ECC_TEMPLATE = ecc_template(EK_ATTRS, policy=EK_POLICY, restricted_decrypt=True, scheme=Alg.NULL,
                               unique_size=32)
# The attestation key: a restricted ECDSA P-256 signing key, primary in the endorsement hierarchy.
AK_TEMPLATE = ecc_template(AK_ATTRS)


@dataclass(frozen=True)
class NvPublic:
    """An NV index's public area."""

    index: int
    name_alg: int
    attributes: int  # TPMA_NV
    auth_policy: bytes
    size: int

    @property
    def platform_created(self) -> bool:
        return bool(self.attributes & NV_PLATFORMCREATE)


@dataclass(frozen=True)
class Public:
    """A loaded object's public area (TPMT_PUBLIC bytes) and its name (nameAlg || digest)."""

    handle: int
    area: bytes
    name: bytes


@dataclass(frozen=True)
class PublicFields:
    """The parts of a TPMT_PUBLIC that callers check."""

    type: int
    name_alg: int
    attributes: int
    auth_policy: bytes
    parameters: bytes  # everything between the policy and the unique field
    unique: bytes      # RSA: the modulus; ECC: x and y, each a TPM2B, as they are on the wire


def parse_public(area: bytes) -> PublicFields:
    """Split a TPMT_PUBLIC of an RSA or ECC key (the two kinds attestation uses)."""
    r = Reader(area, "TPMT_PUBLIC")
    kind, name_alg, attributes, policy = r.u16(), r.u16(), r.u32(), r.b2()
    start = r.pos
    sym = r.u16()
    if sym != Alg.NULL:
        r.take(4)  # key bits and mode
    scheme = r.u16()
    if scheme != Alg.NULL:
        r.take(2)
    if kind == Alg.RSA:
        r.take(6)  # key bits, exponent
        params = area[start:r.pos]
        unique = r.b2()
    elif kind == Alg.ECC:
        r.take(2)  # curve
        if r.u16() != Alg.NULL:
            r.take(2)
        params = area[start:r.pos]
        unique = r.rest()
    else:
        raise TpmFailed(f"a public area of type {kind:#x}: only RSA and ECC are used")
    r.done()
    return PublicFields(kind, name_alg, attributes, policy, params, unique)


def session_area(*sessions: tuple[int, bytes]) -> bytes:
    """The authorization area: (session handle, hmac or password) each, continueSession off."""
    body = b"".join(u32(handle) + b2(b"") + u8(0) + b2(hmac) for handle, hmac in sessions)
    return u32(len(body)) + body


PW = (RS_PW, b"")  # the empty password: every hierarchy's and key's auth here is empty


def _busy(exc: Exception) -> bool:
    """A TPM that answered it is busy (RETRY_CODES): asked again."""
    return isinstance(exc, TpmFailed) and exc.details.get("rc") in _BUSY_RCS


_BUSY_RCS = frozenset(f"{rc:#x}" for rc in RETRY_CODES)


class Tpm:
    """One TPM, through a transport. Transient handles this makes are flushed by ``close``."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._transient: list[int] = []

    def close(self) -> None:
        for handle in reversed(self._transient):
            with contextlib.suppress(TpmFailed, OSError):
                self.flush(handle)
        self._transient.clear()
        self.transport.close()

    def __enter__(self) -> Tpm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, cc: Cc, handles: Iterable[int] = (), params: bytes = b"",
                sessions: Iterable[tuple[int, bytes]] = (), out_handles: int = 0) -> tuple[list[int], Reader]:
        """Run one command; (handles returned, a reader over the response's parameters)."""
        sessions = list(sessions)
        body = b"".join(u32(h) for h in handles) + (session_area(*sessions) if sessions else b"") + params
        tag = ST_SESSIONS if sessions else ST_NO_SESSIONS
        command = u16(tag) + u32(10 + len(body)) + u32(cc) + body

        def once() -> Reader:
            try:
                raw = self.transport.transact(command)
            except OSError as e:
                raise TpmFailed(f"{cc.name}: the TPM could not be reached: {e}") from e
            r = Reader(raw, f"{cc.name}'s response")
            r.u16()
            if r.u32() != len(raw):
                raise TpmFailed(f"{cc.name}: the response's size field is not its length")
            rc = r.u32()
            if rc:
                raise TpmFailed(f"{cc.name} failed: {rc_name(rc)} ({rc:#x})", rc=f"{rc:#x}",
                                rc_name=rc_name(rc), command=cc.name)
            return r

        r = retry(once, BUSY, retryable=_busy, what=cc.name)
        got = [r.u32() for _ in range(out_handles)]
        if sessions:
            params_out = r.take(r.u32())  # the sessions' answers follow; nothing here checks them
            return got, Reader(params_out, f"{cc.name}'s parameters")
        return got, Reader(r.rest(), f"{cc.name}'s parameters")

    # Capabilities ---------------------------------------------------------------------------

    def properties(self, first: int = 0x100, count: int = 64) -> dict[int, int]:
        """TPM_CAP_TPM_PROPERTIES from ``first`` (0x100: the fixed ones; 0x200: the variable ones)."""
        _, r = self.command(Cc.GET_CAPABILITY, params=u32(CAP_TPM_PROPERTIES) + u32(first) + u32(count))
        r.u8()  # moreData
        r.u32()  # the capability
        return {r.u32(): r.u32() for _ in range(r.u32())}

    def pcr_banks(self) -> list[str]:
        """TPM_CAP_PCRS: the active PCR banks (those with PCRs allocated), e.g. ["sha256"].
        Firmware hashes every image it measures once per active bank; the quote reads SHA-256."""
        _, r = self.command(Cc.GET_CAPABILITY, params=u32(CAP_PCRS) + u32(0) + u32(1))
        r.u8()  # moreData
        r.u32()  # the capability
        return [BANKS.get(alg, f"{alg:#06x}") for alg, pcrs in read_pcr_selection(r).items() if pcrs]

    def pcr_allocation(self) -> dict[int, list[int]]:
        """TPM_CAP_PCRS whole: {hash algorithm: [PCR allocated, ...]}, banks without PCRs included."""
        _, r = self.command(Cc.GET_CAPABILITY, params=u32(CAP_PCRS) + u32(0) + u32(1))
        r.u8()  # moreData
        r.u32()  # the capability
        return read_pcr_selection(r)

    def auth_policies(self) -> dict[int, bytes]:
        """TPM_CAP_AUTH_POLICIES: {permanent handle: TPMT_HA of its policy (hash alg || digest)}."""
        _, r = self.command(Cc.GET_CAPABILITY, params=u32(CAP_AUTH_POLICIES) + u32(HR_PERMANENT) + u32(16))
        r.u8()
        r.u32()
        out = {}
        for _ in range(r.u32()):
            handle, alg = r.u32(), r.u16()
            size = {0x0004: 20, 0x000B: 32, 0x000C: 48, 0x000D: 64, 0x0012: 32}.get(alg, 0)
            out[handle] = u16(alg) + r.take(size)
        return out

    def handles(self, first: int) -> list[int]:
        """TPM_CAP_HANDLES: every handle in the range of ``first`` (HR_NV_INDEX, HR_PERSISTENT),
        asked again from the last one while the TPM says there is more."""
        out: list[int] = []
        start = first
        for _ in range(64):  # a TPM holds a few hundred handles at most; 128 per answer
            _, r = self.command(Cc.GET_CAPABILITY, params=u32(CAP_HANDLES) + u32(start) + u32(128))
            more = r.u8()
            r.u32()
            got = [h for h in (r.u32() for _ in range(r.u32())) if h >> 24 == first >> 24]
            out += got
            if not more or not got:
                break
            start = got[-1] + 1
        return out

    # Objects --------------------------------------------------------------------------------

    def create_primary(self, hierarchy: int, template: bytes) -> Public:
        """A primary key from a template (deterministic: the same seed and template, the same key)."""
        sensitive = b2(b2(b"") + b2(b""))
        params = sensitive + b2(template) + b2(b"") + u32(0)
        handles, r = self.command(Cc.CREATE_PRIMARY, [hierarchy], params, [PW], out_handles=1)
        self._transient.append(handles[0])
        area = r.b2()
        r.b2(), r.b2()  # creation data and hash
        r.u16(), r.u32(), r.b2()  # the creation ticket
        return Public(handles[0], area, r.b2())

    def read_public(self, handle: int) -> Public:
        _, r = self.command(Cc.READ_PUBLIC, [handle])
        area = r.b2()
        return Public(handle, area, r.b2())

    def flush(self, handle: int) -> None:
        self.command(Cc.FLUSH_CONTEXT, params=u32(handle))
        with contextlib.suppress(ValueError):
            self._transient.remove(handle)

    def evict_control(self, object_handle: int, persistent: int) -> None:
        """TPM2_EvictControl with the owner's (empty) authorization: a persistent object evicted
        (``object_handle == persistent``), or a loaded one made persistent at ``persistent``."""
        self.command(Cc.EVICT_CONTROL, [RH_OWNER, object_handle], u32(persistent), [PW])

    # NV -------------------------------------------------------------------------------------

    def nv_undefine(self, index: int) -> None:
        """TPM2_NV_UndefineSpace with the owner's (empty) authorization."""
        self.command(Cc.NV_UNDEFINE_SPACE, [RH_OWNER, index], sessions=[PW])

    def nv_public(self, index: int) -> NvPublic | None:
        """A defined NV index's public area (TPMS_NV_PUBLIC); None where it is not defined."""
        try:
            _, r = self.command(Cc.NV_READ_PUBLIC, [index])
        except TpmFailed as e:
            if e.details.get("rc_name", "").startswith("TPM_RC_HANDLE"):
                return None
            raise
        nv = Reader(r.b2(), "TPMS_NV_PUBLIC")
        found = NvPublic(nv.u32(), nv.u16(), nv.u32(), nv.b2(), nv.u16())
        nv.done()
        return found

    def nv_size(self, index: int) -> int | None:
        """The data size of a defined NV index; None where it is not defined."""
        nv = self.nv_public(index)
        return None if nv is None else nv.size

    def nv_read(self, index: int, size: int, chunk: int = 512) -> bytes:
        """An NV index's data, read with its own (empty) auth in chunks the TPM accepts."""
        out = bytearray()
        while len(out) < size:
            n = min(chunk, size - len(out))
            _, r = self.command(Cc.NV_READ, [index, index], u16(n) + u16(len(out)), [PW])
            out += r.b2()
        return bytes(out)

    # Sessions and credential activation ------------------------------------------------------

    def dictionary_attack_lock_reset(self, lockout_auth: bytes = b"") -> None:
        """TPM2_DictionaryAttackLockReset: the lockout counter to zero, with the lockout
        hierarchy's authorization (empty on a cleared TPM). A wrong one counts against the lockout
        hierarchy itself (TPM_PT_LOCKOUT_RECOVERY), so ask only where it is known."""
        self.command(Cc.DICTIONARY_ATTACK_LOCK_RESET, [RH_LOCKOUT], sessions=[(RS_PW, lockout_auth)])

    def dictionary_attack_parameters(self, max_tries: int, recovery: int, lockout_recovery: int,
                                     lockout_auth: bytes = b"") -> None:
        """TPM2_DictionaryAttackParameters: maxTries, recoveryTime and lockoutRecovery."""
        self.command(Cc.DICTIONARY_ATTACK_PARAMETERS, [RH_LOCKOUT],
                     u32(max_tries) + u32(recovery) + u32(lockout_recovery), [(RS_PW, lockout_auth)])

    def policy_session(self) -> int:
        """A policy session (unbound, unsalted, SHA-256)."""
        params = b2(os.urandom(32)) + b2(b"") + u8(0x01) + u16(Alg.NULL) + u16(Alg.SHA256)
        handles, _ = self.command(Cc.START_AUTH_SESSION, [RH_NULL, RH_NULL], params, out_handles=1)
        self._transient.append(handles[0])
        return handles[0]

    def policy_secret(self, auth_handle: int, session: int) -> None:
        params = b2(b"") + b2(b"") + b2(b"") + u32(0)
        self.command(Cc.POLICY_SECRET, [auth_handle, session], params, [PW])

    def activate_credential(self, ak: int, ek: int, credential_blob: bytes, secret: bytes) -> bytes:
        """The secret a MakeCredential for ``ak``'s name and ``ek`` wrapped; the TPM refuses
        (TPM_RC_INTEGRITY) where the credential names another key, or ``ek`` is not its target."""
        session = self.policy_session()
        try:
            self.policy_secret(RH_ENDORSEMENT, session)
            _, r = self.command(Cc.ACTIVATE_CREDENTIAL, [ak, ek], b2(credential_blob) + b2(secret),
                                [PW, (session, b"")])
            return r.b2()
        finally:
            # The session ends with the command when it succeeds (continueSession off).
            with contextlib.suppress(TpmFailed):
                self.flush(session)
            with contextlib.suppress(ValueError):
                self._transient.remove(session)

    # PCRs and quotes ------------------------------------------------------------------------

    def pcr_read(self, pcrs: Iterable[int]) -> dict[int, bytes]:
        """SHA-256 PCR values; the TPM returns at most eight per call, so this asks until done."""
        wanted = sorted(set(pcrs))
        out: dict[int, bytes] = {}
        while left := [p for p in wanted if p not in out]:
            _, r = self.command(Cc.PCR_READ, params=pcr_selection(left))
            r.u32()  # the update counter
            got = read_pcr_selection(r).get(Alg.SHA256, [])
            values = [r.b2() for _ in range(r.u32())]
            if not got or len(got) != len(values):
                raise TpmFailed("PCR_Read: the TPM has no SHA-256 bank for these PCRs", pcrs=left)
            out.update(zip(got, values, strict=True))
        return out

    def pcr_extend(self, pcr: int, digest: bytes) -> None:
        self.command(Cc.PCR_EXTEND, [pcr], u32(1) + u16(Alg.SHA256) + digest, [PW])

    def quote(self, ak: int, qualifying_data: bytes, pcrs: Iterable[int]) -> tuple[bytes, bytes]:
        """(TPMS_ATTEST bytes, TPMT_SIGNATURE bytes) of the SHA-256 ``pcrs`` under the AK's scheme."""
        params = b2(qualifying_data) + u16(Alg.NULL) + pcr_selection(pcrs)
        _, r = self.command(Cc.QUOTE, [ak], params, [PW])
        return r.b2(), r.rest()


@dataclass(frozen=True)
class Attest:
    """A TPMS_ATTEST of a quote, as the verifier reads it."""

    magic: int
    type: int
    signer: bytes
    extra_data: bytes
    clock: int
    reset_count: int
    restart_count: int
    safe: bool
    firmware: int
    pcr_select: dict[int, list[int]]
    pcr_digest: bytes


def parse_attest(data: bytes) -> Attest:
    r = Reader(data, "TPMS_ATTEST")
    magic, kind, signer, extra = r.u32(), r.u16(), r.b2(), r.b2()
    clock, resets, restarts, safe, firmware = r.u64(), r.u32(), r.u32(), r.u8(), r.u64()
    if kind != ST_ATTEST_QUOTE:
        raise TpmFailed(f"TPMS_ATTEST of type {kind:#x}, not a quote")
    select = read_pcr_selection(r)
    digest = r.b2()
    r.done()
    return Attest(magic, kind, signer, extra, clock, resets, restarts, bool(safe), firmware,
                  select, digest)


@contextlib.contextmanager
def opened(transport: Transport) -> Iterator[Tpm]:
    tpm = Tpm(transport)
    try:
        yield tpm
    finally:
        tpm.close()


def opener(spec: str) -> Callable[[], Tpm | None]:
    """How to open the TPM the setting ``bc.tpm`` names, checked now, opened at each call: ""
    the kernel's /dev/tpmrm0 (None where there is none); "none" no TPM at all;
    "tcp:127.0.0.1:PORT" or "unix:/PATH" a simulator's command socket (tests, development)."""
    if spec == "":
        return open_default
    if spec == "none":
        return lambda: None
    kind, _, where = spec.partition(":")
    if kind == "tcp":
        host, _, port = where.rpartition(":")
        if not port.isdigit():
            raise InvalidParameters(f"bc.tpm={spec!r}: expected tcp:127.0.0.1:PORT")
        address: tuple[str, int] | Path = (host.strip("[]"), int(port))
    elif kind == "unix" and where.startswith("/"):
        address = Path(where)
    else:
        raise InvalidParameters(f"bc.tpm={spec!r}: expected \"\", \"none\", tcp:127.0.0.1:PORT or unix:/PATH")
    SocketTransport.check(address)
    return lambda: Tpm(SocketTransport(address))


def absent(spec: str) -> str:
    """Why there is no TPM where ``open_setting(spec, ...)`` found none: the one wording the
    release gate, the tpm driver and the operator read."""
    if spec == "none":
        return "no TPM: disabled by the setting bc.tpm=none"
    return "no TPM: the kernel offers no /dev/tpmrm0"


def open_setting(spec: str, root: Path) -> Tpm | None:
    """The TPM the setting ``bc.tpm`` names (``opener``), with "" the kernel's under ``root``
    (the machine's "/", or a test's tree); None where there is none."""
    return open_default(root / "dev/tpmrm0") if spec == "" else opener(spec)()


def open_default(path: Path = DEVICE) -> Tpm | None:
    """The machine's TPM through the kernel's resource manager; None where there is none."""
    if not path.exists():
        return None
    try:
        return Tpm(DeviceTransport(path))
    except OSError as e:
        raise TpmFailed(f"{path}: cannot open the TPM: {e}") from e
