#!/usr/bin/env python3
"""PyTorch peers of `gcmoe bench layer`: the same rank-local MoE layer built from PyTorch ops.

Run on the GPU machine (PyTorch 2.11, sm90). For each token count T the layer is one rank's
share of an EP-8 layer: T tokens, each routed to top-k distinct local experts uniformly (every
local expert receives T*k/E tokens on average, as in EP-8), tokens already grouped by expert:

  fp8  : rowwise-quantize x -> torch._scaled_grouped_mm (W1, FP8 rowwise) -> SwiGLU (clamp,
         alpha) x routing weight -> rowwise-quantize h -> torch._scaled_grouped_mm (W2) ->
         index_add into y[T, H]
  bf16 : torch._grouped_mm (W1, BF16) -> SwiGLU x routing weight -> torch._grouped_mm (W2)
         -> index_add

Each variant is captured once in a CUDA graph and replayed back to back, as `gcmoe bench layer`
replays its own (--settle-ms first, then warm-up); the median replay time (CUDA events) is
reported with its own weight floor (FP8: 1 byte per weight, BF16: 2) over the copy bandwidth
measured in the same run (torch copy_ of 2 GiB, read + write counted).
With --ours FILE (the JSON of `gcmoe bench layer --json`) it prints the ratio table peer / ours.

  python3 bench/torch_peer.py --hidden 6144 --intermediate 2048 --experts 32 --top-k 8 \
      --tokens-per-rank 1,2,4,8,16,32,64,128,256 --ours glm.json
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch


def copy_bandwidth(nbytes=2 << 30, reps=10):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * nbytes / statistics.median(times)


def route(tokens, experts, top_k, gen):
    """Top-k distinct experts per token, uniformly; returns ids [T, k] and weights [T, k]."""
    scores = torch.rand(tokens, experts, generator=gen)
    ids = scores.topk(top_k, dim=1).indices.to(torch.int64)
    weights = torch.rand(tokens, top_k, generator=gen) * 0.45 + 0.05
    return ids, weights


def rowwise_fp8(x):
    """Per-row E4M3 with an FP32 dequantization scale per row."""
    amax = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-4)
    scale = amax / 448.0
    q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q, scale.squeeze(1)


class Layer:
    """Grouped inputs of one token count and the two peer variants over them."""

    def __init__(self, args, tokens, gen, weights):
        H, I, E, k = args.hidden, args.intermediate, args.experts, args.top_k
        ids, w = route(tokens, E, k, gen)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=E)
        self.pad = args.pad_groups
        if self.pad > 1:
            # Groups padded to a multiple of `pad` rows (padding rows carry token 0, weight 0).
            padded = ((counts + self.pad - 1) // self.pad) * self.pad
            rows = []
            start = 0
            for e in range(E):
                c = int(counts[e])
                sel = order[start:start + c]
                start += c
                fill = int(padded[e]) - c
                rows.append(torch.cat([sel, torch.full((fill,), -1, dtype=torch.int64)]))
            src = torch.cat(rows)
            counts = padded
        else:
            src = order
        valid = src >= 0
        token = torch.where(valid, src // k, torch.zeros_like(src))
        slot_w = torch.where(valid, w.reshape(-1)[src.clamp(min=0)], torch.zeros(src.shape))
        self.tokens = tokens
        self.assignments = int(valid.sum())
        self.active = int((torch.bincount(flat, minlength=E) > 0).sum())
        self.offs = torch.cumsum(counts, 0).to(torch.int32).cuda()
        x = torch.randn(tokens, H, generator=gen).to(torch.bfloat16)
        self.x_grouped = x[token].cuda()  # tokens already grouped by local expert
        self.route_w = slot_w.to(torch.float32).cuda().unsqueeze(1)
        self.token_index = token.cuda()
        self.y = torch.zeros(tokens, H, dtype=torch.bfloat16, device="cuda")
        self.w = weights
        self.alpha, self.clamp = args.alpha, args.clamp
        self.I = I

    def swiglu(self, a):
        gate, up = a[:, :self.I].float(), a[:, self.I:].float()
        if self.clamp > 0:
            gate = gate.clamp(max=self.clamp)
            up = up.clamp(-self.clamp, self.clamp)
        return gate * torch.sigmoid(self.alpha * gate) * up * self.route_w

    def fp8(self):
        xq, xs = rowwise_fp8(self.x_grouped)
        a = torch._scaled_grouped_mm(xq, self.w["w1_fp8"].transpose(-2, -1), xs,
                                     self.w["w1_scale"], offs=self.offs, out_dtype=torch.bfloat16)
        hq, hs = rowwise_fp8(self.swiglu(a))
        p = torch._scaled_grouped_mm(hq, self.w["w2_fp8"].transpose(-2, -1), hs,
                                     self.w["w2_scale"], offs=self.offs, out_dtype=torch.bfloat16)
        self.y.zero_()
        self.y.index_add_(0, self.token_index, p)
        return self.y

    def bf16(self):
        a = torch._grouped_mm(self.x_grouped, self.w["w1_bf16"].transpose(-2, -1), offs=self.offs)
        h = self.swiglu(a).to(torch.bfloat16)
        p = torch._grouped_mm(h, self.w["w2_bf16"].transpose(-2, -1), offs=self.offs)
        self.y.zero_()
        self.y.index_add_(0, self.token_index, p)
        return self.y


def time_graph(fn, warmup, replays, settle_ms=0.0, sync_each=False, sink=None):
    """Median replay time in us, timed as `gcmoe bench layer` times its graph: settle_ms of
    untimed replays (the clocks the GPU sustains under load), warmup more, then replays back to
    back with an event between each two (sync_each: one replay at a time, waiting for each).
    Every replay's time is appended to sink when given."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # warm the kernels' caches before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    settle_end = time.perf_counter() + settle_ms / 1e3
    while time.perf_counter() < settle_end:
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
    for _ in range(warmup):
        graph.replay()
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    if sync_each:  # its own start event per replay, recorded once the previous one is done
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
        for start, end in zip(starts, ends):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
    else:  # each replay starts where the one before it ended
        starts = [torch.cuda.Event(enable_timing=True)] + ends[:-1]
        starts[0].record()
        for end in ends:
            graph.replay()
            end.record()
        ends[-1].synchronize()
    times = [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]
    if sink is not None:
        sink.extend(times)
    return statistics.median(times)


