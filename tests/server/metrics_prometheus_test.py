"""A real Prometheus scrapes `gcmoe serve` while clients call it; its HTTP API must count them.

    /usr/bin/python3 tests/server/metrics_prometheus_test.py --gcmoe build/gcmoe \
        [--prometheus /usr/bin/prometheus] [--workdir DIR]

Starts `gcmoe serve` (the embedded tiny CPU model, 2 ranks) with its metrics endpoint on a
loopback port, and Debian's Prometheus with a generated config that scrapes it every second.
`gcmoe client forward` sends N Forward calls; raw gRPC calls add refused Forwards and
GetModelInfo calls. Prometheus's /api/v1/query must then report exactly what was sent, and the
per-rank loads and tokens what the service's own GetStats reports.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_processes as ops  # noqa: E402

ARGS = None
FORWARD_OK = 37       # Forward calls from `gcmoe client forward`
FORWARD_REFUSED = 5   # empty Forwards, refused with INVALID_ARGUMENT
MODEL_INFO = 4        # raw GetModelInfo calls (the client adds one of its own)
TOKENS = 8


def query(base, expr):
    """The instant vector of `expr` as {label-tuple: value}."""
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: {body}")
    result = {}
    for sample in body["data"]["result"]:
        labels = tuple(sorted((k, v) for k, v in sample["metric"].items()
                              if k not in ("__name__", "instance", "job")))
        result[labels] = float(sample["value"][1])
    return result


def scalar(base, expr):
    values = query(base, expr)
    return next(iter(values.values())) if len(values) == 1 else None


class PrometheusScrapesGcmoe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="gcmoe-prometheus-", dir=ARGS.workdir)
        cls.serve = ops.Serve(ARGS.gcmoe, cls.workdir, "serve")
        port = ops.free_port()
        cls.base = f"http://127.0.0.1:{port}"
        config = os.path.join(cls.workdir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n"
                    "  scrape_interval: 1s\n"
                    "  evaluation_interval: 1s\n"
                    "scrape_configs:\n"
                    "  - job_name: gcmoe\n"
                    "    static_configs:\n"
                    f"      - targets: ['{cls.serve.metrics_address}']\n")
        cls.prometheus_log = open(os.path.join(cls.workdir, "prometheus.log"), "w")
        cls.prometheus = subprocess.Popen(
            [ARGS.prometheus, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(cls.workdir, 'tsdb')}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=cls.prometheus_log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(cls.base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or cls.prometheus.poll() is not None:
                raise AssertionError("Prometheus did not become ready:\n" +
                                     open(cls.prometheus_log.name).read())
            time.sleep(0.3)

        channel = grpc.insecure_channel(cls.serve.address)
        for _ in range(FORWARD_REFUSED):
            assert ops.empty_forward(channel) == grpc.StatusCode.INVALID_ARGUMENT
        for _ in range(MODEL_INFO):
            assert ops.get_model_info(channel) == grpc.StatusCode.OK
        channel.close()
        client = subprocess.run(
            [ARGS.gcmoe, "client", "forward", "--addr", cls.serve.address, "--tokens",
             str(TOKENS), "--requests", str(FORWARD_OK), "--concurrency", "2", "--warmup", "0"],
            capture_output=True, text=True, timeout=120)
        assert client.returncode == 0, client.stdout + client.stderr
        stats = subprocess.run(
            [ARGS.gcmoe, "client", "stats", "--addr", cls.serve.address, "--json"],
            capture_output=True, text=True, timeout=30)
        assert stats.returncode == 0, stats.stderr
        cls.stats = json.loads(stats.stdout)

        # Wait until a scrape after the last call has landed: the OK counter reaches its total
        # (it can never pass it, so waiting for equality cannot hide an overcount).
        deadline = time.monotonic() + 60
        ok = None
        while time.monotonic() < deadline:
            ok = scalar(cls.base, 'gcmoe_requests_total{method="Forward",code="OK"}')
            if ok == FORWARD_OK:
                break
            time.sleep(0.5)
        # One more scrape interval, so every family comes from a scrape after the last call.
        time.sleep(2.5)

    @classmethod
    def tearDownClass(cls):
        if cls.prometheus.poll() is None:
            cls.prometheus.terminate()
            cls.prometheus.wait(timeout=30)
        cls.prometheus_log.close()
        cls.serve.stop()
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def test_request_counter_counts_every_call_by_method_and_code(self):
        counts = query(self.base, "gcmoe_requests_total")
        self.assertEqual(counts, {
            (("code", "OK"), ("method", "Forward")): FORWARD_OK,
            (("code", "INVALID_ARGUMENT"), ("method", "Forward")): FORWARD_REFUSED,
            # The client asks for the model once before its calls.
            (("code", "OK"), ("method", "GetModelInfo")): MODEL_INFO + 1,
            # The client's stats command, after the calls.
            (("code", "OK"), ("method", "GetStats")): 1,
        })

    def test_latency_histogram_counts_every_forward_call(self):
        self.assertEqual(
            scalar(self.base, 'gcmoe_request_duration_seconds_count{method="Forward"}'),
            FORWARD_OK + FORWARD_REFUSED)
        # The +Inf bucket holds every observation; the sum is positive time.
        self.assertEqual(
            scalar(self.base,
                   'gcmoe_request_duration_seconds_bucket{method="Forward",le="+Inf"}'),
            FORWARD_OK + FORWARD_REFUSED)
        self.assertGreater(
            scalar(self.base, 'gcmoe_request_duration_seconds_sum{method="Forward"}'), 0)
        # Queue and engine time exist only for the calls that ran a step.
        self.assertEqual(scalar(self.base, "gcmoe_forward_queue_seconds_count"), FORWARD_OK)
        self.assertEqual(scalar(self.base, "gcmoe_forward_engine_seconds_count"), FORWARD_OK)
        p99 = scalar(self.base, "histogram_quantile(0.99, gcmoe_forward_engine_seconds_bucket)")
        self.assertGreater(p99, 0)

    def test_tokens_and_rank_loads_match_get_stats(self):
        self.assertEqual(scalar(self.base, "gcmoe_tokens_total"), FORWARD_OK * TOKENS)
        self.assertEqual(int(self.stats["tokens_total"]), FORWARD_OK * TOKENS)
        after = query(self.base, "gcmoe_rank_assignments_total")
        before = query(self.base, "gcmoe_rank_assignments_unbalanced_total")
        for rank in self.stats["ranks"]:
            r = str(rank.get("rank", 0))
            self.assertEqual(after[(("rank", r),)], int(rank["load_after_total"]), r)
            self.assertEqual(before[(("rank", r),)], int(rank["load_before_total"]), r)

    def test_state_gauges_show_a_serving_service(self):
        self.assertEqual(scalar(self.base, "gcmoe_serving"), 1)
        self.assertEqual(scalar(self.base, "gcmoe_queue_depth"), 0)
        self.assertEqual(scalar(self.base, "gcmoe_requests_in_flight"), 0)
        self.assertEqual(query(self.base, "gcmoe_rank_ready"),
                         {(("rank", "0"),): 1, (("rank", "1"),): 1})
        self.assertEqual(query(self.base, "gcmoe_rank_restarts_total"),
                         {(("rank", "0"),): 0, (("rank", "1"),): 0})


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcmoe", required=True)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--workdir", default=None)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
