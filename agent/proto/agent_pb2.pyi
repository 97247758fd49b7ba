from agent.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_FORMAT_AUTO: _ClassVar[ImageFormat]
    RAW: _ClassVar[ImageFormat]
    GZIP: _ClassVar[ImageFormat]
    XZ: _ClassVar[ImageFormat]
    BZIP2: _ClassVar[ImageFormat]
    ZSTD: _ClassVar[ImageFormat]
    QCOW2: _ClassVar[ImageFormat]

class WipeMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WIPE_METHOD_UNSPECIFIED: _ClassVar[WipeMethod]
    BEST_AVAILABLE: _ClassVar[WipeMethod]
    METADATA: _ClassVar[WipeMethod]
    DISCARD: _ClassVar[WipeMethod]
    NVME_FORMAT_USER_DATA: _ClassVar[WipeMethod]
    NVME_FORMAT_CRYPTO: _ClassVar[WipeMethod]
    NVME_SANITIZE_BLOCK: _ClassVar[WipeMethod]
    NVME_SANITIZE_CRYPTO: _ClassVar[WipeMethod]
    NVME_SANITIZE_OVERWRITE: _ClassVar[WipeMethod]
    ATA_SECURE_ERASE: _ClassVar[WipeMethod]
    ATA_SECURE_ERASE_ENHANCED: _ClassVar[WipeMethod]
    OVERWRITE_ZEROS: _ClassVar[WipeMethod]
    OVERWRITE_RANDOM: _ClassVar[WipeMethod]

class NistLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NIST_LEVEL_UNSPECIFIED: _ClassVar[NistLevel]
    CLEAR: _ClassVar[NistLevel]
    PURGE: _ClassVar[NistLevel]

