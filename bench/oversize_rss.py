#!/usr/bin/python3
"""Coordinator memory under concurrent oversize Forward calls (issue 40's bound).

Starts `gcmoe serve` (embedded default model), measures the coordinator's idle RSS, sends N
concurrent Forward calls of S MiB each (far above server.max_message_bytes), samples the
coordinator's RSS every 5 ms while they run and for a second after, and prints every call's
status code, the peak RSS and the bound: 2 x idle RSS + 2 x the message limit.

    /usr/bin/python3 bench/oversize_rss.py --gcmoe build/gcmoe --calls 8 --mib 256

Needs only Debian's python3-grpcio: the body is a ForwardRequest encoded by hand (one hidden
tensor whose data is S MiB), so no generated stubs are needed.
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def oversize_request(num_bytes):
    # ForwardRequest { hidden (2): Tensor { dtype (1): FP32, data (3): num_bytes zero bytes } }
    data = b"\x00" * num_bytes
    tensor = b"\x08\x02" + b"\x1a" + varint(len(data)) + data
    return b"\x12" + varint(len(tensor)) + tensor


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gcmoe", required=True, help="the gcmoe binary")
    parser.add_argument("--calls", type=int, default=8, help="concurrent oversize calls")
    parser.add_argument("--mib", type=int, default=256, help="size of each call in MiB")
    parser.add_argument("--set", action="append", default=[], help="config override for serve")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="gcmoe-oversize-")
    address_file = os.path.join(work, "address")
    serve_args = [args.gcmoe, "serve", "--listen", "127.0.0.1:0", "--address-file", address_file]
    for s in args.set:
        serve_args += ["--set", s]
    log = open(os.path.join(work, "serve.log"), "w")
    serve = subprocess.Popen(serve_args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not (os.path.exists(address_file) and os.path.getsize(address_file) > 0):
            if time.time() > deadline or serve.poll() is not None:
                sys.exit("gcmoe serve did not start; see " + log.name)
            time.sleep(0.05)
        address = open(address_file).read().strip()
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        forward = channel.unary_unary("/gcmoe.v1.MoeService/Forward")
        info = channel.unary_unary("/gcmoe.v1.MoeService/GetModelInfo")(b"", timeout=10)
        # ModelInfo.max_message_bytes is field 20 (varint); read it without stubs.
        limit = 0
        i = 0
        while i < len(info):
            key = 0
            shift = 0
            while True:
                b = info[i]; i += 1
                key |= (b & 0x7F) << shift; shift += 7
                if not b & 0x80:
                    break
            field, wire = key >> 3, key & 7
            value = 0
            if wire == 0:
                shift = 0
                while True:
                    b = info[i]; i += 1
                    value |= (b & 0x7F) << shift; shift += 7
                    if not b & 0x80:
                        break
                if field == 20:
                    limit = value
            elif wire == 2:
                shift = 0
                length = 0
                while True:
                    b = info[i]; i += 1
                    length |= (b & 0x7F) << shift; shift += 7
                    if not b & 0x80:
                        break
                i += length
            elif wire == 5:
                i += 4
            elif wire == 1:
                i += 8
        time.sleep(1.0)
        idle = rss_bytes(serve.pid)
        body = oversize_request(args.mib << 20)
        peak = [idle]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], rss_bytes(serve.pid))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        codes = [None] * args.calls
        seconds = [0.0] * args.calls

        def call(n):
            start = time.time()
            try:
                forward(body, timeout=120)
                codes[n] = "OK"
            except grpc.RpcError as e:
                codes[n] = e.code().name + ": " + (e.details() or "")[:100]
            seconds[n] = time.time() - start

        threads = [threading.Thread(target=call, args=(n,)) for n in range(args.calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)
        stop.set()
        sampler.join()
        after = rss_bytes(serve.pid)
        bound = 2 * idle + 2 * limit
        mib = 1 << 20
        print(f"calls: {args.calls} x {args.mib} MiB; server.max_message_bytes (effective): "
              f"{limit} ({limit / mib:.1f} MiB)")
        for n, (code, s) in enumerate(zip(codes, seconds)):
            print(f"  call {n}: {code} after {s:.2f} s")
        print(f"coordinator RSS: idle {idle / mib:.1f} MiB, peak {peak[0] / mib:.1f} MiB, "
              f"1 s after {after / mib:.1f} MiB; bound 2 x idle + 2 x limit = "
              f"{bound / mib:.1f} MiB: {'within' if peak[0] <= bound else 'OVER'}")
        ok = all(c is not None and c.startswith("RESOURCE_EXHAUSTED") for c in codes)
        print("every call RESOURCE_EXHAUSTED:", "yes" if ok else "NO")
        return 0 if ok and peak[0] <= bound else 1
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
