"""The systemd units: `systemd-analyze verify` and `security`, and the split units' config.

    /usr/bin/python3 tests/deploy/systemd_units_test.py --gcmoe build/gcmoe [--workdir DIR]

verify runs on copies of deploy/systemd/*.service whose /usr/local/bin/gcmoe is a stub script
(it checks that every command exists and is executable). security scores each unit offline;
the scores are printed and must be OK or better (an exposure of at most 4.9 of 10). The split
units must work from what deploy/install.sh installs: a coordinator and ranks started apart
from that config alone serve.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
UNITS = os.path.join(REPO, "deploy", "systemd")
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
import ops_processes as ops  # noqa: E402

ARGS = None
# What `systemd-analyze security` calls "OK" starts below 5.0 ("MEDIUM").
OK_EXPOSURE = 4.9


def read_unit(name):
    """The unit as {key: [values]} of its [Service] section (keys repeat in systemd)."""
    values = {}
    section = None
    with open(os.path.join(UNITS, name)) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = line
                continue
            if section == "[Service]":
                key, _, value = line.partition("=")
                values.setdefault(key, []).append(value)
    return values


def systemd_analyze_runs():
    try:
        r = subprocess.run(["systemd-analyze", "--version"], capture_output=True, timeout=30)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Units(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="gcmoe-systemd-", dir=ARGS.workdir)
        stub = os.path.join(cls.workdir, "gcmoe")
        with open(stub, "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(stub, 0o755)
        cls.copies = []
        for name in sorted(os.listdir(UNITS)):
            with open(os.path.join(UNITS, name)) as f:
                text = f.read().replace("/usr/local/bin/gcmoe", stub)
            # verify needs an instance of a template.
            copy = os.path.join(cls.workdir, name.replace("@.service", "@0.service"))
            with open(copy, "w") as f:
                f.write(text)
            cls.copies.append(copy)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def test_systemd_analyze_verify_passes(self):
        if not systemd_analyze_runs():
            self.skipTest("systemd-analyze cannot run here")
        r = subprocess.run(["systemd-analyze", "verify", *self.copies], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stderr.strip(), "", r.stderr)

    def test_security_exposure_is_ok_or_better(self):
        if not systemd_analyze_runs():
            self.skipTest("systemd-analyze cannot run here")
        for copy in self.copies:
            r = subprocess.run(["systemd-analyze", "security", "--offline=yes", copy],
                               capture_output=True, text=True, timeout=120)
            match = re.search(r"Overall exposure level for (\S+): ([0-9.]+) (\w+)",
                              r.stdout + r.stderr)
            self.assertIsNotNone(match, r.stdout + r.stderr)
            unit, score, verdict = match.group(1), float(match.group(2)), match.group(3)
            print(f"systemd-analyze security {unit}: {score} {verdict}", file=sys.stderr)
            self.assertLessEqual(score, OK_EXPOSURE, f"{unit}: {score} {verdict}")

    def test_every_unit_notifies_and_lets_the_gpu_through(self):
        for name in ("gcmoe.service", "gcmoe-coordinator.service", "gcmoe-rank@.service"):
            unit = read_unit(name)
            self.assertEqual(unit["Type"], ["notify"], name)
            self.assertEqual(unit["NotifyAccess"], ["main"], name)
            self.assertIn("WatchdogSec", unit, name)
            self.assertEqual(unit["DevicePolicy"], ["closed"], name)
            self.assertIn("char-nvidia-frontend rw", unit["DeviceAllow"], name)
            self.assertIn("char-nvidia-uvm rw", unit["DeviceAllow"], name)
            # Either would hide /dev/nvidia* or /proc/driver/nvidia from the CUDA backend.
            self.assertNotIn("PrivateDevices", unit, name)
            self.assertNotIn("ProcSubset", unit, name)
            self.assertEqual(unit["CapabilityBoundingSet"], [""], name)
            self.assertEqual(unit["NoNewPrivileges"], ["yes"], name)
        self.assertIn("/usr/local/bin/gcmoe config validate --split /etc/gcmoe/gcmoe.json",
                      read_unit("gcmoe-coordinator.service")["ExecStartPre"])
        # Weight loading: the start-up window of what loads weights is minutes, not 90 s.
        for name in ("gcmoe.service", "gcmoe-rank@.service"):
            self.assertEqual(read_unit(name)["TimeoutStartSec"], ["15min"], name)


class SplitUnitsFromTheInstalledConfig(unittest.TestCase):
    def test_installed_config_serves_with_ranks_started_apart(self):
        workdir = tempfile.mkdtemp(prefix="gcmoe-install-", dir=ARGS.workdir)
        processes = ops.Processes(ARGS.gcmoe, workdir)
        try:
            build_dir = os.path.dirname(os.path.abspath(ARGS.gcmoe))
            r = subprocess.run([os.path.join(REPO, "deploy", "install.sh"), "--build-dir",
                                build_dir, "--prefix", workdir], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            config = os.path.join(workdir, "etc", "gcmoe", "gcmoe.json")
            check = subprocess.run([ARGS.gcmoe, "config", "validate", "--split", config],
                                   capture_output=True, text=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stderr)
            # The units' command lines, on free ports so that tests may run side by side: both
            # sides get the same override, and the ranks get no --coordinator.
            rank_port = ops.free_port()
            # The installed config names /etc/gcmoe/rank.secret; this install's is under workdir.
            secret = os.path.join(workdir, "etc", "gcmoe", "rank.secret")
            self.assertEqual(os.stat(secret).st_mode & 0o777, 0o600)
            common = ["--config", config, "--set", f"server.rank_listen=127.0.0.1:{rank_port}",
                      "--set", "server.metrics_listen=", "--set",
                      f"server.rank_secret_file={secret}"]
            address_file = os.path.join(workdir, "address")
            for name, args in [
                    ("coordinator", ["coordinator", "--listen", "127.0.0.1:0", "--address-file",
                                     address_file]),
                    ("rank0", ["rank", "--rank", "0"]), ("rank1", ["rank", "--rank", "1"])]:
                processes.start(name, [*args, *common])
            address = ops.wait_for_lines(address_file, 1, 60)[0]
            deadline = time.monotonic() + 90
            with grpc.insecure_channel(address) as channel:
                while ops.health(channel) != (grpc.StatusCode.OK, ops.HEALTH_SERVING):
                    self.assertLess(time.monotonic(), deadline, "the split processes never served")
                    time.sleep(0.3)
        finally:
            processes.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcmoe", required=True)
    parser.add_argument("--workdir", default=None)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
