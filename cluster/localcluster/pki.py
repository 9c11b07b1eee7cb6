"""The local cluster's certificates: one CA, the API server's serving certificate, client
certificates per component (their identity is the certificate's CN/O, as kubeadm issues them),
and the service-account signing key. ECDSA P-256 throughout: fast to generate on every start."""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


@dataclass
class Pair:
    cert: Path
    key: Path


class PKI:
    """Writes everything under `root` (0700); `ca` signs the rest."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(minutes=5)
        self._ca_key = _key()
        ca_name = _name("tianji-local-cluster-ca")
        self._ca_name = ca_name
        self._ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                         .public_key(self._ca_key.public_key()).serial_number(x509.random_serial_number())
                         .not_valid_before(self._not_before).not_valid_after(now + VALIDITY)
                         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                         .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                        critical=True)
                         .sign(self._ca_key, hashes.SHA256()))
        self.ca = self._write("ca", self._ca_cert, self._ca_key)

    def _write(self, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
        pair = Pair(self.root / f"{name}.crt", self.root / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              hosts: tuple[str, ...] = ()) -> Pair:
        """A leaf certificate: a client identity (CN = user, O = groups), or a serving one for `hosts`."""
        key = _key()
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(self._ca_name)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(self._not_before).not_valid_after(self._not_before + VALIDITY)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usage), critical=False))
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return self._write(name, b.sign(self._ca_key, hashes.SHA256()), key)

    def signing_key(self, name: str = "sa") -> Pair:
        """The service-account token signing key pair (the 'cert' path holds the public key)."""
        key = _key()
        pub = self.root / f"{name}.pub"
        pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo))
        priv = self.root / f"{name}.key"
        priv.write_bytes(_key_pem(key))
        priv.chmod(0o600)
        return Pair(pub, priv)
