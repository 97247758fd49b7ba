"""The release gate on a real kernel under OVMF: what a tenant leaves in the UEFI variables is
found by the ramdisk, put back by the remedies the gate names, and a clean node passes.

A q35 machine with OVMF boots the ramdisk (its /init mounts efivarfs). The baseline is what
the agent lists of the clean machine (driver.invoke efivars.list): its gate passes. Then, as a
tenant with root does (efibootmgr's own way: a write to efivarfs), the guest gets an extra
Boot0009 and a BootOrder that starts with it. inventory.refresh's expect.state finds both,
each with its remedy; the remedies, sent signed through the gateway, delete the entry and
restore the order, and the gate passes again. (The variables live in OVMF's emulated store
under -bios: written from the guest in this boot, rather than planted in a copy of
OVMF_VARS before it.) The machine's QEMU NVMe drive is checked against its factory layout
through the ramdisk's real nvme-cli: it passes, and once reformatted from the guest to 4 KiB
blocks (Format NVM, which QEMU 7.2 takes) it is named, as what the agent cannot put back.

One guest for the module, the tests in file order; more machines boot OVMF on pflash: the
Secure Boot half (a node left in setup mode with a tenant's key in db: found, the fleet's keys
enrolled by the ramdisk, then a boot of the signed UKI with Secure Boot enforcing), one with
swtpm whose planted residue is cleared through the firmware's PPI, the Clear rejected at OVMF's
prompt with ESC, then confirmed with F12, both pressed on the machine's keyboard.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agent.hw import efivars
from qemu import tpm as qemu_tpm
from qemu.harness import Disk, Machine
from qemu.lab import Lab
from tests.e2e.conftest import JOIN_TIMEOUT, run_command, skip_reason
from tests.tpmsim import SimTpm, need

pytestmark = [pytest.mark.qemu, pytest.mark.slow]

NODE = "release-1"
EFIVARS = "/sys/firmware/efi/efivars"
MiB = 1024 * 1024
FACTORY_NVME = {"namespaces": 1, "full_capacity": True, "lba_data_size": 512}
TENANT_ENTRY = 0x0009


@pytest.fixture(scope="module")
def ovmf_lab(lab: Lab) -> Lab:
    reason = skip_reason(uefi=True)
    if reason:
        pytest.skip(reason)
    return lab


@pytest.fixture(scope="module")
def node(ovmf_lab: Lab) -> Iterator[Machine]:
    d = ovmf_lab.workdir / f"{NODE}-disks"
    d.mkdir(parents=True, exist_ok=True)
    machine = ovmf_lab.boot(NODE, uefi=True, disks=[Disk(d / "nvme0.img", "NVMERELEASE", "nvme", 64 * MiB)])
    ovmf_lab.wait_joined(machine, NODE, JOIN_TIMEOUT)
    yield machine
    machine.stop()


@pytest.fixture(scope="module")
def clean(ovmf_lab: Lab, node: Machine) -> dict[str, Any]:
    listing = {"driver": "efivars", "operation": "list"}
    _, _, listed = run_command(ovmf_lab, node, NODE, "driver.invoke", listing)
    found: dict[str, Any] = json.loads(listed.stdout)
    return found


def baseline(clean: dict[str, Any]) -> dict[str, Any]:
    uefi: dict[str, Any] = {
        "boot_entries": [{"number": int(e["number"], 16), "sha256": e["sha256"],
                          "description": e["description"]} for e in clean["boot_entries"]],
        "boot_order": [int(n, 16) for n in clean["boot_order"]],
        **{f"{name}_sha256": clean[f"{name}_sha256"] for name in ("pk", "kek", "db", "dbx")},
    }
    if clean["secure_boot"] is not None:
        uefi["secure_boot"] = bool(clean["secure_boot"])
    return {"state": {"uefi": uefi, "nvme": FACTORY_NVME}}


def gate(lab: Lab, node: Machine, clean: dict[str, Any]) -> Any:
    _, _, result = run_command(lab, node, NODE, "inventory.refresh", {"expect": baseline(clean)})
    return result


def write_variable(node: Machine, name: str, value: bytes) -> None:
    """A tenant's write: attributes and value in one write() to efivarfs, from the guest."""
    path = f"{EFIVARS}/{name}-{efivars.GLOBAL}"
    data = (struct.pack("<I", efivars.ATTRS_NV_BS_RT) + value).hex()
    code = (f"import os; fd = os.open('{path}', os.O_WRONLY | os.O_CREAT, 0o644); "
            f"os.write(fd, bytes.fromhex('{data}')); os.close(fd)")
    status, out = node.shell(f'python3 -c "{code}"')
    assert status == 0, out


