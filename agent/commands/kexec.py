"""boot.kexec: fetch a kernel (and an initrd), check their digests, load them, execute into them.

Everything that can fail happens in ``run``: the downloads or the read-only partition mount,
the digest checks, and ``kexec_file_load`` itself (bad image, signature enforcement, lockdown).
Only then does the handler return a SelfTermination whose action executes the loaded image.

The new command line carries ``bc.rejoin=boot.kexec:<command id>:<old boot id>``: the agent
that starts in the new kernel (whose tmpfs journal is gone) reads it and reports the command
complete when its boot id differs.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from agent.commands.base import Context, Handler, SelfTermination
from agent.errors import InvalidParameters
from agent.hw import bootid
from agent.hw import kexec as hw_kexec
from agent.images import filesource
from agent.proto import agent_pb2

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class KexecParams:
    kernel: filesource.FileRef
    initrd: filesource.FileRef | None
    cmdline: str
    allow_kexec_tools: bool


class KexecHandler(Handler[agent_pb2.KexecRequest, KexecParams], kind="boot.kexec"):
    def __init__(self, kexec: hw_kexec.Kexec | None = None) -> None:
        self._kexec = kexec

    @property
    def kexec(self) -> hw_kexec.Kexec:
        if self._kexec is None:
            self._kexec = hw_kexec.Kexec()
        return self._kexec

    def parse(self, payload: agent_pb2.KexecRequest) -> KexecParams:
        if not payload.HasField("kernel"):
            raise InvalidParameters("boot.kexec: kernel is required")
        kernel = filesource.parse_source(payload.kernel, "kernel")
        initrd = filesource.parse_source(payload.initrd, "initrd") if payload.HasField("initrd") else None
        # The agent's own parameter is appended later; leave room for it.
        cmdline = hw_kexec.check_cmdline(payload.cmdline.strip())
        if len(cmdline) > hw_kexec.MAX_CMDLINE - 200:
            raise InvalidParameters("boot.kexec: command line leaves no room for the agent's parameter")
        return KexecParams(kernel, initrd, cmdline, payload.allow_kexec_tools)

    def run(self, ctx: Context, params: KexecParams) -> SelfTermination:
        # The boot id the core judges rejoins by (the same file in production; injected in tests).
        old_boot_id = ctx.boot_id
        cmdline = hw_kexec.append_params(
            params.cmdline, [bootid.rejoin_param(self.kind, ctx.command_id, old_boot_id)]
        )
        work = ctx.config.cache_dir / "kexec" / ctx.command_id.replace("/", "_")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, mode=0o700)
        try:
            kernel_sha = self._fetch(ctx, params.kernel, work / "kernel", "kernel")
            initrd_path: Path | None = None
            initrd_sha = ""
            if params.initrd is not None:
                initrd_path = work / "initrd"
                initrd_sha = self._fetch(ctx, params.initrd, initrd_path, "initrd")
            ctx.check()
            ctx.progress(message="loading the kernel", fraction=0.9)
            image = hw_kexec.KexecImage(work / "kernel", initrd_path, cmdline)
            method = self.kexec.load(image, allow_tools=params.allow_kexec_tools)
        finally:
            # The kernel holds its own copy once loaded; the files are no longer needed.
            shutil.rmtree(work, ignore_errors=True)
        log.info("kexec image loaded with %s; executing once the agent is quiet", method)
        result = agent_pb2.KexecResult(
            old_boot_id=old_boot_id, method=method, kernel_sha256=kernel_sha,
            initrd_sha256=initrd_sha, cmdline=cmdline,
        )
        kexec = self.kexec
        return SelfTermination(
            proof={"old_boot_id": old_boot_id},
            action=lambda: kexec.execute(method),
            result=result,
        )

    def _fetch(self, ctx: Context, src: filesource.FileRef, dest: Path, what: str) -> str:
        ctx.progress(message=f"fetching the {what} from {src.describe()}", subject=what)
        got = filesource.fetch(
            src, dest, cancel=ctx.cancel_event, ca_file=ctx.config.ca_bundle,
            progress=lambda n: ctx.progress(done=n, message=f"fetching the {what}", subject=what),
        )
        if src.digest.algorithm == "sha256":
            return got
        return filesource.file_digest(dest, "sha256")
