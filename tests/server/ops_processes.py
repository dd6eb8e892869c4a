"""Processes and raw gRPC calls for the operations tests (metrics, TLS, tokens).

The calls go through grpc's generic unary API with hand-encoded messages, so these tests need
no generated stubs: an empty GetModelInfoRequest or HealthCheckRequest is zero bytes, and a
HealthCheckResponse is field 1 (varint) = the serving status.
"""
import os
import signal
import socket
import subprocess
import time

import grpc

HEALTH_SERVING = 1


def free_port():
    """A loopback port free at this moment, for servers that cannot report the one they bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def secret_settings(directory):
    """--set arguments naming a new rank attach secret in `directory` (mode 0600), for a
    coordinator and ranks started apart (`gcmoe serve` makes its own)."""
    path = os.path.join(directory, "rank.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    return ["--set", "server.rank_secret_file=" + path]


def wait_for_lines(path, count, timeout_s, process=None, log_path=None):
    """The first `count` lines of `path` once it has them, else raises with the process log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                lines = [line.strip() for line in f if line.strip()]
            if len(lines) >= count:
                return lines[:count]
        if process is not None and process.poll() is not None:
            break
        time.sleep(0.2)
    log = open(log_path).read() if log_path and os.path.exists(log_path) else ""
    raise AssertionError(f"{path} did not get {count} line(s) in {timeout_s} s; log:\n{log}")


def wait_for_text(path, text, timeout_s, process=None):
    """Returns once the file at `path` (a process's log) holds `text`, else raises with it."""
    deadline = time.monotonic() + timeout_s
    content = ""
    while time.monotonic() < deadline:
        with open(path) as f:
            content = f.read()
        if text in content or (process is not None and process.poll() is not None):
            break
        time.sleep(0.05)
    if text not in content:
        raise AssertionError(f"no {text!r} in {path} within {timeout_s} s:\n{content}")


class Processes:
    """The gcmoe processes one test starts, each logging to WORKDIR/NAME.log; stop() ends the
    ones still running (SIGTERM, then SIGKILL after 30 s) and closes their logs."""

    def __init__(self, gcmoe, workdir):
        self.gcmoe, self.workdir = gcmoe, workdir
        self.started = []  # (process, log file)

    def start(self, name, args):
        """Starts `gcmoe ARGS`; returns the process and its log's path."""
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        process = subprocess.Popen([self.gcmoe, *args], stdout=log, stderr=subprocess.STDOUT)
        self.started.append((process, log))
        return process, log.name

    def stop(self):
        for process, log in self.started:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            log.close()
        self.started = []


class Serve:
    """`gcmoe serve` on loopback ports, with its metrics endpoint on a free port."""

    def __init__(self, gcmoe, workdir, name, extra_args=(), timeout_s=120):
        self.log_path = os.path.join(workdir, name + ".log")
        address_file = os.path.join(workdir, name + ".address")
        args = [gcmoe, "serve", "--listen", "127.0.0.1:0", "--address-file", address_file,
                "--set", "server.rank_listen=127.0.0.1:0",
                "--set", "server.metrics_listen=127.0.0.1:0", *extra_args]
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        lines = wait_for_lines(address_file, 2, timeout_s, self.process, self.log_path)
        self.address, self.metrics_address = lines

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def log_text(self):
        with open(self.log_path) as f:
            return f.read()


def unary(channel, method, request=b"", metadata=None, timeout=10.0):
    """Calls `method` with raw bytes; returns (grpc.StatusCode, response bytes or None)."""
    call = channel.unary_unary(method, request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    try:
        response = call(request, metadata=metadata, timeout=timeout)
        return grpc.StatusCode.OK, response
    except grpc.RpcError as e:
        return e.code(), None


def health(channel, metadata=None):
    code, response = unary(channel, "/grpc.health.v1.Health/Check", metadata=metadata)
    if code != grpc.StatusCode.OK:
        return code, None
    # An absent field is its default, 0 (UNKNOWN).
    status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
    return code, status


def get_model_info(channel, metadata=None):
    return unary(channel, "/gcmoe.v1.MoeService/GetModelInfo", metadata=metadata)[0]


def empty_forward(channel, metadata=None):
    """A Forward with no tokens: the service refuses it with INVALID_ARGUMENT."""
    return unary(channel, "/gcmoe.v1.MoeService/Forward", metadata=metadata)[0]
