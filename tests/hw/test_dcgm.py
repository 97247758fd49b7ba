"""agent.hw.dcgm: dcgmi's command line and both JSON shapes, including their quirks."""

from __future__ import annotations

import json

import pytest

from agent.errors import InvalidParameters, ToolFailed
from agent.hw import dcgm


def test_argv() -> None:
    assert dcgm.diag_argv("dcgmi", 2, [], {}) == ["dcgmi", "diag", "-r", "2", "-j"]
    assert dcgm.diag_argv("/opt/dcgmi", 4, [1, 7], {"a.b": "1"}, host="unix:///run/x.sock") == [
        "/opt/dcgmi", "diag", "-r", "4", "-j", "-i", "1,7", "-p", "a.b=1", "--host", "unix:///run/x.sock"]
    with pytest.raises(InvalidParameters):
        dcgm.diag_argv("dcgmi", 0, [], {})


def test_parameters_are_checked_and_sorted() -> None:
    assert list(dcgm.check_parameters({"z.y": "1", "a.b": "2.5"})) == ["a.b", "z.y"]
    assert dcgm.check_parameters({"pcie.h2d_d2h_single_pinned.min_bandwidth": "20"})
    for bad in ({"a": "1"}, {"a.b.c.d": "1"}, {"a.b": ""}, {"a.b": "1;c.d=2"}, {"a.b": "x y"}, {"-a.b": "1"}):
        with pytest.raises(InvalidParameters):
            dcgm.check_parameters(bad)


def test_dcgm3_deployment_failure_quirks() -> None:
    # DCGM 3.x: a failed deployment test names the GPU as an integer and its message under
    # "warnings" (the per-GPU tests use "warning" and a string gpu_id).
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "Persistence Mode", "results": [{"gpu_id": 2, "status": "Fail", "warnings": [
            {"warnings": "Persistence mode for GPU 2 is disabled.", "error_id": 29,
             "error_category": 8, "error_severity": 5}]}]}]}]}, "version": "3.3.5"}
    report = dcgm.parse("Some banner line\n" + json.dumps(doc, indent=3) + "\n")
    [t] = report.tests
    assert (report.json_format, t.gpu_index, t.status, t.warnings, t.error_codes) == (
        "v2", 2, "fail", ("Persistence mode for GPU 2 is disabled.",), ("29",))
    assert report.gpus == [2]


def test_dcgm4_cpu_entities_and_summaries() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "cpu_eud", "results": [{"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0,
                                         "status": "Pass"}], "test_summary": {"status": "Pass"}},
        {"name": "eud", "test_summary": {"status": "Skip"}}]}]},
        "metadata": {"version": "4.4.1"}}
    report = dcgm.parse(json.dumps(doc))
    assert report.json_format == "v4" and report.dcgm_version == "4.4.1" and report.gpus == []
    assert [(t.name, t.gpu_index, t.status) for t in report.tests] == [("cpu_eud", -1, "pass"),
                                                                     ("eud", -1, "skip")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no JSON"),
        ("Error: unable to initialize DCGM\n", "no JSON"),
        ('{"DCGM Diagnostic": {', "truncated"),
        ("{not json}", "does not parse"),
        ('{"something": "else"}', "has none of"),
        ('{"DCGM Diagnostic": {"test_categories": 7}}', "no test_categories"),
        ('{"DCGM Diagnostic": {"test_categories": [{"tests": [3]}]}}', "not shaped like"),
    ],
)
def test_output_that_is_not_a_report(text: str, message: str) -> None:
    with pytest.raises(dcgm.DcgmOutputError, match=message):
        dcgm.parse(text)


def test_runtime_error() -> None:
    with pytest.raises(ToolFailed, match="could not run the diagnostic: boom") as info:
        dcgm.parse('{"DCGM Diagnostic": {"runtime_error": "boom", "version": "4.1.0"}}')
    assert not isinstance(info.value, dcgm.DcgmOutputError)
    assert info.value.details["dcgm_version"] == "4.1.0"


def test_connection_failure_is_recognised() -> None:
    assert dcgm.connection_failed("Error: Unable to start an embedded host engine. Library not found.")
    assert dcgm.connection_failed("Error: unable to establish a connection to the specified host: x")
    assert not dcgm.connection_failed('{"DCGM Diagnostic": {}}')
