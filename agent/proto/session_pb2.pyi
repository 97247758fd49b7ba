from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommandState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_STATE_UNSPECIFIED: _ClassVar[CommandState]
    QUEUED: _ClassVar[CommandState]
    RUNNING: _ClassVar[CommandState]
    FINISHED: _ClassVar[CommandState]
    ACKNOWLEDGED: _ClassVar[CommandState]
    AWAITING_REJOIN: _ClassVar[CommandState]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    SUCCEEDED: _ClassVar[Status]
    FAILED: _ClassVar[Status]
    TIMED_OUT: _ClassVar[Status]
    CANCELLED: _ClassVar[Status]
    INTERRUPTED: _ClassVar[Status]
COMMAND_STATE_UNSPECIFIED: CommandState
QUEUED: CommandState
RUNNING: CommandState
FINISHED: CommandState
ACKNOWLEDGED: CommandState
AWAITING_REJOIN: CommandState
STATUS_UNSPECIFIED: Status
SUCCEEDED: Status
FAILED: Status
TIMED_OUT: Status
CANCELLED: Status
INTERRUPTED: Status

class Frame(_message.Message):
    __slots__ = ("hello", "welcome", "command", "accept", "reject", "progress", "log", "result", "ack", "cancel", "heartbeat", "drain", "goodbye", "error", "attest_challenge", "attest_answer", "attest_verdict")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEST_CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    ATTEST_ANSWER_FIELD_NUMBER: _ClassVar[int]
    ATTEST_VERDICT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    welcome: Welcome
    command: SignedCommand
    accept: Accept
    reject: Reject
    progress: Progress
    log: LogLine
    result: SignedResult
    ack: Ack
    cancel: Cancel
    heartbeat: Heartbeat
    drain: Drain
    goodbye: Goodbye
    error: ProtocolError
    attest_challenge: AttestChallenge
    attest_answer: AttestAnswer
    attest_verdict: AttestVerdict
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., command: _Optional[_Union[SignedCommand, _Mapping]] = ..., accept: _Optional[_Union[Accept, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., log: _Optional[_Union[LogLine, _Mapping]] = ..., result: _Optional[_Union[SignedResult, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., error: _Optional[_Union[ProtocolError, _Mapping]] = ..., attest_challenge: _Optional[_Union[AttestChallenge, _Mapping]] = ..., attest_answer: _Optional[_Union[AttestAnswer, _Mapping]] = ..., attest_verdict: _Optional[_Union[AttestVerdict, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "node_id", "role", "agent_version", "boot_id", "kinds", "public_key", "unacked_results", "completions", "in_flight", "enrollment_token", "agent_sha256", "state_id", "tpm")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    UNACKED_RESULTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ENROLLMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_SHA256_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    TPM_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    node_id: str
    role: str
    agent_version: str
    boot_id: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    public_key: bytes
    unacked_results: _containers.RepeatedCompositeFieldContainer[SignedResult]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    in_flight: _containers.RepeatedCompositeFieldContainer[CommandStatus]
    enrollment_token: str
    agent_sha256: str
    state_id: str
    tpm: TpmIdentity
    def __init__(self, protocol_version: _Optional[int] = ..., node_id: _Optional[str] = ..., role: _Optional[str] = ..., agent_version: _Optional[str] = ..., boot_id: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ..., public_key: _Optional[bytes] = ..., unacked_results: _Optional[_Iterable[_Union[SignedResult, _Mapping]]] = ..., completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., in_flight: _Optional[_Iterable[_Union[CommandStatus, _Mapping]]] = ..., enrollment_token: _Optional[str] = ..., agent_sha256: _Optional[str] = ..., state_id: _Optional[str] = ..., tpm: _Optional[_Union[TpmIdentity, _Mapping]] = ...) -> None: ...

class TpmIdentity(_message.Message):
    __slots__ = ("absent", "error", "ek_public", "ek_certificate", "ak_public", "ak_name", "manufacturer", "firmware", "platform")
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    EK_CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    AK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    AK_NAME_FIELD_NUMBER: _ClassVar[int]
    MANUFACTURER_FIELD_NUMBER: _ClassVar[int]
    FIRMWARE_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    absent: str
    error: str
    ek_public: bytes
    ek_certificate: bytes
    ak_public: bytes
    ak_name: bytes
    manufacturer: str
    firmware: str
    platform: str
    def __init__(self, absent: _Optional[str] = ..., error: _Optional[str] = ..., ek_public: _Optional[bytes] = ..., ek_certificate: _Optional[bytes] = ..., ak_public: _Optional[bytes] = ..., ak_name: _Optional[bytes] = ..., manufacturer: _Optional[str] = ..., firmware: _Optional[str] = ..., platform: _Optional[str] = ...) -> None: ...

class AttestChallenge(_message.Message):
    __slots__ = ("nonce", "credential_blob", "encrypted_secret")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_BLOB_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_SECRET_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    credential_blob: bytes
    encrypted_secret: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., credential_blob: _Optional[bytes] = ..., encrypted_secret: _Optional[bytes] = ...) -> None: ...

class PcrValue(_message.Message):
    __slots__ = ("index", "sha256")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    index: int
    sha256: bytes
    def __init__(self, index: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class AttestAnswer(_message.Message):
    __slots__ = ("nonce", "error", "activated", "quote", "signature", "pcrs", "event_log")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ACTIVATED_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PCRS_FIELD_NUMBER: _ClassVar[int]
    EVENT_LOG_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    error: str
    activated: bytes
    quote: bytes
    signature: bytes
    pcrs: _containers.RepeatedCompositeFieldContainer[PcrValue]
    event_log: bytes
    def __init__(self, nonce: _Optional[bytes] = ..., error: _Optional[str] = ..., activated: _Optional[bytes] = ..., quote: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., pcrs: _Optional[_Iterable[_Union[PcrValue, _Mapping]]] = ..., event_log: _Optional[bytes] = ...) -> None: ...

class AttestVerdict(_message.Message):
    __slots__ = ("status", "check", "reason", "matched")
    class MatchedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    status: str
    check: str
    reason: str
    matched: _containers.ScalarMap[str, str]
    def __init__(self, status: _Optional[str] = ..., check: _Optional[str] = ..., reason: _Optional[str] = ..., matched: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("command_id", "kind", "ok", "old_boot_id", "new_boot_id", "old_version", "new_version", "reason", "message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    OLD_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: str
    ok: bool
    old_boot_id: str
    new_boot_id: str
    old_version: str
    new_version: str
    reason: str
    message: str
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[str] = ..., ok: _Optional[bool] = ..., old_boot_id: _Optional[str] = ..., new_boot_id: _Optional[str] = ..., old_version: _Optional[str] = ..., new_version: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CommandStatus(_message.Message):
    __slots__ = ("command_id", "kind", "state")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: str
    state: CommandState
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[str] = ..., state: _Optional[_Union[CommandState, str]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("gateway_id", "heartbeat_interval_ms", "dead_after_ms", "max_frame_bytes")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    heartbeat_interval_ms: int
    dead_after_ms: int
    max_frame_bytes: int
    def __init__(self, gateway_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., dead_after_ms: _Optional[int] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...

class CommandBody(_message.Message):
    __slots__ = ("command_id", "kind", "node_id", "payload", "issued_at_unix_ms", "expires_at_unix_ms", "timeout_seconds", "boot_id", "state_id")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: str
    node_id: str
    payload: bytes
    issued_at_unix_ms: int
    expires_at_unix_ms: int
    timeout_seconds: int
    boot_id: str
    state_id: str
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[str] = ..., node_id: _Optional[str] = ..., payload: _Optional[bytes] = ..., issued_at_unix_ms: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., timeout_seconds: _Optional[int] = ..., boot_id: _Optional[str] = ..., state_id: _Optional[str] = ...) -> None: ...

class SignedCommand(_message.Message):
    __slots__ = ("body", "key_id", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    key_id: str
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., key_id: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Accept(_message.Message):
    __slots__ = ("command_id", "state")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    state: CommandState
    def __init__(self, command_id: _Optional[str] = ..., state: _Optional[_Union[CommandState, str]] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("command_id", "reason", "message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    reason: str
    message: str
    def __init__(self, command_id: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("command_id", "fraction", "message", "done", "total", "rate", "eta_seconds", "time_unix_ms", "subject")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    fraction: float
    message: str
    done: int
    total: int
    rate: float
    eta_seconds: float
    time_unix_ms: int
    subject: str
    def __init__(self, command_id: _Optional[str] = ..., fraction: _Optional[float] = ..., message: _Optional[str] = ..., done: _Optional[int] = ..., total: _Optional[int] = ..., rate: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., time_unix_ms: _Optional[int] = ..., subject: _Optional[str] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("command_id", "level", "message", "time_unix_ms", "dropped_before")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    level: str
    message: str
    time_unix_ms: int
    dropped_before: int
    def __init__(self, command_id: _Optional[str] = ..., level: _Optional[str] = ..., message: _Optional[str] = ..., time_unix_ms: _Optional[int] = ..., dropped_before: _Optional[int] = ...) -> None: ...

class ResultBody(_message.Message):
    __slots__ = ("command_id", "kind", "node_id", "boot_id", "status", "reason", "message", "details", "payload", "payload_type", "started_at_unix_ms", "finished_at_unix_ms", "agent_version")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    kind: str
    node_id: str
    boot_id: str
    status: Status
    reason: str
    message: str
    details: _containers.ScalarMap[str, str]
    payload: bytes
    payload_type: str
    started_at_unix_ms: int
    finished_at_unix_ms: int
    agent_version: str
    def __init__(self, command_id: _Optional[str] = ..., kind: _Optional[str] = ..., node_id: _Optional[str] = ..., boot_id: _Optional[str] = ..., status: _Optional[_Union[Status, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ..., payload: _Optional[bytes] = ..., payload_type: _Optional[str] = ..., started_at_unix_ms: _Optional[int] = ..., finished_at_unix_ms: _Optional[int] = ..., agent_version: _Optional[str] = ...) -> None: ...

class SignedResult(_message.Message):
    __slots__ = ("body", "signature")
    BODY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    signature: bytes
    def __init__(self, body: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("command_id",)
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    def __init__(self, command_id: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("command_id", "reason")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    reason: str
    def __init__(self, command_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "time_unix_ms")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix_ms: int
    def __init__(self, seq: _Optional[int] = ..., time_unix_ms: _Optional[int] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ProtocolError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...
