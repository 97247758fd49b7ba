"""DCGM diagnostics through `dcgmi diag -r LEVEL -j`: the command line and its JSON.

Two JSON shapes exist (both come from dcgmi/Diag.cpp of the DCGM release):

* DCGM 2.x/3.x ("v2"): {"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests":
  [{"name", "results": [{"gpu_id": "0", "status", "info", "warnings": [{"warning" (or
  "warnings" for the deployment tests), "error_id", ...}]}]}]}]}, with "version",
  "Driver Version Detected", "GPU Device IDs" and "GPU Device Serials" at the top.
* DCGM 4.x ("v4"): {"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group":
  "GPU", "entity_group_id": 1, "entity_id": 0, "status", "info": [..], "warnings": [..]}],
  "test_summary": {"status"}]}, "entity_groups": [{"entity_group": "GPU", "entities": [..]}],
  "metadata": {"version", "Driver Version Detected"}}.

A run that could not happen prints {"DCGM ...": {"runtime_error": "...", "version"}}.
dcgmi's exit status is its dcgmReturn_t: 0, or 226 (-30, a test failed), 205 (-51, failed
and the GPU should be isolated), 235 (-21, no host engine)...
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import InvalidParameters, ToolFailed

ROOT_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
GPU_ENTITY_GROUP = 1  # DCGM_FE_GPU
_PARAM_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){1,2}")  # test.param, test.subtest.param
_PARAM_VALUE = re.compile(r"[A-Za-z0-9_.,:/+-]{1,256}")   # both used with fullmatch
_CONNECTION_FAILURES = (
    "unable to start an embedded host engine",
    "unable to connect to host engine",
    "unable to establish a connection",
    "host engine connection invalid",
)
_STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip",
             "skipped": "skip"}


@dataclass(frozen=True)
class DcgmTest:
    """One test's result on one GPU (gpu_index -1: not tied to one GPU)."""

    name: str
    category: str
    gpu_index: int
    status: str                      # "pass", "fail", "warn", "skip"
    info: str = ""
    warnings: tuple[str, ...] = ()
    error_codes: tuple[str, ...] = ()


class DcgmOutputError(ToolFailed):
    """dcgmi printed something that is not a diagnostic report."""


@dataclass(frozen=True)
class DcgmReport:
    json_format: str                 # "v2" or "v4"
    dcgm_version: str
    driver_version: str
    tests: list[DcgmTest]
    gpus: list[int]                  # the GPUs the run covered


def check_parameters(parameters: Mapping[str, str]) -> dict[str, str]:
    """DCGM test parameters ("memtest.test_duration" -> "60"), validated for `-p`."""
    if len(parameters) > 32:
        raise InvalidParameters("at most 32 DCGM test parameters")
    for key, value in parameters.items():
        if not _PARAM_KEY.fullmatch(key):
            raise InvalidParameters(f"DCGM parameter {key!r} is not of the form test.parameter "
                                    "or test.subtest.parameter")
        if not _PARAM_VALUE.fullmatch(value):
            raise InvalidParameters(f"DCGM parameter {key}: value {value!r} has characters dcgmi cannot take")
    return dict(sorted(parameters.items()))


def diag_argv(dcgmi: str, level: int, gpus: Sequence[int], parameters: Mapping[str, str],
              host: str | None = None) -> list[str]:
    """`dcgmi diag -r LEVEL -j [-i 0,1] [-p a.b=c;d.e=f] [--host H]`."""
    if level not in (1, 2, 3, 4):
        raise InvalidParameters(f"DCGM diagnostic level {level} is not 1 to 4")
    argv = [dcgmi, "diag", "-r", str(level), "-j"]
    if gpus:
        argv += ["-i", ",".join(str(g) for g in gpus)]
    if parameters:
        argv += ["-p", ";".join(f"{k}={v}" for k, v in parameters.items())]
    if host:
        argv += ["--host", host]
    return argv


def connection_failed(output: str) -> bool:
    """dcgmi says it could reach no host engine (nor start an embedded one)."""
    low = output.lower()
    return any(marker in low for marker in _CONNECTION_FAILURES)


def _document(text: str) -> dict[str, Any]:
    start, end = text.find("{"), text.rfind("}")
    if start < 0:
        raise DcgmOutputError(f"dcgmi printed no JSON: {_excerpt(text)}")
    if end < start:
        raise DcgmOutputError(f"dcgmi printed JSON that does not parse (truncated): {_excerpt(text)}")
    try:
        doc = json.loads(text[start:end + 1])
    except ValueError as exc:
        raise DcgmOutputError(f"dcgmi printed JSON that does not parse ({exc}): {_excerpt(text)}") from exc
    if not isinstance(doc, dict):
        raise DcgmOutputError(f"dcgmi printed JSON that is not an object: {_excerpt(text)}")
    return doc


