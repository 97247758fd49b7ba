"""The attestation policy: which measured boots the gateway accepts. One JSON file an operator
edits (docs/attestation.md):

    {
      "builds": [                       # the ramdisk builds accepted, as their build writes them
        {"build_id": "...", "pcr4": ["<the UKI's Authenticode SHA-256>", "<its kernel's>"],
         "pcr9": "<hex>", "pcr11": "<hex>", "pcr12": "<hex>"}     # each optional but pcr4
      ],
      "loaders": ["<Authenticode SHA-256>", ...],   # what may start before the ramdisk (iPXE, GRUB)
      "learn": "first",                 # "first": a new hardware profile's PCRs 0, 2, 7 are
                                        # learned on its first attestation; "never": refused
      "profiles": {                     # per hardware profile: "maker|model|firmware version"
        "QEMU|Standard PC (Q35 + ICH9, 2009)|0.0.0": {"pcr0": ["<hex>"], "pcr2": [...], "pcr7": [...]}
      }
    }

PCR 1 (configuration, the NIC's MAC on a netboot) is never judged; PCRs 3, 5, 6, 8 and 10 are
replayed against the event log (or, 10, taken as quoted) and not judged either.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import atomicfile
from agent.errors import InvalidParameters
from agent.gateway import eventlog, pcr7

log = logging.getLogger(__name__)

PROFILE_PCRS = (0, 2, 7)
BUILD_PCRS = (9, 11, 12)
MAX_POLICY_BYTES = 4 << 20


class PolicyFailed(Exception):
    """A policy check failed: ``check`` names it (policy_pcr4, policy_pcr11, policy_profile...)."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(reason)
        self.check = check
        self.reason = reason


@dataclass(frozen=True)
class Build:
    build_id: str
    pcr4: tuple[bytes, ...]  # the images it starts, in order: the UKI (on arm64, then its kernel)
    pcrs: dict[int, bytes]  # 9, 11, 12 where the build states them

    @classmethod
    def from_values(cls, values: Any, where: str = "build") -> Build:
        """A build from its reference values: a policy file's entry, or what initramfs/uki.py
        writes beside the UKI (``ramdisk.efi.json``)."""
        if not isinstance(values, dict) or "pcr4" not in values:
            raise InvalidParameters(f"{where} needs at least pcr4")
        images = values["pcr4"] if isinstance(values["pcr4"], list) else [values["pcr4"]]
        if not images:
            raise InvalidParameters(f"{where}.pcr4 names no image")
        pcrs = {p: _digest(values[f"pcr{p}"], f"{where}.pcr{p}") for p in BUILD_PCRS if f"pcr{p}" in values}
        return cls(str(values.get("build_id", "")), tuple(_digest(v, f"{where}.pcr4") for v in images), pcrs)


