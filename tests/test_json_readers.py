"""JSON that came from the wire or from a file someone else controls is read by one bounded
reader (agent/limits.py's ``loads_json``: size, depth, its refusal the caller's error), never by
``json.loads`` directly: a manifest of 200,000 nested ``[`` is the registry's bad document,
not an internal RecursionError. Every other ``json.loads`` (or ``json.load``) in agent/ is in
the allow-list below, with the reason it reads something trusted."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READ = re.compile(r"\bjson\.loads?\(")

# file -> why its json.loads reads bytes the agent trusts (its own files, its own tools' output)
TRUSTED: dict[str, str] = {
    "agent/limits.py": "the bounded reader itself",
    "agent/runtime/journal.py": "the agent's own journal records, each behind its CRC",
    "agent/launcher.py": "the upgrade marker the agent writes beside its own archive",
    "agent/drivers/nvme.py": "nvme-cli's output about the node's own controller",
    "agent/hw/nvme.py": "nvme-cli's output about the node's own controller",
    "agent/hw/dcgm.py": "dcgmi's output (NVIDIA's tool on the node)",
    "agent/commands/inventory/release.py": "nvme-cli's output about the node's own controller",
    "agent/site/bmc/secrets.py": "the site's own secret store (mode 0600, written atomically by it)",
    "agent/site/boot/pxe.py": "the site daemon's own entries and cache index, written atomically",
    "agent/site/boot/vmedia.py": "the site daemon's own media sets, written atomically",
    "agent/site/serve/routes.py": "the site daemon's own route records, written atomically",
    "agent/site/observe/observer.py": "the site daemon's own bmcs.json",
    "agent/site/observe/console.py": "the site daemon's own console record",
    "agent/site/observe/sshconsole.py": "the site daemon's own record of each BMC's console plan",
    "agent/gateway/verifier/state.py": "the gateway's own per-node state files (0600, written atomically)",
    "agent/gateway/verifier/spdm.py": "the fleet's golden-values file, the operator's own configuration",
    "agent/site/bmc/redfish/fwsets.py": "the site's firmware sets, the operator's own file",
    "agent/site/bmc/partstable.py": "the site daemon's own records of its nodes' parts, written atomically",
    "agent/site/boot/dnsmasq.py": "boot-files.json, the digests the build wrote beside the boot files",
    "agent/site/observe/timeline.py": "the site daemon's own timeline records, and a copy made"
                                      " of its own values (json.dumps then loads)",
}


def readers() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "agent").rglob("*.py")):
        hits = len(READ.findall(path.read_text()))
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    return found


def test_no_json_loads_outside_the_trusted_readers() -> None:
    found = readers()
    untrusted = sorted(set(found) - set(TRUSTED))
    assert not untrusted, (f"json.loads in {untrusted}: read JSON from the wire or a tenant's file with"
                           " limits.loads_json (its error the caller's), or add the file to TRUSTED"
                           " with the reason its bytes are the agent's own")


def test_the_allow_list_names_only_files_that_still_read_json() -> None:
    stale = sorted(set(TRUSTED) - set(readers()))
    assert not stale, f"TRUSTED lists files without a json.loads any more: {stale}"
