"""agent/hw/tpm.py against a real TPM 2.0 (swtpm), with tpm2-tools as the oracle of its encoding,
and against a quote a cloud's TPM made (published, tests/published.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from agent.errors import InvalidParameters, Reason, TpmFailed
from agent.gateway.verifier.attest import check_ak_public, verify_signature
from agent.gateway.verifier.refused import Refused
from agent.hw import tpm as w
from agent.security.attest import Attestor
from tests.published import go_eventlog
from tests.tpmsim import SimTpm, manufactured_tpm, need, sim

__all__ = ["manufactured_tpm", "sim"]


def tools(sim: SimTpm, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    need(argv[0])
    env = dict(os.environ, TPM2TOOLS_TCTI=sim.tcti)
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


# Without a TPM ----------------------------------------------------------------------------

def test_response_codes_are_named() -> None:
    assert w.rc_name(0x18B) == "TPM_RC_HANDLE (handle 1)"
    assert w.rc_name(0x9A2) == "TPM_RC_BAD_AUTH (session 1)"
    assert w.rc_name(0x1DF) == "TPM_RC_INTEGRITY (parameter 1)"
    assert w.rc_name(0x922) == "TPM_RC_RETRY"
    assert w.rc_name(0x101) == "TPM_RC_FAILURE"


@pytest.mark.parametrize(("rc", "name", "described"), [
    (0x12F, "AUTH_UNAVAILABLE", "authValue or authPolicy is not available"),
    (0x130, "REBOOT", "_TPM_Init and StartupCLEAR is required"),
    (0x142, "COMMAND_SIZE", "commandSize value is inconsistent"),
    (0x143, "COMMAND_CODE", "command code not supported"),
    (0x148, "NV_LOCKED", "NV access locked"),
    (0x14A, "NV_UNINITIALIZED", "used before being initialized"),
    (0x14C, "NV_DEFINED", "already defined"),
    (0x920, "NV_RATE", "rate limiting"),
])
def test_format_zero_codes_are_named_as_tpm2_rc_decode_describes_them(rc: int, name: str,
                                                                      described: str) -> None:
    """Part 2's table 16 (TPM_RC_VER1 + n, TPM_RC_WARN + n), with tpm2-tools' description of
    each code as the oracle that the number is the one named."""
    assert w.rc_name(rc) == f"TPM_RC_{name}"
    need("tpm2_rc_decode")
    out = subprocess.run(["tpm2_rc_decode", f"{rc:#x}"], capture_output=True, text=True, timeout=30)
    assert described in out.stdout, out.stdout


def test_pcr_selection_encoding() -> None:
    assert w.pcr_selection(range(13)) == bytes.fromhex("00000001000b03ff1f00")
    assert w.read_pcr_selection(w.Reader(w.pcr_selection([0, 7, 16]))) == {w.Alg.SHA256: [0, 7, 16]}
    with pytest.raises(InvalidParameters):
        w.pcr_selection([24])


def test_templates_parse_as_what_they_say() -> None:
    ek = w.parse_public(w.EK_RSA_TEMPLATE)
    assert ek.type == w.Alg.RSA and ek.attributes == 0x000300B2 and ek.auth_policy == w.EK_POLICY
    assert ek.unique == bytes(256)
    ecc = w.parse_public(w.EK_ECC_TEMPLATE)
    assert ecc.type == w.Alg.ECC and ecc.attributes == 0x000300B2 and ecc.unique == w.b2(bytes(32)) * 2
    ak = w.parse_public(w.AK_TEMPLATE)
    assert ak.type == w.Alg.ECC and ak.attributes & w.Attr.RESTRICTED and ak.attributes & w.Attr.SIGN
    assert not ak.attributes & w.Attr.DECRYPT


def test_a_truncated_response_is_a_tpm_error() -> None:
    with pytest.raises(TpmFailed, match="truncated"):
        w.Reader(b"\x00\x05abc").b2()


def test_no_tpm_is_a_fact_not_an_error(tmp_path: Path) -> None:
    assert w.open_default(tmp_path / "tpmrm0") is None
    attestor = Attestor(lambda: w.open_default(tmp_path / "tpmrm0"))
    assert attestor.open() is False
    assert "no TPM" in attestor.absent


def test_a_loopback_socket_only() -> None:
    with pytest.raises(InvalidParameters, match="loopback"):
        w.SocketTransport(("192.0.2.1", 2321))


# Against swtpm ----------------------------------------------------------------------------

def test_an_error_names_the_response_code(sim: SimTpm) -> None:
    with sim.tpm() as tpm, pytest.raises(TpmFailed) as err:
        tpm.read_public(0x81000099)
    assert err.value.reason == Reason.TPM_ERROR
    assert err.value.details["rc"] == "0x18b"
    assert "TPM_RC_HANDLE" in str(err.value)


def test_the_ek_is_the_certified_one(sim: SimTpm) -> None:
    with sim.tpm() as tpm:
        ident = Attestor(lambda: tpm).identity()
        made = tpm.create_primary(w.RH_ENDORSEMENT, w.EK_RSA_TEMPLATE)  # from the template
        assert made.area == ident.ek_public  # the same key as the persisted one
    cert = x509.load_der_x509_certificate(ident.ek_certificate)
    key = cert.public_key()
    assert isinstance(key, rsa.RSAPublicKey)
    modulus = w.parse_public(ident.ek_public).unique
    assert key.public_numbers().n == int.from_bytes(modulus, "big")
    assert ident.manufacturer == "IBM"
    assert ident.ak_name == struct.pack(">H", w.Alg.SHA256) + hashlib.sha256(ident.ak_public).digest()


def test_pcr_read_follows_extends(sim: SimTpm) -> None:
    digest = hashlib.sha256(b"measured").digest()
    with sim.tpm() as tpm:
        before = tpm.pcr_read(range(24))
        tpm.pcr_extend(16, digest)
        after = tpm.pcr_read([16, 3])
    assert len(before) == 24 and before[16] == bytes(32)
    assert after == {16: hashlib.sha256(bytes(32) + digest).digest(), 3: before[3]}


def test_pcr_banks_as_tpm2_getcap_says(sim: SimTpm, tmp_path: Path) -> None:
    with sim.tpm() as tpm:
        banks = tpm.pcr_banks()
    out = tools(sim, "tpm2_getcap", "pcrs", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    active = [name for name, pcrs in re.findall(r"-\s*(\w+)\s*:\s*\[([^\]]*)\]", out.stdout) if pcrs.strip()]
    assert banks == active
    assert banks == ["sha256"]  # qemu/tpm.py manufactures the test TPM with the SHA-256 bank alone


def test_quote_checked_by_tpm2_checkquote(sim: SimTpm, tmp_path: Path) -> None:
    with sim.tpm() as tpm:
        attestor = Attestor(lambda: tpm)
        ident = attestor.identity()
        tpm.pcr_extend(4, hashlib.sha256(b"app").digest())
        quote, signature = tpm.quote(attestor._ak.handle if attestor._ak else 0, b"q" * 32, range(13))
        pcrs = tpm.pcr_read(range(13))
    attest = w.parse_attest(quote)
    assert attest.magic == w.GENERATED_VALUE and attest.type == w.ST_ATTEST_QUOTE
    assert attest.signer[:2] == ident.ak_name[:2]
    assert attest.extra_data == b"q" * 32
    assert attest.pcr_select == {w.Alg.SHA256: list(range(13))}
    assert attest.pcr_digest == hashlib.sha256(b"".join(pcrs[i] for i in range(13))).digest()
    (tmp_path / "ak.pub").write_bytes(w.b2(ident.ak_public))
    (tmp_path / "q.msg").write_bytes(quote)
    (tmp_path / "q.sig").write_bytes(signature)
    ok = tools(sim, "tpm2_checkquote", "-u", "ak.pub", "-m", "q.msg", "-s", "q.sig",
               "-g", "sha256", "-q", (b"q" * 32).hex(), cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = bytearray(quote)
    bad[-1] ^= 1
    (tmp_path / "q.msg").write_bytes(bytes(bad))
    refused = tools(sim, "tpm2_checkquote", "-u", "ak.pub", "-m", "q.msg", "-s", "q.sig",
                    "-g", "sha256", "-q", (b"q" * 32).hex(), cwd=tmp_path)
    assert refused.returncode != 0


def test_tpm2_quote_parses_here(sim: SimTpm, tmp_path: Path) -> None:
    attrs = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign"
    made = tools(sim, "tpm2_createprimary", "-C", "e", "-g", "sha256", "-G", "ecc256:ecdsa-sha256:null",
                 "-a", attrs, "-c", "ak.ctx", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    quoted = tools(sim, "tpm2_quote", "-c", "ak.ctx", "-l", "sha256:0,1,2,3,4,5,6,7,8,9,10,11,12",
                   "-q", "00112233445566778899", "-m", "q.msg", "-s", "q.sig", "-g", "sha256",
                   cwd=tmp_path)
    assert quoted.returncode == 0, quoted.stderr
    tools(sim, "tpm2_flushcontext", "-t", cwd=tmp_path)
    attest = w.parse_attest((tmp_path / "q.msg").read_bytes())
    assert attest.extra_data == bytes.fromhex("00112233445566778899")
    with sim.tpm() as tpm:
        pcrs = tpm.pcr_read(range(13))
    assert attest.pcr_digest == hashlib.sha256(b"".join(pcrs[i] for i in range(13))).digest()


def test_a_quote_a_cloud_tpm_made() -> None:
    """A GCE shielded VM's quote, AK and PCR values, published by go-attestation: read by the
    product's readers, it is what its TPM signed; the gateway refuses it by name (SHA-1)."""
    dump = json.loads((go_eventlog() / "testdata/legacydata/windows_gcp_shielded_vm.json").read_text())
    quote, signature = (base64.b64decode(dump["Quote"][k]) for k in ("Quote", "Signature"))
    attest = w.parse_attest(quote)
    assert attest.magic == 0xFF544347  # TPM_GENERATED_VALUE
    assert {w.BANKS[alg]: pcrs for alg, pcrs in attest.pcr_select.items()} == {"sha1": list(range(24))}
    reported = {p["Index"]: base64.b64decode(p["Digest"]) for p in dump["Log"]["PCRs"]}
    assert attest.pcr_digest == hashlib.sha1(b"".join(reported[i] for i in range(24))).digest()
    ak = check_ak_public(base64.b64decode(dump["AK"]["Public"]))
    r = w.Reader(signature, "TPMT_SIGNATURE")
    assert (r.u16(), w.BANKS[r.u16()]) == (w.Alg.RSASSA, "sha1")
    assert isinstance(ak, rsa.RSAPublicKey)
    ak.verify(r.b2(), quote, padding.PKCS1v15(), hashes.SHA1())
    with pytest.raises(Refused, match="not SHA-256"):
        verify_signature(ak, quote, signature)


