"""agent.hw.nvme and agent.hw.ata: parsing nvme-cli JSON and hdparm -I, and the argv they run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.errors import ToolFailed, Unsupported
from agent.hw import ata, nvme
from agent.proc import Completed

DATA = Path(__file__).resolve().parent / "data"


def load(name: str) -> dict[str, object]:
    return json.loads((DATA / name).read_text())  # type: ignore[no-any-return]


def test_id_ctrl_qemu_like() -> None:
    c = nvme.parse_id_ctrl("nvme0", load("nvme-id-ctrl-qemu.json"))
    assert c.model == "QEMU NVMe Ctrl" and c.serial == "deadbeef"
    assert c.can_format and not c.can_crypto_format and not c.format_all_namespaces
    assert not (c.can_sanitize_block or c.can_sanitize_crypto or c.can_sanitize_overwrite)


def test_id_ctrl_datacenter() -> None:
    c = nvme.parse_id_ctrl("nvme1", load("nvme-id-ctrl-sanitize.json"))
    assert c.serial == "S64ANE0R812345" and c.model.startswith("SAMSUNG")
    assert c.can_format and c.can_crypto_format
    assert c.can_sanitize_block and c.can_sanitize_crypto and c.can_sanitize_overwrite


def test_id_ctrl_hex_strings() -> None:
    c = nvme.parse_id_ctrl("nvme0", {"oacs": "0x2", "fna": "0x7", "sanicap": "0x2"})
    assert c.can_format and c.can_crypto_format and c.format_all_namespaces and c.can_sanitize_block


def test_id_ns() -> None:
    ns = nvme.parse_id_ns(1, load("nvme-id-ns.json"))
    assert ns.lbaf == 0 and ns.deallocated_reads_zeros
    assert nvme.parse_id_ns(1, {"flbas": 0x61, "dlfeat": 0}).lbaf == 0x31
    assert not nvme.parse_id_ns(1, {"flbas": 1, "dlfeat": 2}).deallocated_reads_zeros


def test_sanitize_log_both_shapes() -> None:
    done = nvme.parse_sanitize_log(load("nvme-sanitize-log-2x.json"))
    assert done.succeeded and not done.running and done.progress == pytest.approx(65535 / 65536)
    running = nvme.parse_sanitize_log(load("nvme-sanitize-log-1x.json"))
    assert running.running and running.progress == 0.5
    failed = nvme.parse_sanitize_log({"sprog": 0, "sstat": 3})
    assert not failed.succeeded and not failed.running
    with pytest.raises(ToolFailed, match="sprog"):
        nvme.parse_sanitize_log({"nvme0": {}})


def runner(out: str) -> tuple[list[list[str]], object]:
    calls: list[list[str]] = []

    def run(argv: Sequence[str], **kw: object) -> Completed:
        calls.append(list(argv))
        return Completed(tuple(argv), 0, out.encode(), b"")

    return calls, run


def test_commands_argv() -> None:
    calls, run = runner("not json")
    ns = nvme.Namespace(nsid=2, lbaf=1, dlfeat=0)
    nvme.format_ns(run, "/dev/nvme0n2", ns, 2, 600000)  # type: ignore[arg-type]
    nvme.sanitize(run, "nvme0", nvme.SANACT_CRYPTO)  # type: ignore[arg-type]
    assert calls == [
        ["nvme", "format", "/dev/nvme0n2", "--namespace-id=2", "--lbaf=1", "--ses=2", "--timeout=600000",
         "--force"],
        ["nvme", "sanitize", "/dev/nvme0", "--sanact=4"],
    ]
    with pytest.raises(ToolFailed, match="not JSON"):
        nvme.id_ctrl(run, "nvme0")  # type: ignore[arg-type]


def test_hdparm_security_parsing() -> None:
    frozen = (DATA / "hdparm-I-frozen.txt").read_text()
    sec = ata.parse_identify(frozen)
    assert sec.supported and sec.frozen and sec.enhanced and not sec.enabled and not sec.locked
    assert sec.minutes == 2 and sec.enhanced_minutes == 8
    thawed = ata.parse_identify(frozen.replace("\t\tfrozen", "\tnot\tfrozen"))
    assert not thawed.frozen
    assert not ata.parse_identify("/dev/sda:\nATA device\n").supported


def test_ata_erase_refuses_frozen_and_runs_in_order() -> None:
    frozen = (DATA / "hdparm-I-frozen.txt").read_text()
    calls, run = runner(frozen)
    with pytest.raises(Unsupported, match="frozen"):
        ata.erase(run, "/dev/sda", enhanced=True, timeout=60)  # type: ignore[arg-type]
    assert calls == [["hdparm", "-I", "/dev/sda"]]
    calls, run = runner(frozen.replace("\t\tfrozen", "\tnot\tfrozen"))
    ata.erase(run, "/dev/sda", enhanced=True, timeout=60)  # type: ignore[arg-type]
    assert calls[1:] == [
        ["hdparm", "--user-master", "u", "--security-set-pass", "NULL", "/dev/sda"],
        ["hdparm", "--user-master", "u", "--security-erase-enhanced", "NULL", "/dev/sda"],
    ]
