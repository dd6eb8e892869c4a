#!/usr/bin/python3
"""Soak and chaos run against a real `gcmoe serve`: N clients for M seconds while ranks are
killed (SIGKILL) and stalled (SIGSTOP, then SIGCONT).

    /usr/bin/python3 bench/soak.py --clients 64 --seconds 60 --kills 3 --stalls 1

It starts `gcmoe serve` on a free loopback port (the embedded default, or --config), sends a
fixed set of requests one at a time to record each one's output, then lets the clients loop
over the same requests. Every OK output must equal, byte for byte, the output of the same
request sent alone (the numerics are deterministic whatever else is in flight); a mismatch is
a wrong answer. It prints, at the end:

  - calls by status code, split into calls that ended inside a fault window (from the fault
    until the service is SERVING again) and outside one;
  - recovery after each fault: until health says SERVING for good (the start of a second of
    unbroken SERVING), and until the last failed call inside the fault window ended;
  - RSS and open file descriptors of the coordinator and the ranks, after the warm-up and at
    the end (ranks that were restarted are new processes: their drift is not comparable);
  - OK throughput over the whole run and over the seconds outside fault windows.

Exit status 0 when there were no wrong bytes and no status code outside the ones a fault may
cause (UNAVAILABLE, DEADLINE_EXCEEDED); 1 otherwise. Uses Debian's python3-grpcio and numpy
(/usr/bin/python3) and the stubs the build generates into build/proto/python.
"""
import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
STABLE_S = 1.0  # health SERVING this long, without a break, ends a fault window
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gcmoe", default=os.path.join(REPO, "build", "gcmoe"),
                   help="the gcmoe binary (default: build/gcmoe)")
    p.add_argument("--stubs", default=None,
                   help="generated Python stubs (default: proto/python next to --gcmoe)")
    p.add_argument("--config", default=None, help="config file (default: the embedded one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override passed to gcmoe serve (repeatable)")
    p.add_argument("--clients", type=int, default=16, help="concurrent clients (threads)")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    p.add_argument("--kills", type=int, default=3, help="rank SIGKILLs, spread over the run")
    p.add_argument("--stalls", type=int, default=1, help="rank SIGSTOPs, spread over the run")
    p.add_argument("--stall-seconds", type=float, default=5.0, help="how long a stall lasts")
    p.add_argument("--tokens", default="64,1,17,128",
                   help="token counts of the request set (comma-separated)")
    p.add_argument("--requests", type=int, default=8, help="distinct requests in the set")
    p.add_argument("--deadline-s", type=float, default=10.0, help="per-call deadline")
    p.add_argument("--warmup-s", type=float, default=3.0,
                   help="load before the first fault and before the first RSS/fd sample")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.kills < 0 or args.stalls < 0:
        p.error("--clients >= 1, --seconds > 0, --kills >= 0 and --stalls >= 0")
    if args.stall_seconds <= 0 or args.deadline_s <= 0 or args.requests < 1:
        p.error("--stall-seconds > 0, --deadline-s > 0 and --requests >= 1")
    if args.stubs is None:
        args.stubs = os.path.join(os.path.dirname(os.path.abspath(args.gcmoe)), "proto",
                                  "python")
    return args


# --- the service and its processes -------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """Child pids of pid (every thread's children, as /proc lists them)."""
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
    except FileNotFoundError:
        pass
    return kids


