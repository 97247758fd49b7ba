"""A BMC's management posture: which of its management protocols are on, against the fleet's
expected posture (the site's ``bmc_posture`` setting, e.g. ``ipmi=off,http=off,https=on``).

    expected = parse("ipmi=off,http=off,https=on")      # {"IPMI": False, "HTTP": False, "HTTPS": True}
    drifted(expected, states)                           # {"IPMI": False}: what to put back
    findings(expected, states, refused)                 # a Mismatch for each still out of line

The states are read over Redfish (ManagerNetworkProtocol: agent/site/bmc/redfish/posture.py);
IPMI has no such resource, so over IPMI the posture is unreadable, a finding. The release gate
(agent/site/bmc/release.py ``posture_check``) reads it and reports every protocol out of line
as a finding, named ``bmc.posture``; ``posture_restore`` (bmc.firmware restore_posture) puts
back what drifted where the BMC takes the write (once, read back), the BMC's own words where
it refused:

  bmc.posture            a protocol on that the fleet keeps off, or off     bmc.firmware
                         that it keeps on                                   restore_posture
                         still so after restore_posture's one PATCH
                         (refused, ignored, or one the vendor's row says
                         its BMC does not take)                          -  (an operator)
                         a protocol the BMC does not list (its state cannot be told)
                         the posture could not be read (IPMI, no NetworkProtocol, an error)
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import InvalidParameters
from agent.proto import agent_pb2, site_pb2

# The ManagerNetworkProtocol properties reported and checked, as the schema spells them.
PROTOCOLS = ("IPMI", "HTTP", "HTTPS", "SSH", "KVMIP", "SSDP", "VirtualMedia")
_BY_NAME = {p.lower(): p for p in PROTOCOLS}
_ON, _OFF = ("on", "true", "enabled"), ("off", "false", "disabled")


@dataclass(frozen=True)
class ProtocolState:
    protocol: str           # one of PROTOCOLS
    listed: bool            # the BMC lists it; False: enabled and port say nothing
    enabled: bool = False
    port: int = 0

    def message(self) -> site_pb2.BmcProtocolState:
        return site_pb2.BmcProtocolState(protocol=self.protocol, listed=self.listed, enabled=self.enabled,
                                         port=self.port)

    @property
    def shown(self) -> str:
        if not self.listed:
            return "not listed"
        return ("on" if self.enabled else "off") + (f" (port {self.port})" if self.port else "")


def parse(text: str) -> dict[str, bool]:
    """``name=on|off`` pairs, comma separated, each protocol once; "" for none (not checked)."""
    expected: dict[str, bool] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, _, value = item.partition("=")
        protocol = _BY_NAME.get(name.strip().lower())
        state = value.strip().lower()
        if protocol is None or protocol in expected or state not in (*_ON, *_OFF):
            raise InvalidParameters(f"bmc_posture {item[:40]!r}: protocol=on|off, each of "
                                    f"{', '.join(p.lower() for p in PROTOCOLS)} at most once")
        expected[protocol] = state in _ON
    return expected


def shown(expected: dict[str, bool]) -> str:
    return ", ".join(f"{p} {'on' if on else 'off'}" for p, on in expected.items())


def drifted(expected: dict[str, bool], states: list[ProtocolState]) -> dict[str, bool]:
    """The listed protocols whose state is not the expected one, with the state wanted."""
    by_name = {s.protocol: s for s in states}
    return {p: on for p, on in expected.items()
            if p in by_name and by_name[p].listed and by_name[p].enabled != on}


def findings(expected: dict[str, bool], states: list[ProtocolState],
             refused: dict[str, str]) -> list[agent_pb2.Mismatch]:
    """A ``bmc.posture`` finding for each expected protocol still out of line in ``states`` (read
    after any put back), saying why it was not put back (``refused``: protocol -> why)."""
    by_name = {s.protocol: s for s in states}
    out: list[agent_pb2.Mismatch] = []
    for protocol, on in expected.items():
        state = by_name.get(protocol, ProtocolState(protocol, listed=False))
        want = "on" if on else "off"
        if not state.listed:
            out.append(agent_pb2.Mismatch(
                check="bmc.posture", expected=want, found="not listed", where=protocol,
                message=f"the BMC does not list {protocol} in its ManagerNetworkProtocol: whether it "
                        f"is {want} cannot be told"))
        elif state.enabled != on:
            why = refused.get(protocol, "not put back")
            out.append(agent_pb2.Mismatch(
                check="bmc.posture", expected=want, found=state.shown, where=protocol,
                message=f"the BMC's {protocol} is {state.shown}, the fleet keeps it {want}; {why}"))
    return out


def unreadable(why: str) -> list[agent_pb2.Mismatch]:
    return [agent_pb2.Mismatch(check="bmc.posture", expected="readable", found="unreadable",
                               where="ManagerNetworkProtocol",
                               message=f"the BMC's management posture cannot be read: {why}")]