@dataclass
class Policy:
    builds: list[Build] = field(default_factory=list)
    loaders: set[bytes] = field(default_factory=set)
    learn: str = "never"
    profiles: dict[str, dict[int, set[bytes]]] = field(default_factory=dict)
    path: Path | None = None
    secure_boot: pcr7.SecureBootPolicy | None = None   # PCR 7 judged event by event where set
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, path: Path) -> Policy:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise InvalidParameters(f"{path}: cannot read the attestation policy: {e}") from e
        if len(raw) > MAX_POLICY_BYTES:
            raise InvalidParameters(f"{path}: the attestation policy is over {MAX_POLICY_BYTES} bytes")
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise InvalidParameters(f"{path}: not JSON: {e}") from e
        policy = cls.from_json(doc, source=str(path))
        policy.path = path
        return policy

    @classmethod
    def from_json(cls, doc: Any, *, source: str = "policy") -> Policy:
        if not isinstance(doc, dict):
            raise InvalidParameters(f"{source}: the policy is a JSON object")
        unknown = set(doc) - {"builds", "loaders", "learn", "profiles", "secure_boot"}
        if unknown:
            raise InvalidParameters(f"{source}: unknown keys {sorted(unknown)}")
        builds = [Build.from_values(b, f"{source}: builds[{i}]") for i, b in enumerate(doc.get("builds", []))]
        learn = doc.get("learn", "never")
        if learn not in ("first", "never"):
            raise InvalidParameters(f"{source}: learn is \"first\" or \"never\", not {learn!r}")
        profiles: dict[str, dict[int, set[bytes]]] = {}
        for name, values in dict(doc.get("profiles", {})).items():
            profiles[str(name)] = {
                p: {_digest(v, f"{source}: {name}.pcr{p}") for v in values.get(f"pcr{p}", [])}
                for p in PROFILE_PCRS}
        loaders = {_digest(v, f"{source}: loaders") for v in doc.get("loaders", [])}
        secure_boot = None
        if "secure_boot" in doc:
            secure_boot = pcr7.SecureBootPolicy.from_json(doc["secure_boot"], source)
        return cls(builds, loaders, learn, profiles, secure_boot=secure_boot)

    def to_json(self) -> dict[str, Any]:
        return {
            "builds": [{"build_id": b.build_id, "pcr4": [v.hex() for v in b.pcr4],
                        **{f"pcr{p}": v.hex() for p, v in sorted(b.pcrs.items())}} for b in self.builds],
            "loaders": sorted(v.hex() for v in self.loaders),
            "learn": self.learn,
            "profiles": {name: {f"pcr{p}": sorted(v.hex() for v in vals) for p, vals in sorted(pcrs.items())}
                         for name, pcrs in sorted(self.profiles.items())},
            **({"secure_boot": self.secure_boot.to_json()} if self.secure_boot is not None else {}),
        }

    def judge(self, log_: eventlog.EventLog, pcrs: dict[int, bytes], profile: str) -> dict[str, str]:
        """What matched (build, profile); PolicyFailed names the first check that did not."""
        apps = [e.sha256 for e in log_.of(4, eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION)]
        build = next((b for b in self.builds if tuple(apps[-len(b.pcr4):]) == b.pcr4), None)
        if build is None:
            raise PolicyFailed("policy_pcr4", "the images started last (PCR 4: "
                               f"{', '.join(a.hex() for a in apps[-2:]) or 'none'}) are no accepted "
                               "ramdisk build")
        # Before the build: accepted loaders (the firmware's PXE starting ipxe.efi, GRUB), and
        # the build's own UKI: iPXE loads an image once to probe it before it starts it (PCR 4
        # shows the UKI twice under OVMF), and that image is the accepted one.
        before = [a for a in apps[:-len(build.pcr4)] if a not in self.loaders and a != build.pcr4[0]]
        if before:
            raise PolicyFailed("policy_pcr4", f"PCR 4: {before[0].hex()} started before the ramdisk "
                               "and is no accepted loader")
        # PCRs 11 and 12 hold nothing the build does not say (zero: no stub, no loader's options);
        # PCR 9 is checked where the build says.
        wanted = {11: bytes(32), 12: bytes(32), **build.pcrs}
        for pcr, want in sorted(wanted.items()):
            if pcrs.get(pcr) != want:
                what = {9: "what the kernel's stub measured (its load options, the initrd)",
                        11: "the UKI's sections", 12: "a command line or credentials given by the loader"}
                raise PolicyFailed(f"policy_pcr{pcr}", f"PCR {pcr} ({what[pcr]}) is "
                                   f"{pcrs.get(pcr, b'').hex()}, build {build.build_id} says {want.hex()}")
        matched = {"build": build.build_id, "pcr4": build.pcr4[0].hex(), "profile": profile}
        if self.secure_boot is not None:   # PCR 7 event by event (agent/gateway/pcr7.py)
            try:
                matched.update(pcr7.judge(log_, self.secure_boot))
            except pcr7.Pcr7Failed as e:
                raise PolicyFailed(e.check, e.reason) from None
        with self._lock:
            known = self.profiles.get(profile)
            if known is None:
                if self.learn != "first":
                    raise PolicyFailed("policy_profile", f"hardware profile {profile!r} is not enrolled "
                                       "and the policy learns none")
                self.profiles[profile] = {p: {pcrs[p]} for p in PROFILE_PCRS}
                self._save()
                log.info("attestation policy: learned hardware profile %r", profile)
                matched["learned"] = "pcr0,pcr2,pcr7"
                return matched
        for pcr in PROFILE_PCRS:
            if pcrs[pcr] not in known.get(pcr, set()):
                raise PolicyFailed("policy_profile", f"PCR {pcr} is {pcrs[pcr].hex()}, not a value "
                                   f"accepted for {profile!r} (firmware or its settings changed)")
        return matched

    def _save(self) -> None:
        if self.path is not None:
            text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
            atomicfile.write_atomic(self.path, text.encode())


def _digest(value: Any, where: str) -> bytes:
    try:
        out = bytes.fromhex(str(value))
    except ValueError:
        out = b""
    if len(out) != 32:
        raise InvalidParameters(f"{where}: {value!r} is not a SHA-256 digest in hex")
    return out
