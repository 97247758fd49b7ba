"""The catalog in code against the seed table and the project's reading of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent import catalog
from agent.catalog import Lane, Role

DOC = Path(__file__).resolve().parent.parent / "docs" / "command-kinds.md"
SHARED = Path(__file__).resolve().parent.parent.parent / "shared"  # where the copy came from
UNITS = {"m": 60, "h": 3600, "s": 1}


def seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smh])", text)
    assert m, text
    return int(m.group(1)) * UNITS[m.group(2)]


def section(title: str) -> str:
    """The text of one ``## `` section of docs/command-kinds.md."""
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n") + len(title) + 5
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def seed_text() -> str:
    """The seed, verbatim: the fenced block of its section."""
    block = section("The seed, verbatim")
    return block[block.index("```text\n") + 8:block.rindex("```")]


def seed_rows() -> dict[str, list[str]]:
    """Rows of the seed as cells; the seed lost its empty cells, not their order."""
    rows = {}
    for line in seed_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        cells = [c for c in cells if c]
        if len(cells) < 5 or cells[0] in ("Kind",) or set(cells[0]) <= {"-"}:
            continue
        rows[cells[0]] = cells
    return rows


def reading_rows(text: str | None = None) -> dict[str, list[str]]:
    rows = {}
    for line in (section("The project's reading of it") if text is None else text).splitlines():
        if not line.startswith("| ") or line.startswith("| Kind"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


@pytest.fixture(scope="module")
def seed() -> dict[str, list[str]]:
    return seed_rows()


def test_the_copy_is_the_shared_table_where_that_is_there() -> None:
    """docs/command-kinds.md is a copy: where ../shared is beside the checkout, they agree."""
    if not (SHARED / "seed" / "command-kinds.txt").exists():
        pytest.skip(f"no {SHARED} beside this checkout: the project's copy is all there is")
    assert seed_text() == (SHARED / "seed" / "command-kinds.txt").read_text().rstrip("\n") + "\n"
    assert reading_rows() == reading_rows((SHARED / "catalog.md").read_text())


def test_exactly_the_seed_kinds(seed: dict[str, list[str]]) -> None:
    assert set(catalog.KINDS) == set(seed)


@pytest.mark.parametrize("name", sorted(catalog.KINDS))
def test_row_matches_seed(name: str, seed: dict[str, list[str]]) -> None:
    cells = seed[name]
    kind = catalog.KINDS[name]
    lane, roles, rest = cells[1], cells[2], cells[3:]
    yes = [c for c in rest if c == "yes"]
    others = [c for c in rest if c != "yes"]
    timeout, payload = others
    assert kind.lane == Lane(lane)
    assert kind.roles == frozenset(Role(r.strip()) for r in roles.split(","))
    assert kind.timeout_seconds == seconds(timeout)
    assert kind.payload == payload
    flags = (kind.retry_safe, kind.self_terminating, kind.attested, kind.destructive)
    assert sum(flags) == len(yes), f"{name}: the seed has {len(yes)} 'yes' cells"


@pytest.mark.parametrize("name", sorted(catalog.KINDS))
def test_row_matches_project_reading(name: str) -> None:
    row = reading_rows()[name]
    kind = catalog.KINDS[name]
    flags = tuple(c == "yes" for c in row[3:7])
    assert flags == (kind.retry_safe, kind.self_terminating, kind.attested, kind.destructive)
    assert kind.timeout_seconds == seconds(row[7])
    assert kind.payload == row[8]


def test_seed_sentences_hold() -> None:
    """The seed's own sentences: kexec, reboot, upgrade self-terminate; no other kind does."""
    selfterm = {k.name for k in catalog.KINDS.values() if k.self_terminating}
    assert selfterm == {"boot.kexec", "node.reboot", "daemon.upgrade"}
    assert catalog.KINDS["disk.wipe"].attested and catalog.KINDS["disk.wipe"].destructive
    assert catalog.KINDS["deploy.image"].destructive


def test_site_only_kinds_are_served_by_the_site_role_alone() -> None:
    site_only = {k.name for k in catalog.KINDS.values() if k.site_only}
    assert site_only == {
        "bmc.boot", "bmc.firmware", "bmc.power", "bmc.query", "bmc.rotate", "bmc.storage",
        "boot.cleanUp", "boot.prepareRamdisk", "site.httpProxy",
    }
    for name in site_only:
        assert not any(catalog.KINDS[name].serves(r) for r in (catalog.Role.RAMDISK, catalog.Role.NODE))
        assert catalog.KINDS[name].serves(catalog.Role.SITE)
