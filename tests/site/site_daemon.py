"""The site's services in a process of their own, for tests that run them inside a network
namespace (``ip netns exec NS python tests/site/site_daemon.py ...``).

It starts the site's services (agent/site/services.py) with the given settings, then reads
one JSON command a line on stdin ({"kind": "boot.prepareRamdisk", "payload": {...}}), runs the
kind's real handler with them in its context and writes one JSON line on stdout:
{"ok": true, "result": {...}} or {"ok": false, "error": "..."}.
{"kind": "counters"} answers with the dnsmasq supervisor's counters (PXE offers, TFTP files);
{"kind": "timeline", "payload": {"node_id": ...}} with the node's boot attempts (agent/site/observe/).
Logs (every HTTP request the service answers) go to stderr. EOF on stdin stops it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

from google.protobuf import json_format  # noqa: E402
from google.protobuf.message import Message  # noqa: E402

from agent import schema  # noqa: E402
from agent.commands import handler_for  # noqa: E402
from agent.commands.base import Context  # noqa: E402
from agent.errors import AgentError  # noqa: E402
from agent.site.services import ServiceSettings, SiteServices  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--port", type=int, default=8088)
    p.add_argument("--interface", default="")
    # Scripts served to any address (tests/site/boot/test_pxe_storm.py: its 32 clients share one
    # NIC, so no neighbour table can tie each MAC to its own address; the binding itself is
    # tested in test_pxe.py and test_ipxe_qemu.py).
    p.add_argument("--untied-scripts", action="store_true")
    a = p.parse_args()
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(message)s")
    site = SiteServices(ServiceSettings(address=a.address, port=a.port, root=a.root,
                                        interface=a.interface, upstreams=("127.0.0.1",)))
    site.start()
    if a.untied_scripts:
        site.entries.clients_tied = False
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            kind = request["kind"]
            if kind == "timeline":     # a node's attempts as the site saw them (site/observe/)
                attempts = site.observe.timelines.attempts(request["payload"]["node_id"])
                print(json.dumps({"ok": True, "result": [a.to_dict() for a in attempts]}), flush=True)
                continue
            if kind == "counters":     # what a scrape of the site's services would read
                dnsmasq = site.dnsmasq
                print(json.dumps({"ok": True, "result": dataclasses.asdict(dnsmasq.counters)
                                  if dnsmasq is not None else {}}), flush=True)
                continue
            try:
                h = handler_for(kind)
                assert h is not None, kind
                payload = schema.payload_from_json(kind, request.get("payload", {}))
                result = h.run(Context.local(kind, site=site), h.parse(payload))
                assert isinstance(result, Message)
                out = {"ok": True, "result": json_format.MessageToDict(
                    result, preserving_proto_field_name=True)}
            except AgentError as exc:
                out = {"ok": False, "error": exc.message}
            print(json.dumps(out), flush=True)
    finally:
        site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
