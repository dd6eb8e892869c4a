"""Calls a gcmoe service from Python: the served model, then one batch of random tokens.

    python clients/python/examples/forward.py [--addr 127.0.0.1:50051] [--tokens 64]
"""
import argparse

import numpy as np

import gcmoe


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--layer", type=int, default=0)
    args = parser.parse_args()

    with gcmoe.Client(args.addr, timeout=30.0) as client:
        info = client.info()
        print(f"gcmoe {info.version}: H={info.hidden} E={info.experts} top-{info.top_k}, "
              f"{info.layers} layers, {info.ranks} ranks ({info.backend})")
        rng = np.random.default_rng(0)
        T = args.tokens
        hidden = rng.standard_normal((T, info.hidden)).astype(np.float32)
        ids = np.argsort(rng.random((T, info.experts)), axis=1)[:, :info.top_k]
        weights = np.full((T, info.top_k), 1.0 / info.top_k, dtype=np.float32)
        for dtype in ("fp32", "bf16", "fp8"):
            y = client.forward(hidden, ids, weights, layer=args.layer, hidden_dtype=dtype,
                               output_dtype="fp32")
            print(f"{dtype:>4} in: output {y.shape} {y.dtype}, mean |y| {np.abs(y).mean():.4f}")


if __name__ == "__main__":
    main()
