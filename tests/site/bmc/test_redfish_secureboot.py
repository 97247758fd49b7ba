"""UEFI Secure Boot through Redfish (bmc.query secure_boot, bmc.firmware restore_secure_boot): each
recorded tree's SecureBoot resource read, a drifted node found by name against the fleet's policy
and put back with the writes the BMC offers (each sent once, read back), on the project's
emulator (tests/site/bmc/redfish_emulator/secureboot.py teaches it the writes)."""

from __future__ import annotations

import datetime
import hashlib
import json
import ssl
from pathlib import Path
from typing import Any

import pytest

from agent.config import Config
from agent.errors import InvalidParameters, Unsupported
from agent.proto import site_pb2
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import parse_kind, run_kind
from tests.site.bmc.redfish_emulator.secureboot import LIVE, SecureBootKeys
from tests.site.bmc.redfish_emulator.server import trees_dir

SECURE_BOOT_TREES = ("dell_r750", "dmtf_public_rackmount1", "hpe_dl385", "lenovo_sr670", "nvidia_bluefield3",
                     "nvidia_dgxh100", "nvidia_gb200", "nvidia_gh200", "supermicro_sys821")


def make_cert(tmp: Path, name: str) -> str:
    """A self-signed certificate of our own (a fleet's or a tenant's key), its PEM written to
    ``tmp/<name>.pem``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=30))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    (tmp / f"{name}.pem").write_text(pem)
    return pem


def der_sha256(pem: str) -> str:
    """The fingerprint, computed apart from the agent's code: SHA-256 over the PEM's DER."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()


def secure_boot(bmc: RedfishEmulator) -> SecureBootKeys:
    [keys] = bmc.state.secure_boot.values()
    return keys


def entries(bmc: RedfishEmulator, name: str) -> tuple[list[str], list[str]]:
    """(certificate fingerprints, signature digests) of a live database as the emulator holds it."""
    keys = secure_boot(bmc)
    db = keys.databases[name]
    certs = [der_sha256(bmc.state.docs[m]["CertificateString"]) for m in keys._members(db, "Certificates")
             if bmc.state.docs[m].get("CertificateString")]
    sigs = [str(bmc.state.docs[m]["SignatureString"]).lower() for m in keys._members(db, "Signatures")]
    return certs, sigs


def factory_policy(bmc: RedfishEmulator, tmp: Path) -> str:
    """A fleet that keeps the factory keys: the recording's defaults, Secure Boot required."""
    keys = secure_boot(bmc)
    doc: dict[str, Any] = {"secure_boot": "required", "restore": "defaults"}
    for name in LIVE:
        factory = keys.factory.get(name, {})
        found = [der_sha256(c["CertificateString"]) for c in factory.get("Certificates", [])]
        found += [str(sg["SignatureString"]).lower() for sg in factory.get("Signatures", [])]
        if name == "dbx":
            doc["dbx"] = found
        else:
            doc[name.lower()] = [{"sha256": fp} for fp in sorted(set(found))]
    path = tmp / "policy.json"
    path.write_text(json.dumps(doc))
    return str(path)


def fleet_policy(tmp: Path) -> str:
    """A fleet of its own keys (PK, KEK, db as PEMs beside the policy), enrolled over Redfish."""
    for name in ("fleet-pk", "fleet-kek", "fleet-db"):
        make_cert(tmp, name)
    path = tmp / "policy.json"
    path.write_text(json.dumps({"secure_boot": "required", "restore": "enroll",
                                "pk": [{"pem": "fleet-pk.pem"}], "kek": [{"pem": "fleet-kek.pem"}],
                                "db": [{"pem": "fleet-db.pem"}]}))
    return str(path)


def checks(result: site_pb2.BmcOperationResult) -> dict[str, bool]:
    """Each finding's check -> whether it has a remedy."""
    out: dict[str, bool] = {}
    for m in result.release.restorable:
        out[m.check] = True
    for m in result.release.cannot_restore:
        out[m.check] = False
    return out


