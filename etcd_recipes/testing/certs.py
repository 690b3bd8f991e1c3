"""Throw-away TLS material for test etcd servers, generated with ``trustme``.

One private CA signs a server certificate (SANs ``127.0.0.1`` and ``localhost``) and a client
certificate; everything is written as PEM files into a directory (normally the server's temp
dir, so it disappears with the server).

Example::

    import ssl
    import tempfile
    from pathlib import Path

    from etcd_recipes.testing import TlsMaterial

    with tempfile.TemporaryDirectory() as tmp:
        material = TlsMaterial.generate(Path(tmp))
        ssl_ctx = ssl.create_default_context(cafile=material.ca_cert)
        ssl_ctx.load_cert_chain(material.client_cert, material.client_key)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsMaterial"]

#: Common name of the generated client certificate (etcd maps it to a user when auth is on).
CLIENT_COMMON_NAME = "etcd-recipes-client"


@dataclass(frozen=True)
class TlsMaterial:
    """Paths of the PEM files of a generated CA, server certificate and client certificate.

    Example::

        import grpc

        from etcd_recipes.testing import EtcdServer

        with EtcdServer(tls=True, client_cert_auth=True) as server:
            tls = server.tls
            assert tls is not None
            creds = grpc.ssl_channel_credentials(
                tls.ca_cert.read_bytes(), tls.client_key.read_bytes(), tls.client_cert.read_bytes()
            )
            with grpc.secure_channel(server.endpoint, creds) as channel:
                grpc.channel_ready_future(channel).result(timeout=5)
    """

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def generate(cls, directory: Path) -> TlsMaterial:
        """Create a fresh CA plus server and client certificates as PEM files in ``directory``.

        Needs the ``trustme`` package (part of the ``test`` extra).

        Example::

            import tempfile
            from pathlib import Path

            from etcd_recipes.testing import TlsMaterial

            with tempfile.TemporaryDirectory() as tmp:
                material = TlsMaterial.generate(Path(tmp))
                assert material.ca_cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
        """
        try:
            import trustme
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "TLS test servers need the `trustme` package: pip install trustme "
                "(or etcd-recipes[test])"
            ) from exc

        directory.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost", common_name="localhost")
        client = ca.issue_cert(CLIENT_COMMON_NAME, common_name=CLIENT_COMMON_NAME)

        material = cls(
            ca_cert=directory / "ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server-key.pem",
            client_cert=directory / "client.pem",
            client_key=directory / "client-key.pem",
        )
        ca.cert_pem.write_to_path(str(material.ca_cert))
        material.server_cert.write_bytes(b"".join(b.bytes() for b in server.cert_chain_pems))
        server.private_key_pem.write_to_path(str(material.server_key))
        material.client_cert.write_bytes(b"".join(b.bytes() for b in client.cert_chain_pems))
        client.private_key_pem.write_to_path(str(material.client_key))
        for key in (material.server_key, material.client_key):
            key.chmod(0o600)
        return material
