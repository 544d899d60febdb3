"""A private certificate authority for the embedded object store's internal listeners.

SeaweedFS's master, volume server and filer talk to each other over HTTP and gRPC, on
ports of their own. Bound to 127.0.0.1 they are still open to every local process, and
the master's HTTP side has no authentication of its own (only an IP white list, which
every local process passes): anyone on the host could delete the bucket's collection or
store files. With the certificates made here every one of those ports takes only
mutual TLS: a caller must present a certificate signed by this CA, whose key is in the
data folder (0600, the store's user only). Only weed's parts and the server (which reads
the master's status) hold one.

One key pair serves every part, as server and as client (both key usages): the parts are
one process, and a second certificate would protect nothing the first does not.
Made at first start, kept, and made again when missing, unreadable or within 30 days of
its end (ten years from its start)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from im_server.runtime.ownership import StoreUser, read_private, write_private

CA_CERT = "tls-ca.pem"
CERT = "tls-cert.pem"
KEY = "tls-key.pem"
_VALID = datetime.timedelta(days=3650)
_RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA certificate, the certificate and its key (PEM)."""

    ca: Path
    cert: Path
    key: Path


def tls_files(folder: Path) -> TlsFiles:
    return TlsFiles(folder / CA_CERT, folder / CERT, folder / KEY)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _pem_cert(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _usable(folder: Path, user: StoreUser) -> bool:
    try:
        ca = x509.load_pem_x509_certificate(read_private(folder / CA_CERT, user).encode())
        cert = x509.load_pem_x509_certificate(read_private(folder / CERT, user).encode())
        serialization.load_pem_private_key(read_private(folder / KEY, user).encode(), None)
    except (OSError, ValueError):
        return False
    end = min(ca.not_valid_after_utc, cert.not_valid_after_utc)
    return end - datetime.datetime.now(datetime.UTC) > _RENEW_BEFORE


def ensure_certificates(folder: Path, user: StoreUser, host: str) -> TlsFiles:
    """The CA and the key pair in ``folder``, made (or made again) when not usable;
    the certificate names ``host`` (an IP address) and ``localhost``."""
    files = tls_files(folder)
    if _usable(folder, user):
        return files
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("im-server object store CA"))
        .issuer_name(_name("im-server object store CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("im-server object store"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALID)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    # the CA's key is not kept: nothing is ever signed with it again (a new pair means a
    # new CA), so a leak of the folder can only yield the one certificate it holds
    write_private(files.key, _pem_key(key), user)
    write_private(files.cert, _pem_cert(cert), user)
    write_private(files.ca, _pem_cert(ca), user)
    return files
