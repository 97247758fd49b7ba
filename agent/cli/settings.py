"""Where the agent's settings come from, in this order (the first that sets a value wins):

1. command-line flags (``agent run --gateway ... --node ...``)
2. a config file (``--config FILE``): one JSON object whose keys are the names below
3. the kernel command line (``bc.*`` parameters, read from /proc/cmdline or ``--cmdline-file``)
4. the defaults in agent/config.py

One table (``SETTINGS``) drives the argparse flags, the config-file keys and the kernel
parameters, so the three cannot drift apart; every setting a handler reads is a row of it.
Kernel parameters that are not in the table (``bc.rejoin=...``, which the runtime reads from
the command line itself) are kept in ``Config.extra``, read by no module by name
(logs.collect redacts the values of those whose names look secret).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import catalog, limits
from agent.config import Config
from agent.errors import InvalidParameters
from agent.link.options import SessionOptions
from agent.security.attest import EVENT_LOG  # the kernel's, where attestation reads it by default


@dataclass(frozen=True)
class Setting:
    """One setting, named once: its Config field (or session option) and config-file key;
    the flag and the kernel parameter are derived from the name (``--name-with-hyphens``,
    ``bc.name``) unless the row gives its own (the older, shorter ones). The default is the
    Config field's (or SessionOptions'), written there once; the help shows it (``shown``
    words it where the value alone would say too little, or is computed at start)."""

    key: str
    parse: Callable[[str], Any]
    help: str
    flag: str = ""          # default: --key, with hyphens
    param: str = ""         # default: bc.key
    shown: str = ""         # the default as the help says it; default: the field's value
    multiple: bool = False  # a list: repeat the flag, a JSON list, or commas on the kernel line
    session: bool = False   # a session option, not a Config field

    def __post_init__(self) -> None:
        if not self.flag:
            object.__setattr__(self, "flag", "--" + self.key.replace("_", "-"))
        if not self.param:
            object.__setattr__(self, "param", f"bc.{self.key}")

    @property
    def default(self) -> Any:
        """The value when no source sets it: the Config field's or the session option's."""
        owner = SessionOptions if self.session else Config
        (f,) = [f for f in dataclasses.fields(owner) if f.name == self.key]
        if f.default is not dataclasses.MISSING:
            return f.default
        assert f.default_factory is not dataclasses.MISSING, f"{self.key} has no default"
        return f.default_factory()

    def default_text(self) -> str:
        if self.shown:
            return self.shown
        value = self.default
        if value is None or value in ("", ()):
            return "none"
        if self.parse is _bytes:
            return _bytes_text(value)
        if self.parse is _path_list:
            return ":".join(str(v) for v in value)
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


def _role(text: str) -> catalog.Role:
    try:
        return catalog.Role(text)
    except ValueError:
        roles = ", ".join(repr(str(r)) for r in catalog.Role)
        raise InvalidParameters(f"role {text!r}: the agent runs as one of {roles}") from None


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"{text} is not a positive number")
    return value


def _count(text: str) -> int:
    value = int(text)
    if not 0 < value <= 100_000:
        raise ValueError(f"{text} is not a count from 1 to 100000")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(f"{text} is not a TCP port")
    return value


def _path_list(text: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in text.split(":") if p)



UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes(text: str) -> int:
    """A byte count: digits with an optional K, M, G or T (powers of 1024)."""
    mult = UNITS.get(text[-1:].upper(), 1)
    digits = text[:-1] if mult > 1 else text
    if not digits.isdigit() or int(digits) == 0:
        raise ValueError(f"{text!r} is not a byte count (e.g. 64G)")
    return int(digits) * mult


def _posture(text: str) -> str:
    """The BMC posture as given, checked (agent/site/bmc/posture.py reads it)."""
    from agent.site.bmc import posture

    try:
        posture.parse(text)
    except InvalidParameters as exc:
        raise ValueError(exc.message) from None
    return text


def _bytes_text(value: int) -> str:
    """A byte count as _bytes reads it back: 64G, 200M, 4097."""
    for unit, mult in sorted(UNITS.items(), key=lambda u: -u[1]):
        if value % mult == 0:
            return f"{value // mult}{unit}"
    return str(value)


def _tpm(text: str) -> str:
    """A ``bc.tpm`` value hw/tpm.py's opener takes ("none", tcp:127.0.0.1:PORT, unix:/PATH)."""
    from agent.hw import tpm

    tpm.opener(text)
    return text


