"""What ipmi_sim cannot be made to do: be busy, refuse with its own words, be slow. A
stand-in ``ipmitool`` (a script) answers like such a BMC and records each call's argv, time,
and whether the password came by environment."""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.commands import handler_for
from agent.commands.base import Context, ResourceLocks
from agent.config import Config
from agent.errors import AgentError, BmcRefused
from agent.proto import site_pb2
from agent.runtime.scheduler import Job, Scheduler
from agent.site.bmc.client import CallContext, Credentials, Pacing, PowerState, Target
from agent.site.bmc.ipmi import IpmiClient
from agent.site.bmc.secrets import SecretStore
from tests.site.conftest import PASSWORD, REF

SECRET = "Busy-Secret-5gH"


def fake_ipmitool(tmp_path: Path, busy_calls: int, final: str) -> Path:
    script = tmp_path / "ipmitool"
    script.write_text(f"""#!/bin/sh
n=$(cat {tmp_path}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp_path}/count
echo "$(date +%s.%N) env=${{IPMI_PASSWORD:+set}} $*" >> {tmp_path}/calls
if [ $n -le {busy_calls} ]; then
  echo "Get Chassis Power Status failed: Node busy" >&2; exit 1
fi
{final}
""")
    script.chmod(0o755)
    return script


def client(tool: Path, pacing: Pacing) -> IpmiClient:
    return IpmiClient(Target("10.9.9.9", Credentials("admin", SECRET)),
                      CallContext(threading.Event(), time.monotonic() + 60, pacing), ipmitool=str(tool))


def test_busy_is_retried_with_backoff_never_faster_than_the_pacing(tmp_path: Path) -> None:
    tool = fake_ipmitool(tmp_path, busy_calls=3, final='echo "Chassis Power is on"')
    c = client(tool, Pacing(min_interval=0.4, max_interval=1.0, factor=2.0))
    assert c.power_state() is PowerState.ON
    assert c.attempts == 4
    calls = (tmp_path / "calls").read_text().splitlines()
    times = [float(line.split()[0]) for line in calls]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g >= 0.4 for g in gaps), gaps
    assert gaps[1] >= 0.8 and gaps[2] >= 0.95    # backed off: 0.4, 0.8, then capped at 1.0
    assert all("env=set" in line and SECRET not in line for line in calls)


def test_a_refusal_carries_the_bmcs_own_words_and_is_not_retried(tmp_path: Path) -> None:
    tool = fake_ipmitool(tmp_path, busy_calls=0,
                         final=f'echo "Set Chassis Power Control to Up/On failed: Command illegal '
                               f'for {SECRET}" >&2; exit 1')
    c = client(tool, Pacing(min_interval=0.1))
    with pytest.raises(BmcRefused) as info:
        c.power_state()
    assert c.attempts == 1
    assert "Command illegal" in info.value.details["bmc_message"]
    # Even a BMC that echoes the password back does not get it into the error.
    assert SECRET not in str(info.value.to_wire()) and "<hidden>" in info.value.message


def test_late_answers_are_no_answer_and_retried(tmp_path: Path) -> None:
    """ipmitool's "IPMI Request Match NOT FOUND" (only late answers came, to requests it had
    sent again) is a lost answer, not a refusal: retried, as ipmi_sim on a loaded machine and a
    busy management network's UDP need."""
    script = tmp_path / "ipmitool"
    script.write_text(f"""#!/bin/sh
n=$(cat {tmp_path}/count 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp_path}/count
if [ $n -le 1 ]; then
  printf 'Discovered IPMB address 0x0\nUnable to get Chassis Power Status\nIPMI Request Match NOT FOUND\n' >&2
  exit 1
fi
echo "Chassis Power is off"
""")
    script.chmod(0o755)
    c = client(script, Pacing(min_interval=0.05))
    assert c.power_state() is PowerState.OFF
    assert c.attempts == 2


def test_a_bmc_busy_for_ever_is_given_up_within_bounds(tmp_path: Path) -> None:
    tool = fake_ipmitool(tmp_path, busy_calls=1000, final="")
    c = client(tool, Pacing(min_interval=0.05, max_interval=0.1))
    with pytest.raises(BmcRefused, match="still busy after 8 attempts"):
        c.power_state()
    assert c.attempts == 8


