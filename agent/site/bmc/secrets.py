"""The site's secret store: BMC credentials named by ``credentials_ref``.

A request names an entry, never a secret. The store is a directory on the site server
(setting ``secrets_dir``, default /var/lib/bettercompute-agent/secrets), root-only::

    secrets/                 0700
      rack1-n01/             0700, one directory per entry (the ref)
        current.json         0600  {"username": ..., "password": ...}
        pending.json         0600  only during a rotation: the password being proven

Entries may also come from an existing secret manager mounted there (a Vault agent or a
Kubernetes secret volume): a directory with the two files ``username`` and ``password``.
Those are used read-only; a rotation of such an entry is refused (rotate it at its source).

Nothing of an entry is followed out of the store: the entry itself must be a directory (a
symlink there is refused, wherever it points), and a file's symlinks are followed only while
they stay inside the entry's own directory (``password -> ..data/password``, as Kubernetes
mounts a secret), each step opened with O_NOFOLLOW (``open_beneath``).

Writes are atomic (a temp file in the same directory, fsync, rename, fsync of the directory),
so a crash leaves the old file or the new one, never a torn one.

Rotation keeps the working password until the new one is proven (bmc.rotate):
``stage`` writes ``pending.json`` beside ``current.json``; the BMC is changed and the new
password proven; ``promote`` renames pending over current. A crash anywhere in between
leaves both readable, and ``reconcile`` (run before the entry's next use) asks the BMC which
of the two it accepts and keeps that one. The site is never locked out of a BMC.

Nothing here logs, returns in an error, or puts in a message a username's password; errors
name the ref and the file, which are not secrets.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets as _random
import stat
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from agent.atomicfile import write_atomic
from agent.errors import AgentError, InvalidParameters, NotFound, Reason, Unsupported
from agent.site.bmc.client import Credentials

log = logging.getLogger(__name__)

CURRENT = "current.json"
PENDING = "pending.json"
KNOWN_HOSTS = ".known_hosts"     # the BMCs' pinned SSH host keys, one file per BMC
MAX_ENTRY_BYTES = 64 * 1024
REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SecretStoreError(AgentError):
    """The entry a request names is unusable (permissions, not JSON, empty): the site's
    operator must fix it; the message names the ref and the file, never their content."""

    reason = Reason.INVALID_PARAMETERS


def check_ref(ref: str) -> str:
    """A ref is one path component: letters, digits, '.', '_', '-'; no '..', no '/'."""
    if not REF_RE.fullmatch(ref) or ".." in ref:
        raise InvalidParameters(
            f"credentials_ref {ref[:64]!r}: a name of letters, digits, '.', '_' and '-' "
            "(at most 128, no '..' or '/')"
        )
    return ref


@dataclass(frozen=True)
class PasswordPolicy:
    """What a BMC accepts. IPMI 2.0 allows 20 bytes (16 for IPMI 1.5 logins); Redfish BMCs
    publish MinPasswordLength/MaxPasswordLength in their AccountService."""

    min_length: int = 16
    max_length: int = 20
    symbols: str = "-_.+=@%"

    def generate(self, length: int | None = None) -> str:
        n = length if length is not None else max(self.min_length, min(16, self.max_length))
        if not self.min_length <= n <= self.max_length or n < 4:
            raise InvalidParameters(
                f"password length {n}: the BMC accepts {self.min_length} to {self.max_length}"
            )
        classes = [string.ascii_lowercase, string.ascii_uppercase, string.digits]
        if self.symbols:
            classes.append(self.symbols)
        alphabet = "".join(classes)
        while True:
            pw = "".join(_random.choice(alphabet) for _ in range(n))
            if all(any(c in cls for c in pw) for cls in classes):
                return pw


MAX_LINKS = 8     # symlinks followed inside one entry (a secret volume needs two)


def open_beneath(dir_fd: int, name: str) -> int:
    """Open ``name`` (relative) read-only under the directory ``dir_fd``, following symlinks
    only while every step stays beneath that directory: an absolute link, a ``..`` above it
    or more than MAX_LINKS links raise OSError(ELOOP/EXDEV). Each step is opened with
    O_NOFOLLOW, so a link swapped in between is refused, not followed."""
    todo = name.split("/")
    stack: list[int] = []                 # the directories entered below dir_fd
    links = 0
    try:
        while todo:
            part = todo.pop(0)
            if part in ("", "."):
                continue
            here = stack[-1] if stack else dir_fd
            if part == "..":
                if not stack:
                    raise OSError(errno.EXDEV, "a link leads out of the entry's directory", name)
                os.close(stack.pop())
                continue
            st = os.stat(part, dir_fd=here, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                target = os.readlink(part, dir_fd=here)
                if links > MAX_LINKS or target.startswith("/"):
                    raise OSError(errno.EXDEV if links <= MAX_LINKS else errno.ELOOP,
                                  "a link leads out of the entry's directory", name)
                todo[:0] = target.split("/")
                continue
            # O_NONBLOCK: a FIFO planted there is refused as "not a file", not waited on.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            if todo:
                stack.append(os.open(part, flags | os.O_DIRECTORY, dir_fd=here))
            else:
                return os.open(part, flags, dir_fd=here)
        raise IsADirectoryError(errno.EISDIR, "not a file", name)
    finally:
        for fd in stack:
            os.close(fd)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


class SecretStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- reading ------------------------------------------------------------------------

    def _entry(self, ref: str) -> Path:
        return self.root / check_ref(ref)

    @contextlib.contextmanager
    def _entry_dir(self, ref: str) -> Iterator[int | None]:
        """The entry's directory, opened under the store without following a link (an entry
        that is a symlink is refused, wherever it points); None when there is no entry."""
        check_ref(ref)
        try:
            root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            yield None
            return
        try:
            try:
                fd = os.open(ref, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=root)
            except FileNotFoundError:
                fd = -1
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise SecretStoreError(f"credentials_ref {ref!r}: the entry is not a directory "
                                           "of the store (a symlink or a file); refused") from None
                raise SecretStoreError(f"credentials_ref {ref!r}: cannot open the entry: "
                                       f"{exc.strerror}") from None
        finally:
            os.close(root)
        if fd < 0:
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)

    def _read_file(self, entry: int, name: str, ref: str, *, private: bool) -> bytes:
        """``name`` in the entry's directory; a symlink is followed only while it stays inside
        that directory (a Kubernetes secret volume's ``password -> ..data/password``)."""
        try:
            fd = open_beneath(entry, name)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise SecretStoreError(f"credentials_ref {ref!r}: cannot read {name}: "
                                   f"{exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SecretStoreError(f"credentials_ref {ref!r}: {name} is not a file")
            if private and st.st_mode & 0o077:
                raise SecretStoreError(
                    f"credentials_ref {ref!r}: {self._entry(ref) / name} is readable by others "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
                )
            data = os.read(fd, MAX_ENTRY_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_ENTRY_BYTES:
            raise SecretStoreError(f"credentials_ref {ref!r}: {name} is larger than "
                                   f"{MAX_ENTRY_BYTES} bytes")
        return data

    def _parse(self, data: bytes, ref: str, name: str) -> Credentials:
        try:
            obj = json.loads(data)
        except ValueError:
            # Never quote the content: it holds a password.
            raise SecretStoreError(f"credentials_ref {ref!r}: {name} is not JSON") from None
        if (not isinstance(obj, dict) or not isinstance(obj.get("username"), str)
                or not isinstance(obj.get("password"), str)):
            raise SecretStoreError(
                f"credentials_ref {ref!r}: {name} must be an object with string "
                "'username' and 'password'"
            )
        if not obj["username"] or not obj["password"]:
            raise SecretStoreError(f"credentials_ref {ref!r}: {name} has an empty username or password")
        return Credentials(obj["username"], obj["password"])

    def _load(self, ref: str, name: str) -> Credentials | None:
        with self._entry_dir(ref) as entry:
            if entry is None:
                return None
            try:
                return self._parse(self._read_file(entry, name, ref, private=True), ref, name)
            except FileNotFoundError:
                return None

    def is_mounted(self, ref: str) -> bool:
        """The entry comes from a mounted secret manager (username + password files)."""
        with self._entry_dir(ref) as entry:
            if entry is None or _exists(entry, CURRENT):
                return False
            try:
                os.close(open_beneath(entry, "password"))
            except OSError:
                return False
            return True

    def _mounted(self, ref: str) -> Credentials | None:
        with self._entry_dir(ref) as entry:
            if entry is None:
                return None
            try:
                user = self._read_file(entry, "username", ref, private=False)
                pw = self._read_file(entry, "password", ref, private=False)
            except FileNotFoundError:
                return None
        username, password = user.decode().strip(), pw.decode().rstrip("\r\n")
        if not username or not password:
            raise SecretStoreError(f"credentials_ref {ref!r}: empty username or password file")
        return Credentials(username, password)

    def get(self, ref: str) -> Credentials:
        """The entry's current credentials. NotFound when there is no such entry."""
        creds = self._load(ref, CURRENT) or self._mounted(ref)
        if creds is None:
            if self._load(ref, PENDING) is not None:
                # Only a crash before the first promote can leave this; use what there is.
                return self._load(ref, PENDING)  # type: ignore[return-value]  # not None: checked above
            raise NotFound(f"credentials_ref {ref!r}: no such entry in the site's secret store "
                           f"({self.root})", credentials_ref=ref)
        return creds

    def pending(self, ref: str) -> Credentials | None:
        """The password a rotation left unproven, if any."""
        return self._load(ref, PENDING)

    def known_hosts(self, address: str) -> Path:
        """The site's own known_hosts for the BMC at ``address`` (its SSH host key, pinned at
        first contact: agent/site/observe/sshconsole.py), in the store's ``.known_hosts``
        folder (a name no ref can take); the folder made 0700 when missing."""
        folder = self.root / KNOWN_HOSTS
        self._ensure_root()
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        name = re.sub(r"[^A-Za-z0-9.:-]", "_", address)[:200] or "_"
        return folder / name

    # -- writing ------------------------------------------------------------------------

    def _ensure_root(self) -> None:
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SecretStoreError(f"secret store {self.root}: {exc.strerror}") from None
        mode = stat.S_IMODE(self.root.stat().st_mode)
        if mode & 0o077:
            raise SecretStoreError(
                f"secret store {self.root} is open to others (mode {mode:04o}); chmod 700 it"
            )

    def _writable_entry(self, ref: str) -> Path:
        self._ensure_root()
        entry = self._entry(ref)
        if self.is_mounted(ref):
            raise Unsupported(
                f"credentials_ref {ref!r} comes from a mounted secret manager; rotate it there",
                credentials_ref=ref,
            )
        with contextlib.suppress(FileExistsError):
            entry.mkdir(mode=0o700)
        with self._entry_dir(ref):    # refuses an entry that is a symlink (out of the store)
            pass
        return entry

    @staticmethod
    def _encode(creds: Credentials) -> bytes:
        return json.dumps({"username": creds.username, "password": creds.password}).encode()

    def put(self, ref: str, creds: Credentials) -> None:
        """Create or replace an entry (enrolment of a BMC)."""
        write_atomic(self._writable_entry(ref) / CURRENT, self._encode(creds), 0o600)
        log.info("secret store: %s written", ref)

    def stage(self, ref: str, creds: Credentials) -> None:
        """Write the candidate password beside the working one (rotation, step 1)."""
        entry = self._writable_entry(ref)
        if self._load(ref, CURRENT) is None:
            raise NotFound(f"credentials_ref {ref!r}: no current entry to rotate", credentials_ref=ref)
        write_atomic(entry / PENDING, self._encode(creds), 0o600)
        log.info("secret store: %s: new password staged (pending)", ref)

    def promote(self, ref: str) -> None:
        """The pending password is proven: it becomes the current one (rotation, last step)."""
        if self._load(ref, PENDING) is None:
            raise NotFound(f"credentials_ref {ref!r}: nothing pending to promote", credentials_ref=ref)
        with self._entry_dir(ref) as entry:
            if entry is None:
                raise NotFound(f"credentials_ref {ref!r}: no such entry", credentials_ref=ref)
            os.replace(PENDING, CURRENT, src_dir_fd=entry, dst_dir_fd=entry)
            os.fsync(entry)
        log.info("secret store: %s: pending password promoted", ref)

    def discard(self, ref: str) -> None:
        """Forget the pending password (the BMC never took it)."""
        with self._entry_dir(ref) as entry, contextlib.suppress(FileNotFoundError):
            if entry is None:
                return
            os.unlink(PENDING, dir_fd=entry)
            os.fsync(entry)
            log.info("secret store: %s: pending password discarded", ref)

    def reconcile(self, ref: str, accepted: Callable[[Credentials], bool]) -> Credentials:
        """After a rotation was interrupted: keep whichever of current and pending the BMC
        accepts (``accepted`` logs in with them), and return it. Without a pending entry,
        the current credentials, untouched."""
        pending = self.pending(ref)
        if pending is None:
            return self.get(ref)
        current = self._load(ref, CURRENT)
        if accepted(pending):
            self.promote(ref)
            log.warning("secret store: %s: an interrupted rotation had changed the BMC; "
                        "kept the new password", ref)
            return pending
        if current is not None and accepted(current):
            self.discard(ref)
            log.warning("secret store: %s: an interrupted rotation had not changed the BMC; "
                        "kept the old password", ref)
            return current
        raise SecretStoreError(
            f"credentials_ref {ref!r}: the BMC accepts neither the current nor the pending "
            "password; both are kept for an operator", credentials_ref=ref
        )
