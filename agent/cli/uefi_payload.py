"""``agent uefi-payload``: a time-based authenticated write of a Secure Boot database, made offline
by whoever holds the fleet's PK and KEK keys (agent/hw/uefi_auth.py says the format).

    agent uefi-payload --variable db --add-cert fleet-db.pem --owner GUID \\
        --key kek.key --cert kek.pem -o db.auth
    agent uefi-payload --variable KEK --add-cert kek.pem --owner GUID --key pk.key --cert pk.pem -o KEK.auth
    agent uefi-payload --variable PK --add-cert pk.pem --owner GUID --key pk.key --cert pk.pem -o PK.auth

PK is signed by the PK's own key, KEK by the PK, db and dbx by a KEK. The files go to the control
plane, which sends them (base64) in the release gate's remedy ``efivars.enroll_keys``; the node
writes them and holds no key. The key is read from its PEM file (an encrypted one with its
passphrase from a file), never from argv. Prints the sha256 of the value written: the digest the
release gate's baseline and the attestation policy name for that database.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import sys
import uuid
from pathlib import Path

from agent.cli import EXIT_OK, command
from agent.errors import InvalidParameters
from agent.limits import read_bounded

MAX_PEM = 64 * 1024


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--variable", required=True, choices=("PK", "KEK", "db", "dbx"),
                   help="the database written")
    p.add_argument("--owner", required=True, type=uuid.UUID, help="the entries' owner GUID (the fleet's)")
    p.add_argument("--add-cert", type=Path, action="append", default=[],
                   help="a PEM certificate the database holds (repeat for more)")
    p.add_argument("--add-hash", action="append", default=[],
                   help="a SHA-256 digest (64 hex digits) the database holds: dbx's revoked images")
    p.add_argument("--key", type=Path, required=True, help="the signer's private key (PEM file)")
    p.add_argument("--key-passphrase-file", type=Path, help="the key's passphrase, when it is encrypted")
    p.add_argument("--cert", type=Path, required=True, help="the signer's certificate (PEM file)")
    p.add_argument("--time", type=datetime.datetime.fromisoformat,
                   help="the write's time stamp, ISO 8601 (default now; a later write must be later)")
    p.add_argument("-o", "--output", type=Path, required=True, help="the authenticated write's file")


@command("uefi-payload", "make a Secure Boot database's authenticated write, offline, as its key holder",
         _args)
def cmd_uefi_payload(args: argparse.Namespace) -> int:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key

    from agent import atomicfile
    from agent.hw import uefi_auth

    def cert(path: Path) -> bytes:
        try:
            loaded = x509.load_pem_x509_certificate(read_bounded(path, what="certificate", max_bytes=MAX_PEM))
        except ValueError:
            raise InvalidParameters(f"{path} is not a PEM X.509 certificate") from None
        return loaded.public_bytes(Encoding.DER)

    lists = b"".join(uefi_auth.x509_list(cert(p), args.owner) for p in args.add_cert)
    digests = []
    for text in args.add_hash:
        try:
            digests.append(bytes.fromhex(text))
        except ValueError:
            raise InvalidParameters(f"--add-hash {text!r} is not hex") from None
    if digests:
        lists += uefi_auth.sha256_list(digests, args.owner)
    if args.variable == "PK" and (len(args.add_cert) != 1 or digests):
        raise InvalidParameters("PK holds one certificate: give one --add-cert and no --add-hash")
    passphrase = None
    if args.key_passphrase_file:
        passphrase = read_bounded(args.key_passphrase_file, what="passphrase file",
                                  max_bytes=4096).rstrip(b"\r\n")
    try:
        key = load_pem_private_key(read_bounded(args.key, what="key", max_bytes=MAX_PEM), passphrase)
    except TypeError:
        raise InvalidParameters(f"the key {args.key} is encrypted: name its --key-passphrase-file") from None
    except ValueError:
        raise InvalidParameters(f"the key {args.key} is no PEM private key, or its passphrase is "
                                "wrong") from None
    signer = cert(args.cert)
    if key.public_key() != x509.load_der_x509_certificate(signer).public_key():
        raise InvalidParameters(f"the key {args.key} is not the key of the certificate {args.cert}")
    when = args.time.replace(tzinfo=args.time.tzinfo or datetime.UTC) if args.time else None
    payload = uefi_auth.signed_write(args.variable, lists, key, signer, when)
    atomicfile.write_atomic(args.output, payload)
    print(f"{hashlib.sha256(lists).hexdigest()}  {args.variable}  {args.output} ({len(payload)} bytes)")
    print(f"signed by {args.cert}; the digest is the value's, as the node reads it back", file=sys.stderr)
    return EXIT_OK
