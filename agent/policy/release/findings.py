"""What every check of the release gate reports with: a finding (Mismatch) and its remedy."""

from __future__ import annotations

from agent.proto import agent_pb2


def invoke(driver: str, operation: str, **arguments: str | int | bool) -> agent_pb2.DriverInvokeRequest:
    """A driver.invoke request; a bool is a bool_value, an int an int_value, else a string."""
    request = agent_pb2.DriverInvokeRequest(driver=driver, operation=operation)
    for name, value in arguments.items():
        if isinstance(value, bool):
            request.arguments[name].bool_value = value
        elif isinstance(value, int):
            request.arguments[name].int_value = value
        else:
            request.arguments[name].string_value = value
    return request


def bmc_remedy(kind: str, operation: str, **parameters: str) -> agent_pb2.BmcRemedy:
    """A site command that puts a BMC finding back (sent with the check's BMC and credentials)."""
    return agent_pb2.BmcRemedy(kind=kind, operation=operation, parameters=parameters)


def restorable(m: agent_pb2.Mismatch) -> bool:
    """Whether the finding has a remedy: a driver.invoke (node) or a site command (BMC)."""
    return m.HasField("remedy") or m.HasField("bmc_remedy")


class Found:
    def __init__(self) -> None:
        self.mismatches: list[agent_pb2.Mismatch] = []

    def add(self, check: str, expected: object, found: object, where: str, message: str,
            remedy: agent_pb2.DriverInvokeRequest | agent_pb2.BmcRemedy | None = None) -> None:
        m = agent_pb2.Mismatch(check=check, expected=str(expected), found=str(found), where=where,
                               message=message)
        if isinstance(remedy, agent_pb2.BmcRemedy):
            m.bmc_remedy.CopyFrom(remedy)
        elif remedy is not None:
            m.remedy.CopyFrom(remedy)
        self.mismatches.append(m)
