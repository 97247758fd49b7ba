from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BmcOperationRequest(_message.Message):
    __slots__ = ("node_id", "bmc_address", "protocol", "operation", "parameters", "credentials_ref", "verify_tls")
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
    node_id: str
    bmc_address: str
    protocol: str
    operation: str
    parameters: _containers.ScalarMap[str, str]
    credentials_ref: str
    verify_tls: bool
    def __init__(self, node_id: _Optional[str] = ..., bmc_address: _Optional[str] = ..., protocol: _Optional[str] = ..., operation: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., credentials_ref: _Optional[str] = ..., verify_tls: _Optional[bool] = ...) -> None: ...

class BmcOperationResult(_message.Message):
    __slots__ = ("operation", "state", "values")
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
    operation: str
    state: str
    values: _containers.ScalarMap[str, str]
    def __init__(self, operation: _Optional[str] = ..., state: _Optional[str] = ..., values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class BootCleanUpRequest(_message.Message):
    __slots__ = ("node_id", "mac_addresses", "keep_ramdisk_cache")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    KEEP_RAMDISK_CACHE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    mac_addresses: _containers.RepeatedScalarFieldContainer[str]
    keep_ramdisk_cache: bool
    def __init__(self, node_id: _Optional[str] = ..., mac_addresses: _Optional[_Iterable[str]] = ..., keep_ramdisk_cache: _Optional[bool] = ...) -> None: ...

class BootCleanUpResult(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ProxyDhcpEntry(_message.Message):
    __slots__ = ("node_id", "mac_address", "boot_file", "ipxe_script_url", "kernel_url", "initrd_url", "kernel_cmdline", "ttl_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MAC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BOOT_FILE_FIELD_NUMBER: _ClassVar[int]
    IPXE_SCRIPT_URL_FIELD_NUMBER: _ClassVar[int]
    KERNEL_URL_FIELD_NUMBER: _ClassVar[int]
    INITRD_URL_FIELD_NUMBER: _ClassVar[int]
    KERNEL_CMDLINE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    mac_address: str
    boot_file: str
    ipxe_script_url: str
    kernel_url: str
    initrd_url: str
    kernel_cmdline: str
    ttl_seconds: int
    def __init__(self, node_id: _Optional[str] = ..., mac_address: _Optional[str] = ..., boot_file: _Optional[str] = ..., ipxe_script_url: _Optional[str] = ..., kernel_url: _Optional[str] = ..., initrd_url: _Optional[str] = ..., kernel_cmdline: _Optional[str] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class ProxyDhcpResult(_message.Message):
    __slots__ = ("entry_id",)
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    def __init__(self, entry_id: _Optional[str] = ...) -> None: ...

class HttpProxyRequest(_message.Message):
    __slots__ = ("node_id", "upstream_url", "allowed_methods", "ttl_seconds", "max_bytes")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_URL_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_METHODS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    upstream_url: str
    allowed_methods: _containers.RepeatedScalarFieldContainer[str]
    ttl_seconds: int
    max_bytes: int
    def __init__(self, node_id: _Optional[str] = ..., upstream_url: _Optional[str] = ..., allowed_methods: _Optional[_Iterable[str]] = ..., ttl_seconds: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class HttpProxyResult(_message.Message):
    __slots__ = ("proxy_url",)
    PROXY_URL_FIELD_NUMBER: _ClassVar[int]
    proxy_url: str
    def __init__(self, proxy_url: _Optional[str] = ...) -> None: ...
