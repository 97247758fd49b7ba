"""The emulated BMC's SecureBoot resource as a QEMU node's own UEFI variable store (issue 52,
item 5): OVMF's Secure Boot variables made by virt-fw-vars with a fleet's keys, a tenant's drift
written into the store file (Secure Boot off, an extra db certificate), found by the site's
bmc.query secure_boot and put back by bmc.firmware restore_secure_boot into the file; and a write
the BMC takes while the node is on waits for its next power-on (redfish_emulator/machine.py
``NodeVariables``). The node has no guest here (NodeSpec ``machine=False``: its power a file):
tests/e2e/test_secure_boot.py boots the put-back store under OVMF."""

from __future__ import annotations

import json
import shutil
import ssl
from pathlib import Path

import pytest

from agent.config import Config
from qemu import secureboot
from qemu.powered import NodeSpec, PoweredNode
from qemu.secureboot import FleetKeys, Signature, StoreKeys, read_store, write_store
from tests.site.bmc.redfish_emulator import RedfishEmulator
from tests.site.bmc.redfish_emulator.handlers import run_kind
from tests.site.bmc.redfish_emulator.machine import PoweredMachine
from tests.site.bmc.test_redfish_secureboot import checks, der_sha256

TREE = "dmtf_public_rackmount1"     # per-database ResetKeys, PEM certificate POSTs: ``restore: enroll``
REVOKED = bytes.fromhex("5a" * 32)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[FleetKeys, Path]:
    """The fleet's keys and OVMF's variable store with them enrolled (a revocation in dbx)."""
    if not secureboot.OVMF_VARS_EMPTY.is_file() or not secureboot.virt_fw_vars().exists() \
            or shutil.which("openssl") is None:
        pytest.skip("needs OVMF_VARS_4M.fd (ovmf), virt-fw-vars (the dev extra) and openssl")
    folder = tmp_path_factory.mktemp("fleet")
    keys = FleetKeys.generate(folder / "keys")
    return keys, keys.enrolled_vars(folder / "enrolled.fd", dbx=[REVOKED])


def node_with(store: Path, folder: Path) -> PoweredNode:
    return PoweredNode(folder / "node").configure(NodeSpec(
        kernel="", initrd="", machine=False, name="n1", uefi=True, secure_boot=True,
        pflash_code=str(secureboot.OVMF_SECBOOT_CODE), pflash_vars=str(store)))


def policy_of(keys: FleetKeys, folder: Path) -> str:
    for name in ("fleet-pk", "fleet-kek", "fleet-db"):
        shutil.copyfile(keys.cert(name), folder / f"{name}.pem")
    path = folder / "secure-boot-policy.json"
    path.write_text(json.dumps({"secure_boot": "required", "restore": "enroll",
                                "pk": [{"pem": "fleet-pk.pem"}], "kek": [{"pem": "fleet-kek.pem"}],
                                "db": [{"pem": "fleet-db.pem"}],
                                "dbx": [REVOKED.hex()]}))
    return str(path)


def tenant_cert(keys: FleetKeys) -> Signature:
    """A tenant's own db certificate (the fleet's other key: one it never enrolled)."""
    return Signature("x509", ssl.PEM_cert_to_DER_cert(keys.cert("other-db").read_text()))