class WipeVerify(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SAMPLED: _ClassVar[WipeVerify]
    FULL: _ClassVar[WipeVerify]
    NO_VERIFY: _ClassVar[WipeVerify]

class XidAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    XID_ACTION_UNSPECIFIED: _ClassVar[XidAction]
    XID_NONE: _ClassVar[XidAction]
    XID_RESET_GPU: _ClassVar[XidAction]
    XID_REBOOT: _ClassVar[XidAction]
    XID_DRAIN: _ClassVar[XidAction]
    XID_UNKNOWN: _ClassVar[XidAction]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ZSTD_COMPRESSION: _ClassVar[Compression]
    GZIP_COMPRESSION: _ClassVar[Compression]
    NO_COMPRESSION: _ClassVar[Compression]

class RebootMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRACEFUL: _ClassVar[RebootMode]
    FORCED: _ClassVar[RebootMode]

class RebootTarget(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEFAULT_TARGET: _ClassVar[RebootTarget]
    FIRMWARE_SETUP: _ClassVar[RebootTarget]
    ONE_TIME_BOOT_ENTRY: _ClassVar[RebootTarget]
IMAGE_FORMAT_AUTO: ImageFormat
RAW: ImageFormat
GZIP: ImageFormat
XZ: ImageFormat
BZIP2: ImageFormat
ZSTD: ImageFormat
QCOW2: ImageFormat
WIPE_METHOD_UNSPECIFIED: WipeMethod
BEST_AVAILABLE: WipeMethod
METADATA: WipeMethod
DISCARD: WipeMethod
NVME_FORMAT_USER_DATA: WipeMethod
NVME_FORMAT_CRYPTO: WipeMethod
NVME_SANITIZE_BLOCK: WipeMethod
NVME_SANITIZE_CRYPTO: WipeMethod
NVME_SANITIZE_OVERWRITE: WipeMethod
ATA_SECURE_ERASE: WipeMethod
ATA_SECURE_ERASE_ENHANCED: WipeMethod
OVERWRITE_ZEROS: WipeMethod
OVERWRITE_RANDOM: WipeMethod
NIST_LEVEL_UNSPECIFIED: NistLevel
CLEAR: NistLevel
PURGE: NistLevel
SAMPLED: WipeVerify
FULL: WipeVerify
NO_VERIFY: WipeVerify
XID_ACTION_UNSPECIFIED: XidAction
XID_NONE: XidAction
XID_RESET_GPU: XidAction
XID_REBOOT: XidAction
XID_DRAIN: XidAction
XID_UNKNOWN: XidAction
ZSTD_COMPRESSION: Compression
GZIP_COMPRESSION: Compression
NO_COMPRESSION: Compression
GRACEFUL: RebootMode
FORCED: RebootMode
DEFAULT_TARGET: RebootTarget
FIRMWARE_SETUP: RebootTarget
ONE_TIME_BOOT_ENTRY: RebootTarget

class KexecRequest(_message.Message):
    __slots__ = ("kernel", "initrd", "cmdline", "allow_kexec_tools")
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    INITRD_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_KEXEC_TOOLS_FIELD_NUMBER: _ClassVar[int]
    kernel: _common_pb2.FileSource
    initrd: _common_pb2.FileSource
    cmdline: str
    allow_kexec_tools: bool
    def __init__(self, kernel: _Optional[_Union[_common_pb2.FileSource, _Mapping]] = ..., initrd: _Optional[_Union[_common_pb2.FileSource, _Mapping]] = ..., cmdline: _Optional[str] = ..., allow_kexec_tools: _Optional[bool] = ...) -> None: ...

class KexecResult(_message.Message):
    __slots__ = ("old_boot_id", "new_boot_id", "method", "kernel_sha256", "initrd_sha256", "cmdline")
    OLD_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    KERNEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    INITRD_SHA256_FIELD_NUMBER: _ClassVar[int]
    CMDLINE_FIELD_NUMBER: _ClassVar[int]
    old_boot_id: str
    new_boot_id: str
    method: str
    kernel_sha256: str
    initrd_sha256: str
    cmdline: str
    def __init__(self, old_boot_id: _Optional[str] = ..., new_boot_id: _Optional[str] = ..., method: _Optional[str] = ..., kernel_sha256: _Optional[str] = ..., initrd_sha256: _Optional[str] = ..., cmdline: _Optional[str] = ...) -> None: ...

class DaemonSection(_message.Message):
    __slots__ = ("version", "url", "digest", "signature", "key_id", "rejoin_timeout_seconds")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    REJOIN_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    url: str
    digest: _common_pb2.Digest
    signature: bytes
    key_id: str
    rejoin_timeout_seconds: int
    def __init__(self, version: _Optional[str] = ..., url: _Optional[str] = ..., digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., signature: _Optional[bytes] = ..., key_id: _Optional[str] = ..., rejoin_timeout_seconds: _Optional[int] = ...) -> None: ...

class DaemonUpgradeResult(_message.Message):
    __slots__ = ("old_version", "new_version", "old_sha256", "new_sha256", "rolled_back", "rollback_reason")
    OLD_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    OLD_SHA256_FIELD_NUMBER: _ClassVar[int]
    NEW_SHA256_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_REASON_FIELD_NUMBER: _ClassVar[int]
    old_version: str
    new_version: str
    old_sha256: str
    new_sha256: str
    rolled_back: bool
    rollback_reason: str
    def __init__(self, old_version: _Optional[str] = ..., new_version: _Optional[str] = ..., old_sha256: _Optional[str] = ..., new_sha256: _Optional[str] = ..., rolled_back: _Optional[bool] = ..., rollback_reason: _Optional[str] = ...) -> None: ...

class DeployImageRequest(_message.Message):
    __slots__ = ("url", "local_path", "format", "digest", "target", "verify_readback", "disable_zero_skip", "ca_bundle_pem", "http_headers", "max_retries", "manifest", "manifest_inline", "gate", "registry_hosts", "allow_plain_http_redirect")
    class HttpHeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PATH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERIFY_READBACK_FIELD_NUMBER: _ClassVar[int]
    DISABLE_ZERO_SKIP_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    HTTP_HEADERS_FIELD_NUMBER: _ClassVar[int]
    MAX_RETRIES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_INLINE_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    REGISTRY_HOSTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_PLAIN_HTTP_REDIRECT_FIELD_NUMBER: _ClassVar[int]
    url: str
    local_path: str
    format: ImageFormat
    digest: _common_pb2.Digest
    target: _common_pb2.DiskHints
    verify_readback: bool
    disable_zero_skip: bool
    ca_bundle_pem: str
    http_headers: _containers.ScalarMap[str, str]
    max_retries: int
    manifest: _common_pb2.FileSource
    manifest_inline: bytes
    gate: ExpectedBuild
    registry_hosts: _containers.RepeatedScalarFieldContainer[str]
    allow_plain_http_redirect: bool
    def __init__(self, url: _Optional[str] = ..., local_path: _Optional[str] = ..., format: _Optional[_Union[ImageFormat, str]] = ..., digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., target: _Optional[_Union[_common_pb2.DiskHints, _Mapping]] = ..., verify_readback: _Optional[bool] = ..., disable_zero_skip: _Optional[bool] = ..., ca_bundle_pem: _Optional[str] = ..., http_headers: _Optional[_Mapping[str, str]] = ..., max_retries: _Optional[int] = ..., manifest: _Optional[_Union[_common_pb2.FileSource, _Mapping]] = ..., manifest_inline: _Optional[bytes] = ..., gate: _Optional[_Union[ExpectedBuild, _Mapping]] = ..., registry_hosts: _Optional[_Iterable[str]] = ..., allow_plain_http_redirect: _Optional[bool] = ...) -> None: ...

class ImageManifest(_message.Message):
    __slots__ = ("version", "image_size", "chunk_size", "algorithm", "chunk_count", "digests", "published", "published_size", "published_format")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_SIZE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FORMAT_FIELD_NUMBER: _ClassVar[int]
    version: int
    image_size: int
    chunk_size: int
    algorithm: str
    chunk_count: int
    digests: bytes
    published: _common_pb2.Digest
    published_size: int
    published_format: ImageFormat
    def __init__(self, version: _Optional[int] = ..., image_size: _Optional[int] = ..., chunk_size: _Optional[int] = ..., algorithm: _Optional[str] = ..., chunk_count: _Optional[int] = ..., digests: _Optional[bytes] = ..., published: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., published_size: _Optional[int] = ..., published_format: _Optional[_Union[ImageFormat, str]] = ...) -> None: ...

class DeployImageResult(_message.Message):
    __slots__ = ("disk", "format", "source_bytes", "image_bytes", "bytes_written", "bytes_skipped", "digest", "readback_verified", "discarded", "direct_io", "partitions", "seconds", "throughput_bytes_per_second", "resumes", "verification", "chunks_verified", "zero_chunks", "resolved_manifest")
    DISK_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_BYTES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    READBACK_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    DIRECT_IO_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    ZERO_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_MANIFEST_FIELD_NUMBER: _ClassVar[int]
    disk: _common_pb2.DiskIdentity
    format: ImageFormat
    source_bytes: int
    image_bytes: int
    bytes_written: int
    bytes_skipped: int
    digest: _common_pb2.Digest
    readback_verified: bool
    discarded: bool
    direct_io: bool
    partitions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Partition]
    seconds: float
    throughput_bytes_per_second: float
    resumes: int
    verification: str
    chunks_verified: int
    zero_chunks: int
    resolved_manifest: str
    def __init__(self, disk: _Optional[_Union[_common_pb2.DiskIdentity, _Mapping]] = ..., format: _Optional[_Union[ImageFormat, str]] = ..., source_bytes: _Optional[int] = ..., image_bytes: _Optional[int] = ..., bytes_written: _Optional[int] = ..., bytes_skipped: _Optional[int] = ..., digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., readback_verified: _Optional[bool] = ..., discarded: _Optional[bool] = ..., direct_io: _Optional[bool] = ..., partitions: _Optional[_Iterable[_Union[_common_pb2.Partition, _Mapping]]] = ..., seconds: _Optional[float] = ..., throughput_bytes_per_second: _Optional[float] = ..., resumes: _Optional[int] = ..., verification: _Optional[str] = ..., chunks_verified: _Optional[int] = ..., zero_chunks: _Optional[int] = ..., resolved_manifest: _Optional[str] = ...) -> None: ...

class WipeRequest(_message.Message):
    __slots__ = ("disks", "method", "passes", "verify", "minimum_level", "samples")
    DISKS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    disks: _containers.RepeatedCompositeFieldContainer[_common_pb2.DiskHints]
    method: WipeMethod
    passes: int
    verify: WipeVerify
    minimum_level: NistLevel
    samples: int
    def __init__(self, disks: _Optional[_Iterable[_Union[_common_pb2.DiskHints, _Mapping]]] = ..., method: _Optional[_Union[WipeMethod, str]] = ..., passes: _Optional[int] = ..., verify: _Optional[_Union[WipeVerify, str]] = ..., minimum_level: _Optional[_Union[NistLevel, str]] = ..., samples: _Optional[int] = ...) -> None: ...

class ErasureCertificate(_message.Message):
    __slots__ = ("node_id", "disk", "method", "level", "passes", "started_at_unix_ms", "finished_at_unix_ms", "verification", "verified", "verification_detail", "bytes_verified", "tool", "error")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_DETAIL_FIELD_NUMBER: _ClassVar[int]
    BYTES_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    disk: _common_pb2.DiskIdentity
    method: WipeMethod
    level: NistLevel
    passes: int
    started_at_unix_ms: int
    finished_at_unix_ms: int
    verification: WipeVerify
    verified: bool
    verification_detail: str
    bytes_verified: int
    tool: str
    error: str
    def __init__(self, node_id: _Optional[str] = ..., disk: _Optional[_Union[_common_pb2.DiskIdentity, _Mapping]] = ..., method: _Optional[_Union[WipeMethod, str]] = ..., level: _Optional[_Union[NistLevel, str]] = ..., passes: _Optional[int] = ..., started_at_unix_ms: _Optional[int] = ..., finished_at_unix_ms: _Optional[int] = ..., verification: _Optional[_Union[WipeVerify, str]] = ..., verified: _Optional[bool] = ..., verification_detail: _Optional[str] = ..., bytes_verified: _Optional[int] = ..., tool: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class WipeResult(_message.Message):
    __slots__ = ("certificates",)
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    certificates: _containers.RepeatedCompositeFieldContainer[ErasureCertificate]
    def __init__(self, certificates: _Optional[_Iterable[_Union[ErasureCertificate, _Mapping]]] = ...) -> None: ...

class GpuThresholds(_message.Message):
    __slots__ = ("expected_gpu_count", "expected_model", "max_temperature_c", "min_pcie_width", "min_pcie_generation", "max_ecc_corrected_volatile", "max_ecc_uncorrected_volatile", "max_retired_pages", "require_persistence_mode", "allow_compute_processes", "treat_warn_as_fail")
    EXPECTED_GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    MIN_PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MIN_PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    MAX_ECC_CORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    MAX_ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    MAX_RETIRED_PAGES_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_PERSISTENCE_MODE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_COMPUTE_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    TREAT_WARN_AS_FAIL_FIELD_NUMBER: _ClassVar[int]
    expected_gpu_count: int
    expected_model: str
    max_temperature_c: int
    min_pcie_width: int
    min_pcie_generation: int
    max_ecc_corrected_volatile: int
    max_ecc_uncorrected_volatile: int
    max_retired_pages: int
    require_persistence_mode: bool
    allow_compute_processes: bool
    treat_warn_as_fail: bool
    def __init__(self, expected_gpu_count: _Optional[int] = ..., expected_model: _Optional[str] = ..., max_temperature_c: _Optional[int] = ..., min_pcie_width: _Optional[int] = ..., min_pcie_generation: _Optional[int] = ..., max_ecc_corrected_volatile: _Optional[int] = ..., max_ecc_uncorrected_volatile: _Optional[int] = ..., max_retired_pages: _Optional[int] = ..., require_persistence_mode: _Optional[bool] = ..., allow_compute_processes: _Optional[bool] = ..., treat_warn_as_fail: _Optional[bool] = ...) -> None: ...

class DiagNvmlRequest(_message.Message):
    __slots__ = ("thresholds", "gpus")
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    thresholds: GpuThresholds
    gpus: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, thresholds: _Optional[_Union[GpuThresholds, _Mapping]] = ..., gpus: _Optional[_Iterable[str]] = ...) -> None: ...

class ClockEventReason(_message.Message):
    __slots__ = ("name", "severe")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEVERE_FIELD_NUMBER: _ClassVar[int]
    name: str
    severe: bool
    def __init__(self, name: _Optional[str] = ..., severe: _Optional[bool] = ...) -> None: ...

class NvLink(_message.Message):
    __slots__ = ("link", "active")
    LINK_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    link: int
    active: bool
    def __init__(self, link: _Optional[int] = ..., active: _Optional[bool] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory_bytes", "name")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory_bytes: int
    name: str
    def __init__(self, pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class GpuHealth(_message.Message):
    __slots__ = ("index", "uuid", "serial", "name", "pci_bus_id", "vbios_version", "memory_total_bytes", "memory_used_bytes", "temperature_c", "temperature_slowdown_c", "temperature_shutdown_c", "power_draw_mw", "power_limit_mw", "clock_sm_mhz", "clock_mem_mhz", "clock_event_reasons", "pcie_generation", "pcie_generation_max", "pcie_width", "pcie_width_max", "ecc_enabled", "ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate", "ecc_uncorrected_aggregate", "retired_pages_single_bit", "retired_pages_double_bit", "retired_pages_pending", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure", "nvlinks", "persistence_mode", "processes", "verdict", "findings", "lost", "unavailable")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_SLOWDOWN_C_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_SHUTDOWN_C_FIELD_NUMBER: _ClassVar[int]
    POWER_DRAW_MW_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_MW_FIELD_NUMBER: _ClassVar[int]
    CLOCK_SM_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MEM_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    ECC_ENABLED_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SINGLE_BIT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DOUBLE_BIT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_FAILURE_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENCE_MODE_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    serial: str
    name: str
    pci_bus_id: str
    vbios_version: str
    memory_total_bytes: int
    memory_used_bytes: int
    temperature_c: int
    temperature_slowdown_c: int
    temperature_shutdown_c: int
    power_draw_mw: int
    power_limit_mw: int
    clock_sm_mhz: int
    clock_mem_mhz: int
    clock_event_reasons: _containers.RepeatedCompositeFieldContainer[ClockEventReason]
    pcie_generation: int
    pcie_generation_max: int
    pcie_width: int
    pcie_width_max: int
    ecc_enabled: bool
    ecc_corrected_volatile: int
    ecc_uncorrected_volatile: int
    ecc_corrected_aggregate: int
    ecc_uncorrected_aggregate: int
    retired_pages_single_bit: int
    retired_pages_double_bit: int
    retired_pages_pending: bool
    remapped_rows_correctable: int
    remapped_rows_uncorrectable: int
    remapped_rows_pending: bool
    remapped_rows_failure: bool
    nvlinks: _containers.RepeatedCompositeFieldContainer[NvLink]
    persistence_mode: bool
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    verdict: _common_pb2.Verdict
    findings: _containers.RepeatedCompositeFieldContainer[_common_pb2.Finding]
    lost: bool
    unavailable: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., serial: _Optional[str] = ..., name: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., vbios_version: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., temperature_c: _Optional[int] = ..., temperature_slowdown_c: _Optional[int] = ..., temperature_shutdown_c: _Optional[int] = ..., power_draw_mw: _Optional[int] = ..., power_limit_mw: _Optional[int] = ..., clock_sm_mhz: _Optional[int] = ..., clock_mem_mhz: _Optional[int] = ..., clock_event_reasons: _Optional[_Iterable[_Union[ClockEventReason, _Mapping]]] = ..., pcie_generation: _Optional[int] = ..., pcie_generation_max: _Optional[int] = ..., pcie_width: _Optional[int] = ..., pcie_width_max: _Optional[int] = ..., ecc_enabled: _Optional[bool] = ..., ecc_corrected_volatile: _Optional[int] = ..., ecc_uncorrected_volatile: _Optional[int] = ..., ecc_corrected_aggregate: _Optional[int] = ..., ecc_uncorrected_aggregate: _Optional[int] = ..., retired_pages_single_bit: _Optional[int] = ..., retired_pages_double_bit: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., remapped_rows_correctable: _Optional[int] = ..., remapped_rows_uncorrectable: _Optional[int] = ..., remapped_rows_pending: _Optional[bool] = ..., remapped_rows_failure: _Optional[bool] = ..., nvlinks: _Optional[_Iterable[_Union[NvLink, _Mapping]]] = ..., persistence_mode: _Optional[bool] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., verdict: _Optional[_Union[_common_pb2.Verdict, str]] = ..., findings: _Optional[_Iterable[_Union[_common_pb2.Finding, _Mapping]]] = ..., lost: _Optional[bool] = ..., unavailable: _Optional[_Iterable[str]] = ...) -> None: ...

class DiagNvmlResult(_message.Message):
    __slots__ = ("driver_present", "driver_version", "cuda_driver_version", "nvml_version", "gpus", "verdict", "findings", "message", "xid_events", "kernel_log_read")
    DRIVER_PRESENT_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    NVML_VERSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_LOG_READ_FIELD_NUMBER: _ClassVar[int]
    driver_present: bool
    driver_version: str
    cuda_driver_version: str
    nvml_version: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuHealth]
    verdict: _common_pb2.Verdict
    findings: _containers.RepeatedCompositeFieldContainer[_common_pb2.Finding]
    message: str
    xid_events: _containers.RepeatedCompositeFieldContainer[XidEvent]
    kernel_log_read: bool
    def __init__(self, driver_present: _Optional[bool] = ..., driver_version: _Optional[str] = ..., cuda_driver_version: _Optional[str] = ..., nvml_version: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuHealth, _Mapping]]] = ..., verdict: _Optional[_Union[_common_pb2.Verdict, str]] = ..., findings: _Optional[_Iterable[_Union[_common_pb2.Finding, _Mapping]]] = ..., message: _Optional[str] = ..., xid_events: _Optional[_Iterable[_Union[XidEvent, _Mapping]]] = ..., kernel_log_read: _Optional[bool] = ...) -> None: ...

