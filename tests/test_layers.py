"""The package's wings and the one rule between them: imports only run down.

A module of agent/ belongs to a wing: its sub-package (agent/hw/, agent/runtime/, ...), or the
base (the top-level modules every wing may use: errors, proc, catalog, config, ...). A wing may
import from wings in lower layers and from itself, never from its own layer or above. Every
import counts, the ones inside functions and under TYPE_CHECKING included.
"""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[1] / "agent"

# Lowest first. docs/architecture.md draws the same picture.
LAYERS: list[set[str]] = [
    {"base"},                                           # errors, proc, catalog, config, proto/, ...
    {"hw"},                                             # sysfs, ioctls, syscalls, the boot id
    {"net"},                                            # the HTTP client: pool, redirects, deadlines
    {"drivers", "security", "images", "policy", "link"},  # tools, trust, images, GPU rules, the session
    {"site", "gateway"},                                # the site's machinery; the reference gateway
    {"commands"},                                       # one handler per kind
    {"runtime"},                                        # admission, lanes, journal, streams
    {"cli"},                                            # agent run / exec / install / manifest
    {"__main__"},
]
RANK = {wing: i for i, layer in enumerate(LAYERS) for wing in layer}


def wing_of(module: str) -> str:
    """``agent.hw.block`` -> ``hw``; ``agent.errors``, ``agent.proto.x`` and ``agent`` -> ``base``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    if (AGENT / parts[1]).is_dir() and parts[1] != "proto":
        return parts[1]
    return "__main__" if parts[1] == "__main__" else "base"


def module_name(path: Path) -> str:
    rel = path.relative_to(AGENT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "agent" or node.module.startswith("agent.")):
            if node.module == "agent":
                out += [(node.lineno, f"agent.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("agent.")]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "relative"))
    return out


def sources() -> list[Path]:
    return sorted(p for p in AGENT.rglob("*.py") if not p.name.endswith("_pb2.py"))


def test_every_wing_has_a_layer() -> None:
    wings = {wing_of(module_name(p)) for p in sources()}
    assert wings <= set(RANK), f"wings without a layer in LAYERS: {sorted(wings - set(RANK))}"


def test_imports_only_run_down() -> None:
    upward = []
    for path in sources():
        mine = wing_of(module_name(path))
        for line, target in imports_of(path):
            assert target != "relative", f"{path}:{line}: the package uses absolute imports only"
            theirs = wing_of(target)
            if theirs != mine and RANK[theirs] >= RANK[mine]:
                upward.append(f"{path.relative_to(AGENT.parent)}:{line}: {mine} imports {target} ({theirs})")
    assert not upward, "imports that do not run down:\n" + "\n".join(upward)


def test_the_rule_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an import from hw into commands is found."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from agent.commands import base\n    import agent.site.boot.pxe\n")
    found = [(line, wing_of(target)) for line, target in imports_of(probe)]
    assert found == [(2, "commands"), (3, "site")]
    assert all(RANK[w] > RANK["hw"] for _, w in found)


# agent/site/'s own floors, lowest first: the same rule inside the wing. A module of site/ belongs
# to its sub-package (bmc, boot, serve, observe) or, at the top of site/, to itself (registries,
# services) or to the ground floor (metrics, ttltable, the content store, the package itself).
# boot/ stores its files in the content store while serve/ serves boot/'s entries, so the store
# sits below both: an import from boot/ into serve/ would tie the two wings into one knot.
SITE = AGENT / "site"
SITE_LAYERS: list[set[str]] = [
    {"ground"},                 # metrics.py, ttltable.py, chunkstore.py (the content store)
    {"bmc", "boot"},            # BMC control; the boot service (PXE entries, dnsmasq, vmedia)
    {"serve", "observe"},       # the provisioning network's HTTP service; boot timelines, consoles
    {"registries"},             # the image registries' credentials, for routes
    {"services"},               # the site daemon's services, started and stopped together
]
SITE_RANK = {wing: i for i, layer in enumerate(SITE_LAYERS) for wing in layer}


def site_wing_of(module: str) -> str | None:
    """``agent.site.boot.pxe`` -> ``boot``; ``agent.site.services`` -> ``services``;
    ``agent.site.ttltable`` and ``agent.site`` -> ``ground``; a module outside site/ -> None."""
    parts = module.split(".")
    if parts[:2] != ["agent", "site"]:
        return None
    if len(parts) == 2:
        return "ground"
    if (SITE / parts[2]).is_dir() or parts[2] in SITE_RANK:
        return parts[2]
    return "ground"


def site_knots(paths: list[Path], name_of: dict[Path, str]) -> list[str]:
    """Imports inside site/ that run sideways or up its floors, as ``path:line: ...`` lines."""
    found = []
    for path in paths:
        mine = site_wing_of(name_of[path])
        assert mine is not None
        for line, target in imports_of(path):
            theirs = site_wing_of(target)
            if theirs is not None and theirs != mine and SITE_RANK[theirs] >= SITE_RANK[mine]:
                found.append(f"{path.name}:{line}: {mine} imports {target} ({theirs})")
    return found


def test_every_site_module_has_a_floor() -> None:
    wings = {site_wing_of(module_name(p)) for p in SITE.rglob("*.py")}
    assert wings <= set(SITE_RANK), f"site/ wings without a floor: {sorted(wings - set(SITE_RANK))}"


def test_site_imports_only_run_down_its_floors() -> None:
    paths = sorted(SITE.rglob("*.py"))
    knots = site_knots(paths, {p: module_name(p) for p in paths})
    assert not knots, "site/ imports that do not run down its floors:\n" + "\n".join(knots)


def test_the_site_rule_refuses_the_old_knot(tmp_path: Path) -> None:
    """The knot this order ended: boot/ reading the content store from serve/ while serve/ imports
    boot/. Each half alone is refused (boot -> serve runs up), as is a sideways import (bmc ->
    boot); the store on the ground floor is allowed to both."""
    boot = tmp_path / "pxe.py"
    boot.write_text("from agent.site.serve.chunkstore import ChunkStore\n"
                    "from agent.site.chunkstore import DIGEST\n")
    bmc = tmp_path / "client.py"
    bmc.write_text("def f():\n    from agent.site.boot import pxe\n")
    serve = tmp_path / "web.py"
    serve.write_text("from agent.site.boot.pxe import BootEntries\nimport agent.site.chunkstore\n")
    names = {boot: "agent.site.boot.pxe", bmc: "agent.site.bmc.client", serve: "agent.site.serve.web"}
    assert site_knots([boot, bmc, serve], names) == [
        "pxe.py:1: boot imports agent.site.serve.chunkstore (serve)",
        "client.py:2: bmc imports agent.site.boot (boot)",
    ]


# Circles between modules still standing, each to be ended by the change that names it; the test
# below refuses any other, and refuses an entry here once its circle is gone.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def _module_files(top: Path) -> dict[str, Path]:
    return {module_name_under(p, top.parent): p for p in sorted(top.rglob("*.py"))
            if not p.name.endswith("_pb2.py") and "out" not in p.relative_to(top).parts}


def module_name_under(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(tops: list[Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``tops`` it imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    files: dict[str, Path] = {}
    for top in tops:
        files |= _module_files(top)
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.append(sub if sub in files else node.module)
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_circle_between_modules() -> None:
    found = set(circles(import_graph([AGENT, AGENT.parent / "initramfs"])))
    new = [sorted(c) for c in found - KNOWN_CIRCLES]
    gone = [sorted(c) for c in KNOWN_CIRCLES - found]
    assert not new, f"modules that import each other (move what both need down a module): {new}"
    assert not gone, f"circles ended: remove them from KNOWN_CIRCLES: {gone}"


def test_the_circle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


# Inside a wing: a sub-folder that names a subsystem of its own, and the modules of its wing it
# must never import (the rest of the wing calls it, not the other way round).
INNER_ORDER: dict[str, str] = {
    "agent.gateway.verifier": "agent.gateway",  # the verifier knows nothing of sessions or commands
}


def inner_violations(module: str, imports: list[tuple[int, str]]) -> list[str]:
    """The imports of ``module`` that break INNER_ORDER, as "line: target"."""
    found = []
    for sub, wing in INNER_ORDER.items():
        if module != sub and not module.startswith(sub + "."):
            continue
        for line, target in imports:
            if (target == wing or target.startswith(wing + ".")) \
                    and target != sub and not target.startswith(sub + "."):
                found.append(f"{line}: {target}")
    return found


def test_the_verifier_imports_nothing_of_the_rest_of_the_gateway() -> None:
    paths = [p for p in sources() if module_name(p).startswith("agent.gateway.verifier")]
    assert len(paths) > 5, "agent/gateway/verifier/ holds the attestation verifier"
    bad = [f"{p.relative_to(AGENT.parent)}:{v}" for p in paths
           for v in inner_violations(module_name(p), imports_of(p))]
    assert not bad, "the verifier reaches into the gateway's session side:\n" + "\n".join(bad)


def test_the_inner_rule_catches_a_verifier_importing_the_server(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from agent.gateway.records import State\nfrom agent.gateway.verifier import eventlog\n"
                     "def f():\n    from agent.gateway import server\n")
    found = inner_violations("agent.gateway.verifier.probe", imports_of(probe))
    assert found == ["1: agent.gateway.records", "4: agent.gateway"]
    assert inner_violations("agent.gateway.server", imports_of(probe)) == []


def test_each_side_of_attestation_holds_only_its_half() -> None:
    """The node's attestor and the verifier share agent/security/attest_contract.py, nothing else."""
    node = AGENT / "security" / "attest.py"
    verifier = [p for p in sources() if module_name(p).startswith("agent.gateway.verifier")]
    assert not [t for _, t in imports_of(node) if t.startswith("agent.gateway")]
    reach = [f"{p.name}:{line}" for p in verifier for line, t in imports_of(p)
             if t == "agent.security.attest"]
    assert not reach, f"the verifier imports the node's attestor: {reach}"
    assert any(t == "agent.security.attest_contract" for p in verifier for _, t in imports_of(p))
