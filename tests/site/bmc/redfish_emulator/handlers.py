"""The bmc.* handlers driven against the emulator as the control plane drives them: one
operation through its handler (``run_kind``), with the site's settings of the
``emulator_config`` fixture (tests/site/conftest.py: its secret store holds the emulator's
credentials under test_bmc_redfish's REF); and a request only parsed, as admission does before
any BMC is reached (``parse_kind``)."""

from __future__ import annotations

from agent.commands import handler_for
from agent.commands.base import Context
from agent.commands.bmc_params import BmcParams
from agent.config import Config
from agent.proto import site_pb2
from tests.site.bmc.redfish_emulator.server import RedfishEmulator
from tests.site.bmc.test_bmc_redfish import REF


def run_kind(kind: str, config: Config, bmc: RedfishEmulator, operation: str,
             **parameters: str) -> site_pb2.BmcOperationResult:
    """``operation`` of ``kind`` on node n1, whose BMC is ``bmc`` (TLS not verified: the
    emulator's certificate is a throw-away one), parsed and run as the gateway's command would be."""
    payload = site_pb2.BmcOperationRequest(node_id="n1", bmc_address=bmc.address, protocol="redfish",
                                           operation=operation, credentials_ref=REF, verify_tls=False,
                                           parameters=parameters)
    handler = handler_for(kind)
    assert handler is not None
    result = handler.run(Context.local(kind, config, timeout=60), handler.parse(payload))
    assert isinstance(result, site_pb2.BmcOperationResult)
    return result


def parse_kind(kind: str, operation: str, **parameters: str) -> BmcParams:
    """A Redfish request of ``kind`` to a BMC at 10.0.0.1 (never reached), parsed by its handler."""
    handler = handler_for(kind)
    assert handler is not None
    params = handler.parse(site_pb2.BmcOperationRequest(bmc_address="10.0.0.1", protocol="redfish",
                                                        operation=operation, credentials_ref=REF,
                                                        parameters=parameters))
    assert isinstance(params, BmcParams)
    return params
