"""The Redfish ``BmcClient``: the session (agent/site/bmc/redfish/session.py) with the methods
every BMC client offers, each a call into the module of its noun.

    client = RedfishClient(Target("10.0.0.5", Credentials("admin", pw)), CallContext(cancel, deadline))
    try:
        client.set_power(PowerAction.ON, graceful_timeout=60)
        client.power_state()                      # the caller polls until it has settled
    finally:
        client.close()                            # DELETEs the session

    session.py   transport, login and sessions, the kept connection and paths, pacing
    system.py    power, the boot override, the inventory bmc.query reads, accounts
    storage.py   Storage / SimpleStorage, volumes
    bios.py      BIOS attributes checked against the BMC's AttributeRegistry
    secureboot.py  UEFI Secure Boot: the SecureBoot resource, its databases, ResetKeys, enrolling
    accounts.py  the AccountService's accounts: listed, disabled, a slot reset
    subscriptions.py  the EventService's subscriptions: one deleted
    golden.py    the configuration read whole (the release gate's golden state)
    media.py     virtual media
    firmware.py  the UpdateService; tasks.py the task monitor it (and volumes) follow
    events.py    the LogServices' entries
    integrity.py ComponentIntegrity: the SPDM responders and their signed measurements
    posture.py   the Manager's network protocols (IPMI, HTTP, ...): read, put back, one set
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.policy.release.state import Account, BiosValue
from agent.proto import site_pb2
from agent.site.bmc.client import BootSetting, PowerAction, PowerState
from agent.site.bmc.posture import ProtocolState
from agent.site.bmc.redfish import (
    accounts,
    bios,
    events,
    firmware,
    media,
    posture,
    storage,
    subscriptions,
    system,
)
from agent.site.bmc.redfish.session import RedfishSession


class RedfishClient(RedfishSession):
    """``BmcClient`` over Redfish; see the module docstring."""

    def power_state(self) -> PowerState:
        return system.power_state(self)

    def set_power(self, action: PowerAction, *, graceful_timeout: float) -> None:
        system.set_power(self, action, graceful_timeout=graceful_timeout)

    def boot_device(self) -> BootSetting:
        return system.boot_device(self)

    def set_boot_device(self, setting: BootSetting) -> BootSetting:
        return system.set_boot_device(self, setting)

    def query(self) -> site_pb2.BmcOperationResult:
        return system.query(self)

    def posture(self) -> list[ProtocolState]:
        """The management protocols of its ManagerNetworkProtocol; Redfish only."""
        return posture.read(self)

    def put_back_posture(self, expected: dict[str, bool],
                         before: list[ProtocolState]) -> tuple[list[ProtocolState], dict[str, str]]:
        return posture.put_back(self, expected, before)

    def sensors(self) -> list[site_pb2.BmcSensor]:
        return system.sensors(self)

    def event_log(self, since: int) -> list[site_pb2.BmcLogEntry]:
        return events.entries(self, since)

    def set_password(self, username: str, new_password: str) -> None:
        system.set_password(self, username, new_password)

    def accounts(self) -> list[Account]:
        return accounts.accounts(self)

    def disable_account(self, username: str) -> list[Account]:
        return accounts.disable(self, username)

    def reset_account(self, slot: str, user_name: str, role: str, enabled: bool | None,
                      site_user: str) -> Account:
        return accounts.reset_slot(self, slot, user_name, role, enabled, site_user)

    def delete_subscription(self, subscription: str) -> bool:
        """Redfish only: an EventService subscription deleted (False: there was none)."""
        return subscriptions.delete(self, subscription)

    def set_service(self, protocol: str, enabled: bool) -> bool:
        """Redfish only: a NetworkProtocol service on or off (False: it already was)."""
        return posture.set_service(self, protocol, enabled)

    def firmware_update(
        self,
        *,
        image_uri: str = "",
        file: Path | None = None,
        sha256: str = "",
        transfer_protocol: str = "",
        method: str = "",
        progress: Callable[[int, str], None] | None = None,
    ) -> site_pb2.BmcFirmwareTask:
        return firmware.update(self, image_uri=image_uri, file=file, sha256=sha256,
                               transfer_protocol=transfer_protocol, method=method, progress=progress)

    def firmware_status(self, task_uri: str = "") -> site_pb2.BmcOperationResult:
        return firmware.status(self, task_uri)

    def bios(self, names: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        return bios.read(self, names)

    def set_bios(self, attributes: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return bios.set_attributes(self, attributes)

    def bios_baseline(self, expected: dict[str, str]) -> list[BiosValue]:
        return bios.baseline(self, expected)

    def storage(self) -> list[site_pb2.BmcStorageController]:
        return storage.controllers(self)

    def create_volume(
        self, controller_id: str, *, name: str, raid_type: str, drives: list[str], capacity_bytes: int
    ) -> site_pb2.BmcVolume:
        return storage.create_volume(self, controller_id, name=name, raid_type=raid_type, drives=drives,
                                     capacity_bytes=capacity_bytes)

    def delete_volume(self, volume_id: str) -> None:
        storage.delete_volume(self, volume_id)

    def virtual_media(self) -> list[site_pb2.BmcVirtualMedia]:
        return media.virtual_media(self)

    def insert_media(self, image_url: str, *, media_type: str = "CD",
                     alternates: tuple[str, ...] = ()) -> site_pb2.BmcVirtualMedia:
        return media.insert_media(self, image_url, media_type=media_type, alternates=alternates)

    def media_schemes(self, media_type: str = "CD") -> tuple[str, ...]:
        """The image URL schemes its virtual media mounts (() for any); Redfish only."""
        return media.mountable_schemes(self, media_type)

    def eject_media(self) -> None:
        media.eject_media(self)
