"""How the IPMI client treats a BMC that is busy or refuses: ipmi_sim cannot be made busy, so
a stand-in ``ipmitool`` (a script) answers like a busy BMC for its first calls, then like a
healthy one, and records each call's argv and whether the password came by environment."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from agent.errors import BmcRefused
from agent.site.bmc import CallContext, Credentials, Pacing, PowerState, Target
from agent.site.ipmi import IpmiClient

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


def test_a_bmc_busy_for_ever_is_given_up_within_bounds(tmp_path: Path) -> None:
    tool = fake_ipmitool(tmp_path, busy_calls=1000, final="")
    c = client(tool, Pacing(min_interval=0.05, max_interval=0.1))
    with pytest.raises(BmcRefused, match="still busy after 8 attempts"):
        c.power_state()
    assert c.attempts == 8
