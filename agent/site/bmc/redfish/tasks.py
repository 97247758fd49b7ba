"""A Redfish task followed to its end: the task monitor (or Task) a 202 names.

``follow`` polls it never faster than ``Pacing.min_interval`` (growing to ``max_interval``,
and never faster than a Retry-After the BMC asks for) until TaskState is final: Completed is
success; Exception, Killed or Cancelled raise BmcRefused with the task's messages; the
command's deadline raises CommandTimeout. ``read`` fills a BmcFirmwareTask from one answer.
Used by firmware updates, volume creation and BIOS settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.errors import BmcRefused, Cancelled, CommandTimeout
from agent.proto import site_pb2
from agent.site.bmc.redfish.session import Answer, RedfishSession

FINAL_OK = frozenset({"Completed"})
FINAL_BAD = frozenset({"Exception", "Killed", "Cancelled"})


def read(client: RedfishSession, answer: Answer, task: site_pb2.BmcFirmwareTask) -> list[str]:
    """``task`` updated from a task monitor's or Task's answer; the messages, redacted."""
    doc = answer.doc
    state = doc.get("TaskState")
    if isinstance(state, str):
        task.state = state
    elif answer.status in (200, 201, 204):
        task.state = "Completed"    # a monitor that answers the final result has no TaskState
    else:
        task.state = task.state or "Running"
    percent = doc.get("PercentComplete")
    if isinstance(percent, int) and 0 <= percent <= 100:
        task.percent = percent
    messages = [m.get("Message", "") for m in doc.get("Messages", []) if isinstance(m, dict)]
    messages = [client.hide(m) for m in messages if isinstance(m, str) and m]
    del task.messages[:]
    task.messages.extend(messages)
    if task.state in FINAL_OK:
        task.percent = 100
    return messages


def follow(
    client: RedfishSession, location: str, progress: Callable[[int, str], None] | None
) -> site_pb2.BmcFirmwareTask:
    """Poll a task monitor or Task resource until it ends; see the module docstring."""
    where = f"Redfish BMC {client.target.address}"
    task = site_pb2.BmcFirmwareTask(task_uri=location)
    seen = (-1, "")
    pacing = client.call.pacing
    interval = pacing.min_interval
    while True:
        answer = client.send("GET", location, ok=(404,))
        if answer.status == 404:
            raise BmcRefused(f"{where}: the task {location} is gone (HTTP 404)")
        messages = read(client, answer, task)
        if progress is not None and (task.percent, task.state) != seen:
            seen = (task.percent, task.state)
            progress(task.percent, task.state + (f": {messages[-1]}" if messages else ""))
        if task.state in FINAL_OK:
            return task
        if task.state in FINAL_BAD:
            raise BmcRefused(
                f"{where}: task {location} ended {task.state}"
                + (f": {'; '.join(messages)}" if messages else ""),
                bmc_message="; ".join(messages), task_state=task.state,
            )
        wait = max(interval, _retry_after(answer.headers.get("retry-after", "")))
        if time.monotonic() + wait >= client.call.deadline:
            raise CommandTimeout(
                f"{where}: task {location} still {task.state} at {task.percent}% at the deadline"
            )
        if client.call.cancel.wait(wait):
            raise Cancelled("cancelled")
        interval = min(pacing.max_interval, interval * pacing.factor)


def _retry_after(value: str) -> float:
    try:
        return min(60.0, max(0.0, float(value)))
    except ValueError:
        return 0.0