def _excerpt(text: str, size: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text[:size] + ("..." if len(text) > size else ""))


def _status(raw: Any) -> str:
    return _STATUSES.get(str(raw).strip().lower(), "fail" if raw else "skip")


def _strings(raw: Any) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, list):
        return [str(x) for x in raw if x not in (None, "")]
    return [str(raw)] if raw != "" else []


def _warnings(raw: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    messages, codes = [], []
    for w in raw if isinstance(raw, list) else ([raw] if raw else []):
        if isinstance(w, dict):
            message = w.get("warning", w.get("warnings", ""))
            messages.append(str(message))
            if "error_id" in w:
                codes.append(str(w["error_id"]))
        else:
            messages.append(str(w))
    return tuple(messages), tuple(codes)


def _gpu_of(result: Mapping[str, Any]) -> int:
    if "entity_group" in result or "entity_group_id" in result:  # v4
        group = result.get("entity_group_id", GPU_ENTITY_GROUP if result.get("entity_group") == "GPU" else -1)
        return int(result.get("entity_id", -1)) if int(group) == GPU_ENTITY_GROUP else -1
    for key in ("gpu_id", "gpu_ids"):  # v2: "3", 3, or "0,1,2" for a deployment test
        value = str(result.get(key, "")).strip()
        if value.isdigit():
            return int(value)
    return -1


def parse(text: str) -> DcgmReport:
    """The report in dcgmi's output; DcgmOutputError when it is not one, ToolFailed for a
    runtime_error document (the diagnostic could not run)."""
    doc = _document(text)
    root_key = next((k for k in ROOT_KEYS if k in doc), None)
    if root_key is None or not isinstance(doc[root_key], dict):
        raise DcgmOutputError(f"dcgmi's JSON has none of {ROOT_KEYS}: {_excerpt(text)}")
    body = doc[root_key]
    if "runtime_error" in body:
        raise ToolFailed(f"DCGM could not run the diagnostic: {body['runtime_error']}",
                         dcgm_version=str(body.get("version", "")))
    categories = body.get("test_categories")
    if not isinstance(categories, list):
        raise DcgmOutputError(f"dcgmi's JSON has no test_categories list: {_excerpt(text)}")
    v4 = "metadata" in doc or "entity_groups" in doc or '"entity_id"' in text or '"test_summary"' in text
    tests: list[DcgmTest] = []
    try:
        for category in categories:
            for test in category.get("tests") or []:
                tests.extend(_test(str(category.get("category", "")), test))
    except (AttributeError, TypeError, ValueError) as exc:
        raise DcgmOutputError(f"dcgmi's JSON is not shaped like a diagnostic report ({exc})") from exc
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    version = str(meta.get("version") or doc.get("version") or body.get("version") or "")
    driver = str(meta.get("Driver Version Detected") or doc.get("Driver Version Detected") or "")
    return DcgmReport(
        json_format="v4" if v4 else "v2",
        dcgm_version=version,
        driver_version=driver,
        tests=tests,
        gpus=_gpus(doc, tests),
    )


def _test(category: str, test: Mapping[str, Any]) -> list[DcgmTest]:
    name = str(test.get("name", ""))
    results = test.get("results") or []
    if not results and isinstance(test.get("test_summary"), dict):
        results = [test["test_summary"]]
    out = []
    for r in results:
        messages, codes = _warnings(r.get("warnings"))
        out.append(DcgmTest(
            name=name,
            category=category,
            gpu_index=_gpu_of(r),
            status=_status(r.get("status")),
            info="; ".join(_strings(r.get("info"))),
            warnings=messages,
            error_codes=codes,
        ))
    return out


def _gpus(doc: Mapping[str, Any], tests: Sequence[DcgmTest]) -> list[int]:
    for group in doc.get("entity_groups") or []:
        if isinstance(group, dict) and (group.get("entity_group") == "GPU"
                                        or group.get("entity_group_id") == GPU_ENTITY_GROUP):
            return sorted(int(e["entity_id"]) for e in group.get("entities") or [] if "entity_id" in e)
    serials = doc.get("GPU Device Serials")
    if isinstance(serials, dict) and all(str(k).isdigit() for k in serials):
        return sorted(int(k) for k in serials)
    return sorted({t.gpu_index for t in tests if t.gpu_index >= 0})
