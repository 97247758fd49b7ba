"""A join the gateway refused (boot.cleanUp's join_refused: agent/commands/boot.py) in the
node's timeline: it names the cause ``refused`` whether the console saw the agent connect
before the verdict came or after it, and the clean-up that carries it ends nothing the cause
has named."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.commands.boot import MAX_REFUSAL, parse_refusal
from agent.errors import InvalidParameters
from agent.site.observe.causes import Diagnosis
from agent.site.observe.timeline import Outcome, Prepared, Step, Timelines
from tests.site.observe.test_causes import Clock, timelines

MAC = "52:54:00:00:00:01"
WHY = "attestation refused (event_log): the event log does not replay to the quoted PCRs"


@pytest.fixture
def tl(tmp_path: Path) -> Timelines:
    t = timelines(tmp_path / "timeline", Clock(), Diagnosis())
    t.prepared("n1", Prepared("pxe", MAC, 1_800_003_600.0, "a" * 64, "b" * 64))
    t.power("n1", "on")
    return t


def test_refused_after_the_console_saw_the_join(tl: Timelines) -> None:
    joined: list[str] = []
    tl.on_joined = lambda node, a: joined.append(node)
    tl.console("n1", Step.JOINED, "agent.link.session: connected to gateway 10.0.2.100:443")
    assert tl.last("n1").outcome == Outcome.JOINED  # type: ignore[union-attr]
    tl.verdict("n1", False, WHY)
    tl.cleaned("n1")
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.FAILED
    assert (a.cause, a.cause_detail) == ("refused", f"the gateway refused the join: {WHY}")
    assert [e.step for e in a.events][-3:] == [Step.JOINED, Step.REFUSED, Step.CLEANED]
    assert joined == ["n1"]


def test_the_console_s_join_after_the_verdict_does_not_undo_it(tl: Timelines) -> None:
    tl.verdict("n1", False, WHY)
    tl.console("n1", Step.JOINED, "agent.link.session: connected to gateway 10.0.2.100:443")
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.FAILED and a.cause == "refused"


def test_a_join_without_a_verdict_stays_joined(tl: Timelines) -> None:
    tl.console("n1", Step.JOINED, "agent.link.session: connected to gateway 10.0.2.100:443")
    tl.cleaned("n1")
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.JOINED and a.cause == ""


def test_a_refusal_is_kept_as_one_bounded_line() -> None:
    assert parse_refusal("") == ""
    said = parse_refusal("attestation refused\n(pcr4):\x1b[31m  bad ")
    assert said == "attestation refused (pcr4): [31m bad"
    assert len(parse_refusal("x" * (4 * MAX_REFUSAL))) == MAX_REFUSAL
    with pytest.raises(InvalidParameters, match="join_refused"):
        parse_refusal("x" * (4 * MAX_REFUSAL + 1))


def test_the_observer_keeps_no_verdict_of_a_node_it_never_saw_boot(tmp_path: Path) -> None:
    from agent.site.observe.observer import Observer, ObserverSettings

    obs = Observer(ObserverSettings(tmp_path / "observe", tmp_path / "secrets"))
    obs.verdict("elsewhere-1", joined=False, detail=WHY)
    assert obs.timelines.nodes() == []
    obs.timelines.power("n1", "on")
    obs.verdict("n1", joined=False, detail=WHY)
    a = obs.timelines.last("n1")
    assert a is not None and a.cause == "refused"
