"""The node's side of attestation: who its TPM is, and what it says about this boot.

At a join the gateway asks for the TPM's identity (the EK certificate from NV and the EK's
public area, the attestation key's public area, the maker and firmware), then challenges: a
credential made for the AK and the EK (only this TPM can activate it, and only for this AK)
and a nonce. The agent answers with the activated secret and a quote of PCRs 0-12 (SHA-256)
whose qualifying data binds the nonce, this boot's id and the node's Ed25519 public key, with
the PCR values and the firmware's event log beside it. What both sides must agree on (the
PCRs, the qualifying data, the records and their wire form) is agent/security/attest_contract.py;
the verifier, which checks all of it, is the gateway's (agent/gateway/verifier/). Standard
library only.

No TPM (no /dev/tpmrm0) is a fact the agent states, not an error: ``Attestor.absent``.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from agent.errors import InvalidParameters, TpmFailed
from agent.hw import sysfs
from agent.hw import tpm as tpmwire
from agent.proto import session_pb2
from agent.security.attest_contract import (
    LEFT_EVENT,
    LEFT_PCR,
    NONCE_BYTES,
    QUOTED_PCRS,
    Evidence,
    Identity,
    answer_message,
    identity_message,
    pcr_digest,
    qualifying_data,
)

log = logging.getLogger(__name__)

EVENT_LOG = Path("/sys/kernel/security/tpm0/binary_bios_measurements")
DMI = Path("/sys/class/dmi/id")
MAX_EVENT_LOG = 1 << 20  # a server's log is tens of KiB; a MiB bounds what one join carries


def read_event_log(path: Path = EVENT_LOG) -> bytes:
    """The firmware's TCG event log from securityfs; b"" where the kernel offers none."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_EVENT_LOG + 1)
    except OSError:
        return b""
    if len(data) > MAX_EVENT_LOG:
        raise InvalidParameters(f"{path}: the event log is over {MAX_EVENT_LOG} bytes")
    return data


def _text(value: int) -> str:
    return struct.pack(">I", value).rstrip(b"\0 ").decode("ascii", "replace")


