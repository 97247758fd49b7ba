"""daemon.upgrade: replace the running agent zipapp with a new build and re-execute it; A/B.

In ``run`` (everything that can fail, the running agent untouched): download the new build
beside the running archive (``agent.pyz.new``), check its digest and its control-plane
signature (an artifact signature over its SHA-256), start it once with ``version`` to see that
it imports and reports the requested version, and keep the running build as
``agent.pyz.prev``. The SelfTermination's action then writes the trial marker, renames the new
build over the archive and re-executes the same Python with the same arguments.

The new agent reports the upgrade complete when it runs the requested version (the core's rule
for a version proof), and confirms its trial once the gateway has welcomed it (the core calls
``launcher.confirm_trial`` at every join). If it does not, agent/launcher.py (which supervises
the agent and survives any new build) puts the previous build back, and the previous agent
reports the command FAILED with the launcher's reason (``completion``). So the upgrade needs
the agent to run under the launcher, as ``agent install`` sets it up; without it the command
is refused.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from agent import atomicfile, launcher, version
from agent.commands.base import Context, Handler, SelfTermination, Verdict
from agent.errors import AgentError, Draining, InvalidParameters, Reason, Unsupported
from agent.images import filesource, image
from agent.net import http
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

DEFAULT_REJOIN_SECONDS = 120
MAX_REJOIN_SECONDS = 600
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


@dataclass(frozen=True)
class UpgradeParams:
    version: str
    source: filesource.FileRef
    signature: bytes
    key_id: str
    rejoin_timeout: int


def running_archive() -> str:
    """The zipapp this agent runs from; Unsupported when it runs from a source tree."""
    if not version.ARCHIVE or not os.path.isfile(version.ARCHIVE):
        raise Unsupported("daemon.upgrade: this agent does not run from a zipapp (source tree?)")
    return os.path.abspath(version.ARCHIVE)


class UpgradeHandler(Handler[agent_pb2.DaemonSection, UpgradeParams], kind="daemon.upgrade"):
    def parse(self, payload: agent_pb2.DaemonSection) -> UpgradeParams:
        if not _VERSION.fullmatch(payload.version):
            raise InvalidParameters(
                f"daemon.upgrade: version {payload.version!r} is not a version string")
        if not payload.url:
            raise InvalidParameters("daemon.upgrade: url is required")
        if not payload.HasField("digest") or not payload.digest.hex:
            raise InvalidParameters("daemon.upgrade: digest is required")
        http.check_url(payload.url)
        digest = image.Digest.from_proto(payload.digest, "daemon.upgrade")
        source = filesource.FileRef(digest, url=payload.url)
        if len(payload.signature) != 64:
            raise InvalidParameters("daemon.upgrade: signature must be a 64-byte Ed25519 signature")
        if not payload.key_id:
            raise InvalidParameters("daemon.upgrade: key_id (the signing control-plane key) is required")
        timeout = payload.rejoin_timeout_seconds or DEFAULT_REJOIN_SECONDS
        if not 1 <= timeout <= MAX_REJOIN_SECONDS:
            raise InvalidParameters(
                f"daemon.upgrade: rejoin_timeout_seconds must be 1..{MAX_REJOIN_SECONDS}")
        return UpgradeParams(payload.version, source, payload.signature, payload.key_id, timeout)

    def run(self, ctx: Context, params: UpgradeParams) -> Message | SelfTermination:
        archive = running_archive()
        current = version.__version__
        old_sha = launcher.sha256_file(archive)
        if params.version == current:
            # Already there. A self-terminating kind completes on rejoin, so restart the same
            # build (no trial needed) and let the version proof complete it.
            log.info("daemon.upgrade: already running %s; restarting it", current)
            return SelfTermination(
                proof={"old_version": current, "new_version": current, "archive": archive},
                action=lambda: reexec(archive),
                result=agent_pb2.DaemonUpgradeResult(old_version=current, new_version=current,
                                                     old_sha256=old_sha, new_sha256=old_sha),
            )
        if not os.environ.get(launcher.LAUNCHER_ENV):
            raise Unsupported("daemon.upgrade needs the agent to run under its launcher, which rolls a "
                              "failed upgrade back (install it with `agent install`)")
        marker = launcher.read_marker(archive)
        if marker is not None and marker.get("state") in (launcher.TRIAL, launcher.ROLLING_BACK):
            raise Draining(f"an upgrade to {marker.get('new_version')} is still being tried")
        new = Path(archive + launcher.NEW_SUFFIX)
        try:
            new_sha = self._fetch_and_verify(ctx, params, new)
            self._preflight(ctx, new, params.version)
            ctx.progress(message="keeping the running build as the fallback", fraction=0.9)
            launcher.link_atomic(archive, archive + launcher.PREV_SUFFIX)
        except BaseException:
            new.unlink(missing_ok=True)
            raise
        result = agent_pb2.DaemonUpgradeResult(old_version=current, new_version=params.version,
                                               old_sha256=old_sha, new_sha256=new_sha)
        trial = {
            "command_id": ctx.command_id, "state": launcher.TRIAL,
            "old_version": current, "new_version": params.version,
            "old_sha256": old_sha, "new_sha256": new_sha,
            "rejoin_timeout": params.rejoin_timeout, "max_starts": launcher.MAX_STARTS,
        }
        return SelfTermination(
            proof={"old_version": current, "new_version": params.version, "archive": archive},
            action=lambda: switch_and_reexec(archive, str(new), trial),
            result=result,
        )

    def _fetch_and_verify(self, ctx: Context, params: UpgradeParams, new: Path) -> str:
        ctx.progress(message=f"fetching agent {params.version}", fraction=0.0)
        filesource.fetch(params.source, new, cancel=ctx.cancel_event, ca_file=ctx.config.ca_bundle,
                         progress=lambda n: ctx.progress(done=n, message=f"fetching agent {params.version}"))
        sha = launcher.sha256_file(str(new))
        from agent.security.trust import TrustStore

        TrustStore.load(ctx.config.trusted_keys).verify_artifact(bytes.fromhex(sha), params.signature,
                                                                 params.key_id)
        os.chmod(new, 0o755)  # noqa: S103 (an executable zipapp, root-owned directory)
        return sha

    def _preflight(self, ctx: Context, new: Path, wanted: str) -> None:
        """Start the new build once: it must import and report the version the request names."""
        ctx.progress(message=f"checking that agent {wanted} starts", fraction=0.8)
        try:
            done = ctx.run([sys.executable, str(new), "version"], timeout=min(120.0, ctx.remaining()))
        except AgentError as exc:
            if exc.reason not in (Reason.TOOL_FAILED, Reason.TOOL_MISSING):
                raise
            raise AgentError(f"the new build does not start: {exc.message}",
                             reason=Reason.BAD_IMAGE) from exc
        got = done.text.strip().splitlines()[0] if done.text.strip() else ""
        if got != wanted:
            raise AgentError(f"the new build reports version {got!r}, the request says {wanted!r}",
                             reason=Reason.BAD_IMAGE, reported=got)

    # -- hooks the core calls -----------------------------------------------------------------

    def completion(self, proof: Mapping[str, str], *, boot_id: str, version: str) -> Verdict | None:
        """After a rollback, the launcher's reason; otherwise the core's rule (None)."""
        archive = proof.get("archive", "")
        if not archive or version == proof.get("new_version"):
            return None
        marker = launcher.read_marker(archive)
        if marker is None or marker.get("new_version") != proof.get("new_version"):
            return None
        if marker.get("state") == launcher.ROLLED_BACK:
            return False, str(marker.get("reason") or Reason.INTERRUPTED), (
                f"rolled back to {version}: {marker.get('message', '')}")
        return None


def switch_and_reexec(archive: str, new: str, trial: dict[str, object]) -> None:
    """The last steps, in an order that a crash at any point leaves runnable (see launcher)."""
    now = time.time()
    rejoin = float(trial["rejoin_timeout"])  # type: ignore[arg-type]  # a number in the trial marker
    launcher.write_marker(
        archive, {**trial, "starts": 1, "started_unix": now, "deadline_unix": now + rejoin}
    )
    os.replace(new, archive)
    atomicfile.fsync_dir(archive)
    reexec(archive)


def reexec(archive: str) -> None:
    """Replace this process with the same Python running ``archive`` with the same arguments."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    argv = [sys.executable, archive, *sys.argv[1:]]
    log.warning("daemon.upgrade: re-executing %s", " ".join(argv))
    os.execv(sys.executable, argv)  # noqa: S606 (argv is ours, not from the wire)
