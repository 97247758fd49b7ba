"""agent/security/attest.py without a TPM: the quote's binding, the bc.tpm setting, the event
log's bound, the EK certificate cut from its NV padding, and what the Hello says."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from agent.errors import InvalidParameters, TpmFailed
from agent.hw import tpm as tpmwire
from agent.security import attest, attest_contract


def test_qualifying_data_binds_nonce_boot_and_key() -> None:
    base = attest_contract.qualifying_data(b"n" * 32, "boot-a", b"k" * 32)
    h = hashlib.sha256(attest_contract.QUOTE_DOMAIN)
    for part in (b"n" * 32, b"boot-a", b"k" * 32):
        h.update(struct.pack(">I", len(part)) + part)
    assert base == h.digest()
    assert len({base, attest_contract.qualifying_data(b"m" * 32, "boot-a", b"k" * 32),
                attest_contract.qualifying_data(b"n" * 32, "boot-b", b"k" * 32),
                attest_contract.qualifying_data(b"n" * 32, "boot-a", b"j" * 32),
                attest_contract.qualifying_data(b"n" * 32 + b"b", "oot-a", b"k" * 32)}) == 5  # lengths count


@pytest.mark.parametrize("spec", ["tcp:192.0.2.1:2321", "tcp:localhost", "unix:relative/path", "file:/x"])
def test_a_tpm_setting_that_is_refused(spec: str) -> None:
    with pytest.raises(InvalidParameters):
        attest.attestor_for(spec)


def test_no_tpm_by_setting_and_by_absence(tmp_path: Path) -> None:
    none = attest.attestor_for("none")
    assert none.identity_message().absent == "no TPM: disabled by the setting bc.tpm=none"
    absent = attest.Attestor(lambda: tpmwire.open_default(tmp_path / "tpmrm0"))
    assert absent.identity_message().absent.startswith("no TPM")
    with pytest.raises(TpmFailed, match="no TPM"):
        absent.answer(credential_blob=b"", encrypted_secret=b"", nonce=bytes(32), boot_id="b",
                      node_public=bytes(32))


def test_a_failing_tpm_is_said_in_the_hello() -> None:
    def broken() -> tpmwire.Tpm:
        raise TpmFailed("READ_PUBLIC failed: TPM_RC_FAILURE (0x101)", rc="0x101", rc_name="TPM_RC_FAILURE")

    msg = attest.Attestor(broken).identity_message()
    assert not msg.absent and "TPM_RC_FAILURE" in msg.error


def test_a_nonce_out_of_bounds(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameters, match="nonce"):
        attest.Attestor(lambda: None).answer(credential_blob=b"", encrypted_secret=b"", nonce=b"short",
                                             boot_id="b", node_public=bytes(32))


def test_the_event_log_is_read_whole_and_bounded(tmp_path: Path) -> None:
    assert attest.read_event_log(tmp_path / "absent") == b""
    (tmp_path / "log").write_bytes(b"x" * 100)
    assert attest.read_event_log(tmp_path / "log") == b"x" * 100
    (tmp_path / "big").write_bytes(bytes(attest.MAX_EVENT_LOG + 1))
    with pytest.raises(InvalidParameters, match="over"):
        attest.read_event_log(tmp_path / "big")


def test_an_ek_certificate_cut_from_its_nv_padding() -> None:
    der = bytes([0x30, 0x82, 0x01, 0x00]) + bytes(0x100)
    assert attest._der_only(der + b"\xff" * 40) == der
    short = bytes([0x30, 0x05]) + b"abcde"
    assert attest._der_only(short + bytes(9)) == short
