"""GPU Xid events: found in the kernel log, classified with NVIDIA's Xid catalogue.

The NVIDIA driver logs each Xid as ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., <text>``.
``parse(text)`` finds those lines in a dmesg-formatted log (``[  12.345678] NVRM: ...``, with
or without syslog's ``<4>`` level prefix); ``since_boot()`` reads this machine's kernel log:
the whole ring buffer in one syslog(2) call (SYSLOG_ACTION_READ_ALL, root), else /dev/kmsg
a record at a time (``agent.hw.kernellog.read_kmsg``), which under emulation costs more.

The catalogue: NVIDIA, "Xid Errors", section "Analyzing Xid Errors with the Xid Catalog",
table "Xids" for Ampere and newer GPUs (https://docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html), its column "Resolution Bucket (Immediate Action)". CATALOGUE
below keeps, for the codes a data-centre GPU logs, NVIDIA's description and that bucket; the
bucket is mapped to what it calls for on a node (``Action``):

  IGNORE, RESTART_APP       none       an application's own error, or informational
  RESET_GPU                 reset_gpu  reset the GPU (gpu.reset) before it runs work again
  RESTART_BM, RESTART_VM    reboot     reboot the node
  CONTACT_SUPPORT           drain      drain the node for service

Xid 154 ("GPU recovery action changed") carries the action in its text ("... to 0x2 (Node
Reboot Required)"), read from there. A code not in CATALOGUE is ``unknown``: reported, and
a warning in the verdicts, never guessed.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from agent.hw import kernellog
from agent.proto import agent_pb2

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class Action(enum.StrEnum):
    NONE = "none"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    DRAIN = "drain"
    UNKNOWN = "unknown"

    @property
    def wire(self) -> agent_pb2.XidAction:
        return _WIRE[self]


_WIRE = {
    Action.NONE: agent_pb2.XID_NONE, Action.RESET_GPU: agent_pb2.XID_RESET_GPU,
    Action.REBOOT: agent_pb2.XID_REBOOT, Action.DRAIN: agent_pb2.XID_DRAIN,
    Action.UNKNOWN: agent_pb2.XID_UNKNOWN,
}  # fmt: skip

BUCKETS: dict[str, Action] = {
    "IGNORE": Action.NONE, "RESTART_APP": Action.NONE, "RESET_GPU": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT, "RESTART_VM": Action.REBOOT, "CONTACT_SUPPORT": Action.DRAIN,
}  # fmt: skip

# code -> (NVIDIA's description, resolution bucket (immediate action))
CATALOGUE: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", "RESTART_APP"),
    13: ("Graphics Engine Exception", "RESTART_APP"),
    31: ("GPU memory page fault", "RESTART_APP"),
    32: ("Invalid or corrupted push buffer stream", "RESTART_APP"),
    43: ("GPU stopped processing", "RESTART_APP"),
    45: ("Preemptive cleanup, due to previous errors", "IGNORE"),
    48: ("Double Bit ECC Error", "RESET_GPU"),
    61: ("Internal micro-controller breakpoint/warning", "RESET_GPU"),
    62: ("Internal micro-controller halt", "RESET_GPU"),
    63: ("ECC page retirement or row remapping recording event", "RESET_GPU"),
    64: ("ECC page retirement or row remapper recording failure", "CONTACT_SUPPORT"),
    68: ("NVDEC0 Exception", "RESTART_APP"),
    69: ("Graphics Engine class error", "RESTART_APP"),
    74: ("NVLINK Error", "RESET_GPU"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    92: ("High single-bit ECC error rate", "IGNORE"),
    94: ("Contained ECC error", "RESTART_APP"),
    95: ("Uncontained ECC error", "RESET_GPU"),
    109: ("Context Switch Timeout Error", "RESTART_APP"),
    119: ("GSP RPC Timeout", "RESET_GPU"),
    120: ("GSP Error", "RESET_GPU"),
    121: ("C2C Link corrected error", "IGNORE"),
    140: ("Unrecovered ECC Error", "RESET_GPU"),
    143: ("GPU Initialization Failure", "RESTART_BM"),
    154: ("GPU Recovery Action Changed", ""),
}

# Xid 154's recovery actions, as the driver words them.
_RECOVERY = (
    ("node reboot required", Action.REBOOT, "RESTART_BM"),
    ("drain", Action.DRAIN, "CONTACT_SUPPORT"),
    ("gpu reset required", Action.RESET_GPU, "RESET_GPU"),
    ("none", Action.NONE, "IGNORE"),
)

_LINE = re.compile(
    r"^(?:<[0-9]+>)?(?:\[\s*(?P<ts>[0-9]+\.[0-9]+)\]\s*)?.*?NVRM: Xid "
    r"\(PCI:(?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.(?P<fn>[0-7]))?\): "
    r"(?P<xid>[0-9]{1,4}),\s*(?P<text>.*)$"
)
MAX_EVENTS = 256           # a flapping GPU logs thousands: the first ones are enough


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci_address: str              # "0000:18:00.0"
    seconds_since_boot: float
    message: str
    action: Action
    bucket: str
    name: str

    def to_proto(self) -> agent_pb2.XidEvent:
        return agent_pb2.XidEvent(xid=self.xid, pci_address=self.pci_address,
                                  seconds_since_boot=self.seconds_since_boot, message=self.message,
                                  action=self.action.wire, bucket=self.bucket, name=self.name)


def classify(xid: int, message: str = "") -> tuple[Action, str, str]:
    """(action, bucket, description) of an Xid code, after the catalogue."""
    name, bucket = CATALOGUE.get(xid, ("", ""))
    if xid == 154:
        lower = message.lower()
        target = lower.rsplit(" to ", 1)[-1]
        for words, action, implied in _RECOVERY:
            if words in target:
                return action, implied, name
        return Action.UNKNOWN, "", name
    if not bucket:
        return Action.UNKNOWN, "", name
    return BUCKETS.get(bucket, Action.UNKNOWN), bucket, name


def parse(text: str, limit: int = MAX_EVENTS) -> list[XidEvent]:
    """The Xid events of a kernel log, in order, at most ``limit``."""
    events: list[XidEvent] = []
    for line in text.splitlines():
        if "NVRM: Xid" not in line:
            continue
        m = _LINE.match(line.strip())
        if m is None:
            continue
        xid = int(m.group("xid"))
        message = m.group("text").strip()[:512]
        action, bucket, name = classify(xid, message)
        events.append(XidEvent(
            xid=xid, pci_address=f"{m.group('pci').lower()}.{m.group('fn') or '0'}",
            seconds_since_boot=float(m.group("ts") or 0.0), message=message, action=action,
            bucket=bucket, name=name,
        ))  # fmt: skip
        if len(events) >= limit:
            break
    return events


def since_boot(cap: int = 8 << 20) -> list[XidEvent] | None:
    """The Xid events in this machine's kernel log; None when it cannot be read."""
    data = kernellog.read(cap)
    return None if data is None else parse(data.decode("utf-8", "replace"))
