"""The demo's timeline lines (the demo itself boots QEMU: ./dev demo)."""

from __future__ import annotations

from agent.proto import session_pb2
from qemu.demo import MIB, deployed, progress_line


def test_deploy_progress_uses_the_summary_s_unit_and_words() -> None:
    p = session_pb2.Progress(fraction=0.9, done=9 * MIB, total=10 * MIB, rate=3 * MIB,
                             message=f"{64 * MIB} image bytes, {24 * MIB} written, {40 * MIB} skipped")
    line = progress_line("deploy.image", p)
    assert line == ("deploy.image  90.0% 64.0 MiB of image (24.0 MiB written, 40.0 MiB of zero blocks "
                    "skipped) so far; 9.0 MiB of 10.0 MiB read at 3.0 MiB/s")
    assert deployed(98 * MIB, 30 * MIB, 68 * MIB) == (
        "98.0 MiB of image (30.0 MiB written, 68.0 MiB of zero blocks skipped)")
    assert str(64 * MIB) not in line  # no raw byte counts


def test_a_progress_without_a_fraction_shows_no_percentage() -> None:
    fetch = session_pb2.Progress(fraction=-1, done=5 * MIB, message="fetching the kernel")
    assert progress_line("boot.kexec", fetch) == "boot.kexec fetching the kernel, 5.0 MiB so far"
    start = session_pb2.Progress(fraction=-1, message="fetching the kernel from disk S1 /boot/vmlinuz")
    assert progress_line("boot.kexec", start) == "boot.kexec fetching the kernel from disk S1 /boot/vmlinuz"
    assert "?" not in progress_line("boot.kexec", fetch) + progress_line("boot.kexec", start)


def test_other_progress_in_mib_and_counts_as_they_are() -> None:
    wipe = session_pb2.Progress(fraction=0.5, done=80 * MIB, total=160 * MIB, rate=MIB,
                                message="overwrite zeros")
    assert progress_line("disk.wipe", wipe) == (
        "disk.wipe  50.0% overwrite zeros, 80.0 MiB of 160.0 MiB done at 1.0 MiB/s")
    samples = session_pb2.Progress(fraction=0.25, done=16, total=64, message="verifying samples")
    assert progress_line("disk.wipe", samples) == "disk.wipe  25.0% verifying samples, 16 of 64"
