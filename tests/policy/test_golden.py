"""The golden-state diff: every item added, removed or changed is a finding; rules say what varies."""

from __future__ import annotations

import pytest

from agent.errors import InvalidParameters
from agent.policy.release.golden import Capture, Rules, diff


def test_added_removed_changed_and_what_varies() -> None:
    golden = Capture({"uefi": {"Boot0000": "a", "Timeout": "5", "MonotonicCounter": "1"}})
    seen = Capture({"uefi": {"Boot0000": "b", "Driver0001": "x", "MonotonicCounter": "9"}})
    d = diff(golden, seen, Rules({"uefi": ("Monotonic*",)}))
    assert [(c.check, c.path) for c in d.changes] == [
        ("uefi.changed", "Boot0000"), ("uefi.added", "Driver0001"), ("uefi.removed", "Timeout")]
    assert d.compared == {"uefi": 3} and d.varied == {"uefi": 1} and not d.unreadable


def test_a_source_not_read_is_unreadable_never_a_pass() -> None:
    golden = Capture({"tpm": {"handle/0x81010001": "ek"}, "uefi": {}})
    d = diff(golden, Capture({"uefi": {}}, unreadable={"bmc": "timeout"}))
    assert d.unreadable == {"tpm": "not read (the golden state has it)", "bmc": "timeout"}
    assert d.compared == {"uefi": 0}


def test_capture_round_trips_and_bad_input_is_refused() -> None:
    c = Capture({"nvme": {"nvme0n1/lbaf": "512+8"}}, unreadable={"nic": "no mlxconfig"})
    assert Capture.from_json(c.to_json()) == c
    for bad in (b"[]", b'{"format": 2}', b'{"format": 1, "sources": {"Bad Name": {}}}',
                b'{"format": 1, "sources": {"uefi": {"a": 1}}}'):
        with pytest.raises(InvalidParameters):
            Capture.from_json(bad)
    with pytest.raises(InvalidParameters):
        Rules.from_json(b'{"vary": {"uefi": "not a list"}}')
    assert Rules.from_json(b'{"vary": {"uefi": ["Mono*"]}}').varies("uefi", "Monotonic")


def test_rules_say_why_each_pattern_varies_and_a_reason_for_no_pattern_is_refused() -> None:
    rules = Rules.from_json(b'{"vary": {"uefi": ["MTC-*"]}, '
                            b'"why": {"uefi": {"MTC-*": "one higher per boot"}}}')
    assert rules.why == {"uefi": {"MTC-*": "one higher per boot"}} and rules.varies("uefi", "MTC-x")
    assert Rules.from_json(b'{"vary": {"uefi": ["MTC-*"]}}').why == {}
    for bad in (b'{"vary": {"uefi": ["MTC-*"]}, "why": {"uefi": {"Boot*": "a pattern vary lacks"}}}',
                b'{"vary": {"uefi": ["MTC-*"]}, "why": {"uefi": {"MTC-*": 1}}}',
                b'{"vary": {}, "why": []}'):
        with pytest.raises(InvalidParameters, match="why"):
            Rules.from_json(bad)
