"""How the clients open their channel: plaintext or TLS, the message limits the service's
[T, H] tensors need, and an optional bearer token sent with every call."""
import grpc

# Outputs of large batches are far past gRPC's 4 MiB default.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20


def channel_options(max_message_bytes):
    return [("grpc.max_receive_message_length", int(max_message_bytes)),
            ("grpc.max_send_message_length", int(max_message_bytes))]


def credentials(tls):
    """None for plaintext; grpc.ChannelCredentials for tls=True (system roots) or as given."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    raise TypeError("tls: expected False, True or grpc.ChannelCredentials "
                    "(e.g. grpc.ssl_channel_credentials(root_certificates=...))")


def call_metadata(token):
    """Metadata for every call: `authorization: Bearer <token>` when a token is given."""
    return (("authorization", "Bearer " + token),) if token else None