def rank_pids(serve_pid):
    """{rank: pid} of the live rank children of `gcmoe serve` (argv: gcmoe rank --rank N ...)."""
    ranks = {}
    for pid in children(serve_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state == "Z" or b"--rank" not in argv:
            continue
        ranks[int(argv[argv.index(b"--rank") + 1])] = pid
    return ranks


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def sample(serve_pid):
    out = {"coordinator": {"pid": serve_pid, "rss_kib": rss_kib(serve_pid),
                           "fds": fd_count(serve_pid)}}
    for rank, pid in sorted(rank_pids(serve_pid).items()):
        try:
            out[f"rank{rank}"] = {"pid": pid, "rss_kib": rss_kib(pid), "fds": fd_count(pid)}
        except FileNotFoundError:
            pass
    return out


def health(channel, timeout=1.0):
    """grpc.health.v1 Check of the whole service: 'SERVING', 'NOT_SERVING', ... or the error.
    The request is empty; the response's only field is the status enum (field 1, a varint)."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda _: b"",
                                response_deserializer=lambda b: b)
    try:
        body = check(None, timeout=timeout)
    except grpc.RpcError as e:
        return e.code().name
    value = body[1] if len(body) >= 2 and body[0] == 0x08 else 0
    return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(value, "?")


def wait_serving(channel, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if health(channel) == "SERVING":
            return True
        time.sleep(0.05)
    return False


# --- requests ----------------------------------------------------------------------------------

def make_requests(pb, info, token_counts, count):
    """`count` distinct ForwardRequests over the model: unit-scale BF16 activations, k distinct
    experts per token, softmax weights, token counts cycling through token_counts."""
    requests = []
    for i in range(count):
        T = min(token_counts[i % len(token_counts)], info.max_tokens)
        rng = np.random.default_rng(1000 + i)
        hidden = rng.standard_normal((T, info.hidden), dtype=np.float32)
        bits = hidden.view(np.uint32).astype(np.uint64)
        bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        ids = np.argsort(rng.random((T, info.experts)), axis=1)[:, :info.top_k].astype("<i4")
        logits = rng.standard_normal((T, info.top_k)).astype(np.float32)
        weights = (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)).astype("<f4")
        requests.append(pb.ForwardRequest(
            layer=i % info.layers,
            hidden=pb.Tensor(dtype=pb.BF16, shape=[T, info.hidden], data=bf16.tobytes()),
            topk_ids=pb.Tensor(dtype=pb.INT32, shape=[T, info.top_k], data=ids.tobytes()),
            topk_weights=pb.Tensor(dtype=pb.FP32, shape=[T, info.top_k],
                                   data=weights.tobytes()),
            output_dtype=pb.BF16,
            request_id=f"soak-{i}"))
    return requests


# --- the run -----------------------------------------------------------------------------------

class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []  # (sent, done, code name, wrong)

    def add(self, sent, done, code, wrong=False):
        with self.lock:
            self.calls.append((sent, done, code, wrong))


def client_loop(stub, requests, references, deadline_s, stop, results, index):
    i = index
    while not stop.is_set():
        n = i % len(requests)
        i += 1
        sent = time.monotonic()
        try:
            response = stub.Forward(requests[n], timeout=deadline_s)
        except grpc.RpcError as e:
            results.add(sent, time.monotonic(), e.code().name)
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                time.sleep(0.01)  # a client would back off; don't spin on a dead rank
            continue
        results.add(sent, time.monotonic(), "OK", response.output.data != references[n])


def chaos(serve_pid, channel, args, start, stop, faults):
    """Kills and stalls at evenly spaced times after the warm-up, round-robin over the ranks;
    records each fault's time and its health recovery."""
    # Alternate kinds while both remain (kill, stall, kill, kill, ...), evenly spaced.
    order = []
    kills, stalls = args.kills, args.stalls
    while kills or stalls:
        if kills:
            order.append("kill")
            kills -= 1
        if stalls:
            order.append("stall")
            stalls -= 1
    span = args.seconds - args.warmup_s
    for n, kind in enumerate(order):
        at = start + args.warmup_s + span * n / max(1, len(order))
        while time.monotonic() < at:
            if stop.wait(0.05):
                return
        pids = rank_pids(serve_pid)
        if not pids:
            faults.append({"kind": kind, "error": "no rank process found"})
            continue
        rank = sorted(pids)[n % len(pids)]
        pid = pids[rank]
        fault = {"kind": kind, "rank": rank, "pid": pid}
        if kind == "kill":
            fault["at"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            fault["at"] = stopped
            stop.wait(args.stall_seconds)
            os.kill(pid, signal.SIGCONT)
            fault["resumed"] = time.monotonic()
        # Recovery: the start of the first stretch of SERVING that lasts STABLE_S. The
        # coordinator may notice a fault late (a stalled rank is dropped when its step times
        # out, after SIGCONT), so the first SERVING after the fault is not yet recovery.
        serving_since = None
        while not stop.is_set():
            now = time.monotonic()
            if health(channel, timeout=0.5) == "SERVING":
                serving_since = serving_since or now
                if now - serving_since >= STABLE_S:
                    fault["serving_again"] = serving_since
                    break
            else:
                serving_since = None
            time.sleep(0.02)
        faults.append(fault)


def sample_rss(serve_pid, start, stop, timeline, every_s=5.0):
    """The coordinator's RSS every few seconds: a leak grows steadily, warm-up levels off."""
    while not stop.wait(every_s):
        timeline.append((round(time.monotonic() - start, 1), rss_kib(serve_pid)))


def summarize(args, results, faults, start, end, before, after, served_alone):
    calls = results.calls
    windows = []
    for f in faults:
        if "at" in f:
            windows.append((f["at"], f.get("serving_again", end)))

    def in_fault(sent, done):
        return any(sent <= w_end and done >= w_start for w_start, w_end in windows)

    by_code = {"outside_faults": collections.Counter(), "in_faults": collections.Counter()}
    wrong = 0
    for sent, done, code, bad in calls:
        by_code["in_faults" if in_fault(sent, done) else "outside_faults"][code] += 1
        wrong += bad
    for f in faults:
        if "at" not in f:
            continue
        f["health_recovery_s"] = round(f.get("serving_again", end) - f["at"], 3)
        # The client side of the outage: the last failed call that ended inside the window.
        until = f.get("serving_again", end) + STABLE_S
        last_error = max((done for sent, done, code, _ in calls
                          if code != "OK" and f["at"] <= done <= until), default=None)
        f["last_error_s"] = None if last_error is None else round(last_error - f["at"], 3)
    ok = sum(1 for c in calls if c[2] == "OK")
    fault_time = sum(min(e, end) - max(s, start) for s, e in windows)
    ok_outside = by_code["outside_faults"]["OK"]
    drift = {}
    for name in before:
        if name in after and before[name]["pid"] == after[name]["pid"]:
            b, a = before[name], after[name]
            drift[name] = {"rss_kib": [b["rss_kib"], a["rss_kib"]],
                           "rss_drift_pct": round(100.0 * (a["rss_kib"] - b["rss_kib"])
                                                  / max(1, b["rss_kib"]), 2),
                           "fds": [b["fds"], a["fds"]]}
        elif name in after:
            drift[name] = {"restarted": True, "rss_kib_end": after[name]["rss_kib"],
                           "fds_end": after[name]["fds"]}
    bad_codes = {c: n for c, n in by_code["outside_faults"].items() if c != "OK"}
    bad_codes.update({c: n for c, n in by_code["in_faults"].items()
                      if c not in FAULT_CODES and c != "OK"})
    return {
        "clients": args.clients, "seconds": round(end - start, 2), "calls": len(calls),
        "ok": ok, "wrong_outputs": wrong, "reference_requests": served_alone,
        "by_code": {k: dict(v) for k, v in by_code.items()},
        "unexpected_codes": bad_codes,
        "faults": faults,
        "throughput_ok_per_s": round(ok / (end - start), 1),
        "throughput_ok_per_s_outside_faults": round(
            ok_outside / max(1e-9, (end - start) - fault_time), 1),
        "processes": drift,
        "passed": wrong == 0 and not bad_codes,
    }


def print_report(r):
    print(f"\nsoak: {r['clients']} clients, {r['seconds']} s, {r['calls']} calls, "
          f"{r['ok']} OK, {r['wrong_outputs']} wrong outputs")
    for where in ("outside_faults", "in_faults"):
        codes = ", ".join(f"{c} {n}" for c, n in sorted(r["by_code"][where].items()))
        print(f"  {where.replace('_', ' '):15s} {codes or '-'}")
    print(f"  throughput      {r['throughput_ok_per_s']} OK/s overall, "
          f"{r['throughput_ok_per_s_outside_faults']} OK/s outside fault windows")
    print("  fault            rank  SERVING again (s)  last failed call (s)")
    for f in r["faults"]:
        if "error" in f:
            print(f"  {f['kind']:16s} {f['error']}")
            continue
        print(f"  {f['kind']:16s} {f['rank']:4d}  {f['health_recovery_s']:17.3f}  "
              f"{f['last_error_s'] if f['last_error_s'] is not None else '-':>20}")
    print(f"  (seconds after the SIGKILL or SIGSTOP; SERVING again = the start of {STABLE_S} s "
          "of unbroken SERVING)")
    print("  process          RSS start -> end (KiB)   drift    fds start -> end")
    for name, d in r["processes"].items():
        if d.get("restarted"):
            print(f"  {name:16s} restarted: {d['rss_kib_end']} KiB, {d['fds_end']} fds at the end")
        else:
            print(f"  {name:16s} {d['rss_kib'][0]:9d} -> {d['rss_kib'][1]:9d}   "
                  f"{d['rss_drift_pct']:6.2f} %  {d['fds'][0]:5d} -> {d['fds'][1]}")
    print("  coordinator RSS (s: KiB) " +
          ", ".join(f"{t:.0f}: {kib}" for t, kib in r["coordinator_rss_kib_timeline"]))
    print("  PASS" if r["passed"] else f"  FAIL: unexpected codes {r['unexpected_codes']}")


def main():
    args = parse_args()
    sys.path.insert(0, args.stubs)
    from gcmoe.v1 import moe_pb2 as pb, moe_pb2_grpc as pb_grpc

    address = f"127.0.0.1:{free_port()}"
    cmd = [args.gcmoe, "serve", "--listen", address, "--set", "server.metrics_listen="]
    if args.config:
        cmd += ["--config", args.config]
    for s in args.set:
        cmd += ["--set", s]
    log = tempfile.NamedTemporaryFile(prefix="gcmoe-soak-", suffix=".log", delete=False)
    print(f"soak: {' '.join(cmd)} (log: {log.name})", flush=True)
    serve = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        if not wait_serving(channel, 60):
            sys.exit(f"soak: the service did not become SERVING within 60 s (see {log.name})")
        stub = pb_grpc.MoeServiceStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest())
        tokens = [int(t) for t in args.tokens.split(",")]
        requests = make_requests(pb, info, tokens, args.requests)
        references = [stub.Forward(r, timeout=args.deadline_s).output.data for r in requests]
        print(f"soak: {len(requests)} requests served alone as references "
              f"(T = {sorted({r.hidden.shape[0] for r in requests})})", flush=True)

        # One channel per client, as separate client processes would have.
        results, faults, stop = Results(), [], threading.Event()
        clients = []
        for c in range(args.clients):
            client_stub = pb_grpc.MoeServiceStub(
                grpc.insecure_channel(address, options=CHANNEL_OPTIONS))
            clients.append(threading.Thread(
                target=client_loop, daemon=True,
                args=(client_stub, requests, references, args.deadline_s, stop, results, c)))
        start = time.monotonic()
        for t in clients:
            t.start()
        time.sleep(min(args.warmup_s, args.seconds))
        before = sample(serve.pid)
        fault_thread = threading.Thread(target=chaos, daemon=True,
                                        args=(serve.pid, channel, args, start, stop, faults))
        fault_thread.start()
        timeline = [(round(time.monotonic() - start, 1), before["coordinator"]["rss_kib"])]
        rss_thread = threading.Thread(target=sample_rss, daemon=True,
                                      args=(serve.pid, start, stop, timeline))
        rss_thread.start()
        time.sleep(max(0.0, start + args.seconds - time.monotonic()))
        stop.set()
        for t in clients:
            t.join()
        fault_thread.join()
        rss_thread.join()
        end = time.monotonic()
        # The end sample after the service settles: a rank restarted by the last fault is up.
        wait_serving(channel, 10)
        after = sample(serve.pid)
        report = summarize(args, results, faults, start, end, before, after, len(requests))
        report["coordinator_rss_kib_timeline"] = timeline
        # A last check that the service still answers every request exactly.
        report["post_run_exact"] = all(
            stub.Forward(r, timeout=args.deadline_s).output.data == ref
            for r, ref in zip(requests, references))
        report["passed"] = report["passed"] and report["post_run_exact"]
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    print_report(report)
    print(f"  after the run, every request sent alone again: "
          f"{'identical' if report['post_run_exact'] else 'DIFFERENT'}")
    report["serve_exit_code"] = serve.returncode
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
