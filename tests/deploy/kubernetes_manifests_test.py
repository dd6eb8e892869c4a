"""Every Kubernetes manifest in deploy/kubernetes, parsed and checked field by field.

    /usr/bin/python3 tests/deploy/kubernetes_manifests_test.py --gcmoe build/gcmoe

No cluster or schema validator is reachable offline, so the test reads the YAML (python3-yaml)
and checks what makes a GPU deployment work: GPUs requested for every rank and as many as the
config's ranks, the exchange the GPU layout allows, a startupProbe long enough to load weights,
readiness on gRPC health, a pinned image, a restricted securityContext, a PodDisruptionBudget,
the metrics port annotated for scraping, and a config that `gcmoe config validate` accepts.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ARGS = None
GPU = "nvidia.com/gpu"
WEIGHT_LOADING_S = 600  # a startupProbe must allow at least this long


def manifests():
    paths = sorted(glob.glob(os.path.join(REPO, "deploy", "kubernetes", "*.yaml")))
    assert paths, "no manifests"
    result = {}
    for p in paths:
        with open(p) as f:
            result[os.path.basename(p)] = [d for d in yaml.safe_load_all(f) if d]
    return result


def pod_templates(doc):
    """(pod template, role) of a workload: Deployment's, or LeaderWorkerSet's leader and worker."""
    if doc["kind"] == "Deployment":
        return [(doc["spec"]["template"], "pod")]
    if doc["kind"] == "LeaderWorkerSet":
        lwt = doc["spec"]["leaderWorkerTemplate"]
        return [(lwt["leaderTemplate"], "leader"), (lwt["workerTemplate"], "worker")]
    return []


def command_of(container):
    """The gcmoe subcommand a container runs (serve, coordinator, rank)."""
    words = " ".join(container.get("command", []) + container.get("args", [])).split()
    for word in words:
        if word in ("serve", "coordinator", "rank"):
            return word
    raise AssertionError(f"container {container['name']} runs no gcmoe command: {words}")


def gpus(container, kind):
    return int(container.get("resources", {}).get(kind, {}).get(GPU, 0))


def probe_seconds(probe):
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def is_health_probe(probe):
    if "grpc" in probe:
        return probe["grpc"]["port"] == 50051
    command = probe.get("exec", {}).get("command", [])
    return command[:3] == ["/usr/local/bin/gcmoe", "client", "health"]


class Manifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.files = manifests()

    def config_of(self, docs):
        maps = [d for d in docs if d["kind"] == "ConfigMap"]
        self.assertEqual(len(maps), 1)
        return json.loads(maps[0]["data"]["gcmoe.json"])

    def test_every_file_parses_into_known_kinds(self):
        for name, docs in self.files.items():
            kinds = sorted(d["kind"] for d in docs)
            self.assertIn("ConfigMap", kinds, name)
            self.assertIn("PodDisruptionBudget", kinds, name)
            self.assertIn("Service", kinds, name)
            self.assertTrue({"Deployment", "LeaderWorkerSet"} & set(kinds), name)

    def test_configs_validate_and_split_configs_name_a_fixed_rank_port(self):
        for name, docs in self.files.items():
            config = self.config_of(docs)
            roles = {command_of(c) for d in docs for t, _ in pod_templates(d)
                     for c in t["spec"]["containers"]}
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                json.dump(config, f)
                f.flush()
                args = [ARGS.gcmoe, "config", "validate", f.name]
                if "coordinator" in roles:
                    args.insert(3, "--split")
                r = subprocess.run(args, capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, f"{name}: {r.stderr}")

    def test_split_processes_mount_the_attach_secret_the_config_names(self):
        for name, docs in self.files.items():
            secret_file = self.config_of(docs)["server"].get("rank_secret_file", "")
            for doc in docs:
                for template, _ in pod_templates(doc):
                    spec = template["spec"]
                    volumes = {v["name"]: v for v in spec.get("volumes", [])}
                    for c in spec["containers"]:
                        if command_of(c) not in ("coordinator", "rank"):
                            continue
                        where = f"{name}/{c['name']}"
                        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
                        self.assertIn(secret_file, mounts, where)
                        secret = volumes[mounts[secret_file]["name"]]["secret"]
                        # Root owns a Secret's files: the service reads it through its group.
                        self.assertEqual(secret["defaultMode"], 0o440, where)
                        self.assertEqual(spec["securityContext"]["fsGroup"],
                                         spec["securityContext"]["runAsGroup"], where)

    def test_gpus_are_requested_for_every_rank(self):
        for name, docs in self.files.items():
            config = self.config_of(docs)
            ranks = config["parallel"]["ranks"]
            exchange = config["engine"].get("exchange", "gcmoe")
            self.assertEqual(config["engine"]["backend"], "cuda", name)
            rank_gpus = 0
            for doc in docs:
                for template, role in pod_templates(doc):
                    for c in template["spec"]["containers"]:
                        command = command_of(c)
                        requested, limit = gpus(c, "requests"), gpus(c, "limits")
                        self.assertEqual(requested, limit, f"{name}/{c['name']}")
                        if command == "coordinator":
                            self.assertEqual(limit, 0, f"{name}: the coordinator needs no GPU")
                        elif command == "serve":
                            # serve's ranks share one container: it sees all their GPUs.
                            self.assertEqual(limit, ranks, name)
                            rank_gpus += ranks
                        else:
                            self.assertEqual(limit, 1, f"{name}/{c['name']}")
                            # A container shows only its own GPU: no peer mappings, so NCCL.
                            self.assertEqual(exchange, "nccl", name)
                            rank_gpus += 1 if role != "worker" else (
                                doc["spec"]["leaderWorkerTemplate"]["size"] - 1)
            self.assertEqual(rank_gpus, ranks, f"{name}: GPUs for {ranks} ranks")

    def test_probes_wait_for_weights_and_readiness_is_grpc_health(self):
        for name, docs in self.files.items():
            for doc in docs:
                for template, _ in pod_templates(doc):
                    for c in template["spec"]["containers"]:
                        if command_of(c) == "rank":
                            continue
                        where = f"{name}/{c['name']}"
                        self.assertIn("startupProbe", c, where)
                        self.assertGreaterEqual(probe_seconds(c["startupProbe"]),
                                                WEIGHT_LOADING_S, where)
                        self.assertTrue(is_health_probe(c["startupProbe"]), where)
                        self.assertTrue(is_health_probe(c["readinessProbe"]), where)
                        if "livenessProbe" in c:
                            # Never shorter than serve's rank restart plus weight loading slack.
                            self.assertGreaterEqual(probe_seconds(c["livenessProbe"]), 60, where)

    def test_images_are_pinned_and_containers_restricted(self):
        for name, docs in self.files.items():
            for doc in docs:
                for template, _ in pod_templates(doc):
                    pod = template["spec"]["securityContext"]
                    self.assertTrue(pod["runAsNonRoot"], name)
                    self.assertNotEqual(pod["runAsUser"], 0, name)
                    self.assertEqual(pod["seccompProfile"]["type"], "RuntimeDefault", name)
                    for c in template["spec"]["containers"]:
                        where = f"{name}/{c['name']}"
                        image = c["image"]
                        self.assertRegex(image, r"^[^@]+:[^:/@]+$|@sha256:[0-9a-f]{64}$", where)
                        self.assertNotRegex(image, r":latest$", where)
                        self.assertEqual(c["imagePullPolicy"], "IfNotPresent", where)
                        s = c["securityContext"]
                        self.assertFalse(s["allowPrivilegeEscalation"], where)
                        self.assertTrue(s["readOnlyRootFilesystem"], where)
                        self.assertEqual(s["capabilities"]["drop"], ["ALL"], where)
                        # A read-only root needs the writable places mounted.
                        if command_of(c) in ("serve", "rank"):
                            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                            self.assertIn("/dev/shm", mounts, where)

    def test_disruption_budget_selects_the_pods(self):
        for name, docs in self.files.items():
            pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
            selector = pdb["spec"]["selector"]["matchLabels"]
            self.assertTrue(("maxUnavailable" in pdb["spec"]) != ("minAvailable" in pdb["spec"]))
            self.assertGreaterEqual(pdb["spec"].get("maxUnavailable", 1), 1,
                                    f"{name}: a budget of 0 blocks every drain")
            for doc in docs:
                for template, _ in pod_templates(doc):
                    labels = template["metadata"]["labels"]
                    self.assertLessEqual(selector.items(), labels.items(), name)

    def test_metrics_port_is_annotated_for_scraping(self):
        for name, docs in self.files.items():
            port = self.config_of(docs)["server"]["metrics_listen"].rsplit(":", 1)[1]
            annotated = 0
            for doc in docs:
                for template, _ in pod_templates(doc):
                    annotations = template["metadata"].get("annotations", {})
                    if annotations.get("prometheus.io/scrape") != "true":
                        continue
                    annotated += 1
                    self.assertEqual(annotations["prometheus.io/port"], port, name)
                    self.assertEqual(annotations["prometheus.io/path"], "/metrics", name)
                    ports = [p["containerPort"] for c in template["spec"]["containers"]
                             for p in c.get("ports", []) if p.get("name") == "metrics"]
                    self.assertEqual(ports, [int(port)], name)
            self.assertGreaterEqual(annotated, 1, name)

    def test_leader_worker_set_ranks_find_their_leader(self):
        docs = self.files["gcmoe-lws.yaml"]
        lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
        worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        script = " ".join(worker["args"])
        self.assertIn('--rank "$((WORKER_INDEX - 1))"', script)
        self.assertIn('--coordinator "${LWS_LEADER_ADDRESS}:50052"', script)
        env = {e["name"]: e for e in worker["env"]}
        self.assertEqual(env["WORKER_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']")
        # The controller names its headless Service after the set: ours must not take it.
        services = [d["metadata"]["name"] for d in docs if d["kind"] == "Service"]
        self.assertNotIn(lws["metadata"]["name"], services)
        self.assertEqual(self.config_of(docs)["engine"]["exchange"], "nccl")


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcmoe", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
