"""``secure_boot_violation`` (agent/site/observe/causes.py) on console text recorded from OVMF's
Secure Boot build with a fleet's keys enrolled (tests/e2e/test_secure_boot.py): the firmware's
refusal is a milestone of the kept console, and the cause is named at once with the console's
line, not at a timeout."""

from __future__ import annotations

from agent.site.observe.causes import NAMES
from agent.site.observe.console import clean, milestone
from agent.site.observe.timeline import Outcome, Step, Timelines
from tests.site.observe.test_causes import (
    IP,
    KERNEL,
    Clock,
    boot_to_script,
    cause,
    clock,  # noqa: F401  (a fixture)
    ev,
    prepare,
    tl,  # noqa: F401  (a fixture)
)

# The firmware's PXE started an unsigned ipxe.efi: edk2's BDS and LoadImage's answer.
OVMF_REFUSED = ('BdsDxe: failed to load Boot0001 "UEFI PXEv4 (MAC:5254005E0001)" from PciRoot(0x0)/'
                "Pci(0x1,0x0)/MAC(5254005E0001,0x1)/IPv4(0.0.0.0,0x0,DHCP,0.0.0.0,0.0.0.0,0.0.0.0): "
                "Access Denied")
# The signed iPXE fetched an unsigned UKI (or one another key signed) and the firmware's
# LoadImage refused it: Debian's iPXE's probe calls that no EFI image.
IPXE_REFUSED = "\x1b[0mCould not boot: Exec format error (http://ipxe.org/2e008081)\r"
# Around them, on the same console: not refusals.
NOT_REFUSALS = (
    'BdsDxe: loading Boot0001 "UEFI PXEv4 (MAC:5254005E0001)" from PciRoot(0x0)/Pci(0x1,0x0)',
    "Could not boot: Error 0x00000001 (http://ipxe.org/00000001)",
    "bettercompute: the ramdisk did not boot; next device",
    "Could not boot image: No such file or directory (http://ipxe.org/2d0c613b)",
)


def test_the_refusals_are_milestones_and_the_rest_is_not() -> None:
    assert "secure_boot_violation" in NAMES
    assert milestone(clean(OVMF_REFUSED)) == Step.SECURE_BOOT_DENIED
    assert milestone(clean(IPXE_REFUSED)) == Step.SECURE_BOOT_DENIED
    shell = "Shell> bootx64.efi: Command Error Status: Security Violation"
    assert milestone(shell) == Step.SECURE_BOOT_DENIED
    for line in NOT_REFUSALS:
        assert milestone(line) != Step.SECURE_BOOT_DENIED, line


def test_an_unsigned_ipxe_is_named_at_once_with_the_firmwares_line(tl: Timelines, clock: Clock) -> None:  # noqa: F811
    prepare(tl, clock)
    tl.console("n1", Step.FIRMWARE, "BdsDxe: loading Boot0001")
    tl.console("n1", Step.SECURE_BOOT_DENIED, clean(OVMF_REFUSED))
    assert cause(tl, clock) == "secure_boot_violation"
    a = tl.last("n1")
    assert a is not None and "Access Denied" in a.cause_detail and "Boot0001" in a.cause_detail


def test_a_uki_refused_after_its_fetch_is_named_not_no_kernel(tl: Timelines, clock: Clock) -> None:  # noqa: F811
    boot_to_script(tl, clock)
    tl.by_ip(IP, ev(clock, Step.TFTP_SENT, "ipxe.efi"))   # the firmware's PXE started the site's iPXE
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)     # the UKI served whole
    tl.console("n1", Step.SECURE_BOOT_DENIED, clean(IPXE_REFUSED))
    assert cause(tl, clock) == "secure_boot_violation"
    a = tl.last("n1")
    assert a is not None and "Exec format error" in a.cause_detail


def test_a_bios_ipxe_that_cannot_run_an_efi_image_is_no_violation(tl: Timelines, clock: Clock) -> None:  # noqa: F811
    """undionly.kpxe says the same words of a UKI (an EFI image it cannot run): that is the
    entry's mistake, not the firmware's refusal, and is left to the other rules."""
    boot_to_script(tl, clock)
    tl.by_ip(IP, ev(clock, Step.TFTP_SENT, "undionly.kpxe"))
    tl.cache_fetch(IP, KERNEL, 200, 9000, 0.0)
    tl.console("n1", Step.SECURE_BOOT_DENIED, clean(IPXE_REFUSED))
    assert cause(tl, clock) != "secure_boot_violation"


def test_a_refusal_the_boot_got_past_ends_as_joined(tl: Timelines, clock: Clock) -> None:  # noqa: F811
    """One image refused (the firmware's first boot option) and the boot went on to join: the
    attempt ends joined, as any named cause does when the node joins after all."""
    boot_to_script(tl, clock)
    tl.console("n1", Step.SECURE_BOOT_DENIED, clean(OVMF_REFUSED))
    tl.console("n1", Step.KERNEL_STARTED, "Linux version 6.1")
    tl.console("n1", Step.JOINED, "connected to gateway gw at 10.0.0.1:7443")
    a = tl.last("n1")
    assert a is not None and a.outcome == Outcome.JOINED