def test_the_ramdisk_reads_ovmfs_variables_and_a_clean_node_passes(ovmf_lab: Lab, node: Machine,
                                                                   clean: dict[str, Any]) -> None:
    assert clean["boot_entries"] and clean["boot_order"], clean
    result = gate(ovmf_lab, node, clean)
    assert result.release.pool_ready and list(result.conformance.mismatches) == [], result.conformance
    assert list(result.release.checked) == ["uefi", "nvme"]


def test_a_planted_entry_and_order_are_found_and_put_back(ovmf_lab: Lab, node: Machine,
                                                          clean: dict[str, Any]) -> None:
    order = [TENANT_ENTRY, *(int(n, 16) for n in clean["boot_order"])]
    write_variable(node, f"Boot{TENANT_ENTRY:04X}", efivars.load_option("tenant iPXE"))
    write_variable(node, "BootOrder", b"".join(struct.pack("<H", n) for n in order))
    found = gate(ovmf_lab, node, clean)
    assert {(m.check, m.where) for m in found.conformance.mismatches} == {
        ("uefi.boot_entry", f"Boot{TENANT_ENTRY:04X}"), ("uefi.boot_order", "BootOrder")}
    assert not found.release.pool_ready and not found.release.cannot_restore
    for m in found.release.restorable:
        run_command(ovmf_lab, node, NODE, "driver.invoke",
                    json_format.MessageToDict(m.remedy, preserving_proto_field_name=True))
    again = gate(ovmf_lab, node, clean)
    assert again.release.pool_ready, again.conformance
    status, out = node.shell(f"ls {EFIVARS}")
    assert status == 0 and f"Boot{TENANT_ENTRY:04X}-" not in out, out


def test_the_gateway_files_the_boots_attestation_verdict(ovmf_lab: Lab, node: Machine,
                                                       clean: dict[str, Any]) -> None:
    """The reference gateway fills the report's verdict; this lab's gateway attests nobody."""
    report = gate(ovmf_lab, node, clean).release
    assert report.boot_id and report.attestation_verdict == (
        "no attestation verdict: this gateway does not attest its nodes"), report


def test_a_reformatted_nvme_namespace_is_named(ovmf_lab: Lab, node: Machine, clean: dict[str, Any]) -> None:
    status, out = node.shell("nvme format /dev/nvme0n1 --lbaf=4 --force", timeout=120)
    assert status == 0, out
    found = gate(ovmf_lab, node, clean)
    assert [(m.check, m.where, m.expected, m.found) for m in found.release.cannot_restore] == [
        ("nvme.lba_size", "nvme0n1", "512", "4096")], found.conformance
    assert not found.release.restorable and not found.release.pool_ready


OVMF_CODE_4M, OVMF_VARS_4M = Path("/usr/share/OVMF/OVMF_CODE_4M.fd"), Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
TENANT_OWNER = uuid.UUID("7e4a1f3c-52b8-4d0e-9c61-0a2b3c4d5e6f")