class XidEvent(_message.Message):
    __slots__ = ("xid", "pci_address", "seconds_since_boot", "message", "action", "bucket", "name")
    XID_FIELD_NUMBER: _ClassVar[int]
    PCI_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_BOOT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    xid: int
    pci_address: str
    seconds_since_boot: float
    message: str
    action: XidAction
    bucket: str
    name: str
    def __init__(self, xid: _Optional[int] = ..., pci_address: _Optional[str] = ..., seconds_since_boot: _Optional[float] = ..., message: _Optional[str] = ..., action: _Optional[_Union[XidAction, str]] = ..., bucket: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DiagDcgmRequest(_message.Message):
    __slots__ = ("level", "gpus", "parameters", "thresholds")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    level: int
    gpus: _containers.RepeatedScalarFieldContainer[str]
    parameters: _containers.ScalarMap[str, str]
    thresholds: GpuThresholds
    def __init__(self, level: _Optional[int] = ..., gpus: _Optional[_Iterable[str]] = ..., parameters: _Optional[_Mapping[str, str]] = ..., thresholds: _Optional[_Union[GpuThresholds, _Mapping]] = ...) -> None: ...

class DcgmTestResult(_message.Message):
    __slots__ = ("name", "category", "gpu_index", "status", "info", "warnings", "error_codes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CATEGORY_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODES_FIELD_NUMBER: _ClassVar[int]
    name: str
    category: str
    gpu_index: int
    status: str
    info: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    error_codes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., category: _Optional[str] = ..., gpu_index: _Optional[int] = ..., status: _Optional[str] = ..., info: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., error_codes: _Optional[_Iterable[str]] = ...) -> None: ...

class DiagDcgmResult(_message.Message):
    __slots__ = ("dcgm_version", "level", "tests", "verdict", "findings", "raw_json", "exit_code", "json_format", "gpus", "hostengine_started")
    DCGM_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    RAW_JSON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    JSON_FORMAT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    HOSTENGINE_STARTED_FIELD_NUMBER: _ClassVar[int]
    dcgm_version: str
    level: int
    tests: _containers.RepeatedCompositeFieldContainer[DcgmTestResult]
    verdict: _common_pb2.Verdict
    findings: _containers.RepeatedCompositeFieldContainer[_common_pb2.Finding]
    raw_json: str
    exit_code: int
    json_format: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    hostengine_started: bool
    def __init__(self, dcgm_version: _Optional[str] = ..., level: _Optional[int] = ..., tests: _Optional[_Iterable[_Union[DcgmTestResult, _Mapping]]] = ..., verdict: _Optional[_Union[_common_pb2.Verdict, str]] = ..., findings: _Optional[_Iterable[_Union[_common_pb2.Finding, _Mapping]]] = ..., raw_json: _Optional[str] = ..., exit_code: _Optional[int] = ..., json_format: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., hostengine_started: _Optional[bool] = ...) -> None: ...

class GpuResetRequest(_message.Message):
    __slots__ = ("gpu", "stop_processes", "thresholds")
    GPU_FIELD_NUMBER: _ClassVar[int]
    STOP_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    gpu: str
    stop_processes: bool
    thresholds: GpuThresholds
    def __init__(self, gpu: _Optional[str] = ..., stop_processes: _Optional[bool] = ..., thresholds: _Optional[_Union[GpuThresholds, _Mapping]] = ...) -> None: ...

class GpuResetResult(_message.Message):
    __slots__ = ("method", "stopped_processes", "health", "index", "uuid", "output")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    STOPPED_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    method: str
    stopped_processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    health: GpuHealth
    index: int
    uuid: str
    output: str
    def __init__(self, method: _Optional[str] = ..., stopped_processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., health: _Optional[_Union[GpuHealth, _Mapping]] = ..., index: _Optional[int] = ..., uuid: _Optional[str] = ..., output: _Optional[str] = ...) -> None: ...

class DriverArgument(_message.Message):
    __slots__ = ("string_value", "int_value", "bool_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    int_value: int
    bool_value: bool
    def __init__(self, string_value: _Optional[str] = ..., int_value: _Optional[int] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class DriverInvokeRequest(_message.Message):
    __slots__ = ("driver", "operation", "arguments")
    class ArgumentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DriverArgument
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DriverArgument, _Mapping]] = ...) -> None: ...
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    driver: str
    operation: str
    arguments: _containers.MessageMap[str, DriverArgument]
    def __init__(self, driver: _Optional[str] = ..., operation: _Optional[str] = ..., arguments: _Optional[_Mapping[str, DriverArgument]] = ...) -> None: ...

