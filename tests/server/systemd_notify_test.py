"""`gcmoe serve` and `gcmoe coordinator` speak systemd's notify protocol to $NOTIFY_SOCKET.

    /usr/bin/python3 tests/server/systemd_notify_test.py --gcmoe build/gcmoe [--workdir DIR]

The test plays systemd: it binds the datagram socket, starts the command with NOTIFY_SOCKET,
WATCHDOG_USEC and WATCHDOG_PID as a Type=notify unit with WatchdogSec would, and reads what
arrives with the sender's credentials: READY=1 only from the main process and only once every
rank is ready, WATCHDOG=1 at about half the period, STOPPING=1 on SIGTERM.
"""
import argparse
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_processes as ops  # noqa: E402

ARGS = None
WATCHDOG_USEC = 1000000


class FakeSystemd:
    def __init__(self, workdir):
        self.path = os.path.join(workdir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.messages = []  # (monotonic time, sender pid, text)

    def receive(self, timeout_s):
        self.sock.settimeout(timeout_s)
        try:
            data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
        except socket.timeout:
            return None
        pid = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        message = (time.monotonic(), pid, data.decode())
        self.messages.append(message)
        return message

    def wait_for(self, text, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self.receive(max(0.05, deadline - time.monotonic()))
            if message and text in message[2].split("\n"):
                return message
        raise AssertionError(f"no {text!r} within {timeout_s} s; got {self.messages}")

    def close(self):
        self.sock.close()


def start_under_fake_systemd(args, fake, log_path):
    env = dict(os.environ, NOTIFY_SOCKET=fake.path, WATCHDOG_USEC=str(WATCHDOG_USEC))
    # systemd names the main process in WATCHDOG_PID; `exec` keeps the shell's pid.
    return subprocess.Popen(["/bin/sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *args],
                            env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


class Notify(unittest.TestCase):
    def setUp(self):
        self.workdir = tempfile.mkdtemp(prefix="gcmoe-notify-", dir=ARGS.workdir)
        self.fake = FakeSystemd(self.workdir)

    def tearDown(self):
        self.fake.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def test_serve_is_ready_once_every_rank_is_and_keeps_the_watchdog_fed(self):
        address_file = os.path.join(self.workdir, "address")
        process = start_under_fake_systemd(
            [ARGS.gcmoe, "serve", "--listen", "127.0.0.1:0", "--address-file", address_file,
             "--set", "server.rank_listen=127.0.0.1:0", "--set",
             "server.metrics_listen=127.0.0.1:0"],
            self.fake, os.path.join(self.workdir, "serve.log"))
        try:
            _, pid, text = self.fake.wait_for("READY=1", 120)
            self.assertEqual(pid, process.pid)
            self.assertIn("STATUS=serving on", text)
            # READY means serving: health says so at once.
            address = ops.wait_for_lines(address_file, 1, 10)[0]
            with grpc.insecure_channel(address) as channel:
                self.assertEqual(ops.health(channel), (grpc.StatusCode.OK, ops.HEALTH_SERVING))
            first = self.fake.wait_for("WATCHDOG=1", 3)
            second = self.fake.wait_for("WATCHDOG=1", 3)
            self.assertEqual({first[1], second[1]}, {process.pid})
            period = second[0] - first[0]
            self.assertGreater(period, 0.3 * WATCHDOG_USEC / 1e6)
            self.assertLess(period, 0.8 * WATCHDOG_USEC / 1e6)
            process.send_signal(signal.SIGTERM)
            self.fake.wait_for("STOPPING=1", 10)
            self.assertEqual(process.wait(timeout=60), 0)
            # Only the main process spoke: the ranks got no notify socket.
            self.assertEqual({m[1] for m in self.fake.messages}, {process.pid})
            ready = [m for m in self.fake.messages if "READY=1" in m[2].split("\n")]
            self.assertEqual(len(ready), 1)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    def test_coordinator_is_ready_once_ranks_can_attach(self):
        address_file = os.path.join(self.workdir, "address")
        process = start_under_fake_systemd(
            [ARGS.gcmoe, "coordinator", "--listen", "127.0.0.1:0", "--rank-listen",
             "127.0.0.1:0", "--address-file", address_file, "--set", "server.metrics_listen="] +
            ops.secret_settings(self.workdir),
            self.fake, os.path.join(self.workdir, "coordinator.log"))
        try:
            _, pid, text = self.fake.wait_for("READY=1", 60)
            self.assertEqual(pid, process.pid)
            rank_address = ops.wait_for_lines(address_file, 2, 10)[1]
            self.assertIn("ranks attach on " + rank_address, text)
            self.fake.wait_for("WATCHDOG=1", 3)
            process.send_signal(signal.SIGTERM)
            self.fake.wait_for("STOPPING=1", 10)
            self.assertEqual(process.wait(timeout=60), 0)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcmoe", required=True)
    parser.add_argument("--workdir", default=None)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