def test_the_store_read_and_written_as_virt_fw_vars_enrolled_it(fleet: tuple[FleetKeys, Path],
                                                                 tmp_path: Path) -> None:
    keys, enrolled = fleet
    store = tmp_path / "vars.fd"
    shutil.copyfile(enrolled, store)
    found = read_store(store)
    fleet_db = der_sha256(keys.cert("fleet-db").read_text())
    assert found.enable is True and found.secure_boot
    assert [(s.kind, s.owner) for s in found.databases["PK"]] == [("x509", secureboot.OWNER)]
    assert [der_sha256(ssl.DER_cert_to_PEM_cert(s.data)) for s in found.databases["db"]] == [fleet_db]
    assert found.databases["dbx"] == (Signature("sha256", REVOKED),)
    drifted = StoreKeys(False, {**found.databases, "db": (*found.databases["db"], tenant_cert(keys))})
    assert write_store(store, drifted) == ["db", "SecureBootEnable"]
    assert read_store(store) == drifted and not read_store(store).secure_boot
    assert write_store(store, drifted) == []              # nothing to change: the file untouched
    no_pk = StoreKeys(None, {"PK": ()})
    assert write_store(store, no_pk) == ["PK", "SecureBootEnable"]
    after = read_store(store)
    assert after.enable is None and not after.databases["PK"] and not after.secure_boot
    assert after.databases["db"] == drifted.databases["db"]     # what was not named, as it was


def test_a_tenants_drift_in_the_nodes_store_found_through_the_bmc_and_put_back_into_it(
        fleet: tuple[FleetKeys, Path], tmp_path: Path, emulator_config: Config) -> None:
    keys, enrolled = fleet
    store = tmp_path / "vars.fd"
    shutil.copyfile(enrolled, store)
    clean = read_store(store)
    # The tenant's OS left Secure Boot off and its own db certificate beside the fleet's.
    tenant_db = (*clean.databases["db"], tenant_cert(keys))
    write_store(store, StoreKeys(False, {**clean.databases, "db": tenant_db}))
    node = node_with(store, tmp_path)
    machine = PoweredMachine(node)
    policy = policy_of(keys, tmp_path)
    with RedfishEmulator.of(TREE, tmp_path / "bmc") as bmc:
        system = bmc.attach(machine)
        ref = f"{system}/SecureBoot"
        assert bmc.doc(ref)["SecureBootEnable"] is False and bmc.doc(ref)["SecureBootMode"] == "UserMode"
        found = run_kind("bmc.query", emulator_config, bmc, "secure_boot", policy=policy)
        assert checks(found) == {"secure_boot.off": True, "secure_boot.db_extra": True}, found.release
        other = der_sha256(keys.cert("other-db").read_text())
        assert found.values["secure_boot.db.certificates"] == ",".join(
            [der_sha256(keys.cert("fleet-db").read_text()), other])
        done = run_kind("bmc.firmware", emulator_config, bmc, "restore_secure_boot", policy=policy)
        assert done.release.pool_ready, done.release
        # Into the node's own store, while it is off: the db emptied, the fleet's certificate
        # enrolled, Secure Boot on; PK, KEK and dbx as they were.
        assert machine.events == ["variables written: db", "variables written: db",
                                  "variables written: SecureBootEnable"], machine.events
        assert read_store(store) == clean
        assert [p.rsplit("/SecureBootDatabases/", 1)[1] for _, p, _ in bmc.writes("POST", "ResetKeys")] == \
            ["db/Actions/SecureBootDatabase.ResetKeys"]

        # A write while the node runs waits for its next power-on: the file untouched until then.
        run_kind("bmc.power", emulator_config, bmc, "on")
        with bmc.state.lock:       # a certificate POSTed to dbx (the emulator's answer to it)
            status, _ = bmc.state.actions[f"{ref}/SecureBootDatabases/dbx/Certificates"](
                {"CertificateString": keys.cert("other-db").read_text(), "CertificateType": "PEM"})
        assert status == 200 and machine.events[-1] == "variables staged for the next power-on"
        run_kind("bmc.power", emulator_config, bmc, "off", graceful_timeout_seconds="0")
        assert read_store(store) == clean                          # off: still waiting
        assert bmc.doc(f"{ref}/SecureBootDatabases/dbx/Certificates")["Members@odata.count"] == 1
        run_kind("bmc.power", emulator_config, bmc, "on")
        assert machine.events[-2:] == ["variables written: dbx", "start"], machine.events
        assert read_store(store).databases["dbx"] == (tenant_cert(keys), *clean.databases["dbx"])