class DriverInvokeResult(_message.Message):
    __slots__ = ("driver", "operation", "argv", "exit_code", "stdout", "stderr", "truncated", "seconds")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    driver: str
    operation: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    exit_code: int
    stdout: bytes
    stderr: bytes
    truncated: bool
    seconds: float
    def __init__(self, driver: _Optional[str] = ..., operation: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., exit_code: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., truncated: _Optional[bool] = ..., seconds: _Optional[float] = ...) -> None: ...

class InstanceSnapshotRequest(_message.Message):
    __slots__ = ("source_path", "upload_url", "compression", "quiesce_mountpoint", "bandwidth_limit_bytes_per_second", "http_headers", "ca_bundle_pem")
    class HttpHeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_PATH_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_URL_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    QUIESCE_MOUNTPOINT_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_LIMIT_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    HTTP_HEADERS_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    source_path: str
    upload_url: str
    compression: Compression
    quiesce_mountpoint: str
    bandwidth_limit_bytes_per_second: int
    http_headers: _containers.ScalarMap[str, str]
    ca_bundle_pem: str
    def __init__(self, source_path: _Optional[str] = ..., upload_url: _Optional[str] = ..., compression: _Optional[_Union[Compression, str]] = ..., quiesce_mountpoint: _Optional[str] = ..., bandwidth_limit_bytes_per_second: _Optional[int] = ..., http_headers: _Optional[_Mapping[str, str]] = ..., ca_bundle_pem: _Optional[str] = ...) -> None: ...

class InstanceSnapshotResult(_message.Message):
    __slots__ = ("source_bytes", "uploaded_bytes", "source_digest", "uploaded_digest", "compression", "quiesced", "seconds")
    SOURCE_BYTES_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_DIGEST_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    QUIESCED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    source_bytes: int
    uploaded_bytes: int
    source_digest: _common_pb2.Digest
    uploaded_digest: _common_pb2.Digest
    compression: Compression
    quiesced: bool
    seconds: float
    def __init__(self, source_bytes: _Optional[int] = ..., uploaded_bytes: _Optional[int] = ..., source_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., uploaded_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., compression: _Optional[_Union[Compression, str]] = ..., quiesced: _Optional[bool] = ..., seconds: _Optional[float] = ...) -> None: ...

class InventoryRefreshRequest(_message.Message):
    __slots__ = ("include_lldp", "skip_gpus", "expect")
    INCLUDE_LLDP_FIELD_NUMBER: _ClassVar[int]
    SKIP_GPUS_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    include_lldp: bool
    skip_gpus: bool
    expect: ExpectedBuild
    def __init__(self, include_lldp: _Optional[bool] = ..., skip_gpus: _Optional[bool] = ..., expect: _Optional[_Union[ExpectedBuild, _Mapping]] = ...) -> None: ...

class ExpectedBuild(_message.Message):
    __slots__ = ("cpu_model", "cpu_sockets", "cpu_threads", "memory_bytes", "memory_tolerance_percent", "gpus", "nics", "nvme", "full_link_classes", "slots", "state")
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_SOCKETS_FIELD_NUMBER: _ClassVar[int]
    CPU_THREADS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOLERANCE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    NVME_FIELD_NUMBER: _ClassVar[int]
    FULL_LINK_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    cpu_model: str
    cpu_sockets: int
    cpu_threads: int
    memory_bytes: int
    memory_tolerance_percent: int
    gpus: ExpectedGpus
    nics: ExpectedNics
    nvme: ExpectedNvme
    full_link_classes: _containers.RepeatedScalarFieldContainer[str]
    slots: _containers.RepeatedCompositeFieldContainer[ExpectedSlot]
    state: ExpectedState
    def __init__(self, cpu_model: _Optional[str] = ..., cpu_sockets: _Optional[int] = ..., cpu_threads: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_tolerance_percent: _Optional[int] = ..., gpus: _Optional[_Union[ExpectedGpus, _Mapping]] = ..., nics: _Optional[_Union[ExpectedNics, _Mapping]] = ..., nvme: _Optional[_Union[ExpectedNvme, _Mapping]] = ..., full_link_classes: _Optional[_Iterable[str]] = ..., slots: _Optional[_Iterable[_Union[ExpectedSlot, _Mapping]]] = ..., state: _Optional[_Union[ExpectedState, _Mapping]] = ...) -> None: ...