def test_secure_boot_off_and_a_tenant_db_entry_are_found_put_back_and_the_node_boots_signed(
        ovmf_lab: Lab, tmp_path: Path) -> None:
    """The gate's Secure Boot half (issue 52, item 5), put back by the ramdisk. A node whose
    tenant left it in setup mode (the PK deleted, their own certificate added to db beside the
    fleet's, the KEK the fleet's; planted offline in its variable store by virt-fw-vars), booted
    under OVMF's Secure Boot build: the gate names setup mode, PK absent, db changed and Secure
    Boot off against the fleet's keys, each with the remedy efivars.enroll_keys. The test, as the
    control plane, completes it with the fleet's authenticated writes that it made as the key
    holder (agent/hw/uefi_auth.py: db signed by the KEK, KEK and PK by the PK) and sends it signed
    through the gateway; the ramdisk checks them, writes db, KEK and PK last through efivarfs
    and reads them back in the same boot (SetupMode 0, each digest the fleet's); the gate then
    names only Secure Boot off, which the firmware turns on at the next boot (edk2: a PK enrolled
    and no SecureBootEnable). The node boots again on the same variable store, now the ramdisk
    as a UKI signed with the fleet's db key: Secure Boot enforcing (its kernel says so) and its
    gate passes. Two boots: 58 s to 1 min 12 s under TCG on the 2-core machine at a load average of
    about 2 (nice; the module's lab 11 s more); 7 min 31 s at a load average of about 16."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key

    from agent.hw import uefi_auth
    from initramfs import signing
    from qemu import secureboot

    reason = secureboot.missing()
    if reason:
        pytest.skip(reason)
    keys = secureboot.FleetKeys.generate(tmp_path / "fleet-keys")
    _, tenant_cert = secureboot.self_signed(tmp_path, "tenant")

    def der(name: str) -> bytes:
        return x509.load_pem_x509_certificate(keys.cert(name).read_bytes()).public_bytes(Encoding.DER)

    def signed(name: str, value: bytes, signer: str) -> str:
        """The fleet's write of ``name``, as its key holder makes it offline (base64 to send)."""
        key = load_pem_private_key((keys.folder / f"{signer}.key").read_bytes(), None)
        return base64.b64encode(uefi_auth.signed_write(name, value, key, der(signer))).decode()

    lists = {name: uefi_auth.x509_list(der(f"fleet-{name.lower()}"), secureboot.OWNER)
             for name in ("PK", "KEK", "db")}
    # The fleet's golden state: its PK, KEK and db, out of setup mode, Secure Boot on.
    fleet = {**{f"{name.lower()}_sha256": hashlib.sha256(value).hexdigest() for name, value in lists.items()},
             "secure_boot": True, "setup_mode": False}
    variables = tmp_path / "vars.fd"
    owner = str(secureboot.OWNER)
    subprocess.run([str(secureboot.virt_fw_vars()), "--input", str(secureboot.OVMF_VARS_EMPTY),
                    "--output", str(variables), "--add-kek", owner, str(keys.cert("fleet-kek")),
                    "--add-db", owner, str(keys.cert("fleet-db")),
                    "--add-db", str(TENANT_OWNER), str(tenant_cert), "--no-microsoft"],
                   check=True, capture_output=True, timeout=120)
    firmware = (secureboot.OVMF_SECBOOT_CODE, variables)
    node_id = "release-db"
    machine = ovmf_lab.boot(node_id, uefi=True, pflash=firmware, secure_boot=True)
    try:
        ovmf_lab.wait_joined(machine, node_id, JOIN_TIMEOUT)
        _, _, result = run_command(ovmf_lab, machine, node_id, "inventory.refresh",
                                   {"expect": {"state": {"uefi": fleet}}})
        report = result.release
        found = sorted((m.check, m.where, m.expected, m.remedy.operation) for m in report.restorable)
        assert found == [("uefi.db", "db", fleet["db_sha256"], "enroll_keys"),
                         ("uefi.pk", "pk", fleet["pk_sha256"], "enroll_keys"),
                         ("uefi.secure_boot", "secure_boot", "1", "enroll_keys"),
                         ("uefi.setup_mode", "setup_mode", "0", "enroll_keys")], found
        assert not report.cannot_restore and not report.pool_ready
        # The control plane completes the one remedy with the fleet's writes, and sends it once.
        remedy = json_format.MessageToDict(report.restorable[0].remedy, preserving_proto_field_name=True)
        remedy["arguments"] = {"db": {"string_value": signed("db", lists["db"], "fleet-kek")},
                               "kek": {"string_value": signed("KEK", lists["KEK"], "fleet-pk")},
                               "pk": {"string_value": signed("PK", lists["PK"], "fleet-pk")}}
        _, _, enrolled = run_command(ovmf_lab, machine, node_id, "driver.invoke", remedy)
        done = json.loads(enrolled.stdout)
        assert done["written"] == ["db", "KEK", "PK"] and done["setup_mode"] == 0, done
        assert {f"{n}_sha256": done[f"{n}_sha256"] for n in ("pk", "kek", "db")} == {
            k: v for k, v in fleet.items() if k.endswith("_sha256")}, done
        # The keys are the fleet's, setup mode is over; Secure Boot waits for the next boot.
        _, _, after = run_command(ovmf_lab, machine, node_id, "inventory.refresh",
                                  {"expect": {"state": {"uefi": fleet}}})
        assert [(m.check, m.found) for m in after.release.cannot_restore] == [("uefi.secure_boot", "0")]
        assert not after.release.restorable
    finally:
        machine.stop()
    # The same variable store, as the node's own flash keeps it: the signed ramdisk boots.
    node_id = "release-db-restored"
    esp, _ = ovmf_lab.uki(node_id, sign=lambda image: signing.sign(image, keys.db_key()))
    machine = ovmf_lab.boot(node_id, uefi=True, esp=esp, pflash=firmware, secure_boot=True)
    try:
        ovmf_lab.wait_joined(machine, node_id, JOIN_TIMEOUT)
        _, _, again = run_command(ovmf_lab, machine, node_id, "inventory.refresh",
                                  {"expect": {"state": {"uefi": fleet}}})
        status, out = machine.shell("dmesg | grep -i 'secure boot enabled'")
    finally:
        machine.stop()
    assert again.release.pool_ready and not again.release.cannot_restore, again.conformance
    assert status == 0 and "Secure boot enabled" in out, out     # the firmware enforced it


