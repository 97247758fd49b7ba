"""The agent's settings. Loaded (by agent/cli/settings.py at start) from, in order of
precedence: command-line flags, then a config file, then the kernel command line (``bc.*``
parameters), then these defaults. Handlers read the frozen object they are given; there is no
global config. Every field but ``extra`` is a row of agent/cli/settings.py's table, which
derives its flag and ``bc.*`` parameter and shows the default written here in ``--help``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agent.catalog import Role


@dataclass(frozen=True)
class Config:
    node_id: str = ""
    role: Role = Role.RAMDISK
    gateway: str = ""                       # host:port the agent dials
    ca_bundle: Path | None = None           # CA that signs the gateway's certificate
    client_cert: Path | None = None         # PEM; with client_key, mutual TLS
    client_key: Path | None = None
    enrollment_token: str = ""              # per-boot token when there is no client cert
    state_dir: Path = Path("/run/bettercompute-agent")  # journal, node key (tmpfs in the ramdisk)
    cache_dir: Path = Path("/run/bettercompute-agent/cache")
    trusted_keys: tuple[Path, ...] = ()     # control-plane Ed25519 public keys (PEM or raw)
    log_file: Path | None = None
    logs_allow: tuple[Path, ...] = (Path("/var/log"), Path("/run/bettercompute-agent"))
    bulk_bandwidth_bytes_per_second: int = 200 * 1024 * 1024
    heartbeat_seconds: float = 5.0
    max_signature_lifetime_seconds: float = 900.0  # a command expiring further out is refused
    secrets_dir: Path = Path("/var/lib/bettercompute-agent/secrets")  # site role: BMC credentials
    # The TPM (agent/hw/tpm.py opener): "" the kernel's /dev/tpmrm0, "none" no TPM at all,
    # "tcp:127.0.0.1:PORT" or "unix:/PATH" a simulator's command socket (tests, development).
    tpm: str = ""
    tpm_event_log: Path | None = None       # its boot's event log; None: the kernel's
    # The site role's boot service and proxy routes (agent/site/services.py).
    site_address: str = ""                  # the site's address on the provisioning network
    site_http_port: int = 8088              # its HTTP service (iPXE scripts, routes)
    site_interface: str = ""                # dnsmasq's interface; "" = no proxy DHCP/TFTP
    site_ipxe_dir: Path = Path("/usr/lib/ipxe")  # undionly.kpxe, ipxe.efi (Debian's ipxe)
    # Its TLS listener for BMCs that mount https:// media only: port, certificate, key (all or none).
    site_https_port: int = 0                # 0 = no https listener
    site_tls_cert: Path | None = None       # PEM, the site's certificate (chain) for that listener
    site_tls_key: Path | None = None        # its private key (PEM)
    # The site role's caps on BMC work (docs/site.md, "How BMC work is scheduled").
    bmc_max_in_flight: int = 512            # BMC operations running at once; the rest queue
    bmc_max_queued: int = 4096              # BMC operations queued past those; more are refused
    # Commands queued on each lane beyond those running; more are refused (busy) at admission.
    lane_max_queued: int = 256
    ipmi_max_sessions: int = 64             # ipmitool sessions at once, site-wide
    # How a bmc.* command waits on its BMC (agent/site/bmc/client.py Pacing): its first poll or
    # retry after this many seconds, growing by 1.5 up to the cap. Real BMCs hang when polled
    # more often; tests against an emulator set them small.
    bmc_poll_seconds: float = 2.0
    bmc_poll_max_seconds: float = 15.0
    # The vendor tools and libraries the GPU kinds use (docs/gpu.md); a name is looked up on PATH.
    nvml_library: str = ""                  # libnvidia-ml; "" = $BC_NVML_LIBRARY, else the loader's
    nvidia_smi: str = "nvidia-smi"
    dcgmi: str = "dcgmi"
    nv_hostengine: str = "nv-hostengine"
    snapshot_allow: tuple[Path, ...] = ()   # instance.snapshot's file sources; () = its defaults
    site_store_dir: Path | None = None      # the content store (default: state_dir/site/store)
    site_store_bytes: int = 64 << 30        # its byte budget (LRU eviction past it)
    site_metrics_address: str = "127.0.0.1:9108"  # GET /metrics (Prometheus); "" serves none
    site_firmware_sets: Path | None = None  # the firmware sets per hardware profile (JSON, docs/site.md)
    site_upstreams: tuple[str, ...] = ()    # what routes and site fetches reach (site/serve/upstreams.py)
    # The nodes' kept serial consoles (agent/site/observe/console.py).
    site_console_dir: Path | None = None    # the rings (default: state_dir/site/observe/console)
    site_console_ring_bytes: int = 4 << 20  # each node's ring
    site_console_budget_bytes: int = 1 << 30  # all the rings together
    # Every kept console's history on disk (agent/site/observe/consolestore.py).
    site_console_store_dir: Path | None = None  # default: state_dir/site/observe/console-store
    site_console_keep_days: float = 30.0    # how far back
    site_console_node_bytes: int = 256 << 20  # each node's segments together
    site_console_site_bytes: int = 32 << 30   # all the nodes' segments together
    # A Redfish BMC that offers no console (no SSH console, IPMI off): its answer kept this long
    # before a bmc.* command reads its offer again (agent/site/observe/observer.py console_for).
    site_console_recheck_seconds: float = 600.0
    # The fleet's BMC management posture the release gate keeps ("ipmi=off,http=off,https=on";
    # agent/site/bmc/posture.py); "" checks none.
    bmc_posture: str = ""
    # The boot diagnosis' waits (agent/site/observe/causes.py's RULES), by rule: (name, seconds).
    site_cause_waits: tuple[tuple[str, float], ...] = ()
    extra: dict[str, str] = field(default_factory=dict)  # bc.* parameters not in the settings table