def test_activate_a_tpm2_makecredential(sim: SimTpm, tmp_path: Path) -> None:
    with sim.tpm() as tpm:
        attestor = Attestor(lambda: tpm)
        ident = attestor.identity()
        (tmp_path / "ek.pub").write_bytes(w.b2(ident.ek_public))
        (tmp_path / "secret").write_bytes(b"the gateway's secret")
        for name, out in ((ident.ak_name, "cred"), (b"\x00\x0b" + bytes(32), "cred.other")):
            made = tools(sim, "tpm2_makecredential", "-T", "none", "-u", "ek.pub", "-s", "secret",
                         "-n", name.hex(), "-o", out, cwd=tmp_path)
            assert made.returncode == 0, made.stderr
        blob, secret = read_tools_credential(tmp_path / "cred")
        assert attestor._ak is not None and attestor._ek is not None
        got = tpm.activate_credential(attestor._ak.handle, attestor._ek.handle, blob, secret)
        assert got == b"the gateway's secret"
        blob, secret = read_tools_credential(tmp_path / "cred.other")  # made for another key
        with pytest.raises(TpmFailed, match="TPM_RC_INTEGRITY"):
            tpm.activate_credential(attestor._ak.handle, attestor._ek.handle, blob, secret)


def read_tools_credential(path: Path) -> tuple[bytes, bytes]:
    """tpm2-tools' credential file: magic, version, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET."""
    r = w.Reader(path.read_bytes())
    assert r.u32() == 0xBADCC0DE and r.u32() == 1
    blob, secret = r.b2(), r.b2()
    r.done()
    return blob, secret


