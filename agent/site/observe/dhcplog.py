"""dnsmasq's log (``--log-dhcp``, read by its supervisor) as boot steps of a MAC or an address.

The lines that matter (dnsmasq 2.90, the xid first when --log-dhcp is on)::

    1389036598 PXE(eth0) 52:54:00:00:00:03 proxy-ignored       a request, not answered
    2353434870 PXE(eth0) 52:54:00:00:00:01 proxy               the proxy offer
    2353434870 PXE(eth0) 10.99.0.50 52:54:00:00:00:01 undionly.kpxe   the boot server's answer:
                                                               the client's address and MAC
    sent /srv/site/boot/tftp/ipxe.efi to 10.99.0.50            the boot loader, sent whole
    file /srv/site/boot/tftp/snponly.efi not found for 10.99.0.50   a file the site does not serve

Every other line is no step (None).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from agent.site.observe.timeline import Step

_MAC = r"((?:[0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2})"
_PXE = re.compile(r"\bPXE\([^)]*\) (?:(\d{1,3}(?:\.\d{1,3}){3}) )?" + _MAC + r" (\S+)$")
_SENT = re.compile(r"\bsent (\S+) to (\S+)$")
_MISSING = re.compile(r"\bfile (\S+) not found for (\S+)$")


@dataclass(frozen=True)
class DhcpStep:
    step: Step
    mac: str = ""            # lower case
    ip: str = ""
    detail: str = ""


def parse(line: str) -> DhcpStep | None:
    m = _PXE.search(line)
    if m:
        ip, mac, what = m.group(1) or "", m.group(2).lower(), m.group(3)
        if what == "proxy-ignored":
            return DhcpStep(Step.DHCP_IGNORED, mac, ip, mac)
        if what == "proxy":
            return DhcpStep(Step.DHCP_OFFER, mac, ip, "proxy offer")
        if ip:   # the boot server's answer (port 4011): which file, and the client's address
            return DhcpStep(Step.DHCP_OFFER, mac, ip, f"boot server: {os.path.basename(what)}")
        return None
    m = _SENT.search(line)
    if m:
        return DhcpStep(Step.TFTP_SENT, "", m.group(2), os.path.basename(m.group(1)))
    m = _MISSING.search(line)
    if m:
        return DhcpStep(Step.TFTP_MISSING, "", m.group(2), os.path.basename(m.group(1)))
    return None