class Attestor:
    """The machine's TPM, opened once per join, or the fact that there is none."""

    def __init__(self, opener: Callable[[], tpmwire.Tpm | None] = tpmwire.open_default,
                 event_log: Path = EVENT_LOG, dmi: Path = DMI, ek: str = "auto") -> None:
        self._opener = opener
        self._ek_kind = ek  # "auto" (the certified one, RSA first), "rsa" or "ecc"
        self._event_log = event_log
        self._dmi = dmi
        self._tpm: tpmwire.Tpm | None = None
        self._ek: tpmwire.Public | None = None
        self._ak: tpmwire.Public | None = None
        self._identity: Identity | None = None
        self._lock = threading.RLock()  # the Hello and a challenge come from different threads
        self.absent = ""  # why there is no TPM to attest with; "" where there is one

    def open(self) -> bool:
        """True where a TPM answers; otherwise ``absent`` says why."""
        if self._tpm is None and not self.absent:
            tpm = self._opener()
            if tpm is None:
                self.absent = "no TPM: the kernel offers no /dev/tpmrm0"
            self._tpm = tpm
        return self._tpm is not None

    def close(self) -> None:
        with self._lock:
            if self._tpm is not None:
                self._tpm.close()
            self._tpm = self._ek = self._ak = None
            self._identity = None

    def leave_measured_boot(self) -> None:
        """Mark PCR 11 before a kexec or an agent upgrade; no TPM, nothing to mark. A TPM that
        refuses is logged: the gateway also tells a kexec by the TPM's unchanged reset count."""
        with self._lock:
            try:
                if self.open() and self._tpm is not None:
                    self._tpm.pcr_extend(LEFT_PCR, LEFT_EVENT)
                    log.info("attestation: PCR %d marked: this boot's measured code ends here", LEFT_PCR)
            except TpmFailed as e:
                log.error("attestation: could not mark PCR %d before leaving the measured boot: %s",
                          LEFT_PCR, e)

    # On the wire (agent/proto/session.proto) ---------------------------------------------

    def identity_message(self) -> session_pb2.TpmIdentity:
        """The Hello's TpmIdentity: the TPM, why there is none, or how it failed."""
        try:
            if not self.open():
                return session_pb2.TpmIdentity(absent=self.absent)
            i = self.identity()
        except TpmFailed as e:
            log.warning("the TPM: %s", e)
            self.close()  # asked again at the next Hello
            return session_pb2.TpmIdentity(error=str(e))
        return identity_message(i)

    def answer_message(self, challenge: session_pb2.AttestChallenge, *, boot_id: str,
                       node_public: bytes) -> session_pb2.AttestAnswer:
        try:
            ev = self.answer(credential_blob=challenge.credential_blob,
                             encrypted_secret=challenge.encrypted_secret, nonce=challenge.nonce,
                             boot_id=boot_id, node_public=node_public)
        except (TpmFailed, InvalidParameters) as e:
            log.warning("attestation: %s", e)
            return session_pb2.AttestAnswer(nonce=challenge.nonce, error=str(e))
        return answer_message(challenge.nonce, ev)

    def __enter__(self) -> Attestor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _need(self) -> tpmwire.Tpm:
        if not self.open() or self._tpm is None:
            raise TpmFailed(self.absent or "no TPM")
        return self._tpm

    def _load_ek(self, tpm: tpmwire.Tpm) -> tuple[tpmwire.Public, bytes]:
        """The EK and its certificate: the RSA 2048 one where NV holds its certificate (or where
        NV holds none, for an EK pinned at the gateway), else the ECC P-256 one with its."""
        cert, template, handle = b"", tpmwire.EK_RSA_TEMPLATE, tpmwire.EK_HANDLE
        for index, tmpl, hdl in ((tpmwire.EK_CERT_RSA_INDEX, tpmwire.EK_RSA_TEMPLATE, tpmwire.EK_HANDLE),
                                 (tpmwire.EK_CERT_ECC_INDEX, tpmwire.EK_ECC_TEMPLATE, tpmwire.EK_ECC_HANDLE)):
            if self._ek_kind in ("auto", "rsa" if hdl == tpmwire.EK_HANDLE else "ecc"):
                size = tpm.nv_size(index)
                if size or self._ek_kind != "auto":
                    cert, template, handle = (tpm.nv_read(index, size) if size else b""), tmpl, hdl
                    break
        return self._ek_from(tpm, template, handle), _der_only(cert)

    def _ek_from(self, tpm: tpmwire.Tpm, template: bytes, handle: int) -> tpmwire.Public:
        """Persisted at ``handle`` where it matches the default template, else made from the
        template (the same key: a primary key is a function of the seed and the template)."""
        want = tpmwire.parse_public(template)
        try:
            persisted = tpm.read_public(handle)
            got = tpmwire.parse_public(persisted.area)
            if (got.type, got.attributes, got.auth_policy, got.parameters) == \
                    (want.type, want.attributes, want.auth_policy, want.parameters):
                return persisted
            log.info("the key at %#x is not the default EK; making the EK from its template", handle)
        except TpmFailed as e:
            if not e.details.get("rc_name", "").startswith("TPM_RC_HANDLE"):
                raise
        return tpm.create_primary(tpmwire.RH_ENDORSEMENT, template)

    def identity(self) -> Identity:
        with self._lock:
            if self._identity is None:
                self._identity = self._read_identity()
            return self._identity

    def _read_identity(self) -> Identity:
        tpm = self._need()
        self._ek, cert = self._load_ek(tpm)
        if self._ak is None:
            self._ak = tpm.create_primary(tpmwire.RH_ENDORSEMENT, tpmwire.AK_TEMPLATE)
        props = tpm.properties()
        fw1, fw2 = props.get(0x10B, 0), props.get(0x10C, 0)
        # Stated, not judged: the quote is of the SHA-256 bank; any other active bank only makes
        # the firmware hash each image once more (docs/attestation.md, "PCR banks").
        log.info("attestation: the TPM's active PCR banks: %s", ", ".join(tpm.pcr_banks()) or "none")
        return Identity(
            ek_public=self._ek.area, ek_certificate=cert, ak_public=self._ak.area,
            ak_name=self._ak.name, manufacturer=_text(props.get(0x105, 0)),
            firmware=f"{fw1 >> 16}.{fw1 & 0xFFFF}.{fw2:08x}",
            platform="|".join(sysfs.read(self._dmi / name).replace("|", "/")
                              for name in ("sys_vendor", "product_name", "bios_version")),
        )

    def answer(self, *, credential_blob: bytes, encrypted_secret: bytes, nonce: bytes,
               boot_id: str, node_public: bytes) -> Evidence:
        """Activate the gateway's credential and quote this boot for its nonce."""
        if not NONCE_BYTES[0] <= len(nonce) <= NONCE_BYTES[1]:
            raise InvalidParameters(f"a nonce of {len(nonce)} bytes (expected 16-64)")
        with self._lock:
            return self._answer(credential_blob, encrypted_secret, nonce, boot_id, node_public)

    def _answer(self, credential_blob: bytes, encrypted_secret: bytes, nonce: bytes, boot_id: str,
                node_public: bytes) -> Evidence:
        tpm = self._need()
        if self._ek is None or self._ak is None:
            self.identity()
        assert self._ek is not None and self._ak is not None
        secret = tpm.activate_credential(self._ak.handle, self._ek.handle, credential_blob,
                                         encrypted_secret)
        extra = qualifying_data(nonce, boot_id, node_public)
        for _ in range(3):  # a PCR extended between the quote and the read: quote again
            quote, signature = tpm.quote(self._ak.handle, extra, QUOTED_PCRS)
            pcrs = tpm.pcr_read(QUOTED_PCRS)
            if tpmwire.parse_attest(quote).pcr_digest == pcr_digest(pcrs):
                break
        return Evidence(secret, quote, signature, pcrs, read_event_log(self._event_log))


def _der_only(cert: bytes) -> bytes:
    """The DER certificate without the padding NV indices often carry after it."""
    if len(cert) < 4 or cert[0] != 0x30:
        return cert
    if cert[1] == 0x82:
        return cert[:4 + int.from_bytes(cert[2:4], "big")]
    if cert[1] == 0x81:
        return cert[:3 + cert[2]]
    return cert[:2 + cert[1]] if cert[1] < 0x80 else cert


def attestor_for(spec: str, event_log: str = "") -> Attestor:
    """The TPM the setting ``bc.tpm`` names: "" the kernel's /dev/tpmrm0; "none" no TPM at all;
    "tcp:127.0.0.1:PORT" or "unix:PATH" a simulator's command socket (tests, development), with
    the event log of its made-up boot at ``bc.tpm_event_log``."""
    log_path = Path(event_log) if event_log else EVENT_LOG
    if spec == "":
        return Attestor(event_log=log_path)
    if spec == "none":
        def no_tpm() -> tpmwire.Tpm | None:
            return None
        attestor = Attestor(no_tpm)
        attestor.absent = "no TPM: disabled by the setting bc.tpm=none"
        return attestor
    return Attestor(tpmwire.opener(spec), event_log=log_path)
