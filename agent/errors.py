"""One error base class with a reason code, and one conversion to the wire.

A handler raises the subclass that tells an operator what happened; the runtime turns it into
a Result (status, reason code, message, details) with ``to_wire``. Reason codes are stable
strings: the gateway, the tests and operators match on them.
"""

from __future__ import annotations

import enum
from typing import Any


class Reason(enum.StrEnum):
    # Refusals before anything runs.
    INVALID_PARAMETERS = "invalid_parameters"
    UNKNOWN_KIND = "unknown_kind"
    WRONG_ROLE = "wrong_role"  # the kind does not list this agent's role
    NOT_THIS_DAEMON = "not_this_daemon"  # site-only kind: belongs to the site daemon
    UNTRUSTED = "untrusted"  # generic trust failure
    SIGNATURE_MISSING = "signature_missing"
    SIGNATURE_UNKNOWN_KEY = "signature_unknown_key"
    SIGNATURE_INVALID = "signature_invalid"  # modified payload or wrong key
    WRONG_NODE = "wrong_node"
    WRONG_BOOT = "wrong_boot"  # signed for another boot of this node (or, destructive, for none)
    WRONG_STATE = "wrong_state"  # signed for another state (journal) of this agent, or for none
    EXPIRED = "expired"
    REPLAYED = "replayed"
    DRAINING = "draining"
    BUSY = "busy"  # the command's queue is full: nothing journaled; the control plane may retry
    # Failures while running.
    PROTECTED_DEVICE = "protected_device"  # mounted, holds the running system, in use
    NOT_CONFORMING = "not_conforming"  # the node is not the build the command's gate expects
    NOT_FOUND = "not_found"  # a disk/GPU/file the request names is not there
    AMBIGUOUS = "ambiguous"  # hints match more than one device
    UNSUPPORTED = "unsupported"  # not supported on this hardware/controller
    TOOL_MISSING = "tool_missing"
    TOOL_FAILED = "tool_failed"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    BAD_IMAGE = "bad_image"  # a kernel/agent build that cannot be loaded or started
    SOURCE_FAILED = "source_failed"  # download/stream error, truncated input
    TOO_LARGE = "too_large"
    AUTH_FAILED = "auth_failed"  # a BMC (or other peer) refused the credentials
    UNREACHABLE = "unreachable"  # a BMC (or other peer) could not be reached within the retries
    BMC_REFUSED = "bmc_refused"  # the BMC answered and refused; its own message is kept
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # agent died while a non-retry-safe command ran
    TPM_ERROR = "tpm_error"  # the TPM refused a command; details name its response code
    INTERNAL = "internal"


class AgentError(Exception):
    """Base of every error the agent reports. ``reason`` is the wire reason code."""

    reason: Reason = Reason.INTERNAL

    def __init__(self, message: str, *, reason: Reason | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.details: dict[str, str] = {k: str(v) for k, v in details.items()}

    def to_wire(self) -> tuple[str, str, dict[str, str]]:
        """(reason code, message, details) as the Result message carries them."""
        return str(self.reason), self.message, dict(self.details)

    def __str__(self) -> str:
        return self.message


class InvalidParameters(AgentError):
    reason = Reason.INVALID_PARAMETERS


class UnknownKind(AgentError):
    reason = Reason.UNKNOWN_KIND


class WrongRole(AgentError):
    """The kind does not list this agent's role (NOT_THIS_DAEMON for a site-only kind)."""

    reason = Reason.WRONG_ROLE


class Draining(AgentError):
    """The agent accepts nothing new: it is stopping, or a command is ending it."""

    reason = Reason.DRAINING


class Busy(AgentError):
    """The queue the command would wait in (its lane's, or the keyed pool's of BMC work) holds
    as many commands as its bound: refused at admission, nothing journaled nor run. The agent
    is not failing, only full: the control plane may send the same command again later."""

    reason = Reason.BUSY


class Untrusted(AgentError):
    """Signature, key, node binding, expiry or replay check failed."""

    reason = Reason.UNTRUSTED


class ProtectedDevice(AgentError):
    reason = Reason.PROTECTED_DEVICE


class NotConforming(AgentError):
    """The node differs from the expected build (SKU) a command was gated on."""

    reason = Reason.NOT_CONFORMING


class NotFound(AgentError):
    reason = Reason.NOT_FOUND


class Unsupported(AgentError):
    reason = Reason.UNSUPPORTED


class ToolMissing(AgentError):
    reason = Reason.TOOL_MISSING


class ToolFailed(AgentError):
    reason = Reason.TOOL_FAILED


class AuthFailed(AgentError):
    reason = Reason.AUTH_FAILED


class BmcUnreachable(AgentError):
    reason = Reason.UNREACHABLE


class BmcRefused(AgentError):
    """The BMC answered and refused; ``bmc_message`` in the details is its own message."""

    reason = Reason.BMC_REFUSED


class SourceFailed(AgentError):
    reason = Reason.SOURCE_FAILED


class ChecksumMismatch(AgentError):
    reason = Reason.CHECKSUM_MISMATCH


class CommandTimeout(AgentError):
    reason = Reason.TIMEOUT


class Cancelled(AgentError):
    reason = Reason.CANCELLED


class Interrupted(AgentError):
    reason = Reason.INTERRUPTED


class MissingDependency(AgentError):
    """A Python dependency or a native library cannot be imported."""

    reason = Reason.TOOL_MISSING


class TpmFailed(AgentError):
    """The TPM answered a command with an error; ``rc`` and ``rc_name`` in the details."""

    reason = Reason.TPM_ERROR