@pytest.mark.parametrize("tree", SECURE_BOOT_TREES)
def test_each_recorded_secure_boot_resource_read(tree: str, trees: Path, emulator_config: Config) -> None:
    if not (trees_dir() / tree).is_dir():
        pytest.skip(f"{tree} is not recorded here")
    with RedfishEmulator.of(tree, trees) as bmc:
        keys = secure_boot(bmc)
        recorded = bmc.doc(keys.ref)
        got = run_kind("bmc.query", emulator_config, bmc, "secure_boot")
        assert got.state == recorded["SecureBootMode"]
        assert got.values["secure_boot.enable"] == str(recorded["SecureBootEnable"]).lower()
        assert got.values["secure_boot.current_boot"] == recorded["SecureBootCurrentBoot"]
        offered = "#SecureBoot.ResetKeys" in recorded.get("Actions", {})
        assert offered or not got.values["secure_boot.reset_keys"]
        for name in keys.databases:
            certs, sigs = entries(bmc, name)
            listed = got.values[f"secure_boot.{name}.certificates"]
            assert sorted(listed.split(",") if listed else []) == sorted(certs)
            assert got.values[f"secure_boot.{name}.signatures"] == str(len(sigs))
        if tree == "dell_r750":       # iDRAC lists its certificates without their PEM
            assert got.values["secure_boot.KEK.unnamed"] == "1"
            assert got.values["secure_boot.dbx.signatures"] == "78"
        if tree in ("hpe_dl385", "lenovo_sr670", "supermicro_sys821"):
            assert not keys.databases and not any(k.endswith(".certificates") for k in got.values)


@pytest.mark.parametrize("tree", ["dmtf_public_rackmount1", "nvidia_dgxh100"])
def test_tenant_drift_found_by_name_and_put_back_to_the_factory_keys(tree: str, trees: Path, tmp_path: Path,
                                                                     emulator_config: Config) -> None:
    with RedfishEmulator.of(tree, trees) as bmc:
        policy = factory_policy(bmc, tmp_path)
        keys = secure_boot(bmc)
        tenant_kek, tenant_db = make_cert(tmp_path, "tenant-kek"), make_cert(tmp_path, "tenant-db")
        keys.add("KEK", "Certificates", {"CertificateString": tenant_kek, "CertificateType": "PEM"})
        keys.add("db", "Certificates", {"CertificateString": tenant_db, "CertificateType": "PEM"})
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert not found.release.pool_ready
        named = checks(found)
        assert {"secure_boot.off", "secure_boot.kek_foreign", "secure_boot.db_extra"} <= set(named)
        assert all(named.values()), named          # every one put back by this BMC's writes
        foreign = [m for m in found.release.restorable if m.check == "secure_boot.kek_foreign"]
        assert [m.found for m in foreign] == [der_sha256(tenant_kek)]
        assert "tenant-kek" in foreign[0].message
        assert foreign[0].bmc_remedy.kind == "bmc.firmware"
        assert foreign[0].bmc_remedy.operation == "restore_secure_boot"
        assert bmc.writes("POST", "ResetKeys") == [] and bmc.writes("PATCH") == []

        remedy = found.release.restorable[0].bmc_remedy
        done = run_kind(remedy.kind, emulator_config, bmc, remedy.operation, **dict(remedy.parameters))
        assert done.release.pool_ready, done.release
        assert done.state == "restored"
        [(_, path, body)] = bmc.writes("POST", "ResetKeys")
        assert path.endswith("/SecureBoot/Actions/SecureBoot.ResetKeys")
        assert body == {"ResetKeysType": "ResetAllKeysToDefault"}
        [(_, path, body)] = bmc.writes("PATCH")
        assert path == keys.ref and body == {"SecureBootEnable": True}
        assert der_sha256(tenant_kek) not in entries(bmc, "KEK")[0]
        again = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert again.release.pool_ready and again.state == "pool_ready"
        assert again.values["secure_boot.current_boot"] == "Disabled"     # until the node boots
        run_kind("bmc.power", emulator_config, bmc, "reset")
        booted = run_kind("bmc.query", emulator_config, bmc, "secure_boot")
        assert booted.values["secure_boot.current_boot"] == "Enabled"


