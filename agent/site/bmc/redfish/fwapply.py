"""bmc.firmware apply: a firmware set's plan (agent/site/bmc/redfish/fwsets.py) carried out.

Step by step, in the plan's order: the image found by its digest in the site's content store
(fetched into it from the entry's url first where it is not held; pinned while it is pushed),
or for a SimpleUpdate the url handed to the BMC; the update sent once through
``firmware.update`` (its task followed to its end, the BMC's own reboot waited out); the
reboot or AC cycle the entry needs, then its settle wait; then the inventory read back. A step
whose components do not all report the set's version, or whose push or task fails, is named
and the rest are not started: ``ApplyStopped`` carries every step's state. A push whose answer
was lost (the connection cut after the BMC read it) is never sent again: the step fails with
the BMC's state unknown, and the operator's next ``plan`` shows where the BMC stands.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from agent.errors import AgentError, BmcRefused, InvalidParameters
from agent.net import http
from agent.proto import site_pb2
from agent.site.bmc.redfish import firmware
from agent.site.bmc.redfish.fwsets import After, Entry, Plan, Step, step_message
from agent.site.bmc.redfish.session import RedfishSession, link
from agent.site.chunkstore import ChunkStore

log = logging.getLogger(__name__)


class ApplyStopped(BmcRefused):
    """A step did not reach its version (or its push or task failed): the rest not started."""


@dataclasses.dataclass(frozen=True)
class Images:
    """Where pushed images come from: the site's content store, and the options its fetches
    from an upstream take (None: no store, a push cannot be carried out)."""

    store: ChunkStore | None
    options: http.HttpOptions = dataclasses.field(default_factory=http.HttpOptions)


def apply(
    client: RedfishSession,
    plan: Plan,
    images: Images,
    *,
    power: Callable[[After], None],
    settle: Callable[[float], None],
    progress: Callable[[int, str], None] | None = None,
) -> list[site_pb2.BmcFirmwareStep]:
    """Every step of ``plan`` carried out (see the module docstring); each step's message."""
    done = [step_message(s) for s in plan.steps]
    for n, (step, out) in enumerate(zip(plan.steps, done, strict=True)):
        where = f"step {n + 1} of {len(done)} ({out.match} -> {out.expected})"
        if progress is not None:
            progress(int(100 * n / len(done)), where)
        try:
            task = _push(client, step, images, progress)
            out.method = task.messages[0].removeprefix("method ") if task.messages else out.method
            if step.entry.after is not After.NONE:
                power(step.entry.after)
            if step.entry.settle_seconds:
                settle(step.entry.settle_seconds)
            short = _behind(client, step)
        except AgentError as exc:
            out.state, out.message = "failed", exc.message
            _stop(done, n, f"{where}: {exc.message}")
        if short:
            out.state = "not_reached"
            out.message = "; ".join(f"{cid} reports {v or 'nothing'}" for cid, v in short)
            _stop(done, n, f"{where}: not reached: {out.message}")
        out.state, out.message = "done", f"{len(step.components)} component(s) at {out.expected}"
        log.info("Redfish BMC %s: firmware %s done", client.target.address, where)
    return done


def _stop(done: Sequence[site_pb2.BmcFirmwareStep], n: int, message: str) -> None:
    for later in done[n + 1:]:
        later.state = "not_started"
    raise ApplyStopped(f"firmware apply stopped at {message}; {len(done) - n - 1} step(s) not started",
                       steps=";".join(f"{s.match}={s.state}" for s in done))


def offered(client: RedfishSession) -> firmware.Offer | None:
    """What the BMC's UpdateService offers (None: it has none)."""
    ref = link(client.root(), "UpdateService")
    return firmware.offer(client, client.get(ref)) if ref else None


def method_for(entry: Entry, offer: firmware.Offer | None) -> firmware.Method | None:
    """The entry's method, or where it names none what the BMC offers: a push of the store's
    file (multipart, else HttpPushUri), else SimpleUpdate of its url; None: nothing fits."""
    if entry.method is not None or offer is None:
        return entry.method
    if offer.multipart:
        return firmware.Method.MULTIPART
    if offer.http_push:
        return firmware.Method.HTTP_PUSH
    return firmware.Method.SIMPLE_UPDATE if offer.simple_update and entry.image.url else None


def _push(client: RedfishSession, step: Step, images: Images,
          progress: Callable[[int, str], None] | None) -> site_pb2.BmcFirmwareTask:
    e = step.entry
    targets = tuple(c.uri for c in step.components if c.uri)
    method = method_for(e, offered(client))
    if method is firmware.Method.SIMPLE_UPDATE:
        return firmware.update(client, image_uri=e.image.url, method=str(e.method), progress=progress)
    store = images.store
    if store is None:
        raise InvalidParameters("firmware apply: the site has no content store to push images from")
    if not store.has(e.image.sha256):
        if not e.image.url:
            raise InvalidParameters(f"firmware apply: image sha256:{e.image.sha256} is not in the site's"
                                    " content store and its entry gives no url to fetch it from")
        store.fetch(e.image.url, e.image.sha256, images.options, "firmware image")
    with store.open(e.image.sha256) as pinned:          # never evicted while pushed
        if pinned is None:
            raise InvalidParameters(f"firmware apply: image sha256:{e.image.sha256} left the content store")
        return firmware.update(client, file=Path(store.root) / e.image.sha256, sha256=e.image.sha256,
                               method=str(method or ""), progress=progress, targets=targets,
                               apply_time=str(e.apply_time))


def _behind(client: RedfishSession, step: Step) -> list[tuple[str, str]]:
    """The step's components not at the set's version, read back now."""
    now = {c.id: c.version for c in firmware.inventory(client)}
    return [(c.id, now.get(c.id, "")) for c in step.components if now.get(c.id) != step.entry.version]
