"""How the clients open their channel: plaintext or TLS (gcmoe.TLS: the CA, a client certificate
for mTLS, a server name), the message limits the service's [T, H] tensors need, and an optional
bearer token sent with every call."""
import ipaddress
import os

import grpc

# Outputs of large batches are far past gRPC's 4 MiB default.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


class TLS:
    """TLS settings of a connection, the tls= argument of gcmoe.Client and gcmoe.aio.Client:

        gcmoe.Client(addr, tls=gcmoe.TLS(ca="ca.crt"), token=token)
        gcmoe.Client(addr, tls=gcmoe.TLS(ca="ca.crt", cert="client.crt", key="client.key"))

    ca: the PEM certificate(s) of the CA that signed the server's certificate, as a file path or
        bytes; None trusts the system's roots.
    cert, key: the client's PEM certificate chain and private key (paths or bytes), for a service
        that requires client certificates (server.tls.client_ca); both or neither.
    server_name: the name the server's certificate is checked against, when it is not the host
        in addr (a certificate for "gcmoe.internal" reached at an IP address).
    Files are read here, so a missing one fails at construction, not at the first call.
    """

    def __init__(self, ca=None, cert=None, key=None, server_name=None):
        if (cert is None) != (key is None):
            raise ValueError("tls: cert and key go together (the client certificate for mTLS)")
        self.ca = _pem(ca)
        self.cert = _pem(cert)
        self.key = _pem(key)
        self.server_name = server_name

    def credentials(self):
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self):
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def __repr__(self):
        # Never the key.
        return (f"gcmoe.TLS(ca={'given' if self.ca else None}, "
                f"client_cert={'given' if self.cert else None}, server_name={self.server_name!r})")


def _pem(value):
    """PEM bytes from bytes, or from the file a str or os.PathLike names; None stays None."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read()
    raise TypeError(f"tls: expected a file path or PEM bytes, got {type(value).__name__}")


def channel_options(max_message_bytes):
    return [("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", int(max_message_bytes))]


def credentials(tls):
    """(grpc.ChannelCredentials or None for plaintext, extra channel options) for the tls=
    argument: False/None (plaintext), True (TLS with the system's roots), a gcmoe.TLS, or
    grpc.ChannelCredentials as made by the caller."""
    if tls is None or tls is False:
        return None, []
    if tls is True:
        return grpc.ssl_channel_credentials(), []
    if isinstance(tls, TLS):
        return tls.credentials(), tls.channel_options()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls, []
    raise TypeError("tls: expected False, True, gcmoe.TLS(ca=..., cert=..., key=..., "
                    "server_name=...) or grpc.ChannelCredentials")


def call_metadata(token, addr, tls):
    """Metadata for every call: `authorization: Bearer <token>` when a token is given. A token
    on a plaintext connection would cross the network in the clear: refused (ValueError) unless
    addr is a loopback address or a Unix socket."""
    if not token:
        return None
    if (tls is None or tls is False) and not is_loopback(addr):
        raise ValueError(f"token: needs tls= to reach {addr}: a token on a plaintext connection "
                         "crosses the network in the clear (only a loopback address may go "
                         "without)")
    return (("authorization", "Bearer " + token),)


def is_loopback(addr):
    """True when addr ("host:port", "[v6]:port", "unix:PATH", with gRPC's "dns:///", "ipv4:" or
    "ipv6:" scheme) can only reach this machine."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
    if addr.startswith(("unix:", "unix-abstract:")):
        return True
    host = addr
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
