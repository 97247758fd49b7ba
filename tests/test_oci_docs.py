"""docs/oci.md's deploy command lines are ones that work: every deploy.image payload the page
shows (on an ``agent exec deploy.image`` line, or the JSON of its payload file) parses as the
kind's payload and passes deploy.image's checks, and together they show a tag, a digest,
``http_headers`` (in a file, never in argv) and a site route's proxy_url."""

from __future__ import annotations

import re
from pathlib import Path

from agent import schema
from agent.commands.deploy import DeployImage
from agent.proto import agent_pb2

DOC = Path(__file__).resolve().parent.parent / "docs" / "oci.md"


def section() -> str:
    text = DOC.read_text()
    start = text.index("### The command lines")
    return text[start: text.index("\n## ", start)]


def payloads() -> list[str]:
    found = []
    for line in section().splitlines():
        line = line.strip()
        if line.startswith("agent exec deploy.image") and "--payload '" in line:
            found.append(line.split("--payload '", 1)[1].rsplit("'", 1)[0])
        elif line.startswith('{"url"'):
            found.append(line)
    return found


def test_the_documented_deploy_payloads_pass_deploy_images_checks() -> None:
    shown = payloads()
    assert len(shown) >= 5, shown
    for text in shown:
        msg = schema.payload_from_json("deploy.image", text)
        assert isinstance(msg, agent_pb2.DeployImageRequest)
        DeployImage().parse(msg)          # raises InvalidParameters on a payload it would refuse
    urls = " ".join(shown)
    assert re.search(r"oci://\S+:[\w.]+\"", urls) and "@sha256:" in urls
    assert "/r/" in urls                  # a site route's proxy_url
    headers = [t for t in shown if "http_headers" in t]
    assert headers and not any("--payload '" in line and "http_headers" in line
                               for line in section().splitlines())   # a header's secret never in argv


def test_the_documented_route_request_parses() -> None:
    routes = [line.strip() for line in section().splitlines() if line.strip().startswith('{"node_id"')]
    assert routes
    for text in routes:
        msg = schema.payload_from_json("site.httpProxy", text)
        assert msg.upstream_url.startswith("oci://")  # type: ignore[attr-defined]


def test_the_page_says_what_a_digest_failure_leaves_on_the_disk() -> None:
    text = DOC.read_text()
    assert "### What the disk holds after a failure" in text and "unverified bytes" in text
