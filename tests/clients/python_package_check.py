"""Integration-test driver of the installed gcmoe Python package (run by python_package_test).

    python python_package_check.py forward --addr HOST:PORT --out DIR [--tokens T] [--layer L]
    python python_package_check.py fp8 --input X.npy --out DIR

forward: calls the service through gcmoe.Client and gcmoe.aio.Client with FP32, BF16 and FP8
activations (FP32 outputs), checks what needs no reference here (version, BF16 outputs, typed
errors) and saves every input and output as .npy for the C++ test to check against the float64
reference. fp8: encodes X [N, 32m] with gcmoe.numerics.quantize_fp8 and saves the E4M3 codes and
UE8M0 scales (as int32) for the C++ test to compare with the server's quantizer.
"""
import argparse
import asyncio
import os
import sys

import numpy as np

import gcmoe
from gcmoe import numerics

DTYPES = ("fp32", "bf16", "fp8")


def fail(message):
    print("python_package_check: " + message, file=sys.stderr)
    sys.exit(1)


def random_inputs(info, tokens, seed):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((tokens, info.hidden)).astype(np.float32)
    ids = np.argsort(rng.random((tokens, info.experts)), axis=1)[:, :info.top_k].astype(np.int32)
    ids[::3, info.top_k - 1] = -1  # unused slots
    weights = rng.uniform(0.05, 1.0, (tokens, info.top_k)).astype(np.float32)
    return hidden, ids, weights


def hidden_for(hidden, dtype):
    """The same activations in the form each dtype is given to the client: float32 as is, BF16
    as uint16 bit patterns, FP8 as an Fp8Hidden from the package's encoder."""
    if dtype == "fp32":
        return hidden
    if dtype == "bf16":
        return numerics.float32_to_bf16_bits(hidden)
    return gcmoe.Fp8Hidden.quantize(hidden)


def expect_error(call, error_type, words):
    try:
        call()
    except error_type as error:
        if words not in error.message:
            fail(f"{error_type.__name__} message {error.message!r} does not contain {words!r}")
        return
    except gcmoe.GcmoeError as error:
        fail(f"expected {error_type.__name__}, got {type(error).__name__}: {error}")
    fail(f"expected {error_type.__name__}, the call succeeded")


def check_sync(addr, hidden, ids, weights, layer, out):
    with gcmoe.Client(addr, timeout=30.0) as client:
        info = client.info()
        if info.version != gcmoe.__version__:
            fail(f"package version {gcmoe.__version__} != server version {info.version}")
        for dtype in DTYPES:
            y = client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer,
                               output_dtype="fp32")
            if y.dtype != np.float32 or y.shape != hidden.shape:
                fail(f"{dtype}: output {y.dtype} {y.shape}, expected float32 {hidden.shape}")
            np.save(os.path.join(out, f"output_{dtype}_sync.npy"), y)
            # BF16 output is the FP32 output rounded to nearest even.
            y16 = client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer)
            bits = np.asarray(y16).view(np.uint16)
            if not np.array_equal(bits, numerics.float32_to_bf16_bits(y)):
                fail(f"{dtype}: the BF16 output is not the FP32 output rounded to BF16")
        # Encoding in the client from float32 gives the same request as pre-encoded input.
        y_fp8 = client.forward(hidden, ids, weights, layer=layer, output_dtype="fp32",
                               hidden_dtype="fp8")
        if not np.array_equal(y_fp8, np.load(os.path.join(out, "output_fp8_sync.npy"))):
            fail("hidden_dtype='fp8' and Fp8Hidden.quantize gave different outputs")
        expect_error(lambda: client.forward(hidden, ids, weights, layer=info.layers),
                     gcmoe.NotFoundError, "layer")
        expect_error(lambda: client.forward(hidden, ids[:, :1], weights, layer=layer),
                     gcmoe.InvalidArgumentError, "topk_ids")
        bad_ids = ids.copy()
        bad_ids[0, 0] = info.experts
        expect_error(lambda: client.forward(hidden, bad_ids, weights, layer=layer),
                     gcmoe.InvalidArgumentError, "topk_ids")


async def check_async(addr, hidden, ids, weights, layer, out):
    async with gcmoe.aio.Client(addr, timeout=30.0) as client:
        info = await client.info()
        if info.version != gcmoe.__version__:
            fail(f"aio: package version {gcmoe.__version__} != server version {info.version}")
        outputs = await asyncio.gather(*(
            client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer,
                           output_dtype="fp32") for dtype in DTYPES))
        for dtype, y in zip(DTYPES, outputs):
            np.save(os.path.join(out, f"output_{dtype}_async.npy"), y)
        try:
            await client.forward(hidden, ids, weights, layer=info.layers)
        except gcmoe.NotFoundError as error:
            if "layer" not in error.message:
                fail(f"aio: NotFoundError message {error.message!r} does not name the layer")
        else:
            fail("aio: expected NotFoundError for a layer past the model")


def check_typing_files():
    """The package ships its .pyi files (hand-written and protoc's) and the py.typed marker."""
    root = os.path.dirname(gcmoe.__file__)
    for name in ("__init__.pyi", "client.pyi", "aio.pyi", "numerics.pyi", "errors.pyi",
                 "tensors.pyi", "py.typed", os.path.join("v1", "moe_pb2.pyi")):
        if not os.path.isfile(os.path.join(root, name)):
            fail(f"the installed package has no {name}")


def forward(args):
    os.makedirs(args.out, exist_ok=True)
    check_typing_files()
    with gcmoe.Client(args.addr) as client:
        info = client.info(timeout=10.0)
    hidden, ids, weights = random_inputs(info, args.tokens, args.seed)
    np.save(os.path.join(args.out, "hidden.npy"), hidden)
    np.save(os.path.join(args.out, "hidden_bf16.npy"),
            numerics.bf16_bits_to_float32(numerics.float32_to_bf16_bits(hidden)))
    np.save(os.path.join(args.out, "topk_ids.npy"), ids)
    np.save(os.path.join(args.out, "topk_weights.npy"), weights)
    check_sync(args.addr, hidden, ids, weights, args.layer, args.out)
    asyncio.run(check_async(args.addr, hidden, ids, weights, args.layer, args.out))
    print(f"python_package_check: gcmoe {gcmoe.__version__}: outputs saved to {args.out}")


def fp8(args):
    x = np.load(args.input)
    codes, scales = numerics.quantize_fp8(x)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "codes.npy"), codes.astype(np.int32))
    np.save(os.path.join(args.out, "scales.npy"), scales.astype(np.int32))
    # The decoder inverts the encoder on every code it produced.
    finite = codes[~np.isnan(numerics.decode_e4m3(codes))]
    if not np.array_equal(numerics.encode_e4m3(numerics.decode_e4m3(finite)), finite):
        fail("decode_e4m3 then encode_e4m3 does not give the codes back")
    print(f"python_package_check: encoded {x.shape} values")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--addr", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--tokens", type=int, default=40)
    f.add_argument("--layer", type=int, default=1)
    f.add_argument("--seed", type=int, default=5)
    q = sub.add_parser("fp8")
    q.add_argument("--input", required=True)
    q.add_argument("--out", required=True)
    args = parser.parse_args()
    forward(args) if args.mode == "forward" else fp8(args)


if __name__ == "__main__":
    main()
