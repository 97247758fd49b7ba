"""Inside the lab BMC's own mount namespace (``unshare --mount``, tests/site/observe/sshbmc.py):
the lab's passwd and shadow over the host's, a tmpfs on /run with sshd's privilege-separation
folder, then sshd in the foreground. Only this namespace sees the mounts.

    python sshbmc_ns.py <folder> /usr/sbin/sshd
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(folder: str, sshd: str) -> None:
    for name in ("passwd", "shadow"):
        subprocess.run(["mount", "--bind", os.path.join(folder, name), f"/etc/{name}"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", "/run"], check=True)
    os.mkdir("/run/sshd", 0o755)
    os.execv(sshd, [sshd, "-D", "-e", "-f", os.path.join(folder, "sshd_config")])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