def _cause_wait(text: str) -> tuple[str, float]:
    """RULE=SECONDS: a boot diagnosis rule's wait (agent/site/observe/causes.py)."""
    from agent.site.observe.causes import NAMES

    name, sep, seconds = text.partition("=")
    if not sep or name not in NAMES:
        raise ValueError(f"{text[:60]!r}: expected RULE=SECONDS, RULE one of {', '.join(NAMES)}")
    value = float(seconds)
    if not 0 <= value <= 86_400:
        raise ValueError(f"{text[:60]!r}: a wait from 0 to 86400 seconds")
    return name, value


def _upstream(text: str) -> str:
    from agent.site.serve.upstreams import parse_entry

    return parse_entry(text)


SETTINGS: tuple[Setting, ...] = (
    Setting("gateway", str, "gateway address, host:port"),
    Setting("node_id", str, "this node's id", flag="--node", param="bc.node", shown="the host name"),
    Setting("role", _role, "ramdisk, node or site"),
    Setting("ca_bundle", Path, "CA bundle (PEM) that signs the gateway's certificate",
            flag="--ca", param="bc.ca"),
    Setting("client_cert", Path, "client certificate (PEM) for mutual TLS", flag="--cert", param="bc.cert"),
    Setting("client_key", Path, "its private key (PEM)", flag="--key", param="bc.key"),
    Setting("enrollment_token", str, "per-boot enrollment token (no client cert)",
            flag="--token", param="bc.token"),
    Setting("state_dir", Path, "journal and node key (tmpfs in the ramdisk)", param="bc.state"),
    Setting("cache_dir", Path, "download cache", param="bc.cache", shown="STATE_DIR/cache"),
    Setting("trusted_keys", Path, "control-plane Ed25519 public key file or directory (repeatable)",
            flag="--trusted-key", param="bc.trust", multiple=True),
    Setting("log_file", Path, "also log to this file", param="bc.log"),
    Setting("secrets_dir", Path, "site role: the secret store of BMC credentials (docs/site.md)",
            param="bc.secrets"),
    Setting("tpm", _tpm, "the TPM: 'none' for no TPM, tcp:127.0.0.1:PORT or unix:/PATH a TPM "
            "simulator's command socket (tests, development)", shown="/dev/tpmrm0"),
    Setting("tpm_event_log", Path, "the event log of the TPM's boot (attestation)",
            shown=str(EVENT_LOG)),
    Setting("heartbeat_seconds", _positive, "heartbeat interval when the gateway does not set one",
            flag="--heartbeat", param="bc.heartbeat"),
    Setting("max_signature_lifetime_seconds", _positive,
            "longest signature lifetime accepted: a command expiring further out is refused",
            flag="--max-signature-lifetime", param="bc.max_sig_lifetime"),
    Setting("logs_allow", _path_list,
            "logs.collect: the folders a named log file may be in, colon-separated"),
    Setting("bulk_bandwidth_bytes_per_second", _bytes,
            "the bulk lane's uploads (logs.collect, instance.snapshot) when the command sets no "
            "rate: bytes a second, e.g. 200M"),
    Setting("site_address", str,
            "site role: its address on the provisioning network (boot service, proxy routes)"),
    Setting("site_http_port", _port, "site role: the port of its HTTP service"),
    Setting("site_interface", str, "site role: the provisioning interface for proxy DHCP and TFTP (dnsmasq)"),
    Setting("site_ipxe_dir", Path, "site role: where undionly.kpxe and ipxe.efi are"),
    Setting("site_https_port", _port,
            "site role: the port of its HTTP service's TLS listener (virtual media for BMCs that "
            "mount https:// only), with --site-tls-cert and --site-tls-key", shown="none"),
    Setting("site_tls_cert", Path, "site role: the certificate (PEM) of that https listener"),
    Setting("site_tls_key", Path, "site role: the private key (PEM) of that https listener"),
    Setting("bmc_max_in_flight", _count, "site role: BMC operations in flight at once, the rest queued"),
    Setting("bmc_max_queued", _count,
            "site role: BMC operations queued beyond those in flight; more are refused (busy)"),
    Setting("lane_max_queued", _count,
            "commands queued on each lane beyond those running; more are refused (busy)"),
    Setting("ipmi_max_sessions", _count, "site role: concurrent IPMI sessions (ipmitool runs), site-wide"),
    Setting("bmc_poll_seconds", _positive,
            "site role: seconds before a BMC's first poll or retry, growing by 1.5 to the cap below"),
    Setting("bmc_poll_max_seconds", _positive,
            "site role: the longest wait in seconds between a BMC's polls or retries"),
    Setting("nvml_library", str, "the NVML library (libnvidia-ml.so.1) to load",
            shown="$BC_NVML_LIBRARY, else the loader's"),
    Setting("nvidia_smi", str, "the nvidia-smi of gpu.reset"),
    Setting("dcgmi", str, "the dcgmi of diag.dcgm"),
    Setting("nv_hostengine", str, "the nv-hostengine diag.dcgm starts when none runs"),
    Setting("snapshot_allow", _path_list,
            "instance.snapshot: the folders a file source may be in, colon-separated",
            shown="instance.snapshot's own"),
    Setting("site_store_dir", Path,
            "site role: the content store of image chunks, kernels and initrds, on a disk",
            shown="STATE_DIR/site/store"),
    Setting("site_store_bytes", _bytes, "site role: the content store's byte budget, e.g. 64G"),
    Setting("site_metrics_address", str, "site role: host:port of GET /metrics, or '' for none",
            param="bc.site_metrics"),
    Setting("site_firmware_sets", Path,
            "site role: the firmware sets file (JSON: per hardware profile, each component's version)"),
    Setting("site_upstreams", _upstream,
            "site role: a host, address or network proxy routes may reach (repeatable)",
            flag="--site-upstream", shown="any but loopback, link-local and the site's own", multiple=True),
    Setting("reconnect_min_seconds", _positive, "base of the reconnect backoff (seconds)",
            flag="--reconnect-min", param="bc.reconnect_min", session=True),
    Setting("reconnect_max_seconds", _positive, "cap of the reconnect backoff (seconds)",
            flag="--reconnect-max", param="bc.reconnect_max", session=True),
    Setting("site_console_dir", Path, "site role: where the nodes' kept serial consoles are, on a disk",
            shown="STATE_DIR/site/observe/console"),
    Setting("site_console_ring_bytes", _bytes, "site role: each node's console ring, e.g. 4M"),
    Setting("site_console_budget_bytes", _bytes, "site role: all the consoles' rings together, e.g. 1G"),
    Setting("site_console_store_dir", Path, "site role: where every node's console history is kept, "
            "compressed, on a disk", shown="STATE_DIR/site/observe/console-store"),
    Setting("site_console_keep_days", _positive, "site role: how many days of console history are kept"),
    Setting("site_console_node_bytes", _bytes, "site role: each node's console history on disk, e.g. 256M"),
    Setting("site_console_site_bytes", _bytes, "site role: all the nodes' console history on disk, e.g. 32G"),
    Setting("site_console_recheck_seconds", _positive, "site role: how long a Redfish BMC's answer "
            "that it offers no console (no SSH console, IPMI off) is kept before it is read again"),
    Setting("bmc_posture", _posture, "site role: the BMCs' management posture the release gate keeps, "
            "e.g. ipmi=off,http=off,https=on (protocols: ipmi http https ssh kvmip ssdp virtualmedia)",
            shown="none checked"),
    Setting("site_cause_waits", _cause_wait,
            "site role: a boot diagnosis rule's wait, RULE=SECONDS, e.g. no_kernel=120 (repeatable)",
            flag="--site-cause-wait", param="bc.site_cause_wait", shown="each rule's own (docs/site.md)",
            multiple=True),
)
BY_KEY = {s.key: s for s in SETTINGS}
BY_PARAM = {s.param: s for s in SETTINGS}

