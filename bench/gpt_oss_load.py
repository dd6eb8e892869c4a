#!/usr/bin/env python3
"""Load time and peak host memory of a gpt-oss-120b-shaped checkpoint on `gcmoe serve`.

Writes a checkpoint in gpt-oss's on-disk layout (H = I = 2880, 128 experts, top-4, MXFP4 codes
with E8M0 scales and BF16 biases, one shard per layer, random codes) with LAYERS MoE layers,
then starts `gcmoe serve` on it (one rank, the backend given) and reports the time from start
to SERVING, the per-layer load lines of the log, and the peak resident memory of the service's
processes. Run it for two layer counts: with streaming loads the peak is one layer's worth of
pages plus the service, not the checkpoint.

    /usr/bin/python3 bench/gpt_oss_load.py --gcmoe build/gcmoe --dir /tmp/gptoss \
        --layers 2,8 --backend cuda

Writes only what is missing (a directory per layer count is reused). Needs numpy.
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np

H = I = 2880
E = 128
TOP_K = 4


def tensor_specs(layer):
    p = f"model.layers.{layer}.mlp.experts."
    return [  # name, dtype, shape, bytes per element
        (p + "down_proj_bias", "BF16", [E, H], 2),
        (p + "down_proj_blocks", "U8", [E, H, I // 32, 16], 1),
        (p + "down_proj_scales", "U8", [E, H, I // 32], 1),
        (p + "gate_up_proj_bias", "BF16", [E, 2 * I], 2),
        (p + "gate_up_proj_blocks", "U8", [E, 2 * I, H // 32, 16], 1),
        (p + "gate_up_proj_scales", "U8", [E, 2 * I, H // 32], 1),
    ]


def tensor_bytes(name, dtype, shape, rng):
    count = int(np.prod(shape))
    if name.endswith("_blocks"):
        return rng.integers(0, 256, count, dtype=np.uint8).tobytes()
    if name.endswith("_scales"):  # 2^-6 .. 2^-4: outputs stay well inside BF16
        return rng.integers(121, 124, count, dtype=np.uint8).tobytes()
    bias = (rng.standard_normal(count) * 0.05).astype(np.float32)
    return (bias.view(np.uint32) >> 16).astype("<u2").tobytes()  # BF16 by truncation


def write_shard(path, layer, rng):
    """Streams one layer's tensors to `path`, one tensor in memory at a time."""
    specs = tensor_specs(layer)
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, size in specs:
        n = int(np.prod(shape)) * size
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape, _ in specs:
            f.write(tensor_bytes(name, dtype, shape, rng))
    os.rename(path + ".tmp", path)
    return {name: os.path.basename(path) for name, *_ in specs}, offset


def write_checkpoint(directory, layers):
    os.makedirs(directory, exist_ok=True)
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": H, "intermediate_size": I, "num_hidden_layers": layers,
        "num_local_experts": E, "num_experts_per_tok": TOP_K, "experts_per_token": TOP_K,
        "swiglu_limit": 7.0, "head_dim": 64, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": 201088, "rms_norm_eps": 1e-5,
        "quantization_config": {"quant_method": "mxfp4"},
    }
    weight_map, total = {}, 0
    for layer in range(layers):
        name = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
        path = os.path.join(directory, name)
        rng = np.random.default_rng(layer)
        if os.path.exists(path):
            names = {n: name for n, *_ in tensor_specs(layer)}
            size = sum(int(np.prod(s)) * b for _, _, s, b in tensor_specs(layer))
        else:
            started = time.monotonic()
            names, size = write_shard(path, layer, rng)
            print(f"  wrote layer {layer}: {size / 2**30:.2f} GiB in "
                  f"{time.monotonic() - started:.1f} s", flush=True)
        weight_map.update(names)
        total += size
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return total


def serve_once(gcmoe, directory, backend, workdir):
    """Starts serve, waits for SERVING, stops it; (seconds to serving, peak RSS in KiB of serve
    or any rank it started, log text)."""
    address_file = os.path.join(workdir, "address")
    log_path = os.path.join(workdir, "serve.log")
    config_path = os.path.join(workdir, "serve.json")
    if os.path.exists(address_file):
        os.remove(address_file)
    # Every model key from config.json; startup sized for loading tens of GiB.
    config = {"model": {"weights": "hf:" + directory}, "parallel": {"ranks": 1},
              "engine": {"backend": backend},
              "server": {"listen": "127.0.0.1:0", "rank_listen": "127.0.0.1:0",
                         "metrics_listen": "", "startup_timeout_ms": 1800000}}
    with open(config_path, "w") as f:
        json.dump(config, f)
    args = [gcmoe, "serve", "--config", config_path, "--address-file", address_file]
    started = time.monotonic()
    usage = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        ready = None
        while time.monotonic() - started < 1800:
            # Reaped here, not by Popen: wait4's usage of serve includes the ranks it reaped,
            # so its ru_maxrss is the largest RSS of the tree.
            pid, _, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid != 0:
                break
            if os.path.exists(address_file):
                ready = time.monotonic() - started
                break
            time.sleep(0.05)
        if ready is not None or pid == 0:
            proc.send_signal(signal.SIGTERM)
            _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0
    with open(log_path) as f:
        text = f.read()
    return ready, usage.ru_maxrss, text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gcmoe", required=True)
    parser.add_argument("--dir", required=True, help="where the checkpoints are written")
    parser.add_argument("--layers", default="2,8", help="layer counts, comma-separated")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints")
    args = parser.parse_args()
    rows = []
    for layers in [int(x) for x in args.layers.split(",")]:
        directory = os.path.join(args.dir, f"layers{layers}")
        total = write_checkpoint(directory, layers)
        seconds, peak_kib, log = serve_once(args.gcmoe, directory, args.backend, args.dir)
        loads = [line for line in log.splitlines() if " loaded (" in line]
        print(f"layers {layers}: checkpoint {total / 2**30:.2f} GiB; serving after "
              f"{'%.1f s' % seconds if seconds else 'NEVER'}; peak RSS of any process "
              f"{peak_kib / 2**20:.2f} GiB", flush=True)
        for line in loads[-3:]:
            print("   ", line.strip()[:200])
        if seconds is None:
            print(log[-3000:])
        rows.append((layers, total, seconds, peak_kib))
        if not args.keep:
            shutil.rmtree(directory)
    print("\nlayers  checkpoint GiB  to SERVING s  peak RSS GiB")
    for layers, total, seconds, peak in rows:
        print(f"{layers:6d}  {total / 2**30:14.2f}  {seconds or float('nan'):12.1f}  "
              f"{peak / 2**20:12.2f}")
    return 0 if all(r[2] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
