"""Reference integrity manifests (RIMs): a device maker's signed golden measurements.

NVIDIA publishes its GPUs' RIMs as SWID tags (ISO/IEC 19770-2) in TCG's RIM information model:
one ``Resource type="Measurement"`` per measurement index, each with one or more accepted
SHA-384 digests (``Hash0``, ``Hash1`` ... in the ``xmlenc#sha384`` namespace), an ``active``
flag, and in ``Meta`` the firmware version it is for (``colloquialVersion``). The tag carries
an enveloped XML-DSig signature: its Reference (``URI=""``, the whole document) is digested with
SHA-384 after the enveloped-signature transform and Canonical XML 1.1, its SignedInfo is
canonicalized with Canonical XML 1.1 and signed with ECDSA P-384 (``r || s``); the signer's
certificate and its CAs ride in KeyInfo/X509Data, and the chain must end at a configured RIM
root.

Only that profile is accepted: any other canonicalization, digest, signature method, transform
or reference is refused (``rim_signature``), so a manifest cannot choose a weaker check. The
canonicalizer below is the part of Canonical XML 1.1 a whole-document, comment-free signature
needs (inclusive namespaces, sorted attributes, the C14N escapes); a document type declaration,
an entity or a processing instruction is refused rather than canonicalized.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import datetime
from xml.parsers import expat

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from agent.gateway.verifier.refused import Refused
from agent.gateway.verifier.x509chain import verify_chain

DSIG = "http://www.w3.org/2000/09/xmldsig#"
SWID = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
SHA384_NS = "http://www.w3.org/2001/04/xmlenc#sha384"
XML_NS = "http://www.w3.org/XML/1998/namespace"
C14N11 = "http://www.w3.org/2006/12/xml-c14n11"
ENVELOPED = "http://www.w3.org/2000/09/xmldsig#enveloped-signature"
ECDSA_SHA384 = "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384"
DIGEST_SHA384 = "http://www.w3.org/2001/04/xmldsig-more#sha384"
MAX_RIM = 1 << 20  # NVIDIA's are about 20 KB
MAX_ALTERNATIVES = 16


class XmlElement:
    """One element as written: its qualified name, its attributes, its children in order."""

    __slots__ = ("attrs", "children", "declared", "name", "parent")

    def __init__(self, name: str, attrs: dict[str, str], parent: XmlElement | None) -> None:
        self.name = name
        self.attrs = attrs
        self.parent = parent
        self.children: list[XmlElement | str] = []
        self.declared = {k[6:] if k.startswith("xmlns:") else "": v
                         for k, v in attrs.items() if k == "xmlns" or k.startswith("xmlns:")}

    def namespaces(self) -> dict[str, str]:
        """The namespaces in scope here, prefix ('' for the default) -> URI."""
        chain: list[XmlElement] = []
        node: XmlElement | None = self
        while node is not None:
            chain.append(node)
            node = node.parent
        scope = {"xml": XML_NS}
        for node in reversed(chain):
            scope.update(node.declared)
        return scope

    def expanded(self, qname: str, *, attribute: bool = False) -> tuple[str, str]:
        """(namespace URI, local name) of a name written on this element."""
        prefix, _, local = qname.rpartition(":")
        if not prefix and attribute:
            return "", qname
        uri = self.namespaces().get(prefix, "")
        if prefix and not uri:
            raise Refused("rim_signature", f"the RIM uses an undeclared prefix {prefix!r}")
        return uri, local

    def elements(self) -> list[XmlElement]:
        return [c for c in self.children if isinstance(c, XmlElement)]

    def find(self, uri: str, local: str) -> list[XmlElement]:
        return [c for c in self.elements() if self.expanded_child(c) == (uri, local)]

    def one(self, uri: str, local: str) -> XmlElement:
        found = self.find(uri, local)
        if len(found) != 1:
            raise Refused("rim_signature", f"the RIM has {len(found)} {local} under {self.name}, not one")
        return found[0]

    @staticmethod
    def expanded_child(child: XmlElement) -> tuple[str, str]:
        return child.expanded(child.name)

    def text(self) -> str:
        return "".join(c for c in self.children if isinstance(c, str))

    def attribute(self, uri: str, local: str) -> str | None:
        for name, value in self.attrs.items():
            if name != "xmlns" and not name.startswith("xmlns:") and \
                    self.expanded(name, attribute=True) == (uri, local):
                return value
        return None


def parse_document(document: bytes) -> XmlElement:
    if len(document) > MAX_RIM:
        raise Refused("rim_signature", f"the RIM is {len(document)} bytes, more than {MAX_RIM}")
    parser = expat.ParserCreate()
    parser.buffer_text = True
    stack: list[XmlElement] = []
    root: list[XmlElement] = []

    def start(name: str, attrs: dict[str, str]) -> None:
        element = XmlElement(name, attrs, stack[-1] if stack else None)
        (stack[-1].children if stack else root).append(element)
        stack.append(element)

    def end(_name: str) -> None:
        stack.pop()

    def text(data: str) -> None:
        if stack:  # whitespace outside the root element is not in the canonical form
            children = stack[-1].children
            if children and isinstance(children[-1], str):
                children[-1] += data
            else:
                children.append(data)

    def refuse(*_args: object) -> None:
        raise Refused("rim_signature", "the RIM has a document type, an entity or a processing "
                      "instruction: refused rather than canonicalized")

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.ProcessingInstructionHandler = refuse
    try:
        parser.Parse(document, True)
    except expat.ExpatError as e:
        raise Refused("rim_signature", f"the RIM is not well-formed XML: {e}") from e
    if len(root) != 1:
        raise Refused("rim_signature", "the RIM has no root element")
    return root[0]


def _escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\r", "&#xD;")


def _escape_attr(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace('"', "&quot;")
            .replace("\t", "&#x9;").replace("\n", "&#xA;").replace("\r", "&#xD;"))


def canonical(element: XmlElement, *, leave_out: XmlElement | None = None) -> bytes:
    """Canonical XML 1.1 (without comments) of ``element`` and its descendants, ``leave_out``
    (the enveloped signature) and its descendants removed."""
    out: list[str] = []
    _canonical(element, {}, leave_out, out)
    return "".join(out).encode()


def _canonical(element: XmlElement, rendered: dict[str, str], leave_out: XmlElement | None,
               out: list[str]) -> None:
    scope = element.namespaces()
    del scope["xml"]
    # Inclusive C14N: every namespace in scope that the nearest rendered ancestor does not
    # already have (xmlns="" only to undo an ancestor's default).
    declare = sorted((prefix, uri) for prefix, uri in scope.items()
                     if (rendered.get(prefix, "") if not prefix else rendered.get(prefix)) != uri)
    now = dict(rendered)
    now.update(declare)
    names = [a for a in element.attrs if a != "xmlns" and not a.startswith("xmlns:")]
    names.sort(key=lambda a: element.expanded(a, attribute=True))
    out.append("<" + element.name)
    for prefix, uri in declare:
        out.append(f' xmlns{":" + prefix if prefix else ""}="{_escape_attr(uri)}"')
    for name in names:
        out.append(f' {name}="{_escape_attr(element.attrs[name])}"')
    out.append(">")
    for child in element.children:
        if isinstance(child, str):
            out.append(_escape_text(child))
        elif child is not leave_out:
            _canonical(child, now, leave_out, out)
    out.append(f"</{element.name}>")


@dataclass(frozen=True)
class RimMeasurement:
    index: int  # the RIM's index: NVIDIA's SPDM measurement index less one
    active: bool
    digests: tuple[bytes, ...]
    name: str


@dataclass(frozen=True)
class Rim:
    """A RIM whose signature verified: what it is for and its measurements by index."""

    product: str
    version: str  # Meta colloquialVersion: the firmware version it describes
    signer: str  # the signing certificate's subject
    measurements: dict[int, RimMeasurement] = field(repr=False)


def _algorithm(element: XmlElement, local: str, expected: str) -> None:
    got = element.one(DSIG, local).attrs.get("Algorithm")
    if got != expected:
        raise Refused("rim_signature", f"the RIM's {local} is {got!r}; only {expected} is accepted")


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise Refused("rim_signature", f"the RIM's {what} is not base64") from e


def verify_rim(document: bytes, roots: list[x509.Certificate], *, at: datetime | None = None) -> Rim:
    """Check a RIM's enveloped signature and its signer's chain to one of ``roots`` (valid at
    ``at``, now by default); its content. Refused ``rim_signature`` or ``rim_chain``."""
    root = parse_document(document)
    if root.expanded(root.name) != (SWID, "SoftwareIdentity"):
        raise Refused("rim_signature", f"the RIM's root is {root.name}, not a SWID SoftwareIdentity")
    signature = root.one(DSIG, "Signature")
    signed_info = signature.one(DSIG, "SignedInfo")
    _algorithm(signed_info, "CanonicalizationMethod", C14N11)
    _algorithm(signed_info, "SignatureMethod", ECDSA_SHA384)
    reference = signed_info.one(DSIG, "Reference")
    if reference.attrs.get("URI") != "":
        raise Refused("rim_signature", "the RIM's signature does not cover the whole document "
                      "(URI is not \"\")")
    transforms = [t.attrs.get("Algorithm") for t in reference.one(DSIG, "Transforms").find(DSIG, "Transform")]
    if transforms != [ENVELOPED, C14N11]:
        raise Refused("rim_signature", f"the RIM's transforms are {transforms}, "
                      "not enveloped-signature then C14N 1.1")
    _algorithm(reference, "DigestMethod", DIGEST_SHA384)
    digest = _b64(reference.one(DSIG, "DigestValue").text(), "DigestValue")
    if not hmac.compare_digest(hashlib.sha384(canonical(root, leave_out=signature)).digest(), digest):
        raise Refused("rim_signature", "the RIM's content does not match its signed digest")
    value = _b64(signature.one(DSIG, "SignatureValue").text(), "SignatureValue")
    if len(value) != 96:
        raise Refused("rim_signature", f"the RIM's ECDSA P-384 signature is {len(value)} bytes, not 96")
    try:
        certs = [x509.load_der_x509_certificate(_b64(c.text(), "X509Certificate"))
                 for c in signature.one(DSIG, "KeyInfo").one(DSIG, "X509Data").find(DSIG, "X509Certificate")]
    except ValueError as e:
        raise Refused("rim_chain", f"a certificate in the RIM does not parse: {e}") from e
    if not certs:
        raise Refused("rim_chain", "the RIM carries no signing certificate")
    key = certs[0].public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
        raise Refused("rim_signature", "the RIM's signing key is not ECDSA P-384")
    try:
        key.verify(encode_dss_signature(int.from_bytes(value[:48], "big"), int.from_bytes(value[48:], "big")),
                   canonical(signed_info), ec.ECDSA(hashes.SHA384()))
    except InvalidSignature as e:
        raise Refused("rim_signature", "the RIM's signature does not verify with its signing "
                      "certificate") from e
    verify_chain(certs, roots, check="rim_chain", at=at)
    return _content(root, certs[0])


def _content(root: XmlElement, signer: x509.Certificate) -> Rim:
    meta = root.one(SWID, "Meta")
    version = meta.attrs.get("colloquialVersion", "")
    measurements: dict[int, RimMeasurement] = {}
    for resource in root.one(SWID, "Payload").find(SWID, "Resource"):
        if resource.attrs.get("type") != "Measurement":
            continue
        try:
            index = int(resource.attrs["index"])
            alternatives = int(resource.attrs.get("alternatives", "1"))
        except (KeyError, ValueError) as e:
            raise Refused("rim_content", f"a RIM measurement has no readable index: {e}") from e
        if not 0 <= alternatives <= MAX_ALTERNATIVES or index in measurements:
            raise Refused("rim_content", f"RIM measurement {index}: {alternatives} alternatives "
                          "or a repeated index")
        digests = []
        for n in range(alternatives):
            hexed = resource.attribute(SHA384_NS, f"Hash{n}")
            try:
                digests.append(bytes.fromhex(hexed or ""))
            except ValueError as e:
                raise Refused("rim_content", f"RIM measurement {index}: Hash{n} is not hex") from e
            if len(digests[-1]) != 48:
                raise Refused("rim_content", f"RIM measurement {index}: Hash{n} is not a SHA-384 digest")
        measurements[index] = RimMeasurement(index, resource.attrs.get("active") == "True", tuple(digests),
                                             resource.attrs.get("name", ""))
    return Rim(product=root.attrs.get("name", ""), version=version,
               signer=signer.subject.rfc4514_string(), measurements=measurements)
