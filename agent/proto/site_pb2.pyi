from agent.proto import agent_pb2 as _agent_pb2
from agent.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BmcOperationRequest(_message.Message):
    __slots__ = ("node_id", "bmc_address", "protocol", "operation", "parameters", "credentials_ref", "verify_tls", "expect")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BMC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_REF_FIELD_NUMBER: _ClassVar[int]
    VERIFY_TLS_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    bmc_address: str
    protocol: str
    operation: str
    parameters: _containers.ScalarMap[str, str]
    credentials_ref: str
    verify_tls: bool
    expect: _agent_pb2.ExpectedState
    def __init__(self, node_id: _Optional[str] = ..., bmc_address: _Optional[str] = ..., protocol: _Optional[str] = ..., operation: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., credentials_ref: _Optional[str] = ..., verify_tls: _Optional[bool] = ..., expect: _Optional[_Union[_agent_pb2.ExpectedState, _Mapping]] = ...) -> None: ...

class BmcSystem(_message.Message):
    __slots__ = ("manufacturer", "model", "serial", "bios_version", "bmc_firmware_version", "health", "uuid")
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    BIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    BMC_FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    manufacturer: str
    model: str
    serial: str
    bios_version: str
    bmc_firmware_version: str
    health: str
    uuid: str
    def __init__(self, manufacturer: _Optional[str] = ..., model: _Optional[str] = ..., serial: _Optional[str] = ..., bios_version: _Optional[str] = ..., bmc_firmware_version: _Optional[str] = ..., health: _Optional[str] = ..., uuid: _Optional[str] = ...) -> None: ...

class BmcNic(_message.Message):
    __slots__ = ("id", "mac_address", "link_status")
    ID_FIELD_NUMBER: _ClassVar[int]
    MAC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LINK_STATUS_FIELD_NUMBER: _ClassVar[int]
    id: str
    mac_address: str
    link_status: str
    def __init__(self, id: _Optional[str] = ..., mac_address: _Optional[str] = ..., link_status: _Optional[str] = ...) -> None: ...

class BmcSensor(_message.Message):
    __slots__ = ("name", "kind", "reading", "units", "health", "has_reading")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    READING_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HAS_READING_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    reading: float
    units: str
    health: str
    has_reading: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., reading: _Optional[float] = ..., units: _Optional[str] = ..., health: _Optional[str] = ..., has_reading: _Optional[bool] = ...) -> None: ...

class BmcBootDevice(_message.Message):
    __slots__ = ("device", "persistent", "mode")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PERSISTENT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    device: str
    persistent: bool
    mode: str
    def __init__(self, device: _Optional[str] = ..., persistent: _Optional[bool] = ..., mode: _Optional[str] = ...) -> None: ...

class BmcDrive(_message.Message):
    __slots__ = ("id", "model", "serial", "capacity_bytes", "media_type", "protocol", "health")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    serial: str
    capacity_bytes: int
    media_type: str
    protocol: str
    health: str
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., serial: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., media_type: _Optional[str] = ..., protocol: _Optional[str] = ..., health: _Optional[str] = ...) -> None: ...

class BmcVolume(_message.Message):
    __slots__ = ("id", "name", "capacity_bytes", "raid_type", "drives")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAID_TYPE_FIELD_NUMBER: _ClassVar[int]
    DRIVES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    capacity_bytes: int
    raid_type: str
    drives: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., raid_type: _Optional[str] = ..., drives: _Optional[_Iterable[str]] = ...) -> None: ...

class BmcStorageController(_message.Message):
    __slots__ = ("id", "name", "drives", "volumes")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DRIVES_FIELD_NUMBER: _ClassVar[int]
    VOLUMES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    drives: _containers.RepeatedCompositeFieldContainer[BmcDrive]
    volumes: _containers.RepeatedCompositeFieldContainer[BmcVolume]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., drives: _Optional[_Iterable[_Union[BmcDrive, _Mapping]]] = ..., volumes: _Optional[_Iterable[_Union[BmcVolume, _Mapping]]] = ...) -> None: ...

class BmcVirtualMedia(_message.Message):
    __slots__ = ("id", "image", "inserted", "media_types")
    ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPES_FIELD_NUMBER: _ClassVar[int]
    id: str
    image: str
    inserted: bool
    media_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., image: _Optional[str] = ..., inserted: _Optional[bool] = ..., media_types: _Optional[_Iterable[str]] = ...) -> None: ...