def make_weights(args):
    """Random weights drawn on the GPU: FP8 [E, N, K] with an FP32 scale per output row
    (rowwise), and the same values in BF16."""
    H, I, E = args.hidden, args.intermediate, args.experts
    gen = torch.Generator(device="cuda").manual_seed(2)
    w = {}
    w1 = torch.randn(E, 2 * I, H, generator=gen, device="cuda")
    w["w1_fp8"] = w1.to(torch.float8_e4m3fn)
    w["w1_scale"] = torch.full((E, 2 * I), 1.0 / math.sqrt(H), device="cuda")
    w["w1_bf16"] = (w1 / math.sqrt(H)).to(torch.bfloat16)
    del w1
    w2 = torch.randn(E, H, I, generator=gen, device="cuda")
    w["w2_fp8"] = w2.to(torch.float8_e4m3fn)
    w["w2_scale"] = torch.full((E, H), 1.0 / math.sqrt(I), device="cuda")
    w["w2_bf16"] = (w2 / math.sqrt(I)).to(torch.bfloat16)
    del w2
    torch.cuda.empty_cache()
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--intermediate", type=int, required=True)
    ap.add_argument("--experts", type=int, required=True, help="local experts")
    ap.add_argument("--top-k", type=int, required=True)
    ap.add_argument("--alpha", type=float, default=1.0)
    ap.add_argument("--clamp", type=float, default=10.0)
    ap.add_argument("--tokens-per-rank", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="untimed replays for this long first (the clocks sustained under load)")
    ap.add_argument("--sync-each", action="store_true",
                    help="wait for every replay before the next (serializes the replays)")
    ap.add_argument("--pad-groups", type=int, default=1,
                    help="pad every expert's group to a multiple of this many rows")
    ap.add_argument("--ours", help="JSON written by `gcmoe bench layer --json`")
    ap.add_argument("--json", help="write the peer results here")
    ap.add_argument("--label", default="")
    ap.add_argument("--times", help="also write every timed replay as CSV (variant,tokens,replay,us)")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    bw = copy_bandwidth()
    weights = make_weights(args)
    H, I = args.hidden, args.intermediate
    expert_fp8 = 3 * H * I + (2 * I + H) * 4  # E4M3 weights + FP32 row scales
    ours = {}
    if args.ours:
        with open(args.ours) as f:
            for row in json.load(f)["rows"]:
                ours[row["tokens"]] = row
    results = []
    times_csv = open(args.times, "w") if args.times else None
    if times_csv:
        times_csv.write("variant,tokens,replay,us\n")
    for T in [int(t) for t in args.tokens_per_rank.split(",")]:
        layer = Layer(args, T, gen, weights)
        row = {"tokens": T, "assignments": layer.assignments, "active": layer.active}
        for name in ("fp8", "bf16"):
            try:
                sink = [] if times_csv else None
                row[name + "_us"] = time_graph(getattr(layer, name), args.warmup, args.replays,
                                             args.settle_ms, args.sync_each, sink)
                for i, us in enumerate(sink or []):
                    times_csv.write(f"{name},{T},{i},{us:.2f}\n")
            except Exception as exc:  # report and keep going: one failing variant is a finding
                print(f"T={T} {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
                row[name + "_us"] = float("nan")
        act = 2.0 * T * H * 2
        row["fp8_floor_us"] = (layer.active * expert_fp8 + act) / bw * 1e6
        row["bf16_floor_us"] = (layer.active * 2 * 3 * H * I + act) / bw * 1e6
        results.append(row)
        print(f"T={T}: fp8 {row['fp8_us']:.1f} us, bf16 {row['bf16_us']:.1f} us", file=sys.stderr)

    print(f"torch peers {args.label} (H {H}, I {I}, {args.experts} local experts, top-{args.top_k}); "
          f"torch {torch.__version__}, {torch.cuda.get_device_name()}, copy {bw / 1e9:.0f} GB/s")
    head = f"{'T/rank':>6} {'fp8_us':>9} {'fp8 %flr':>8} {'bf16_us':>9} {'bf16 %flr':>9}"
    if ours:
        head += f" {'ours_us':>9} {'ours %flr':>9} {'fp8/ours':>8} {'bf16/ours':>9}"
    print(head)
    for r in results:
        line = (f"{r['tokens']:>6} {r['fp8_us']:>9.1f} {100 * r['fp8_floor_us'] / r['fp8_us']:>7.1f}% "
                f"{r['bf16_us']:>9.1f} {100 * r['bf16_floor_us'] / r['bf16_us']:>8.1f}%")
        o = ours.get(r["tokens"])
        if o:
            line += (f" {o['median_us']:>9.1f} {100 * o['floor_us'] / o['median_us']:>8.1f}% "
                     f"{r['fp8_us'] / o['median_us']:>8.2f} {r['bf16_us'] / o['median_us']:>9.2f}")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth_Bps": bw, "rows": results}, f)


if __name__ == "__main__":
    main()