class ExpectedState(_message.Message):
    __slots__ = ("uefi", "gpus", "nics", "nvme", "tpm", "bios", "bmc_accounts", "wipes", "firmware", "golden")
    UEFI_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    NVME_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    BIOS_FIELD_NUMBER: _ClassVar[int]
    BMC_ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    WIPES_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    GOLDEN_FIELD_NUMBER: _ClassVar[int]
    uefi: ExpectedUefi
    gpus: ExpectedGpuState
    nics: _containers.RepeatedCompositeFieldContainer[NicProfile]
    nvme: ExpectedNvmeLayout
    tpm: ExpectedTpm
    bios: ExpectedBios
    bmc_accounts: ExpectedBmcAccounts
    wipes: ExpectedWipes
    firmware: ExpectedFirmware
    golden: GoldenState
    def __init__(self, uefi: _Optional[_Union[ExpectedUefi, _Mapping]] = ..., gpus: _Optional[_Union[ExpectedGpuState, _Mapping]] = ..., nics: _Optional[_Iterable[_Union[NicProfile, _Mapping]]] = ..., nvme: _Optional[_Union[ExpectedNvmeLayout, _Mapping]] = ..., tpm: _Optional[_Union[ExpectedTpm, _Mapping]] = ..., bios: _Optional[_Union[ExpectedBios, _Mapping]] = ..., bmc_accounts: _Optional[_Union[ExpectedBmcAccounts, _Mapping]] = ..., wipes: _Optional[_Union[ExpectedWipes, _Mapping]] = ..., firmware: _Optional[_Union[ExpectedFirmware, _Mapping]] = ..., golden: _Optional[_Union[GoldenState, _Mapping]] = ...) -> None: ...

class GoldenState(_message.Message):
    __slots__ = ("profile", "capture", "rules")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    profile: str
    capture: bytes
    rules: bytes
    def __init__(self, profile: _Optional[str] = ..., capture: _Optional[bytes] = ..., rules: _Optional[bytes] = ...) -> None: ...

class SourceCount(_message.Message):
    __slots__ = ("source", "compared", "varied", "unreadable")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COMPARED_FIELD_NUMBER: _ClassVar[int]
    VARIED_FIELD_NUMBER: _ClassVar[int]
    UNREADABLE_FIELD_NUMBER: _ClassVar[int]
    source: str
    compared: int
    varied: int
    unreadable: str
    def __init__(self, source: _Optional[str] = ..., compared: _Optional[int] = ..., varied: _Optional[int] = ..., unreadable: _Optional[str] = ...) -> None: ...