def stand_in_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """A stand-in ``ipmitool`` (a shell script) found first on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ipmitool").write_text("#!/bin/sh" + script)
    (bindir / "ipmitool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")


def power_status_on_scheduler(config: Config, addresses: list[str]) -> list[AgentError | None]:
    """bmc.power status on each address (IPMI), all submitted at once to a Scheduler as the
    Agent does (the BMC as the key, one set of locks and slots for all); how each ended."""
    handler = handler_for("bmc.power")
    assert handler is not None
    errors: list[AgentError | None] = []
    done = threading.Semaphore(0)
    shared = ResourceLocks()
    lanes = Scheduler()
    lanes.start()

    def finished(job: Job, value: object, error: AgentError | None) -> None:
        errors.append(error)
        done.release()

    try:
        for n, address in enumerate(addresses):
            params = handler.parse(site_pb2.BmcOperationRequest(
                bmc_address=address, protocol="ipmi", operation="status", credentials_ref=REF))
            ctx = Context.local("bmc.power", config, timeout=60, command_id=f"p{n}")
            ctx.locks = shared
            lanes.submit(Job(id=f"p{n}", kind=ctx.kind, ctx=ctx, timeout=60, on_done=finished,
                             body=lambda c, p=params: handler.run(c, p), key=handler.serial_key(params)))
        for _ in addresses:
            assert done.acquire(timeout=60)
    finally:
        lanes.stop()
    return errors


def test_one_operation_at_a_time_per_bmc_and_bmcs_in_parallel(tmp_path: Path, site_config: Config,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Four bmc.power status commands on two BMCs through the scheduler (its keyed pool): the
    stand-in ipmitool (found first on PATH) takes 0.4 s a call and records when each ran."""
    stand_in_on_path(tmp_path, monkeypatch, f"""
for a; do case $prev in -H) host=$a;; esac; prev=$a; done
echo "$host start $(date +%s.%N)" >> {tmp_path}/spans
sleep 0.4
echo "$host end $(date +%s.%N)" >> {tmp_path}/spans
echo "Chassis Power is on"
""")
    errors = power_status_on_scheduler(site_config, ["10.0.0.1", "10.0.0.2"] * 2)
    assert errors == [None] * 4, errors
    spans: dict[str, list[tuple[float, float]]] = {}
    starts: dict[str, list[float]] = {}
    for line in (tmp_path / "spans").read_text().splitlines():
        host, what, when = line.split()
        if what == "start":
            starts.setdefault(host, []).append(float(when))
        else:
            spans.setdefault(host, []).append((starts[host].pop(0), float(when)))
    assert sorted(spans) == ["10.0.0.1", "10.0.0.2"] and all(len(v) == 2 for v in spans.values())
    for host, (first, second) in ((h, sorted(v)) for h, v in spans.items()):
        assert second[0] >= first[1], f"two operations overlapped on {host}"
    a, b = sorted(spans["10.0.0.1"])[0], sorted(spans["10.0.0.2"])[0]
    assert a[0] < b[1] and b[0] < a[1], "the two BMCs were not driven in parallel"


def test_a_bmc_that_refuses_the_new_password_keeps_the_old_one(tmp_path: Path, site_config: Config,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """bmc.rotate halfway: the password is staged, the BMC refuses the change. The store keeps
    the working password, drops the pending one, and the error carries the BMC's words."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ipmitool").write_text(f"""#!/bin/sh
if [ "$IPMI_PASSWORD" != "{PASSWORD}" ]; then echo "> RAKP 2 HMAC is invalid" >&2; exit 1; fi
case "$*" in
  *"user list"*) echo "2   bcadmin          true    false      true       ADMINISTRATOR";;
  *exec*) echo "Set User Password command failed (user 2): Invalid data field in request" >&2; exit 1;;
  *) echo "Chassis Power is on";;
esac
""")
    (bindir / "ipmitool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    handler = handler_for("bmc.rotate")
    assert handler is not None
    params = handler.parse(site_pb2.BmcOperationRequest(
        bmc_address="10.0.0.3", protocol="ipmi", operation="rotate", credentials_ref=REF))
    with pytest.raises(BmcRefused) as info:
        handler.run(Context.local("bmc.rotate", site_config), params)
    assert "Invalid data field in request" in info.value.details["bmc_message"]
    store = SecretStore(site_config.secrets_dir)
    assert store.get(REF).password == PASSWORD and store.pending(REF) is None


def test_a_kill_during_the_password_change_leaves_no_file_behind(tmp_path: Path) -> None:
    """The daemon and its ``ipmitool exec`` SIGKILLed while the new password is with the
    child: no file holding it is left anywhere (not in $TMPDIR, which nothing sweeps)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ipmitool").write_text(f"""#!/bin/sh
case "$*" in
  *"user list"*) echo "2   admin            true    false      true       ADMINISTRATOR";;
  *exec*) for last; do :; done; cat "$last" > {tmp_path}/exec-input; echo $$ > {tmp_path}/exec-pid
          exec sleep 60;;
  *) echo "Chassis Power is on";;
esac
""")
    (bindir / "ipmitool").chmod(0o755)
    daemon = subprocess.Popen(
        [sys.executable, "-c", f"""
import threading, time
from agent.site.bmc.client import CallContext, Credentials, Target
from agent.site.bmc.ipmi import IpmiClient
c = IpmiClient(Target("10.9.9.9", Credentials("admin", {SECRET!r})),
               CallContext(threading.Event(), time.monotonic() + 120), ipmitool={str(bindir / "ipmitool")!r})
c.set_password("admin", "New-Secret-6hJ")
"""], env={**os.environ, "TMPDIR": str(tmpdir)}, cwd=Path(__file__).parents[3])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "exec-pid").exists() or not (tmp_path / "exec-pid").read_text():
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert (tmp_path / "exec-input").read_text() == "user set password 2 New-Secret-6hJ 16\n"
        daemon.kill()
        os.kill(int((tmp_path / "exec-pid").read_text()), signal.SIGKILL)
    finally:
        daemon.kill()
        daemon.wait()
    assert list(tmpdir.iterdir()) == []


def test_ipmi_sessions_are_capped_site_wide(tmp_path: Path, site_config: Config,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Six BMCs at once with ipmi_max_sessions 2: never more than two ipmitool runs at a time
    (the stand-in records when each ran), and every command succeeds."""
    stand_in_on_path(tmp_path, monkeypatch, f"""
echo "start $(date +%s.%N)" >> {tmp_path}/runs
sleep 0.3
echo "end $(date +%s.%N)" >> {tmp_path}/runs
echo "Chassis Power is on"
""")
    config = dataclasses.replace(site_config, ipmi_max_sessions=2)
    errors = power_status_on_scheduler(config, [f"10.0.1.{n + 1}" for n in range(6)])
    assert errors == [None] * 6, errors
    events = sorted((float(when), what) for what, when in
                    (line.split() for line in (tmp_path / "runs").read_text().splitlines()))
    running = most = 0
    for _, what in events:
        running += 1 if what == "start" else -1
        most = max(most, running)
    assert most == 2 and len(events) == 12, (most, events)