OWNER_INDEX = 0x01500001
SWTPM_ECC_EK = ("tpm.persistent_handle", "0x81010016")   # swtpm_setup persists its ECC EK there
PROMPT = r"clear this computer's TPM[\s\S]*Press F12 to clear the TPM[\s\S]*Press ESC to reject"


def tpm2(state: Path, ca: Path, cwd: Path, *argvs: list[str]) -> list[str]:
    """tpm2-tools run on the machine's swtpm state while no machine holds it; their outputs."""
    need(*{argv[0] for argv in argvs})
    sim = SimTpm(state, ca)
    sim.start()
    outs = []
    try:
        for argv in argvs:
            done = subprocess.run(argv, cwd=cwd, env={"PATH": "/usr/bin:/bin", "TPM2TOOLS_TCTI": sim.tcti},
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (argv, done.stderr)
            outs.append(done.stdout)
    finally:
        sim.stop()
    return outs


def tenant_traces(state: Path, ca: Path, cwd: Path) -> tuple[bool, bool]:
    """(the owner's NV index is defined, an owner password is set), as tpm2-tools read them:
    the NV handles listed and TPM2_PT_PERMANENT's ownerAuthSet."""
    handles, props = tpm2(state, ca, cwd, ["tpm2_getcap", "handles-nv-index"],
                          ["tpm2_getcap", "properties-variable"])
    listed = {int(h, 16) for h in re.findall(r"0x[0-9a-fA-F]+", handles)}
    assert 0x01C00002 in listed, handles                  # the RSA EK certificate: read as it is
    auth = re.search(r"ownerAuthSet:\s+(\d)", props)
    assert auth is not None, props
    return OWNER_INDEX in listed, auth.group(1) == "1"


def plant_tpm_residue(state: Path, ca: Path, cwd: Path) -> None:
    """As a tenant leaves it: an NV index of the owner's and an owner password (tpm2-tools on
    the same swtpm state, before the machine boots on it)."""
    tpm2(state, ca, cwd,
         ["tpm2_nvdefine", f"{OWNER_INDEX:#x}", "-C", "o", "-s", "32", "-a", "ownerwrite|ownerread"],
         ["tpm2_changeauth", "-c", "owner", "tenant-password"])
    assert tenant_traces(state, ca, cwd) == (True, True)


def tpm_findings(result: Any) -> dict[tuple[str, str], Any]:
    return {(m.check, m.where): m for m in result.conformance.mismatches if m.check.startswith("tpm.")}


def ask_clear_and_reboot(lab: Lab, machine: Machine, node_id: str, clear: Any) -> int:
    """The gate's remedy through the agent (PPI request 5), then the reboot that carries it to
    the firmware; the console's length before it."""
    _, _, asked = run_command(lab, machine, node_id, "driver.invoke",
                              json_format.MessageToDict(clear, preserving_proto_field_name=True))
    assert b"pending" in asked.stdout, asked
    booted = len(machine.console())
    status, out = machine.shell("(sleep 1; echo b > /proc/sysrq-trigger) >/dev/null 2>&1 & true")
    assert status == 0, out
    return booted


def ppi_status(lab: Lab, machine: Machine, node_id: str) -> dict[str, Any]:
    _, _, result = run_command(lab, machine, node_id, "driver.invoke",
                               {"driver": "tpm-ppi", "operation": "status"})
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def test_a_ppi_clear_is_rejected_with_esc_then_confirmed_with_f12_and_the_tpm_passes(
        ovmf_lab: Lab, tmp_path: Path) -> None:
    """An NV index and an owner password on swtpm are found, each with the PPI Clear as remedy;
    the agent's driver asks OVMF's PPI for it (QEMU's tpm-tis offers the PPI, Linux shows it in
    sysfs); at the reboot OVMF asks at its console for F12, and an operator at the machine's
    keyboard (QMP send-key, as at a BMC's KVM console: OVMF's serial terminal is PC ANSI, which
    has no F12) answers. ESC first: the request is rejected, the node boots on and the residue
    is still named. Asked again and confirmed with F12: OVMF clears the TPM and resets, the node
    rejoins, the gate's TPM part passes, and the swtpm state read with tpm2-tools after has
    neither trace."""
    if qemu_tpm.missing() or not OVMF_CODE_4M.is_file() or not OVMF_VARS_4M.is_file():
        pytest.skip(qemu_tpm.missing() or "no OVMF_CODE_4M.fd / OVMF_VARS_4M.fd (Debian's ovmf)")
    state, ca = tmp_path / "state", tmp_path / "ca"
    qemu_tpm.manufacture(state, ca)
    plant_tpm_residue(state, ca, tmp_path)
    shutil.copyfile(OVMF_VARS_4M, tmp_path / "vars.fd")
    node_id = "release-ppi"
    planted = {("tpm.nv_index", f"{OWNER_INDEX:#010x}"), ("tpm.owner_auth", "owner")}
    baseline = {"expect": {"state": {"tpm": {}}}}
    with qemu_tpm.Swtpm(state, tmp_path / "swtpm.sock") as swtpm:
        machine = ovmf_lab.boot(node_id, uefi=True, tpm=swtpm.socket, keyboard=True,
                                pflash=(OVMF_CODE_4M, tmp_path / "vars.fd"))
        try:
            ovmf_lab.wait_joined(machine, node_id, JOIN_TIMEOUT)
            _, _, before = run_command(ovmf_lab, machine, node_id, "inventory.refresh", baseline)
            found = tpm_findings(before)
            assert set(found) == planted | {SWTPM_ECC_EK} and not before.release.pool_ready, before.release
            clear = found[("tpm.owner_auth", "owner")].remedy
            assert (clear.driver, clear.operation) == ("tpm-ppi", "clear")

            # ESC: the operator rejects the request; the firmware boots on without clearing.
            booted = ask_clear_and_reboot(ovmf_lab, machine, node_id, clear)
            machine.wait_console(PROMPT, 300, after=booted)
            machine.press("esc")
            ovmf_lab.wait_joined(machine, node_id, JOIN_TIMEOUT, sessions=2)
            _, _, rejected = run_command(ovmf_lab, machine, node_id, "inventory.refresh", baseline)
            assert set(tpm_findings(rejected)) == planted | {SWTPM_ECC_EK}, rejected.release
            assert ppi_status(ovmf_lab, machine, node_id)["response"] == "5 0xFFFFFFF0: User Abort"

            # F12: the operator confirms; the firmware clears the TPM and resets the machine.
            booted = ask_clear_and_reboot(ovmf_lab, machine, node_id, clear)
            machine.wait_console(PROMPT, 300, after=booted)
            machine.press("f12")
            machine.wait_console(r"Rebooting system to make TPM2 settings in effect", 120, after=booted)
            ovmf_lab.wait_joined(machine, node_id, JOIN_TIMEOUT, sessions=3)
            assert ppi_status(ovmf_lab, machine, node_id)["response"] == "5 0: Success"
            _, _, cleared = run_command(ovmf_lab, machine, node_id, "inventory.refresh", baseline)
            # The index, the owner password and swtpm's persisted ECC EK gone; the unclean resets
            # counted no authorization failure: the gate's TPM part passes as it is.
            assert cleared.release.pool_ready and not cleared.conformance.mismatches, cleared.conformance
            assert list(cleared.release.checked) == ["tpm"]
        finally:
            machine.stop()
    assert tenant_traces(state, ca, tmp_path) == (False, False)
