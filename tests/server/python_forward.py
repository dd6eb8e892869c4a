"""Integration-test driver: Forward from Python on random inputs, every array saved as .npy.

    /usr/bin/python3 tests/server/python_forward.py --addr HOST:PORT --stubs build/proto/python \
        --out DIR [--tokens T] [--layer L] [--seed S]

Writes DIR/hidden.npy [T, H] float32, DIR/topk_ids.npy [T, k] int32 (some slots -1),
DIR/topk_weights.npy [T, k] float32 and DIR/output.npy [T, H] float32, for the C++ test to
check against the float64 reference.
"""
import argparse
import os
import sys

import grpc
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward_client as fc  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True)
    parser.add_argument("--stubs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--layer", type=int, default=1)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    fc.load_stubs(args.stubs)

    with grpc.insecure_channel(args.addr, options=fc.CHANNEL_OPTIONS) as channel:
        stub = fc.moe_pb2_grpc.MoeServiceStub(channel)
        info = stub.GetModelInfo(fc.moe_pb2.GetModelInfoRequest(), timeout=10.0)
        hidden, topk_ids, topk_weights = fc.random_inputs(info, args.tokens, args.seed)
        topk_ids[::3, info.top_k - 1] = -1  # unused slots
        output = fc.forward(stub, hidden, topk_ids, topk_weights, layer=args.layer,
                            hidden_dtype=fc.moe_pb2.FP32, output_dtype=fc.moe_pb2.FP32)
    os.makedirs(args.out, exist_ok=True)
    for name, array in (("hidden", hidden), ("topk_ids", topk_ids),
                        ("topk_weights", topk_weights), ("output", output)):
        np.save(os.path.join(args.out, name + ".npy"), array)
    print(f"saved {output.shape} output to {args.out}")


if __name__ == "__main__":
    main()