class ExpectedFirmware(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: str
    def __init__(self, profile: _Optional[str] = ...) -> None: ...

class ExpectedUefi(_message.Message):
    __slots__ = ("boot_entries", "boot_order", "secure_boot", "setup_mode", "pk_sha256", "kek_sha256", "db_sha256", "dbx_sha256", "memory_overwrite_request_control")
    BOOT_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BOOT_ORDER_FIELD_NUMBER: _ClassVar[int]
    SECURE_BOOT_FIELD_NUMBER: _ClassVar[int]
    SETUP_MODE_FIELD_NUMBER: _ClassVar[int]
    PK_SHA256_FIELD_NUMBER: _ClassVar[int]
    KEK_SHA256_FIELD_NUMBER: _ClassVar[int]
    DB_SHA256_FIELD_NUMBER: _ClassVar[int]
    DBX_SHA256_FIELD_NUMBER: _ClassVar[int]
    MEMORY_OVERWRITE_REQUEST_CONTROL_FIELD_NUMBER: _ClassVar[int]
    boot_entries: _containers.RepeatedCompositeFieldContainer[UefiBootEntry]
    boot_order: _containers.RepeatedScalarFieldContainer[int]
    secure_boot: bool
    setup_mode: bool
    pk_sha256: str
    kek_sha256: str
    db_sha256: str
    dbx_sha256: str
    memory_overwrite_request_control: int
    def __init__(self, boot_entries: _Optional[_Iterable[_Union[UefiBootEntry, _Mapping]]] = ..., boot_order: _Optional[_Iterable[int]] = ..., secure_boot: _Optional[bool] = ..., setup_mode: _Optional[bool] = ..., pk_sha256: _Optional[str] = ..., kek_sha256: _Optional[str] = ..., db_sha256: _Optional[str] = ..., dbx_sha256: _Optional[str] = ..., memory_overwrite_request_control: _Optional[int] = ...) -> None: ...

class UefiBootEntry(_message.Message):
    __slots__ = ("number", "sha256", "description")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    number: int
    sha256: str
    description: str
    def __init__(self, number: _Optional[int] = ..., sha256: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ExpectedGpuState(_message.Message):
    __slots__ = ("at_defaults", "persistence_mode")
    AT_DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    PERSISTENCE_MODE_FIELD_NUMBER: _ClassVar[int]
    at_defaults: bool
    persistence_mode: bool
    def __init__(self, at_defaults: _Optional[bool] = ..., persistence_mode: _Optional[bool] = ...) -> None: ...

class NicProfile(_message.Message):
    __slots__ = ("match", "config", "firmware_version")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MATCH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    match: str
    config: _containers.ScalarMap[str, str]
    firmware_version: str
    def __init__(self, match: _Optional[str] = ..., config: _Optional[_Mapping[str, str]] = ..., firmware_version: _Optional[str] = ...) -> None: ...

class ExpectedNvmeLayout(_message.Message):
    __slots__ = ("namespaces", "full_capacity", "lba_data_size")
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    FULL_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LBA_DATA_SIZE_FIELD_NUMBER: _ClassVar[int]
    namespaces: int
    full_capacity: bool
    lba_data_size: int
    def __init__(self, namespaces: _Optional[int] = ..., full_capacity: _Optional[bool] = ..., lba_data_size: _Optional[int] = ...) -> None: ...

class ExpectedTpm(_message.Message):
    __slots__ = ("persistent_handles", "nv_indices")
    PERSISTENT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    NV_INDICES_FIELD_NUMBER: _ClassVar[int]
    persistent_handles: _containers.RepeatedScalarFieldContainer[int]
    nv_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, persistent_handles: _Optional[_Iterable[int]] = ..., nv_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class ExpectedBios(_message.Message):
    __slots__ = ("attributes",)
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ExpectedBmcAccounts(_message.Message):
    __slots__ = ("accounts",)
    ACCOUNTS_FIELD_NUMBER: _ClassVar[int]
    accounts: _containers.RepeatedCompositeFieldContainer[BmcAccount]
    def __init__(self, accounts: _Optional[_Iterable[_Union[BmcAccount, _Mapping]]] = ...) -> None: ...

class BmcAccount(_message.Message):
    __slots__ = ("user_name", "role", "disabled")
    USER_NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    user_name: str
    role: str
    disabled: bool
    def __init__(self, user_name: _Optional[str] = ..., role: _Optional[str] = ..., disabled: _Optional[bool] = ...) -> None: ...

class ExpectedWipes(_message.Message):
    __slots__ = ("disks",)
    DISKS_FIELD_NUMBER: _ClassVar[int]
    disks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, disks: _Optional[_Iterable[str]] = ...) -> None: ...

class ExpectedSlot(_message.Message):
    __slots__ = ("class_code", "min_speed_gts", "min_width")
    CLASS_CODE_FIELD_NUMBER: _ClassVar[int]
    MIN_SPEED_GTS_FIELD_NUMBER: _ClassVar[int]
    MIN_WIDTH_FIELD_NUMBER: _ClassVar[int]
    class_code: str
    min_speed_gts: float
    min_width: int
    def __init__(self, class_code: _Optional[str] = ..., min_speed_gts: _Optional[float] = ..., min_width: _Optional[int] = ...) -> None: ...

class ExpectedGpus(_message.Message):
    __slots__ = ("count", "model", "min_memory_bytes", "min_vbios", "nvlinks_up")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_VBIOS_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_UP_FIELD_NUMBER: _ClassVar[int]
    count: int
    model: str
    min_memory_bytes: int
    min_vbios: str
    nvlinks_up: int
    def __init__(self, count: _Optional[int] = ..., model: _Optional[str] = ..., min_memory_bytes: _Optional[int] = ..., min_vbios: _Optional[str] = ..., nvlinks_up: _Optional[int] = ...) -> None: ...

class ExpectedNics(_message.Message):
    __slots__ = ("count", "model", "min_firmware", "speed_mbps")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    count: int
    model: str
    min_firmware: str
    speed_mbps: int
    def __init__(self, count: _Optional[int] = ..., model: _Optional[str] = ..., min_firmware: _Optional[str] = ..., speed_mbps: _Optional[int] = ...) -> None: ...

class ExpectedNvme(_message.Message):
    __slots__ = ("count", "model", "min_capacity_bytes", "min_firmware")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MIN_FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    count: int
    model: str
    min_capacity_bytes: int
    min_firmware: str
    def __init__(self, count: _Optional[int] = ..., model: _Optional[str] = ..., min_capacity_bytes: _Optional[int] = ..., min_firmware: _Optional[str] = ...) -> None: ...

class Mismatch(_message.Message):
    __slots__ = ("check", "expected", "found", "where", "message", "remedy", "bmc_remedy")
    CHECK_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REMEDY_FIELD_NUMBER: _ClassVar[int]
    BMC_REMEDY_FIELD_NUMBER: _ClassVar[int]
    check: str
    expected: str
    found: str
    where: str
    message: str
    remedy: DriverInvokeRequest
    bmc_remedy: BmcRemedy
    def __init__(self, check: _Optional[str] = ..., expected: _Optional[str] = ..., found: _Optional[str] = ..., where: _Optional[str] = ..., message: _Optional[str] = ..., remedy: _Optional[_Union[DriverInvokeRequest, _Mapping]] = ..., bmc_remedy: _Optional[_Union[BmcRemedy, _Mapping]] = ...) -> None: ...

class BmcRemedy(_message.Message):
    __slots__ = ("kind", "operation", "parameters")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    operation: str
    parameters: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., operation: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Conformance(_message.Message):
    __slots__ = ("passed", "mismatches")
    PASSED_FIELD_NUMBER: _ClassVar[int]
    MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    passed: bool
    mismatches: _containers.RepeatedCompositeFieldContainer[Mismatch]
    def __init__(self, passed: _Optional[bool] = ..., mismatches: _Optional[_Iterable[_Union[Mismatch, _Mapping]]] = ...) -> None: ...

class SystemInfo(_message.Message):
    __slots__ = ("vendor", "product", "serial", "uuid", "firmware_vendor", "firmware_version", "firmware_date", "board_vendor", "board_product", "boot_mode", "bmc_address", "kernel", "hostname")
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    PRODUCT_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VENDOR_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_DATE_FIELD_NUMBER: _ClassVar[int]
    BOARD_VENDOR_FIELD_NUMBER: _ClassVar[int]
    BOARD_PRODUCT_FIELD_NUMBER: _ClassVar[int]
    BOOT_MODE_FIELD_NUMBER: _ClassVar[int]
    BMC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    vendor: str
    product: str
    serial: str
    uuid: str
    firmware_vendor: str
    firmware_version: str
    firmware_date: str
    board_vendor: str
    board_product: str
    boot_mode: str
    bmc_address: str
    kernel: str
    hostname: str
    def __init__(self, vendor: _Optional[str] = ..., product: _Optional[str] = ..., serial: _Optional[str] = ..., uuid: _Optional[str] = ..., firmware_vendor: _Optional[str] = ..., firmware_version: _Optional[str] = ..., firmware_date: _Optional[str] = ..., board_vendor: _Optional[str] = ..., board_product: _Optional[str] = ..., boot_mode: _Optional[str] = ..., bmc_address: _Optional[str] = ..., kernel: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class CpuInfo(_message.Message):
    __slots__ = ("model", "sockets", "cores", "threads", "architecture", "flags", "max_mhz")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SOCKETS_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    MAX_MHZ_FIELD_NUMBER: _ClassVar[int]
    model: str
    sockets: int
    cores: int
    threads: int
    architecture: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    max_mhz: float
    def __init__(self, model: _Optional[str] = ..., sockets: _Optional[int] = ..., cores: _Optional[int] = ..., threads: _Optional[int] = ..., architecture: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ..., max_mhz: _Optional[float] = ...) -> None: ...

class MemoryDimm(_message.Message):
    __slots__ = ("locator", "size_bytes", "type", "speed_mts", "manufacturer", "serial")
    LOCATOR_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SPEED_MTS_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    locator: str
    size_bytes: int
    type: str
    speed_mts: int
    manufacturer: str
    serial: str
    def __init__(self, locator: _Optional[str] = ..., size_bytes: _Optional[int] = ..., type: _Optional[str] = ..., speed_mts: _Optional[int] = ..., manufacturer: _Optional[str] = ..., serial: _Optional[str] = ...) -> None: ...

class MemoryInfo(_message.Message):
    __slots__ = ("total_bytes", "dimms", "numa_nodes")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIMMS_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODES_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    dimms: _containers.RepeatedCompositeFieldContainer[MemoryDimm]
    numa_nodes: int
    def __init__(self, total_bytes: _Optional[int] = ..., dimms: _Optional[_Iterable[_Union[MemoryDimm, _Mapping]]] = ..., numa_nodes: _Optional[int] = ...) -> None: ...

class NicInfo(_message.Message):
    __slots__ = ("name", "mac", "driver", "speed_mbps", "link", "pci_address", "mtu", "lldp_chassis_id", "lldp_port_id", "lldp_system_name", "addresses", "firmware_version", "driver_version", "model")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    PCI_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MTU_FIELD_NUMBER: _ClassVar[int]
    LLDP_CHASSIS_ID_FIELD_NUMBER: _ClassVar[int]
    LLDP_PORT_ID_FIELD_NUMBER: _ClassVar[int]
    LLDP_SYSTEM_NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    mac: str
    driver: str
    speed_mbps: int
    link: bool
    pci_address: str
    mtu: int
    lldp_chassis_id: str
    lldp_port_id: str
    lldp_system_name: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    firmware_version: str
    driver_version: str
    model: str
    def __init__(self, name: _Optional[str] = ..., mac: _Optional[str] = ..., driver: _Optional[str] = ..., speed_mbps: _Optional[int] = ..., link: _Optional[bool] = ..., pci_address: _Optional[str] = ..., mtu: _Optional[int] = ..., lldp_chassis_id: _Optional[str] = ..., lldp_port_id: _Optional[str] = ..., lldp_system_name: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., firmware_version: _Optional[str] = ..., driver_version: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "pci_address", "vendor_id", "device_id", "name", "uuid", "serial", "memory_bytes", "source", "vbios_version", "pcie_generation", "pcie_generation_max", "pcie_width", "pcie_width_max", "nvlinks_up", "nvlinks")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PCI_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VENDOR_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_UP_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    index: int
    pci_address: str
    vendor_id: str
    device_id: str
    name: str
    uuid: str
    serial: str
    memory_bytes: int
    source: str
    vbios_version: str
    pcie_generation: int
    pcie_generation_max: int
    pcie_width: int
    pcie_width_max: int
    nvlinks_up: int
    nvlinks: int
    def __init__(self, index: _Optional[int] = ..., pci_address: _Optional[str] = ..., vendor_id: _Optional[str] = ..., device_id: _Optional[str] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., serial: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., source: _Optional[str] = ..., vbios_version: _Optional[str] = ..., pcie_generation: _Optional[int] = ..., pcie_generation_max: _Optional[int] = ..., pcie_width: _Optional[int] = ..., pcie_width_max: _Optional[int] = ..., nvlinks_up: _Optional[int] = ..., nvlinks: _Optional[int] = ...) -> None: ...

class AerCounts(_message.Message):
    __slots__ = ("correctable", "nonfatal", "fatal")
    CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    NONFATAL_FIELD_NUMBER: _ClassVar[int]
    FATAL_FIELD_NUMBER: _ClassVar[int]
    correctable: int
    nonfatal: int
    fatal: int
    def __init__(self, correctable: _Optional[int] = ..., nonfatal: _Optional[int] = ..., fatal: _Optional[int] = ...) -> None: ...

class PciDevice(_message.Message):
    __slots__ = ("address", "vendor_id", "device_id", "class_code", "driver", "link_speed", "link_width", "max_link_speed", "max_link_width", "upstream", "aer", "name")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VENDOR_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    CLASS_CODE_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    LINK_SPEED_FIELD_NUMBER: _ClassVar[int]
    LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_LINK_SPEED_FIELD_NUMBER: _ClassVar[int]
    MAX_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    AER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    address: str
    vendor_id: str
    device_id: str
    class_code: str
    driver: str
    link_speed: str
    link_width: int
    max_link_speed: str
    max_link_width: int
    upstream: str
    aer: AerCounts
    name: str
    def __init__(self, address: _Optional[str] = ..., vendor_id: _Optional[str] = ..., device_id: _Optional[str] = ..., class_code: _Optional[str] = ..., driver: _Optional[str] = ..., link_speed: _Optional[str] = ..., link_width: _Optional[int] = ..., max_link_speed: _Optional[str] = ..., max_link_width: _Optional[int] = ..., upstream: _Optional[str] = ..., aer: _Optional[_Union[AerCounts, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class InfinibandPort(_message.Message):
    __slots__ = ("device", "port", "state", "rate", "guid", "link_layer")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    device: str
    port: int
    state: str
    rate: str
    guid: str
    link_layer: str
    def __init__(self, device: _Optional[str] = ..., port: _Optional[int] = ..., state: _Optional[str] = ..., rate: _Optional[str] = ..., guid: _Optional[str] = ..., link_layer: _Optional[str] = ...) -> None: ...

class DiskInfo(_message.Message):
    __slots__ = ("identity", "removable", "read_only", "holder")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    REMOVABLE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    identity: _common_pb2.DiskIdentity
    removable: bool
    read_only: bool
    holder: str
    def __init__(self, identity: _Optional[_Union[_common_pb2.DiskIdentity, _Mapping]] = ..., removable: _Optional[bool] = ..., read_only: _Optional[bool] = ..., holder: _Optional[str] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("system", "cpu", "memory", "disks", "nics", "gpus", "infiniband", "pci_devices", "xid_events")
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    INFINIBAND_FIELD_NUMBER: _ClassVar[int]
    PCI_DEVICES_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    system: SystemInfo
    cpu: CpuInfo
    memory: MemoryInfo
    disks: _containers.RepeatedCompositeFieldContainer[DiskInfo]
    nics: _containers.RepeatedCompositeFieldContainer[NicInfo]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    infiniband: _containers.RepeatedCompositeFieldContainer[InfinibandPort]
    pci_devices: _containers.RepeatedCompositeFieldContainer[PciDevice]
    xid_events: _containers.RepeatedCompositeFieldContainer[XidEvent]
    def __init__(self, system: _Optional[_Union[SystemInfo, _Mapping]] = ..., cpu: _Optional[_Union[CpuInfo, _Mapping]] = ..., memory: _Optional[_Union[MemoryInfo, _Mapping]] = ..., disks: _Optional[_Iterable[_Union[DiskInfo, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[NicInfo, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., infiniband: _Optional[_Iterable[_Union[InfinibandPort, _Mapping]]] = ..., pci_devices: _Optional[_Iterable[_Union[PciDevice, _Mapping]]] = ..., xid_events: _Optional[_Iterable[_Union[XidEvent, _Mapping]]] = ...) -> None: ...

class InventoryChange(_message.Message):
    __slots__ = ("path", "old_value", "new_value")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OLD_VALUE_FIELD_NUMBER: _ClassVar[int]
    NEW_VALUE_FIELD_NUMBER: _ClassVar[int]
    path: str
    old_value: str
    new_value: str
    def __init__(self, path: _Optional[str] = ..., old_value: _Optional[str] = ..., new_value: _Optional[str] = ...) -> None: ...

class InventoryRefreshResult(_message.Message):
    __slots__ = ("inventory", "changes", "first", "seconds", "conformance", "release", "node_boots", "node_parts", "node_parts_left_out")
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONFORMANCE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    NODE_BOOTS_FIELD_NUMBER: _ClassVar[int]
    NODE_PARTS_FIELD_NUMBER: _ClassVar[int]
    NODE_PARTS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    inventory: Inventory
    changes: _containers.RepeatedCompositeFieldContainer[InventoryChange]
    first: bool
    seconds: float
    conformance: Conformance
    release: ReleaseReport
    node_boots: _containers.RepeatedCompositeFieldContainer[NodeBoot]
    node_parts: _containers.RepeatedCompositeFieldContainer[NodeParts]
    node_parts_left_out: int
    def __init__(self, inventory: _Optional[_Union[Inventory, _Mapping]] = ..., changes: _Optional[_Iterable[_Union[InventoryChange, _Mapping]]] = ..., first: _Optional[bool] = ..., seconds: _Optional[float] = ..., conformance: _Optional[_Union[Conformance, _Mapping]] = ..., release: _Optional[_Union[ReleaseReport, _Mapping]] = ..., node_boots: _Optional[_Iterable[_Union[NodeBoot, _Mapping]]] = ..., node_parts: _Optional[_Iterable[_Union[NodeParts, _Mapping]]] = ..., node_parts_left_out: _Optional[int] = ...) -> None: ...

class NodeParts(_message.Message):
    __slots__ = ("node_id", "bmc_address", "read_unix_ms", "bmc_parts")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BMC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    READ_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BMC_PARTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    bmc_address: str
    read_unix_ms: int
    bmc_parts: bytes
    def __init__(self, node_id: _Optional[str] = ..., bmc_address: _Optional[str] = ..., read_unix_ms: _Optional[int] = ..., bmc_parts: _Optional[bytes] = ...) -> None: ...

class ReleaseReport(_message.Message):
    __slots__ = ("boot_id", "pool_ready", "restorable", "cannot_restore", "checked", "not_checked", "wipe_certificates", "attestation_verdict", "tpm_absent", "checked_elsewhere", "wipe_results", "firmware", "devices", "compared")
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_READY_FIELD_NUMBER: _ClassVar[int]
    RESTORABLE_FIELD_NUMBER: _ClassVar[int]
    CANNOT_RESTORE_FIELD_NUMBER: _ClassVar[int]
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    NOT_CHECKED_FIELD_NUMBER: _ClassVar[int]
    WIPE_CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_VERDICT_FIELD_NUMBER: _ClassVar[int]
    TPM_ABSENT_FIELD_NUMBER: _ClassVar[int]
    CHECKED_ELSEWHERE_FIELD_NUMBER: _ClassVar[int]
    WIPE_RESULTS_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    COMPARED_FIELD_NUMBER: _ClassVar[int]
    boot_id: str
    pool_ready: bool
    restorable: _containers.RepeatedCompositeFieldContainer[Mismatch]
    cannot_restore: _containers.RepeatedCompositeFieldContainer[Mismatch]
    checked: _containers.RepeatedScalarFieldContainer[str]
    not_checked: _containers.RepeatedScalarFieldContainer[str]
    wipe_certificates: _containers.RepeatedCompositeFieldContainer[ErasureCertificate]
    attestation_verdict: str
    tpm_absent: str
    checked_elsewhere: _containers.RepeatedScalarFieldContainer[str]
    wipe_results: _containers.RepeatedScalarFieldContainer[bytes]
    firmware: _containers.RepeatedCompositeFieldContainer[FirmwareVersion]
    devices: _containers.RepeatedCompositeFieldContainer[DeviceAttestation]
    compared: _containers.RepeatedCompositeFieldContainer[SourceCount]
    def __init__(self, boot_id: _Optional[str] = ..., pool_ready: _Optional[bool] = ..., restorable: _Optional[_Iterable[_Union[Mismatch, _Mapping]]] = ..., cannot_restore: _Optional[_Iterable[_Union[Mismatch, _Mapping]]] = ..., checked: _Optional[_Iterable[str]] = ..., not_checked: _Optional[_Iterable[str]] = ..., wipe_certificates: _Optional[_Iterable[_Union[ErasureCertificate, _Mapping]]] = ..., attestation_verdict: _Optional[str] = ..., tpm_absent: _Optional[str] = ..., checked_elsewhere: _Optional[_Iterable[str]] = ..., wipe_results: _Optional[_Iterable[bytes]] = ..., firmware: _Optional[_Iterable[_Union[FirmwareVersion, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[DeviceAttestation, _Mapping]]] = ..., compared: _Optional[_Iterable[_Union[SourceCount, _Mapping]]] = ...) -> None: ...

class DeviceAttestation(_message.Message):
    __slots__ = ("device", "verified", "check", "reason", "firmware", "golden", "bmc_firmware", "bmc_component")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    GOLDEN_FIELD_NUMBER: _ClassVar[int]
    BMC_FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    BMC_COMPONENT_FIELD_NUMBER: _ClassVar[int]
    device: str
    verified: bool
    check: str
    reason: str
    firmware: str
    golden: str
    bmc_firmware: str
    bmc_component: str
    def __init__(self, device: _Optional[str] = ..., verified: _Optional[bool] = ..., check: _Optional[str] = ..., reason: _Optional[str] = ..., firmware: _Optional[str] = ..., golden: _Optional[str] = ..., bmc_firmware: _Optional[str] = ..., bmc_component: _Optional[str] = ...) -> None: ...

class FirmwareVersion(_message.Message):
    __slots__ = ("component_id", "name", "version", "expected", "match", "ok")
    COMPONENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    component_id: str
    name: str
    version: str
    expected: str
    match: str
    ok: bool
    def __init__(self, component_id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[str] = ..., expected: _Optional[str] = ..., match: _Optional[str] = ..., ok: _Optional[bool] = ...) -> None: ...

class NodeBoot(_message.Message):
    __slots__ = ("node_id", "attempt", "method", "trigger", "started_unix_ms", "outcome", "cause", "cause_detail", "console", "last_lines", "steps", "console_oldest_unix_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    CONSOLE_FIELD_NUMBER: _ClassVar[int]
    LAST_LINES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CONSOLE_OLDEST_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    attempt: int
    method: str
    trigger: str
    started_unix_ms: int
    outcome: str
    cause: str
    cause_detail: str
    console: str
    last_lines: _containers.RepeatedScalarFieldContainer[str]
    steps: _containers.RepeatedScalarFieldContainer[str]
    console_oldest_unix_ms: int
    def __init__(self, node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., method: _Optional[str] = ..., trigger: _Optional[str] = ..., started_unix_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., cause: _Optional[str] = ..., cause_detail: _Optional[str] = ..., console: _Optional[str] = ..., last_lines: _Optional[_Iterable[str]] = ..., steps: _Optional[_Iterable[str]] = ..., console_oldest_unix_ms: _Optional[int] = ...) -> None: ...

class LogsCollectRequest(_message.Message):
    __slots__ = ("paths", "upload_url", "max_bytes", "max_file_bytes", "include_kernel_log", "include_system_journal", "since_seconds", "http_headers", "ca_bundle_pem", "node_ids", "from_unix_ms", "until_unix_ms", "console_last_lines")
    class HttpHeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATHS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_URL_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_KERNEL_LOG_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_SYSTEM_JOURNAL_FIELD_NUMBER: _ClassVar[int]
    SINCE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HTTP_HEADERS_FIELD_NUMBER: _ClassVar[int]
    CA_BUNDLE_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    FROM_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CONSOLE_LAST_LINES_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    upload_url: str
    max_bytes: int
    max_file_bytes: int
    include_kernel_log: bool
    include_system_journal: bool
    since_seconds: int
    http_headers: _containers.ScalarMap[str, str]
    ca_bundle_pem: str
    node_ids: _containers.RepeatedScalarFieldContainer[str]
    from_unix_ms: int
    until_unix_ms: int
    console_last_lines: int
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., upload_url: _Optional[str] = ..., max_bytes: _Optional[int] = ..., max_file_bytes: _Optional[int] = ..., include_kernel_log: _Optional[bool] = ..., include_system_journal: _Optional[bool] = ..., since_seconds: _Optional[int] = ..., http_headers: _Optional[_Mapping[str, str]] = ..., ca_bundle_pem: _Optional[str] = ..., node_ids: _Optional[_Iterable[str]] = ..., from_unix_ms: _Optional[int] = ..., until_unix_ms: _Optional[int] = ..., console_last_lines: _Optional[int] = ...) -> None: ...

class ManifestEntry(_message.Message):
    __slots__ = ("name", "source", "size_bytes", "sha256", "truncated", "redacted")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    size_bytes: int
    sha256: str
    truncated: bool
    redacted: bool
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., truncated: _Optional[bool] = ..., redacted: _Optional[bool] = ...) -> None: ...

class LogsCollectResult(_message.Message):
    __slots__ = ("manifest", "archive_bytes", "archive_digest", "inline_archive", "uploaded_to", "skipped")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    INLINE_ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    UPLOADED_TO_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    manifest: _containers.RepeatedCompositeFieldContainer[ManifestEntry]
    archive_bytes: int
    archive_digest: _common_pb2.Digest
    inline_archive: bytes
    uploaded_to: str
    skipped: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, manifest: _Optional[_Iterable[_Union[ManifestEntry, _Mapping]]] = ..., archive_bytes: _Optional[int] = ..., archive_digest: _Optional[_Union[_common_pb2.Digest, _Mapping]] = ..., inline_archive: _Optional[bytes] = ..., uploaded_to: _Optional[str] = ..., skipped: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeRebootRequest(_message.Message):
    __slots__ = ("mode", "target", "boot_entry")
    MODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BOOT_ENTRY_FIELD_NUMBER: _ClassVar[int]
    mode: RebootMode
    target: RebootTarget
    boot_entry: str
    def __init__(self, mode: _Optional[_Union[RebootMode, str]] = ..., target: _Optional[_Union[RebootTarget, str]] = ..., boot_entry: _Optional[str] = ...) -> None: ...

class NodeRebootResult(_message.Message):
    __slots__ = ("old_boot_id", "new_boot_id", "mode", "target")
    OLD_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    old_boot_id: str
    new_boot_id: str
    mode: RebootMode
    target: RebootTarget
    def __init__(self, old_boot_id: _Optional[str] = ..., new_boot_id: _Optional[str] = ..., mode: _Optional[_Union[RebootMode, str]] = ..., target: _Optional[_Union[RebootTarget, str]] = ...) -> None: ...