def test_a_node_in_setup_mode_gets_the_fleets_own_keys_then_a_tenants_kek_is_taken_out(
        trees: Path, tmp_path: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:       # recorded: no keys, SetupMode, off
        policy = fleet_policy(tmp_path)
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert checks(found) == {"secure_boot.off": True, "secure_boot.setup_mode": True,
                                 "secure_boot.pk_missing": True, "secure_boot.kek_missing": True,
                                 "secure_boot.db_missing": True}
        done = run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=policy)
        assert done.release.pool_ready, done.release
        posts = [p.rsplit("/SecureBootDatabases/", 1)[1] for _, p, _ in bmc.writes("POST", "/Certificates")]
        assert posts == ["PK/Certificates", "KEK/Certificates", "db/Certificates"][::-1]   # PK last
        assert not bmc.writes("POST", "ResetKeys")          # nothing there to take out
        assert bmc.doc(secure_boot(bmc).ref)["SecureBootMode"] == "UserMode"
        fleet_db = (tmp_path / "fleet-db.pem").read_text()
        assert entries(bmc, "db")[0] == [der_sha256(fleet_db)]

        tenant = make_cert(tmp_path, "tenant-kek")
        secure_boot(bmc).add("KEK", "Certificates", {"CertificateString": tenant, "CertificateType": "PEM"})
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert checks(found) == {"secure_boot.kek_foreign": True}
        run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=policy)
        [(_, path, body)] = bmc.writes("POST", "ResetKeys")
        assert path.endswith("/KEK/Actions/SecureBootDatabase.ResetKeys")
        assert body == {"ResetKeysType": "DeleteAllKeys"}
        assert entries(bmc, "KEK")[0] == [der_sha256((tmp_path / "fleet-kek.pem").read_text())]
        assert run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy).release.pool_ready


def test_bluefield_key_writes_wait_for_the_next_boot_and_are_not_passed_before(
        trees: Path, tmp_path: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("nvidia_bluefield3", trees) as bmc:
        policy = fleet_policy(tmp_path)
        done = run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=policy)
        assert not done.release.pool_ready                  # the firmware has not run the tasks yet
        assert "next boot" in done.values["writes"]
        assert {"secure_boot.db_extra", "secure_boot.pk_missing"} <= set(checks(done))
        assert len(bmc.writes("POST", "ResetKeys")) == 2     # db's six and KEK's one, taken out once
        run_kind("bmc.power", emulator_config, bmc, "reset")
        after = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert after.release.pool_ready, after.release
        assert after.values["secure_boot.current_boot"] == "Enabled"


def test_an_ambiguous_reset_is_read_back_never_sent_twice(trees: Path, tmp_path: Path,
                                                          emulator_config: Config) -> None:
    with RedfishEmulator.of("dmtf_public_rackmount1", trees) as bmc:
        policy = factory_policy(bmc, tmp_path)
        secure_boot(bmc).add("db", "Certificates", {"CertificateString": make_cert(tmp_path, "t"),
                                                    "CertificateType": "PEM"})
        target = bmc.doc(secure_boot(bmc).ref)["Actions"]["#SecureBoot.ResetKeys"]["target"]
        bmc.state.cut.add(target)                            # done, then the answer lost
        done = run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=policy)
        assert done.release.pool_ready
        assert len(bmc.writes("POST", "ResetKeys")) == 1


def test_dell_certificates_without_a_fingerprint_are_not_passed(trees: Path, tmp_path: Path,
                                                                emulator_config: Config) -> None:
    with RedfishEmulator.of("dell_r750", trees) as bmc:
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"pk": [{"sha256": "a" * 64}], "restore": "defaults"}))
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=str(policy))
        assert not found.release.pool_ready
        unreadable = [m.where for m in found.release.cannot_restore if m.check == "secure_boot.unreadable"]
        assert unreadable == ["KEK", "PK", "db"]


