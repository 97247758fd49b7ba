"""The attestation policy: which measured boots the gateway accepts. One JSON file an operator
edits (docs/attestation.md):

    {
      "builds": [                       # the ramdisk builds accepted, as their build writes them
        {"build_id": "...", "pcr4": ["<the UKI's Authenticode SHA-256>", "<its kernel's>"],
         "pcr4_secure_boot": ["<the UKI's>"],   # arm64: what PCR 4 shows under Secure Boot
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
replayed against the event log (or, 10, taken as quoted) and not judged either. Every event of
the PCRs that are judged is (``judge_events``): its type, an action's string and digest, the
separators, every image in PCR 4 whatever its label.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import atomicfile, limits
from agent.errors import InvalidParameters
from agent.gateway.verifier import eventlog, pcr7
from agent.gateway.verifier.refused import PolicyFailed

log = logging.getLogger(__name__)

PROFILE_PCRS = (0, 2, 7)
BUILD_PCRS = (9, 11, 12)
MAX_POLICY_BYTES = 4 << 20


@dataclass(frozen=True)
class Build:
    build_id: str
    pcr4: tuple[bytes, ...]  # the images it starts, in order: the UKI (on arm64, then its kernel)
    pcrs: dict[int, bytes]  # 9, 11, 12 where the build states them
    # What PCR 4 shows of it under Secure Boot where that differs (arm64: the UKI alone; its stub
    # starts the kernel under its own security override, which the firmware neither verifies
    # nor measures; the UKI's digest covers the kernel, its .linux section).
    pcr4_secure_boot: tuple[bytes, ...] = ()

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
        secure = values.get("pcr4_secure_boot", [])
        if not isinstance(secure, list):
            raise InvalidParameters(f"{where}.pcr4_secure_boot is a list of digests")
        return cls(str(values.get("build_id", "")), tuple(_digest(v, f"{where}.pcr4") for v in images), pcrs,
                   tuple(_digest(v, f"{where}.pcr4_secure_boot") for v in secure))

    def to_json(self) -> dict[str, Any]:
        secure = {"pcr4_secure_boot": [v.hex() for v in self.pcr4_secure_boot]} if self.pcr4_secure_boot \
            else {}
        return {"build_id": self.build_id, "pcr4": [v.hex() for v in self.pcr4], **secure,
                **{f"pcr{p}": v.hex() for p, v in sorted(self.pcrs.items())}}

    def started(self, digests: list[bytes]) -> tuple[bytes, ...] | None:
        """The build's images as PCR 4's last ``digests`` show them (its Secure Boot form where
        it has one and the other does not match), or None."""
        for images in (self.pcr4, self.pcr4_secure_boot):
            if images and tuple(digests[-len(images):]) == images:
                return images
        return None


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
        doc = limits.loads_json(raw, what=f"{path}: the attestation policy", max_bytes=MAX_POLICY_BYTES)
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

    def to_json(self, profiles: dict[str, dict[int, set[bytes]]] | None = None) -> dict[str, Any]:
        """The policy as its file holds it; with ``profiles`` in place of its own where given."""
        profiles = self.profiles if profiles is None else profiles
        return {
            "builds": [b.to_json() for b in self.builds],
            "loaders": sorted(v.hex() for v in self.loaders),
            "learn": self.learn,
            "profiles": {name: {f"pcr{p}": sorted(v.hex() for v in vals) for p, vals in sorted(pcrs.items())}
                         for name, pcrs in sorted(profiles.items())},
            **({"secure_boot": self.secure_boot.to_json()} if self.secure_boot is not None else {}),
        }

    def judge(self, log_: eventlog.EventLog, pcrs: dict[int, bytes], profile: str, *,
              learn: bool = True, accept: bool = False) -> dict[str, str]:
        """What matched (build, profile); PolicyFailed names the first check that did not.

        ``learn``: the caller allows a new profile to be learned here (with ``"learn": "first"``:
        the node's first attestation); ``accept``: an operator opened the node's window, and
        PCRs 0, 2 and 7 are learned under its profile, known or not."""
        images = judge_events(log_)
        digests = [e.sha256 for e in images]
        build, started = next(((b, s) for b in self.builds if (s := b.started(digests)) is not None),
                              (None, ()))
        if build is None:
            raise PolicyFailed("policy_pcr4", "the images started last (PCR 4: "
                               f"{', '.join(a.hex() for a in digests[-2:]) or 'none'}) are no accepted "
                               "ramdisk build")
        # Before the build: accepted loaders (the firmware's PXE starting ipxe.efi, GRUB), and
        # the build's own images: iPXE loads an image once to probe it before it starts it (PCR 4
        # shows the UKI twice under OVMF), and that image is the accepted one. Every digest PCR 4
        # holds counts, whatever its event says it is: the label is the log's word, the digest
        # the firmware's.
        accepted = self.loaders | set(build.pcr4)
        before = [e for e in images[:-len(started)] if e.sha256 not in accepted]
        if before:
            label = eventlog.type_name(before[0].type)
            raise PolicyFailed("policy_pcr4", f"PCR 4: {before[0].sha256.hex()} (logged as {label}) "
                               "started before the ramdisk and is no accepted loader")
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
        if self.secure_boot is not None:   # PCR 7 event by event (agent/gateway/verifier/pcr7.py)
            matched.update(pcr7.judge(log_, self.secure_boot))
        with self._lock:
            known = self.profiles.get(profile)
            if accept and (known is None or any(pcrs[p] not in known.get(p, set()) for p in PROFILE_PCRS)):
                self._keep(profile, {p: {*(known or {}).get(p, set()), pcrs[p]} for p in PROFILE_PCRS})
                log.info("attestation policy: an operator accepted hardware profile %r's firmware", profile)
                matched["learned"] = "pcr0,pcr2,pcr7 (accepted by an operator)"
                return matched
            if known is None:
                if self.learn != "first" or not learn:
                    raise PolicyFailed("policy_profile", f"hardware profile {profile!r} is not enrolled "
                                       "and the policy learns none here (an operator opens a node's window: "
                                       "agent gateway accept)")
                self._keep(profile, {p: {pcrs[p]} for p in PROFILE_PCRS})
                log.info("attestation policy: learned hardware profile %r", profile)
                matched["learned"] = "pcr0,pcr2,pcr7"
                return matched
        for pcr in PROFILE_PCRS:
            if pcrs[pcr] not in known.get(pcr, set()):
                raise PolicyFailed("policy_profile", f"PCR {pcr} is {pcrs[pcr].hex()}, not a value "
                                   f"accepted for {profile!r} (firmware or its settings changed; refused "
                                   "until an operator accepts it: agent gateway accept NODE)")
        return matched

    def _keep(self, profile: str, values: dict[int, set[bytes]]) -> None:
        """``profile``'s values written to the policy file, then kept in memory: learned once,
        or not at all (a file that cannot be written refuses, and nothing is kept)."""
        try:
            self._save({**self.profiles, profile: values})
        except OSError as e:
            raise PolicyFailed("policy_profile", f"hardware profile {profile!r} not learned: the "
                               f"policy file cannot be written ({e})") from e
        self.profiles[profile] = values

    def _save(self, profiles: dict[str, dict[int, set[bytes]]]) -> None:
        if self.path is not None:
            text = json.dumps(self.to_json(profiles), indent=2, sort_keys=True) + "\n"
            atomicfile.write_atomic(self.path, text.encode())


# The PCRs the policy relies on: every event logged in them is judged (judge_events), never a
# subset picked by type.
JUDGED_PCRS = tuple(sorted(eventlog.PCR_EVENT_TYPES))
SEPARATED_PCRS = (0, 2, 4, 7)


def judge_events(log_: eventlog.EventLog) -> list[eventlog.Event]:
    """Every event of the PCRs the policy relies on, against the PC Client PFP; PCR 4's images
    (every event extended there but its separator and its boot attempts) in the order started.

    The digests were extended into the PCRs (the replay checked that); an event's type and data
    are the log's word only. So a type the PFP does not allow in its PCR is refused
    (``policy_event_type``); an EV_EFI_ACTION must hold one of the PFP's strings and its digest be
    their hash (``policy_event_action``), or it could hide any digest; each firmware PCR judged
    holds one separator, 0 and hashed, and after PCR 4's come only boot applications and boot
    attempts (``policy_separator``). Whatever else PCR 4 holds is an image, for the caller to
    find on its accepted list."""
    separators = dict.fromkeys(SEPARATED_PCRS, 0)
    images: list[eventlog.Event] = []
    for n, e in enumerate(log_.events, 1):
        if e.type == eventlog.Ev.NO_ACTION or e.pcr not in eventlog.PCR_EVENT_TYPES:
            continue
        where = f"event {n} (PCR {e.pcr}, {eventlog.type_name(e.type)})"
        if e.type not in eventlog.PCR_EVENT_TYPES[e.pcr]:
            raise PolicyFailed("policy_event_type", f"{where}: the PC Client PFP puts no such event in "
                               f"PCR {e.pcr}: a relabelled measurement")
        if e.type == eventlog.Ev.EFI_ACTION:
            if e.data not in eventlog.EFI_ACTIONS.get(e.pcr, frozenset()):
                raise PolicyFailed("policy_event_action", f"{where}: {e.data[:80]!r} is none of the "
                                   f"PC Client PFP's actions for PCR {e.pcr}")
            if hashlib.sha256(e.data).digest() != e.sha256:
                raise PolicyFailed("policy_event_action", f"{where}: its digest {e.sha256.hex()} is not "
                                   f"the hash of {e.data.decode()!r}: another measurement under its name")
            continue
        if e.type == eventlog.Ev.SEPARATOR:
            if e.data == eventlog.SEPARATOR_ERROR:
                raise PolicyFailed("policy_separator", f"{where}: the firmware logged an error separator "
                                   "(it failed to measure something)")
            if e.data != eventlog.SEPARATOR or hashlib.sha256(e.data).digest() != e.sha256:
                raise PolicyFailed("policy_separator", f"{where}: not a separator (data {e.data[:8].hex()}, "
                                   f"digest {e.sha256.hex()}): another measurement under its name")
            separators[e.pcr] += 1
            if separators[e.pcr] > 1:
                raise PolicyFailed("policy_separator", f"{where}: a second separator in PCR {e.pcr}")
            continue
        if e.pcr != 4:
            continue
        if separators[4] and e.type != eventlog.Ev.EFI_BOOT_SERVICES_APPLICATION:
            raise PolicyFailed("policy_separator", f"{where} after PCR 4's separator, where the firmware "
                               "logs only the boot applications it starts and its boot attempts")
        images.append(e)
    missing = [str(p) for p, count in separators.items() if not count]
    if missing:
        raise PolicyFailed("policy_separator", f"no separator in PCR {', '.join(missing)}: the log does not "
                           "show where the firmware ended its own measurements")
    return images


def _digest(value: Any, where: str) -> bytes:
    return pcr7.sha256_hex(value, where)