def test_handles_and_nv_public_match_tpm2_tools(sim: SimTpm, tmp_path: Path) -> None:
    """TPM_CAP_HANDLES and TPM2_NV_ReadPublic, against tpm2_getcap and tpm2_nvreadpublic."""
    assert tools(sim, "tpm2_nvdefine", "0x1500001", "-C", "o", "-s", "16", cwd=tmp_path).returncode == 0
    listed = tools(sim, "tpm2_getcap", "handles-nv-index", cwd=tmp_path).stdout
    with sim.tpm() as tpm:
        nv = tpm.handles(w.HR_NV_INDEX)
        assert nv == [int(line.strip("- "), 16) for line in listed.split() if line != "-"]
        assert w.EK_CERT_RSA_INDEX in nv and 0x01500001 in nv
        persistent = tpm.handles(w.HR_PERSISTENT)
        ek_cert, owner = tpm.nv_public(w.EK_CERT_RSA_INDEX), tpm.nv_public(0x01500001)
        assert tpm.nv_public(0x01500002) is None
    assert w.EK_HANDLE in persistent and all(h >> 24 == 0x81 for h in persistent)
    assert ek_cert is not None and ek_cert.platform_created
    assert owner is not None and not owner.platform_created
    assert owner.size == 16 and owner.index == 0x01500001
    shown = tools(sim, "tpm2_nvreadpublic", "0x1c00002", cwd=tmp_path).stdout
    assert f"value: {ek_cert.attributes:#010X}".replace("0X", "0x") in shown
