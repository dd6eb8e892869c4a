#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

    /usr/bin/python3 tests/fuzz/make_seeds.py --gcmoe build/gcmoe

The seeds are committed; this script is how they were made, so a change of the API or of the
file formats can remake them. Each seed is a small valid input (the fuzzer reaches the deep
checks by mutating valid inputs) or one that fails exactly one check:
  forward_request: serialized ForwardRequests for the embedded default model (H=256, E=16,
                   top-4, 2 layers): BF16, FP32 and FP8 hidden, unused slots, and one each with
                   a NaN, a repeated expert and a wrong shape; tensors and output in the fuzz
                   target's registration, and references past its end or to no registration.
  config:          the examples, the embedded default as `gcmoe config show` prints it (every
                   key), and configs with a misspelled key, a wrong type and an override.
  safetensors:     `gcmoe weights export` files of the fuzz target's small model (H=32, I=32,
                   E=2, I_s=32, one layer) in each form, and small hand-made headers.
  hf_checkpoint:   config.json text, a NUL byte and model.safetensors.index.json text (or the
                   config alone: an unsharded checkpoint), with the keys of the four families
                   as their models publish them (gpt_oss, qwen3_moe, mixtral, deepseek_v3,
                   FP8 and BF16), and ones that fail one check of config.json or the index.
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

    # The fuzz target's registration "fuzz" (forward_request_fuzz.cc): BF16 activations at 0,
    # ids at 16 KiB, weights at 20 KiB, room for the output at 24 KiB.
    def region(offset, size):
        return pb.TensorRegion(region="fuzz", offset=offset, byte_size=size)

    def from_region(T, output=pb.BF16):
        r = pb.ForwardRequest(layer=0, output_dtype=output, request_id=f"region-{T}")
        r.hidden.CopyFrom(pb.Tensor(dtype=pb.BF16, shape=[T, H], region=region(0, T * H * 2)))
        r.topk_ids.CopyFrom(pb.Tensor(dtype=pb.INT32, shape=[T, k],
                                      region=region(16 << 10, T * k * 4)))
        r.topk_weights.CopyFrom(pb.Tensor(dtype=pb.FP32, shape=[T, k],
                                          region=region(20 << 10, T * k * 4)))
        r.output_region.CopyFrom(region(24 << 10, T * H * (4 if output == pb.FP32 else 2)))
        return r

    write("forward_request", "region_bf16_t2", from_region(2).SerializeToString())
    write("forward_request", "region_t5_fp32_out", from_region(5, pb.FP32).SerializeToString())
    mixed = request(3)
    mixed.hidden.ClearField("data")
    mixed.hidden.region.CopyFrom(region(0, 3 * H * 2))
    write("forward_request", "region_hidden_inline_routing", mixed.SerializeToString())
    beyond = from_region(1)
    beyond.topk_weights.region.offset = (64 << 10) - 8
    write("forward_request", "bad_region_past_the_end", beyond.SerializeToString())
    unknown = from_region(1)
    unknown.topk_ids.region.region = "nothing"
    write("forward_request", "bad_region_unknown", unknown.SerializeToString())


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


def hf_index(files, layers, experts, names):
    """An index that puts MoE layer l's tensors in files[l % len(files)]."""
    weight_map = {"model.embed_tokens.weight": files[0]}
    for n, layer in enumerate(layers):
        for e in experts:
            for name in names(layer, e):
                weight_map[name] = files[n % len(files)]
    return {"metadata": {"total_size": 123456}, "weight_map": weight_map}


def hf_configs():
    """{family: (config, index or None)}: small models in each family's layout."""
    shards = [f"model-{i + 1:05d}-of-00002.safetensors" for i in range(2)]
    gpt_oss = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
               "hidden_size": 160, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_local_experts": 8, "num_experts_per_tok": 4, "experts_per_token": 4,
               "swiglu_limit": 7.0, "head_dim": 64,
               "quantization_config": {"quant_method": "mxfp4"}}
    fused = [f"experts.{m}_{p}" for m in ("gate_up_proj", "down_proj")
             for p in ("blocks", "scales", "bias")]
    gpt_oss_index = hf_index(shards, [0, 1], [0],
                             lambda l, e: [f"model.layers.{l}.mlp.{t}" for t in fused])
    qwen = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 128, "intermediate_size": 192, "moe_intermediate_size": 64,
            "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
            "decoder_sparse_step": 1, "mlp_only_layers": [1], "norm_topk_prob": True}
    mixtral = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
               "hidden_size": 128, "intermediate_size": 96, "num_hidden_layers": 2,
               "num_local_experts": 4, "num_experts_per_tok": 2}
    mixtral_index = hf_index(shards, [0, 1], range(4), lambda l, e: [
        f"model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight" for w in ("w1", "w3", "w2")])
    deepseek = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "hidden_size": 192, "intermediate_size": 256, "moe_intermediate_size": 64,
                "num_hidden_layers": 3, "n_routed_experts": 8, "n_shared_experts": 1,
                "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                        "quant_method": "fp8", "weight_block_size": [128, 128]}}

    def deepseek_names(layer, e):
        return [f"model.layers.{layer}.mlp.{owner}.{m}_proj.{w}"
                for owner in (f"experts.{e}", "shared_experts") for m in ("gate", "up", "down")
                for w in ("weight", "weight_scale_inv")]

    deepseek_index = hf_index(shards, [1, 2], range(8), deepseek_names)
    deepseek_bf16 = {k: v for k, v in deepseek.items() if k != "quantization_config"}
    return {"gpt_oss": (gpt_oss, gpt_oss_index), "qwen3_moe": (qwen, None),
            "mixtral": (mixtral, mixtral_index), "deepseek_v3": (deepseek, deepseek_index),
            "deepseek_v3_bf16": (deepseek_bf16, None)}