def test_no_secure_boot_resource_is_named_never_passed(trees: Path, tmp_path: Path,
                                                       emulator_config: Config) -> None:
    with RedfishEmulator.of("hpe_dl385", trees) as bmc:
        bmc.state.gone.add(secure_boot(bmc).ref)
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"secure_boot": "required"}))
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=str(policy))
        assert checks(found) == {"secure_boot.unreadable": False} and not found.release.pool_ready
        with pytest.raises(Unsupported):
            run_kind("bmc.query", emulator_config, bmc, "secure_boot")


@pytest.mark.parametrize(("doc", "words"), [
    ({"secure_boot": "maybe"}, "required or off_allowed"),
    ({"kek": [{"sha256": "12"}]}, "64 digits"),
    ({"db": [{"pem": "../etc/cert.pem"}]}, "beside the policy"),
    ({"db": [{"pem": "absent.pem"}]}, "not a readable PEM"),
    ({"extra": 1}, "unknown field"),
    ({"restore": "wipe"}, "defaults or enroll"),
])
def test_a_bad_policy_is_refused_before_any_bmc_is_reached(doc: dict[str, Any], words: str,
                                                           tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(doc))
    with pytest.raises(InvalidParameters, match=words):
        parse_kind("bmc.query", "secure_boot", policy=str(policy))
    with pytest.raises(InvalidParameters, match="missing parameter"):
        parse_kind("bmc.firmware", "restore_secure_boot")


def test_a_bmc_that_does_not_expand_is_read_one_entry_at_a_time(trees: Path, emulator_config: Config) -> None:
    with RedfishEmulator.of("dmtf_public_rackmount1", trees) as bmc:
        expanded = run_kind("bmc.query", emulator_config, bmc, "secure_boot")
        assert not [p for _, p, _ in bmc.writes("GET", "/Signatures/1")]
        bmc.state.docs["/redfish/v1"].pop("ProtocolFeaturesSupported")
        one_by_one = run_kind("bmc.query", emulator_config, bmc, "secure_boot")
        assert bmc.writes("GET", "/dbx/Signatures/1")
        assert dict(one_by_one.values) == dict(expanded.values)


def test_factory_keys_with_the_fleets_db_certificate_appended(trees: Path, tmp_path: Path,
                                                               emulator_config: Config) -> None:
    """The path for fleets that keep the vendor's keys (docs/site.md, "Secure Boot with the
    vendor's keys"): the factory's PK, KEK and db, and the fleet's own db certificate beside them."""
    with RedfishEmulator.of("dmtf_public_rackmount1", trees) as bmc:
        path = Path(factory_policy(bmc, tmp_path))
        fleet = make_cert(tmp_path, "fleet-db")
        policy = json.loads(path.read_text())
        policy["db"].append({"pem": "fleet-db.pem"})
        path.write_text(json.dumps(policy))
        secure_boot(bmc).add("KEK", "Certificates", {"CertificateString": make_cert(tmp_path, "tenant"),
                                                     "CertificateType": "PEM"})
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=str(path))
        assert {"secure_boot.kek_foreign", "secure_boot.db_missing"} <= set(checks(found))
        done = run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=str(path))
        assert done.release.pool_ready, done.release
        resets = [b for _, _, b in bmc.writes("POST", "ResetKeys")]
        assert resets == [{"ResetKeysType": "ResetAllKeysToDefault"}]
        [(_, where, body)] = bmc.writes("POST", "/Certificates")
        assert where.endswith("/db/Certificates") and body["CertificateString"] == fleet
        assert der_sha256(fleet) in entries(bmc, "db")[0]


def test_a_profile_that_accepts_secure_boot_off_is_not_refused_for_it(trees: Path, tmp_path: Path,
                                                                      emulator_config: Config) -> None:
    with RedfishEmulator.of("nvidia_gh200", trees) as bmc:        # recorded: off, no keys
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"secure_boot": "off_allowed"}))
        allowed = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=str(policy))
        assert allowed.release.pool_ready and not checks(allowed)
        policy.write_text(json.dumps({"secure_boot": "required"}))
        required = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=str(policy))
        assert checks(required) == {"secure_boot.off": True, "secure_boot.setup_mode": False}
