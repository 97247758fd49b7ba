from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    PASS: _ClassVar[Verdict]
    WARN: _ClassVar[Verdict]
    FAIL: _ClassVar[Verdict]
VERDICT_UNSPECIFIED: Verdict
PASS: Verdict
WARN: Verdict
FAIL: Verdict

class Digest(_message.Message):
    __slots__ = ("algorithm", "hex")
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    HEX_FIELD_NUMBER: _ClassVar[int]
    algorithm: str
    hex: str
    def __init__(self, algorithm: _Optional[str] = ..., hex: _Optional[str] = ...) -> None: ...

class DiskHints(_message.Message):
    __slots__ = ("serial", "wwn", "model", "min_size_bytes", "max_size_bytes", "by_path", "name", "vendor")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    WWN_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BY_PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    serial: str
    wwn: str
    model: str
    min_size_bytes: int
    max_size_bytes: int
    by_path: str
    name: str
    vendor: str
    def __init__(self, serial: _Optional[str] = ..., wwn: _Optional[str] = ..., model: _Optional[str] = ..., min_size_bytes: _Optional[int] = ..., max_size_bytes: _Optional[int] = ..., by_path: _Optional[str] = ..., name: _Optional[str] = ..., vendor: _Optional[str] = ...) -> None: ...

class DiskIdentity(_message.Message):
    __slots__ = ("name", "model", "serial", "wwn", "size_bytes", "transport", "by_path", "logical_block_size", "physical_block_size", "rotational", "firmware")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    WWN_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    BY_PATH_FIELD_NUMBER: _ClassVar[int]
    LOGICAL_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROTATIONAL_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    name: str
    model: str
    serial: str
    wwn: str
    size_bytes: int
    transport: str
    by_path: str
    logical_block_size: int
    physical_block_size: int
    rotational: bool
    firmware: str
    def __init__(self, name: _Optional[str] = ..., model: _Optional[str] = ..., serial: _Optional[str] = ..., wwn: _Optional[str] = ..., size_bytes: _Optional[int] = ..., transport: _Optional[str] = ..., by_path: _Optional[str] = ..., logical_block_size: _Optional[int] = ..., physical_block_size: _Optional[int] = ..., rotational: _Optional[bool] = ..., firmware: _Optional[str] = ...) -> None: ...

class Partition(_message.Message):
    __slots__ = ("number", "name", "start_bytes", "size_bytes", "type_guid", "part_uuid", "label", "fs_type", "fs_uuid", "fs_label")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TYPE_GUID_FIELD_NUMBER: _ClassVar[int]
    PART_UUID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    FS_TYPE_FIELD_NUMBER: _ClassVar[int]
    FS_UUID_FIELD_NUMBER: _ClassVar[int]
    FS_LABEL_FIELD_NUMBER: _ClassVar[int]
    number: int
    name: str
    start_bytes: int
    size_bytes: int
    type_guid: str
    part_uuid: str
    label: str
    fs_type: str
    fs_uuid: str
    fs_label: str
    def __init__(self, number: _Optional[int] = ..., name: _Optional[str] = ..., start_bytes: _Optional[int] = ..., size_bytes: _Optional[int] = ..., type_guid: _Optional[str] = ..., part_uuid: _Optional[str] = ..., label: _Optional[str] = ..., fs_type: _Optional[str] = ..., fs_uuid: _Optional[str] = ..., fs_label: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("verdict", "code", "message", "gpu_index", "subject")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    code: str
    message: str
    gpu_index: int
    subject: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., gpu_index: _Optional[int] = ..., subject: _Optional[str] = ...) -> None: ...

class FileSource(_message.Message):
    __slots__ = ("url", "partition_file", "local_path", "digest")
    URL_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FILE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PATH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    url: str
    partition_file: PartitionFile
    local_path: str
    digest: Digest
    def __init__(self, url: _Optional[str] = ..., partition_file: _Optional[_Union[PartitionFile, _Mapping]] = ..., local_path: _Optional[str] = ..., digest: _Optional[_Union[Digest, _Mapping]] = ...) -> None: ...

class PartitionFile(_message.Message):
    __slots__ = ("disk", "partition_number", "partition_label", "path")
    DISK_FIELD_NUMBER: _ClassVar[int]
    PARTITION_NUMBER_FIELD_NUMBER: _ClassVar[int]
    PARTITION_LABEL_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    disk: DiskHints
    partition_number: int
    partition_label: str
    path: str
    def __init__(self, disk: _Optional[_Union[DiskHints, _Mapping]] = ..., partition_number: _Optional[int] = ..., partition_label: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...
