#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

    /usr/bin/python3 tests/fuzz/make_seeds.py --gcmoe build/gcmoe

The seeds are committed; this script is how they were made, so a change of the API or of the
file formats can remake them. Each seed is a small valid input (the fuzzer reaches the deep
checks by mutating valid inputs) or one that fails exactly one check:
  forward_request: serialized ForwardRequests for the embedded default model (H=256, E=16,
                   top-4, 2 layers): BF16, FP32 and FP8 hidden, unused slots, and one each with
                   a NaN, a repeated expert and a wrong shape.
  config:          the examples, the embedded default as `gcmoe config show` prints it (every
                   key), and configs with a misspelled key, a wrong type and an override.
  safetensors:     `gcmoe weights export` files of the fuzz target's small model (H=32, I=32,
                   E=2, I_s=32, one layer) in each form, and small hand-made headers.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def write(target, name, data):
    path = os.path.join(HERE, "corpus", target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def forward_seeds(pb):
    H, E, k = 256, 16, 4
    rng = np.random.default_rng(3)

    def request(T, hidden_dtype=pb.BF16, layer=0, output=pb.BF16, unused=0):
        ids = np.argsort(rng.random((T, E)), axis=1)[:, :k].astype("<i4")
        ids[:, k - unused:] = -1
        weights = np.full((T, k), 1.0 / k, dtype="<f4")
        x = rng.standard_normal((T, H)).astype(np.float32)
        r = pb.ForwardRequest(layer=layer, output_dtype=output, request_id=f"seed-{T}")
        if hidden_dtype == pb.BF16:
            data = (x.view(np.uint32) >> 16).astype("<u2").tobytes()
        elif hidden_dtype == pb.FP32:
            data = x.astype("<f4").tobytes()
        else:  # FP8_E4M3 codes of small magnitude, scale 2^0 (UE8M0 code 127)
            data = rng.integers(0, 0x50, size=(T, H), dtype=np.uint8).tobytes()
            r.hidden_scales.CopyFrom(pb.Tensor(dtype=pb.UE8M0, shape=[T, H // 32],
                                               data=bytes([127]) * (T * H // 32)))
        r.hidden.CopyFrom(pb.Tensor(dtype=hidden_dtype, shape=[T, H], data=data))
        r.topk_ids.CopyFrom(pb.Tensor(dtype=pb.INT32, shape=[T, k], data=ids.tobytes()))
        r.topk_weights.CopyFrom(pb.Tensor(dtype=pb.FP32, shape=[T, k], data=weights.tobytes()))
        return r

    write("forward_request", "bf16_t1", request(1).SerializeToString())
    write("forward_request", "bf16_t3_layer1_fp32_out",
          request(3, layer=1, output=pb.FP32).SerializeToString())
    write("forward_request", "fp32_t2_unused_slots",
          request(2, pb.FP32, unused=2).SerializeToString())
    write("forward_request", "fp8_t2", request(2, pb.FP8_E4M3).SerializeToString())
    nan = request(1, pb.FP32)
    nan.hidden.data = struct.pack("<f", float("nan")) + nan.hidden.data[4:]
    write("forward_request", "bad_nan_hidden", nan.SerializeToString())
    repeated = request(1)
    ids = bytearray(repeated.topk_ids.data)
    ids[4:8] = ids[0:4]
    repeated.topk_ids.data = bytes(ids)
    write("forward_request", "bad_repeated_expert", repeated.SerializeToString())
    shape = request(1)
    shape.topk_ids.shape[1] = k + 1
    write("forward_request", "bad_ids_shape", shape.SerializeToString())


def config_seeds(gcmoe):
    examples = os.path.join(REPO, "config", "examples")
    for name in sorted(os.listdir(examples)):
        if name.endswith(".json"):
            shutil.copy(os.path.join(examples, name),
                        os.path.join(HERE, "corpus", "config", name))
    shown = subprocess.run([gcmoe, "config", "show"], check=True, capture_output=True,
                           text=True).stdout
    write("config", "every_key.json", shown)
    write("config", "bad_misspelled_key.json", '{"model": {"hiden": 256}}')
    write("config", "bad_types.json",
          '{"parallel": {"ranks": "two"}, "engine": {"max_tokens_per_rank": -1}}')
    write("config", "bad_syntax.json", '{"model": {"hidden": 256,}')
    write("config", "empty_object.json", "{}")


def safetensors_file(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds(gcmoe):
    shape = ["--hidden", "32", "--intermediate", "32", "--experts", "2", "--top-k", "1",
             "--layers", "1", "--shared-intermediate", "32"]
    with tempfile.TemporaryDirectory() as tmp:
        for form in ("prequantized", "bf16", "f32"):
            out = os.path.join(tmp, form)
            subprocess.run([gcmoe, "weights", "export", *shape, "--form", form, "--out", out],
                           check=True, capture_output=True)
            with open(out, "rb") as f:
                write("safetensors", f"small_model_{form}", f.read())
    write("safetensors", "one_tensor",
          safetensors_file({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                            "__metadata__": {"format": "pt"}}, bytes(16)))
    write("safetensors", "empty_header", safetensors_file({}))
    write("safetensors", "bad_offsets",
          safetensors_file({"a": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}},
                           bytes(4)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gcmoe", default=os.path.join(REPO, "build", "gcmoe"))
    p.add_argument("--stubs", default=None,
                   help="generated Python stubs (default: proto/python next to --gcmoe)")
    args = p.parse_args()
    stubs = args.stubs or os.path.join(os.path.dirname(os.path.abspath(args.gcmoe)), "proto",
                                       "python")
    sys.path.insert(0, stubs)
    from gcmoe.v1 import moe_pb2
    forward_seeds(moe_pb2)
    config_seeds(args.gcmoe)
    safetensors_seeds(args.gcmoe)


if __name__ == "__main__":
    main()
