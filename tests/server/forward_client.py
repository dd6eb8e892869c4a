"""Calls gcmoe's Forward from Python with numpy arrays.

    PYTHONPATH=build/proto/python python3 tests/server/forward_client.py --addr 127.0.0.1:50051

The stubs are generated at build time into build/proto/python (or pass --stubs DIR). As a module:

    channel = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
    stub = moe_pb2_grpc.MoeServiceStub(channel)
    y = forward(stub, hidden, topk_ids, topk_weights)   # [T, H] float32
"""
import argparse
import sys

import grpc
import numpy as np

moe_pb2 = moe_pb2_grpc = None  # set by load_stubs()

# Outputs are [T, H]: raise gRPC's 4 MiB default message size.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]


def load_stubs(stubs_dir=None):
    """Imports the generated gcmoe.v1 stubs, from stubs_dir or from sys.path (PYTHONPATH)."""
    global moe_pb2, moe_pb2_grpc
    if stubs_dir:
        sys.path.insert(0, stubs_dir)
    from gcmoe.v1 import moe_pb2, moe_pb2_grpc


def to_bf16(x):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def tensor(array, dtype):
    """A gcmoe.v1.Tensor: little-endian, row-major bytes of `array` encoded as `dtype`."""
    if dtype == moe_pb2.BF16:
        data = to_bf16(array).astype("<u2").tobytes()
    elif dtype == moe_pb2.FP32:
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    elif dtype == moe_pb2.INT32:
        data = np.ascontiguousarray(array, dtype="<i4").tobytes()
    else:
        raise ValueError(f"unsupported dtype {moe_pb2.DType.Name(dtype)}")
    return moe_pb2.Tensor(dtype=dtype, shape=list(array.shape), data=data)


def make_request(hidden, topk_ids, topk_weights, layer=0, hidden_dtype=None, output_dtype=None,
                 request_id=""):
    """hidden [T, H] float, topk_ids [T, k] int (-1 = unused slot), topk_weights [T, k] float."""
    return moe_pb2.ForwardRequest(
        layer=layer,
        hidden=tensor(hidden, hidden_dtype or moe_pb2.BF16),
        topk_ids=tensor(topk_ids, moe_pb2.INT32),
        topk_weights=tensor(topk_weights, moe_pb2.FP32),
        output_dtype=output_dtype or moe_pb2.BF16,
        request_id=request_id)


def output_array(response):
    """The response's output as a [T, H] float32 array."""
    out = response.output
    if out.dtype == moe_pb2.BF16:
        bits = np.frombuffer(out.data, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32)
    elif out.dtype == moe_pb2.FP32:
        values = np.frombuffer(out.data, dtype="<f4")
    else:
        raise ValueError(f"unexpected output dtype {moe_pb2.DType.Name(out.dtype)}")
    return values.reshape(tuple(out.shape)).astype(np.float32)


def random_inputs(info, tokens, seed=0):
    """Unit-scale activations and k distinct random experts per token with softmax weights."""
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((tokens, info.hidden), dtype=np.float32)
    topk_ids = np.argsort(rng.random((tokens, info.experts)), axis=1)[:, :info.top_k]
    logits = rng.standard_normal((tokens, info.top_k))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    topk_weights = (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)
    return hidden, topk_ids.astype(np.int32), topk_weights


def forward(stub, hidden, topk_ids, topk_weights, timeout=30.0, **request_fields):
    """One Forward call; returns the output as [T, H] float32."""
    request = make_request(hidden, topk_ids, topk_weights, **request_fields)
    return output_array(stub.Forward(request, timeout=timeout))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp32", action="store_true", help="send FP32 activations, ask FP32 out")
    parser.add_argument("--stubs", help="folder of the generated Python stubs (build/proto/python)")
    args = parser.parse_args(argv)
    load_stubs(args.stubs)

    with grpc.insecure_channel(args.addr, options=CHANNEL_OPTIONS) as channel:
        stub = moe_pb2_grpc.MoeServiceStub(channel)
        info = stub.GetModelInfo(moe_pb2.GetModelInfoRequest(), timeout=10.0)
        hidden, topk_ids, topk_weights = random_inputs(info, args.tokens, args.seed)
        dtype = moe_pb2.FP32 if args.fp32 else moe_pb2.BF16
        y = forward(stub, hidden, topk_ids, topk_weights, layer=args.layer, hidden_dtype=dtype,
                    output_dtype=dtype)
    print(f"output {y.shape} {y.dtype}: mean |y| {np.abs(y).mean():.6f}, "
          f"NaN {int(np.isnan(y).sum())}")
    return y


if __name__ == "__main__":
    main()