def hf_input(config, index=None):
    text = json.dumps(config, indent=2)
    return text if index is None else text + "\0" + json.dumps(index, indent=2)


def hf_checkpoint_seeds():
    configs = hf_configs()
    for name, (config, index) in configs.items():
        write("hf_checkpoint", name, hf_input(config, index))
    gpt_oss, gpt_oss_index = configs["gpt_oss"]
    qwen = configs["qwen3_moe"][0]
    mixtral, mixtral_index = configs["mixtral"]
    deepseek, deepseek_index = configs["deepseek_v3"]
    # config.json, one check each
    bad = {
        "bad_model_type": dict(mixtral, model_type="llama"),
        "bad_hidden_not_32": dict(mixtral, hidden_size=100),
        "bad_missing_experts": {k: v for k, v in mixtral.items() if k != "num_local_experts"},
        "bad_top_k_over_experts": dict(mixtral, num_experts_per_tok=5),
        "bad_layers_string": dict(qwen, num_hidden_layers="3"),
        "bad_no_moe_layer": dict(qwen, mlp_only_layers=[0, 1, 2]),
        "bad_mlp_only_not_list": dict(qwen, mlp_only_layers=1),
        "bad_swiglu_limit": dict(gpt_oss, swiglu_limit=-1.0),
        "bad_first_dense_all": dict(deepseek, first_k_dense_replace=3),
        "bad_quant_method": dict(deepseek, quantization_config={"quant_method": "awq"}),
        "bad_block_size": dict(deepseek, quantization_config={"quant_method": "fp8",
                                                              "weight_block_size": [64, 64]}),
        # the reader's bounds and types, where it once allocated, overflowed or threw
        "bad_quant_method_type": dict(deepseek, quantization_config={"quant_method": 1}),
        "bad_layers_beyond_bound": dict(mixtral, num_hidden_layers=2**31 - 1),
        "bad_shared_experts_overflow": dict(deepseek, n_shared_experts=2**31 - 1),
        "bad_experts_beyond_bound": dict(mixtral, num_local_experts=2**16 + 1),
        "bad_swiglu_limit_below_float": dict(gpt_oss, swiglu_limit=1e-50),
        "bad_swiglu_limit_above_float": dict(gpt_oss, swiglu_limit=1e300),
        "bad_mlp_only_beyond_int": dict(qwen, mlp_only_layers=[2**32 + 1]),
    }
    for name, config in bad.items():
        write("hf_checkpoint", name, hf_input(config))
    write("hf_checkpoint", "bad_config_syntax", '{"model_type": "mixtral", "hidden_size": 128,}')
    write("hf_checkpoint", "bad_config_array", "[1, 2]")
    # the index, one check each (config.json valid)
    write("hf_checkpoint", "bad_index_no_weight_map",
          hf_input(mixtral, {"metadata": {"total_size": 1}}))
    write("hf_checkpoint", "bad_index_empty_map", hf_input(mixtral, {"weight_map": {}}))
    write("hf_checkpoint", "bad_index_path_in_name",
          hf_input(mixtral, {"weight_map": {"model.layers.0.block_sparse_moe.experts.0.w1.weight":
                                            "../model-00001-of-00002.safetensors"}}))
    write("hf_checkpoint", "bad_index_file_not_string",
          hf_input(deepseek, {"weight_map": {"model.embed_tokens.weight": 1}}))
    write("hf_checkpoint", "bad_index_syntax", hf_input(gpt_oss) + "\0{\"weight_map\": {")


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
    hf_checkpoint_seeds()


if __name__ == "__main__":
    main()
