"""tpm-ppi: the TPM cleared by the firmware at the next boot, asked through its Physical Presence
Interface (TCG PC Client PPI 1.3), in the agent.

The OS cannot clear a TPM whose owner set an authorization it does not know; the firmware can,
with the platform hierarchy, before it hands over. Linux offers the firmware's ACPI PPI methods
under ``/sys/class/tpm/tpm0/ppi``: ``request`` (write an operation number; it reads back the
pending one), ``response`` (the last operation and its result), ``tcg_operations`` (per
operation: "5 4: User not required"). Operation 5 is Clear. ``root`` is the machine's root ("/",
or a test's tree); the release's remedies (agent.policy.release) name ``clear``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from agent.drivers.base import Arg, ArgType, Driver, Operation, Settings, Values, register
from agent.errors import AgentError, Reason, Unsupported

log = logging.getLogger(__name__)

PPI = Path("sys/class/tpm/tpm0/ppi")
CLEAR = 5
SET_PCR_BANKS = 23                 # PPI 1.3: "Set PCR Banks", its parameter the banks' bitmap
# EFI_TCG2_BOOT_HASH_ALG_*: the bitmap operation 23 takes.
BANK_BITS = {"sha1": 1, "sha256": 2, "sha384": 4, "sha512": 8, "sm3_256": 16}
_BANK = "|".join(BANK_BITS)
# tcg_operations' statuses (PPI 1.3, "Get User Confirmation Status for Operation"): 0 not
# implemented, 1 BIOS only, 2 blocked for the OS by the BIOS, 3 a person must confirm, 4 not.
REFUSED = {0: "Clear is not implemented by the firmware's PPI", 1: "the firmware allows Clear only "
           "from its setup", 2: "the firmware blocks Clear requests from the OS"}
USER_REQUIRED = 3


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError as exc:
        return f"(unreadable: {exc.strerror})"


def operation_status(root: Path) -> dict[int, int]:
    """tcg_operations as {operation: status}; {} where the kernel offers none."""
    out = {}
    try:
        text = (root / PPI / "tcg_operations").read_text(errors="replace")
    except OSError:
        return {}
    for line in text.splitlines():
        head = line.split(":", 1)[0].split()
        if len(head) == 2 and head[0].isdigit() and head[1].isdigit():
            out[int(head[0])] = int(head[1])
    return out


def clear_refused(root: Path, operation: int = CLEAR) -> str:
    """Why a Clear (or another ``operation``) cannot be asked for here; "" where it can."""
    if not (root / PPI / "request").exists():
        return "no TPM Physical Presence Interface (the firmware offers none to the OS)"
    status = operation_status(root).get(operation)
    if operation != CLEAR and status is None:
        return f"the firmware's PPI does not list operation {operation}"
    text = REFUSED.get(status, "") if status is not None else ""
    return text.replace("Clear", f"operation {operation}") if operation != CLEAR else text


def _status(_: Values, root: Path, _settings: Settings) -> str:
    ppi = root / PPI
    if not ppi.is_dir():
        raise Unsupported("no TPM Physical Presence Interface under " + str(ppi))
    clear = operation_status(root).get(CLEAR)
    return json.dumps({"version": _read(ppi / "version"), "request": _read(ppi / "request"),
                       "response": _read(ppi / "response"),
                       "clear_status": clear, "clear_refused": clear_refused(root)}, indent=1)


def _request(root: Path, operation: int, name: str, parameter: int | None = None) -> None:
    """Write one PPI request ("23 2" with a parameter: the kernel passes both for PPI 1.3) and
    read it back."""
    refused = clear_refused(root, operation)
    if refused:
        raise Unsupported(f"the TPM's PPI cannot be asked for {name}: {refused}")
    request = root / PPI / "request"
    text = f"{operation}" if parameter is None else f"{operation} {parameter}"
    try:
        fd = os.open(request, os.O_WRONLY)
        try:
            os.write(fd, f"{text}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise AgentError(f"the firmware refused the PPI request {operation} ({name}): {exc.strerror}",
                         reason=Reason.TOOL_FAILED) from exc
    pending = _read(request)
    if pending.split()[:1] != [str(operation)]:
        raise AgentError(f"the PPI request reads back {pending!r}, not {operation} ({name})",
                         reason=Reason.TOOL_FAILED)


def _set_pcr_banks(values: Values, root: Path, _settings: Settings) -> str:
    banks = str(values["banks"]).split(",")
    bitmap = sum(BANK_BITS[b] for b in set(banks))
    _request(root, SET_PCR_BANKS, "Set PCR Banks", bitmap)
    log.info("TPM: PPI Set PCR Banks (%s) requested", ",".join(banks))
    return (f"PPI request {SET_PCR_BANKS} (Set PCR Banks: {','.join(sorted(set(banks)))}) pending: the "
            f"firmware allocates them at the next boot; last response: {_read(root / PPI / 'response')}\n")


def _clear(_: Values, root: Path, _settings: Settings) -> str:
    _request(root, CLEAR, "Clear")
    log.info("TPM: PPI Clear requested; the firmware carries it out at the next boot")
    confirm = (" (the firmware asks a person at the console to confirm)"
               if operation_status(root).get(CLEAR) == USER_REQUIRED else "")
    return (f"PPI request {CLEAR} (Clear) pending: the firmware clears the TPM at the next boot{confirm}; "
            f"last response: {_read(root / PPI / 'response')}\n")


DRIVER = register(
    Driver(
        name="tpm-ppi",
        tool="",
        description="the TPM's Physical Presence Interface, in the agent: a Clear or the PCR banks, "
                    "at the next boot",
        install_hint="a firmware with TPM PPI (ACPI) and Linux's tpm driver (/sys/class/tpm/tpm0/ppi)",
        operations={
            op.name: op
            for op in (
                Operation("status", "the PPI's version, pending request, last response (JSON)",
                          build=lambda v: ["status"], local=_status),
                Operation("clear", "ask the firmware to clear the TPM at the next boot (PPI operation 5)",
                          build=lambda v: ["clear"], changes_state=True, local=_clear),
                Operation("set_pcr_banks", "ask the firmware to allocate these PCR banks at the next "
                          "boot (PPI operation 23)", build=lambda v: ["set_pcr_banks", str(v["banks"])],
                          args=(Arg("banks", ArgType.STRING, "hash algorithms (sha256,sha384)",
                                    pattern=rf"({_BANK})(,({_BANK})){{0,4}}"),),
                          changes_state=True, local=_set_pcr_banks),
            )
        },
    )
)
