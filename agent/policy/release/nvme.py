"""The release gate's NVMe area: each controller's namespace layout."""

from __future__ import annotations

from agent.policy.release.findings import Found, invoke
from agent.policy.release.state import NvmeLayout, Observed


def check_nvme(e: NvmeLayout, seen: Observed, out: Found) -> None:
    if not seen.nvme and "nvme" in seen.unread:
        out.add("nvme.unreadable", "nvme-cli", "unreadable", "", f"NVMe layout: {seen.unread['nvme']}")
    for c in seen.nvme:
        if c.error:
            out.add("nvme.unreadable", "readable", "unreadable", c.name, f"{c.name}: {c.error}")
            continue
        remedy = (invoke("nvme", "factory_layout", device=f"/dev/{c.name}", namespaces=e.namespaces,
                         lba_data_size=e.lba_data_size)
                  if c.managed and e.namespaces and e.lba_data_size else None)
        seen_before = len(out.mismatches)
        detached = sorted(set(c.namespaces) - set(c.attached))
        if e.namespaces and (len(c.namespaces) != e.namespaces or detached):
            also = f", {len(detached)} detached ({','.join(map(str, detached))})" if detached else ""
            out.add("nvme.namespaces", e.namespaces, f"{len(c.namespaces)}{also}", c.name,
                    f"{c.name} has {len(c.namespaces)} namespace(s) "
                    f"({','.join(map(str, c.namespaces)) or 'none'}){also}, "
                    f"the factory layout {e.namespaces}")
        if e.full_capacity and c.unallocated_bytes:
            out.add("nvme.capacity", 0, c.unallocated_bytes, c.name,
                    f"{c.name} leaves {c.unallocated_bytes} bytes unallocated to any namespace")
        for nsid, size in sorted(c.lba_sizes.items()):
            if e.lba_data_size and size != e.lba_data_size:
                out.add("nvme.lba_size", e.lba_data_size, size, f"{c.name}n{nsid}",
                        f"{c.name}n{nsid} is formatted with {size}-byte blocks, "
                        f"the baseline {e.lba_data_size}")
        for m in out.mismatches[seen_before:]:     # the whole layout, put back at once, before disk.wipe
            if remedy is not None:
                m.remedy.CopyFrom(remedy)
            else:
                m.message += ("; the drive has no namespace management: its layout cannot be changed "
                              "from the OS" if not c.managed else
                              "; the baseline names no namespace count and LBA size to put it back to")