PRECEDENCE = "flags, then the --config JSON file, then kernel bc.* parameters, then defaults"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of every setting, plus --config and --cmdline-file."""
    g = p.add_argument_group("settings", f"Precedence: {PRECEDENCE}.")
    g.add_argument("--config", type=Path, metavar="FILE",
                   help="JSON object of settings, keys: " + ", ".join(s.key for s in SETTINGS))
    g.add_argument("--cmdline-file", type=Path, default=Path("/proc/cmdline"), metavar="FILE",
                   help="kernel command line to read bc.* parameters from (default: /proc/cmdline)")
    for s in SETTINGS:
        g.add_argument(s.flag, dest=f"setting_{s.key}", action="append" if s.multiple else "store",
                       metavar=s.key.upper(), help=f"{s.help} (default: {s.default_text()}) [{s.param}=]")


def parse_cmdline(text: str) -> dict[str, str]:
    """bc.* parameters of a kernel command line ("bc.node=n1 quiet bc.token=x" -> dict)."""
    out: dict[str, str] = {}
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    for word in words:
        name, sep, value = word.partition("=")
        if name.startswith("bc.") and sep:
            out[name] = value
    return out


def _convert(s: Setting, value: Any, source: str) -> Any:
    try:
        if s.multiple:
            items = value if isinstance(value, list) else [v for v in str(value).split(",") if v]
            return tuple(s.parse(str(v)) for v in items)
        if isinstance(value, (dict, list)):
            raise ValueError("expected a single value")
        return s.parse(str(value))
    except InvalidParameters as exc:
        raise InvalidParameters(f"{source}: {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise InvalidParameters(f"{source}: {s.key}: {exc}") from exc


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a JSON config file; refused when over limits.MAX_CONFIG_BYTES, nested
    too deeply, not JSON, or with unknown keys."""
    raw = limits.read_bounded(Path(path), what="config file", max_bytes=limits.MAX_CONFIG_BYTES)
    data = limits.loads_json(raw, what=f"config file {path}", max_bytes=limits.MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise InvalidParameters(f"config file {path}: expected a JSON object")
    unknown = sorted(set(data) - set(BY_KEY))
    if unknown:
        raise InvalidParameters(f"config file {path}: unknown keys {unknown}; known: {sorted(BY_KEY)}")
    return data


@dataclass(frozen=True)
class Loaded:
    config: Config
    session: dict[str, Any]       # SessionOptions keyword arguments
    cmdline: str                  # the kernel command line text (core reads bc.rejoin from it)
    sources: dict[str, str]       # key -> where its value came from ("flag", "file", "cmdline")


def load(
    flags: Mapping[str, Any],
    config_file: Path | None = None,
    cmdline_text: str = "",
) -> Loaded:
    """Merge the sources in precedence order into a Config (and the session options)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    params = parse_cmdline(cmdline_text)
    extra = {k[3:]: v for k, v in params.items() if k not in BY_PARAM}
    layers: list[tuple[str, Mapping[str, Any]]] = [
        ("cmdline", {BY_PARAM[k].key: v for k, v in params.items() if k in BY_PARAM}),
    ]
    if config_file is not None:
        layers.append((f"file {config_file}", read_config_file(config_file)))
    layers.append(("flag", {k: v for k, v in flags.items() if v is not None}))
    for source, layer in layers:  # lowest precedence first; later layers override
        for key, raw in layer.items():
            values[key] = _convert(BY_KEY[key], raw, source)
            sources[key] = source
    session = {k: values.pop(k) for k in list(values) if BY_KEY[k].session}
    if not values.get("node_id"):
        values["node_id"] = socket.gethostname()
        sources["node_id"] = "default (host name)"
    if "state_dir" in values and "cache_dir" not in values:
        values["cache_dir"] = values["state_dir"] / "cache"
    config = Config(**values, extra=extra)
    if (config.client_cert is None) != (config.client_key is None):
        raise InvalidParameters("a client certificate needs its key and the other way round (--cert, --key)")
    return Loaded(config=config, session=session, cmdline=cmdline_text, sources=sources)


def load_from_args(args: argparse.Namespace) -> Loaded:
    flags = {s.key: getattr(args, f"setting_{s.key}", None) for s in SETTINGS}
    cmdline = ""
    path: Path | None = getattr(args, "cmdline_file", None)
    if path is not None and os.path.exists(path):
        raw = limits.read_bounded(path, what="kernel command line", max_bytes=limits.MAX_CMDLINE_BYTES)
        cmdline = raw.decode("utf-8", "replace")
    return load(flags, getattr(args, "config", None), cmdline)