class BmcFirmwareTask(_message.Message):
    __slots__ = ("task_uri", "state", "percent", "messages")
    TASK_URI_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    task_uri: str
    state: str
    percent: int
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_uri: _Optional[str] = ..., state: _Optional[str] = ..., percent: _Optional[int] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class BmcOperationResult(_message.Message):
    __slots__ = ("operation", "state", "values", "power_state", "system", "nics", "sensors", "boot", "storage", "virtual_media", "firmware", "bmc_message", "attempts", "settle_seconds", "firmware_inventory", "events", "changed", "power_state_before", "not_kept", "release", "firmware_plan", "parts", "management", "devices")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    POWER_STATE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    SENSORS_FIELD_NUMBER: _ClassVar[int]
    BOOT_FIELD_NUMBER: _ClassVar[int]
    STORAGE_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_MEDIA_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    BMC_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SETTLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_INVENTORY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    POWER_STATE_BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_KEPT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_PLAN_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    MANAGEMENT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    operation: str
    state: str
    values: _containers.ScalarMap[str, str]
    power_state: str
    system: BmcSystem
    nics: _containers.RepeatedCompositeFieldContainer[BmcNic]
    sensors: _containers.RepeatedCompositeFieldContainer[BmcSensor]
    boot: BmcBootDevice
    storage: _containers.RepeatedCompositeFieldContainer[BmcStorageController]
    virtual_media: _containers.RepeatedCompositeFieldContainer[BmcVirtualMedia]
    firmware: BmcFirmwareTask
    bmc_message: str
    attempts: int
    settle_seconds: float
    firmware_inventory: _containers.RepeatedCompositeFieldContainer[BmcFirmwareComponent]
    events: _containers.RepeatedCompositeFieldContainer[BmcLogEntry]
    changed: bool
    power_state_before: str
    not_kept: _containers.RepeatedScalarFieldContainer[str]
    release: _agent_pb2.ReleaseReport
    firmware_plan: _containers.RepeatedCompositeFieldContainer[BmcFirmwareStep]
    parts: _containers.RepeatedCompositeFieldContainer[BmcPart]
    management: _containers.RepeatedCompositeFieldContainer[BmcProtocolState]
    devices: _containers.RepeatedCompositeFieldContainer[BmcDeviceEvidence]
    def __init__(self, operation: _Optional[str] = ..., state: _Optional[str] = ..., values: _Optional[_Mapping[str, str]] = ..., power_state: _Optional[str] = ..., system: _Optional[_Union[BmcSystem, _Mapping]] = ..., nics: _Optional[_Iterable[_Union[BmcNic, _Mapping]]] = ..., sensors: _Optional[_Iterable[_Union[BmcSensor, _Mapping]]] = ..., boot: _Optional[_Union[BmcBootDevice, _Mapping]] = ..., storage: _Optional[_Iterable[_Union[BmcStorageController, _Mapping]]] = ..., virtual_media: _Optional[_Iterable[_Union[BmcVirtualMedia, _Mapping]]] = ..., firmware: _Optional[_Union[BmcFirmwareTask, _Mapping]] = ..., bmc_message: _Optional[str] = ..., attempts: _Optional[int] = ..., settle_seconds: _Optional[float] = ..., firmware_inventory: _Optional[_Iterable[_Union[BmcFirmwareComponent, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[BmcLogEntry, _Mapping]]] = ..., changed: _Optional[bool] = ..., power_state_before: _Optional[str] = ..., not_kept: _Optional[_Iterable[str]] = ..., release: _Optional[_Union[_agent_pb2.ReleaseReport, _Mapping]] = ..., firmware_plan: _Optional[_Iterable[_Union[BmcFirmwareStep, _Mapping]]] = ..., parts: _Optional[_Iterable[_Union[BmcPart, _Mapping]]] = ..., management: _Optional[_Iterable[_Union[BmcProtocolState, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[BmcDeviceEvidence, _Mapping]]] = ...) -> None: ...

class BmcDeviceEvidence(_message.Message):
    __slots__ = ("device", "signed_measurements", "certificate_chain", "error", "version", "firmware", "firmware_component", "firmware_error")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_CHAIN_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_COMPONENT_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_ERROR_FIELD_NUMBER: _ClassVar[int]
    device: str
    signed_measurements: str
    certificate_chain: str
    error: str
    version: str
    firmware: str
    firmware_component: str
    firmware_error: str
    def __init__(self, device: _Optional[str] = ..., signed_measurements: _Optional[str] = ..., certificate_chain: _Optional[str] = ..., error: _Optional[str] = ..., version: _Optional[str] = ..., firmware: _Optional[str] = ..., firmware_component: _Optional[str] = ..., firmware_error: _Optional[str] = ...) -> None: ...

class BmcPart(_message.Message):
    __slots__ = ("kind", "id", "uri", "manufacturer", "model", "part_number", "serial", "firmware_version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PART_NUMBER_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: str
    id: str
    uri: str
    manufacturer: str
    model: str
    part_number: str
    serial: str
    firmware_version: str
    def __init__(self, kind: _Optional[str] = ..., id: _Optional[str] = ..., uri: _Optional[str] = ..., manufacturer: _Optional[str] = ..., model: _Optional[str] = ..., part_number: _Optional[str] = ..., serial: _Optional[str] = ..., firmware_version: _Optional[str] = ...) -> None: ...

class BmcProtocolState(_message.Message):
    __slots__ = ("protocol", "listed", "enabled", "port")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    protocol: str
    listed: bool
    enabled: bool
    port: int
    def __init__(self, protocol: _Optional[str] = ..., listed: _Optional[bool] = ..., enabled: _Optional[bool] = ..., port: _Optional[int] = ...) -> None: ...

class BmcFirmwareComponent(_message.Message):
    __slots__ = ("id", "name", "version", "updateable", "health", "software_id", "manufacturer", "uri", "related")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATEABLE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_ID_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    RELATED_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    version: str
    updateable: bool
    health: str
    software_id: str
    manufacturer: str
    uri: str
    related: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., updateable: _Optional[bool] = ..., health: _Optional[str] = ..., software_id: _Optional[str] = ..., manufacturer: _Optional[str] = ..., uri: _Optional[str] = ..., related: _Optional[_Iterable[str]] = ...) -> None: ...

class BmcFirmwareStep(_message.Message):
    __slots__ = ("match", "component_ids", "found", "expected", "sha256", "method", "apply_time", "after", "settle_seconds", "order", "state", "message")
    MATCH_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    APPLY_TIME_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SETTLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    match: str
    component_ids: _containers.RepeatedScalarFieldContainer[str]
    found: _containers.RepeatedScalarFieldContainer[str]
    expected: str
    sha256: str
    method: str
    apply_time: str
    after: str
    settle_seconds: float
    order: int
    state: str
    message: str
    def __init__(self, match: _Optional[str] = ..., component_ids: _Optional[_Iterable[str]] = ..., found: _Optional[_Iterable[str]] = ..., expected: _Optional[str] = ..., sha256: _Optional[str] = ..., method: _Optional[str] = ..., apply_time: _Optional[str] = ..., after: _Optional[str] = ..., settle_seconds: _Optional[float] = ..., order: _Optional[int] = ..., state: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class BmcLogEntry(_message.Message):
    __slots__ = ("id", "created", "created_unix", "severity", "message", "sensor", "log")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SENSOR_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    id: str
    created: str
    created_unix: int
    severity: str
    message: str
    sensor: str
    log: str
    def __init__(self, id: _Optional[str] = ..., created: _Optional[str] = ..., created_unix: _Optional[int] = ..., severity: _Optional[str] = ..., message: _Optional[str] = ..., sensor: _Optional[str] = ..., log: _Optional[str] = ...) -> None: ...

class BootCleanUpRequest(_message.Message):
    __slots__ = ("node_id", "mac_addresses", "keep_ramdisk_cache", "join_refused")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    KEEP_RAMDISK_CACHE_FIELD_NUMBER: _ClassVar[int]
    JOIN_REFUSED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    mac_addresses: _containers.RepeatedScalarFieldContainer[str]
    keep_ramdisk_cache: bool
    join_refused: str
    def __init__(self, node_id: _Optional[str] = ..., mac_addresses: _Optional[_Iterable[str]] = ..., keep_ramdisk_cache: _Optional[bool] = ..., join_refused: _Optional[str] = ...) -> None: ...

class BootCleanUpResult(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ProxyDhcpEntry(_message.Message):
    __slots__ = ("node_id", "mac_address", "boot_file", "ipxe_script_url", "kernel_url", "initrd_url", "kernel_cmdline", "ttl_seconds", "kernel_digest", "initrd_digest", "boot_method", "iso_url", "static_network", "agent_gateway", "ca_pem", "iso_digest", "media_bmc", "uki_url", "uki_digest")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BOOT_FILE_FIELD_NUMBER: _ClassVar[int]
    IPXE_SCRIPT_URL_FIELD_NUMBER: _ClassVar[int]
    KERNEL_URL_FIELD_NUMBER: _ClassVar[int]
    INITRD_URL_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CMDLINE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_DIGEST_FIELD_NUMBER: _ClassVar[int]
    INITRD_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BOOT_METHOD_FIELD_NUMBER: _ClassVar[int]
    ISO_URL_FIELD_NUMBER: _ClassVar[int]
    STATIC_NETWORK_FIELD_NUMBER: _ClassVar[int]
    AGENT_GATEWAY_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    ISO_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MEDIA_BMC_FIELD_NUMBER: _ClassVar[int]
    UKI_URL_FIELD_NUMBER: _ClassVar[int]
    UKI_DIGEST_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    mac_address: str
    boot_file: str
    ipxe_script_url: str
    kernel_url: str
    initrd_url: str
    kernel_cmdline: str
    ttl_seconds: int
    kernel_digest: _common_pb2.Digest
    initrd_digest: _common_pb2.Digest
    boot_method: str
    iso_url: str
    static_network: StaticNetwork
    agent_gateway: str
    ca_pem: str
    iso_digest: _common_pb2.Digest
    media_bmc: MediaBmc
    uki_url: str
    uki_digest: _common_pb2.Digest
    def __init__(self, node_id: _Optional[str] = ..., mac_address: _Optional[str] = ..., boot_file: _Optional[str] = ..., ipxe_script_url: _Optional[str] = ..., kernel_url: _Optional[str] = ..., initrd_url: _Optional[str] = ..., kernel_cmdline: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., kernel_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., initrd_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., boot_method: _Optional[str] = ..., iso_url: _Optional[str] = ..., static_network: _Optional[_Union[StaticNetwork, _Mapping]] = ..., agent_gateway: _Optional[str] = ..., ca_pem: _Optional[str] = ..., iso_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., media_bmc: _Optional[_Union[MediaBmc, _Mapping]] = ..., uki_url: _Optional[str] = ..., uki_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ...) -> None: ...

class MediaBmc(_message.Message):
    __slots__ = ("bmc_address", "credentials_ref", "verify_tls", "vendor")
    BMC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_REF_FIELD_NUMBER: _ClassVar[int]
    VERIFY_TLS_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    bmc_address: str
    credentials_ref: str
    verify_tls: bool
    vendor: str
    def __init__(self, bmc_address: _Optional[str] = ..., credentials_ref: _Optional[str] = ..., verify_tls: _Optional[bool] = ..., vendor: _Optional[str] = ...) -> None: ...

class StaticNetwork(_message.Message):
    __slots__ = ("address", "prefix_length", "default_route", "dns")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ROUTE_FIELD_NUMBER: _ClassVar[int]
    DNS_FIELD_NUMBER: _ClassVar[int]
    address: str
    prefix_length: int
    default_route: str
    dns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, address: _Optional[str] = ..., prefix_length: _Optional[int] = ..., default_route: _Optional[str] = ..., dns: _Optional[_Iterable[str]] = ...) -> None: ...

class ProxyDhcpResult(_message.Message):
    __slots__ = ("entry_id", "ramdisk_media_url", "config_media_url", "expires_at", "media_scheme")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    RAMDISK_MEDIA_URL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_MEDIA_URL_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    MEDIA_SCHEME_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    ramdisk_media_url: str
    config_media_url: str
    expires_at: float
    media_scheme: str
    def __init__(self, entry_id: _Optional[str] = ..., ramdisk_media_url: _Optional[str] = ..., config_media_url: _Optional[str] = ..., expires_at: _Optional[float] = ..., media_scheme: _Optional[str] = ...) -> None: ...

class HttpProxyRequest(_message.Message):
    __slots__ = ("node_id", "upstream_url", "allowed_methods", "ttl_seconds", "max_bytes", "manifest", "credentials_ref", "architecture", "registry_hosts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_URL_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_METHODS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CREDENTIALS_REF_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_HOSTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    upstream_url: str
    allowed_methods: _containers.RepeatedScalarFieldContainer[str]
    ttl_seconds: int
    max_bytes: int
    manifest: _common_pb2.FileSource
    credentials_ref: str
    architecture: str
    registry_hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., upstream_url: _Optional[str] = ..., allowed_methods: _Optional[_Iterable[str]] = ..., ttl_seconds: _Optional[int] = ..., max_bytes: _Optional[int] = ..., manifest: _Optional[_Union[_common_pb2.FileSource, _Mapping]] = ..., credentials_ref: _Optional[str] = ..., architecture: _Optional[str] = ..., registry_hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class HttpProxyResult(_message.Message):
    __slots__ = ("proxy_url", "resolved_manifest", "disk_digest", "chunk_manifest")
    PROXY_URL_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DISK_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    proxy_url: str
    resolved_manifest: str
    disk_digest: _common_pb2.Digest
    chunk_manifest: bytes
    def __init__(self, proxy_url: _Optional[str] = ..., resolved_manifest: _Optional[str] = ..., disk_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., chunk_manifest: _Optional[bytes] = ...) -> None: ...
