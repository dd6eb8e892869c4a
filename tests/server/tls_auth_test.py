"""TLS, mTLS and bearer tokens on the public port, mutual TLS on the rank port, SIGHUP reloads.

    /usr/bin/python3 tests/server/tls_auth_test.py --gcmoe build/gcmoe [--workdir DIR]

The test makes its own CA (and an untrusted one) with openssl. Each case checks the status
code a client gets: a TLS client with the CA, a client certificate and a token is served; a
plaintext client, an untrusted or missing client certificate (mTLS on) cannot connect
(UNAVAILABLE); a wrong or missing token is UNAUTHENTICATED; health stays open without a token.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_processes as ops  # noqa: E402

ARGS = None
TOKEN = "s3cret-token-0123456789"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(dir, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=dir)


def make_cert(dir, name, ca, usages, cn=None):
    """A key and a certificate for 127.0.0.1 and localhost, signed by `ca`."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn or name}",
            cwd=dir)
    with open(os.path.join(dir, f"{name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                f"extendedKeyUsage={usages}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
            cwd=dir)


def read(dir, name):
    with open(os.path.join(dir, name), "rb") as f:
        return f.read()


def served_certificate_cn(address, dir):
    """The CN of the certificate the server presents now (openssl s_client, client cert on)."""
    host, port = address.rsplit(":", 1)
    out = subprocess.run(
        ["openssl", "s_client", "-connect", f"{host}:{port}", "-CAfile", "ca.crt", "-cert",
         "client.crt", "-key", "client.key", "-servername", "localhost"],
        cwd=dir, input=b"", capture_output=True, timeout=20)
    subject = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=out.stdout,
                             capture_output=True, timeout=20)
    return subject.stdout.decode().strip()


class Pki:
    def __init__(self, dir):
        self.dir = dir
        make_ca(dir, "ca")
        make_ca(dir, "rogue-ca")
        make_cert(dir, "server", "ca", "serverAuth")
        make_cert(dir, "server2", "ca", "serverAuth", cn="server-renewed")
        make_cert(dir, "client", "ca", "clientAuth")
        make_cert(dir, "rogue-client", "rogue-ca", "clientAuth")
        # In `gcmoe serve` the coordinator and its ranks share server.rank_tls: one certificate
        # good for both ends.
        make_cert(dir, "rank", "ca", "serverAuth,clientAuth")
        make_cert(dir, "rogue-rank", "rogue-ca", "serverAuth,clientAuth")
        with open(os.path.join(dir, "tokens"), "w") as f:
            f.write("# one token per line\n\nold-token-unused\n" + TOKEN + "\n")
        with open(os.path.join(dir, "wrong-token"), "w") as f:
            f.write("not-the-token\n")
        with open(os.path.join(dir, "token"), "w") as f:
            f.write(TOKEN + "\n")

    def path(self, name):
        return os.path.join(self.dir, name)

    def channel(self, address, cert="client", ca="ca"):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(self.dir, f"{ca}.crt"),
            private_key=read(self.dir, f"{cert}.key") if cert else None,
            certificate_chain=read(self.dir, f"{cert}.crt") if cert else None)
        return grpc.secure_channel(address, credentials)

    def server_settings(self):
        return ["--set", f"server.tls.cert={self.path('server.crt')}",
                "--set", f"server.tls.key={self.path('server.key')}",
                "--set", f"server.tls.client_ca={self.path('ca.crt')}",
                "--set", f"server.auth.tokens_file={self.path('tokens')}"]

    def rank_settings(self, cert="rank"):
        return ["--set", f"server.rank_tls.cert={self.path(cert + '.crt')}",
                "--set", f"server.rank_tls.key={self.path(cert + '.key')}",
                "--set", f"server.rank_tls.ca={self.path('ca.crt')}"]


BEARER = [("authorization", "Bearer " + TOKEN)]


class PublicPortSecurity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.workdir = tempfile.mkdtemp(prefix="gcmoe-tls-", dir=ARGS.workdir)
        cls.pki = Pki(cls.workdir)
        cls.serve = ops.Serve(ARGS.gcmoe, cls.workdir, "serve",
                              cls.pki.server_settings() + cls.pki.rank_settings())
        # SERVING at all means both ranks attached over mutual TLS.
        deadline = time.monotonic() + 60
        with cls.pki.channel(cls.serve.address) as channel:
            while ops.health(channel) != (grpc.StatusCode.OK, ops.HEALTH_SERVING):
                assert time.monotonic() < deadline, cls.serve.log_text()
                time.sleep(0.2)

    @classmethod
    def tearDownClass(cls):
        cls.serve.stop()
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def test_tls_client_with_certificate_and_token_is_served(self):
        with self.pki.channel(self.serve.address) as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER), grpc.StatusCode.OK)
        log = self.serve.log_text()
        self.assertIn("API over TLS with client certificates (mTLS); rank port over mutual TLS",
                      log)

    def test_health_stays_open_without_a_token(self):
        with self.pki.channel(self.serve.address) as channel:
            self.assertEqual(ops.health(channel), (grpc.StatusCode.OK, ops.HEALTH_SERVING))

    def test_plaintext_client_cannot_connect(self):
        with grpc.insecure_channel(self.serve.address) as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER), grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(ops.health(channel)[0], grpc.StatusCode.UNAVAILABLE)

    def test_untrusted_client_certificate_cannot_connect(self):
        with self.pki.channel(self.serve.address, cert="rogue-client") as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER), grpc.StatusCode.UNAVAILABLE)

    def test_client_without_certificate_cannot_connect(self):
        with self.pki.channel(self.serve.address, cert=None) as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER), grpc.StatusCode.UNAVAILABLE)

    def test_client_that_does_not_trust_the_server_cannot_connect(self):
        with self.pki.channel(self.serve.address, ca="rogue-ca") as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER), grpc.StatusCode.UNAVAILABLE)

    def test_wrong_or_missing_token_is_unauthenticated(self):
        with self.pki.channel(self.serve.address) as channel:
            wrong = [("authorization", "Bearer not-the-token")]
            self.assertEqual(ops.get_model_info(channel, wrong), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(ops.get_model_info(channel), grpc.StatusCode.UNAUTHENTICATED)
            # A prefix of the token, and the token without the "Bearer " scheme.
            prefix = [("authorization", "Bearer " + TOKEN[:-1])]
            self.assertEqual(ops.get_model_info(channel, prefix),
                             grpc.StatusCode.UNAUTHENTICATED)
            bare = [("authorization", TOKEN)]
            self.assertEqual(ops.get_model_info(channel, bare), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(ops.empty_forward(channel), grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(
                ops.unary(channel, "/gcmoe.v1.MoeService/GetStats")[0],
                grpc.StatusCode.UNAUTHENTICATED)

    def test_cpp_client_speaks_tls_with_a_token(self):
        tls = ["--addr", self.serve.address, "--tls-ca", self.pki.path("ca.crt"),
               "--tls-cert", self.pki.path("client.crt"), "--tls-key",
               self.pki.path("client.key")]
        ok = subprocess.run([ARGS.gcmoe, "client", "forward", *tls, "--token-file",
                             self.pki.path("token"), "--tokens", "8", "--requests", "3",
                             "--warmup", "0"], capture_output=True, text=True, timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        wrong = subprocess.run([ARGS.gcmoe, "client", "info", *tls, "--token-file",
                                self.pki.path("wrong-token")],
                               capture_output=True, text=True, timeout=60)
        self.assertEqual(wrong.returncode, 1, wrong.stdout + wrong.stderr)
        self.assertIn("failed: UNAUTHENTICATED", wrong.stderr)
        health = subprocess.run([ARGS.gcmoe, "client", "health", *tls],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual((health.returncode, health.stdout.strip()), (0, "SERVING"),
                         health.stderr)
        # The certificate names 127.0.0.1 and localhost; a probe may check another name.
        named = subprocess.run([ARGS.gcmoe, "client", "health", *tls, "--tls-server-name",
                                "localhost"], capture_output=True, text=True, timeout=60)
        self.assertEqual(named.returncode, 0, named.stderr)
        misnamed = subprocess.run([ARGS.gcmoe, "client", "health", *tls, "--tls-server-name",
                                   "gcmoe.example", "--timeout-ms", "3000"],
                                  capture_output=True, text=True, timeout=60)
        self.assertEqual(misnamed.returncode, 1, misnamed.stdout)
        self.assertIn("cannot reach " + self.serve.address, misnamed.stderr)
        plaintext = subprocess.run([ARGS.gcmoe, "client", "info", "--addr", self.serve.address,
                                    "--timeout-ms", "3000"],
                                   capture_output=True, text=True, timeout=60)
        self.assertEqual(plaintext.returncode, 1)
        self.assertIn("cannot reach " + self.serve.address, plaintext.stderr)

    def test_sighup_reloads_certificates_and_tokens(self):
        self.assertIn("CN = server", served_certificate_cn(self.serve.address, self.workdir))
        # A key that does not belong to the certificate is refused; the old pair keeps serving.
        shutil.copy(self.pki.path("server.crt"), self.pki.path("server.crt.orig"))
        shutil.copy(self.pki.path("server.key"), self.pki.path("server.key.orig"))
        shutil.copy(self.pki.path("server2.crt"), self.pki.path("server.crt"))
        self.serve.process.send_signal(signal.SIGHUP)
        self.wait_for_log("does not belong to the certificate")
        self.assertIn("CN = server", served_certificate_cn(self.serve.address, self.workdir))
        # The renewed pair and a rotated token file, then SIGHUP.
        shutil.copy(self.pki.path("server2.key"), self.pki.path("server.key"))
        with open(self.pki.path("tokens"), "w") as f:
            f.write("rotated-token\n")
        self.serve.process.send_signal(signal.SIGHUP)
        self.wait_for_log("reload: tokens reloaded")
        deadline = time.monotonic() + 10
        while "server-renewed" not in served_certificate_cn(self.serve.address, self.workdir):
            self.assertLess(time.monotonic(), deadline, "the renewed certificate never served")
            time.sleep(0.3)
        with self.pki.channel(self.serve.address) as channel:
            self.assertEqual(ops.get_model_info(channel, BEARER),
                             grpc.StatusCode.UNAUTHENTICATED)
            rotated = [("authorization", "Bearer rotated-token")]
            self.assertEqual(ops.get_model_info(channel, rotated), grpc.StatusCode.OK)
        # Back to the first pair and token for the other cases.
        shutil.copy(self.pki.path("server.crt.orig"), self.pki.path("server.crt"))
        shutil.copy(self.pki.path("server.key.orig"), self.pki.path("server.key"))
        with open(self.pki.path("tokens"), "w") as f:
            f.write(TOKEN + "\n")
        self.serve.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "server-renewed" in served_certificate_cn(self.serve.address, self.workdir):
            self.assertLess(time.monotonic(), deadline, "the first certificate never returned")
            time.sleep(0.3)

    def wait_for_log(self, text, timeout_s=10):
        deadline = time.monotonic() + timeout_s
        while text not in self.serve.log_text():
            self.assertLess(time.monotonic(), deadline, f"no {text!r} in the log")
            time.sleep(0.1)


class BadFilesRefuseToStart(unittest.TestCase):
    """A service whose TLS or token files are wrong does not start, and says which key."""

    def test_each_bad_file_names_its_config_key(self):
        workdir = tempfile.mkdtemp(prefix="gcmoe-tls-bad-", dir=ARGS.workdir)
        try:
            pki = Pki(workdir)
            with open(pki.path("empty-tokens"), "w") as f:
                f.write("# no token yet\n\n")
            cases = [
                (["server.tls.cert=" + pki.path("server.crt"),
                  "server.tls.key=" + pki.path("client.key")],
                 "server.tls.key: the key in " + pki.path("client.key") +
                 " does not belong to the certificate in " + pki.path("server.crt")),
                (["server.tls.cert=" + pki.path("server.key"),
                  "server.tls.key=" + pki.path("server.key")],
                 "server.tls.cert: " + pki.path("server.key") + " holds no PEM certificate"),
                (["server.tls.cert=" + pki.path("server.crt"),
                  "server.tls.key=" + pki.path("server.key"),
                  "server.tls.client_ca=" + pki.path("missing.crt")],
                 "server.tls.client_ca: cannot read " + pki.path("missing.crt")),
                (["server.auth.tokens_file=" + pki.path("empty-tokens")],
                 "server.auth.tokens_file: " + pki.path("empty-tokens") + " holds no token"),
            ]
            for settings, message in cases:
                args = [ARGS.gcmoe, "serve", "--listen", "127.0.0.1:0", "--set",
                        "server.rank_listen=127.0.0.1:0", "--set", "server.metrics_listen="]
                for setting in settings:
                    args += ["--set", setting]
                r = subprocess.run(args, capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(message, r.stdout + r.stderr)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


class RankPortMutualTls(unittest.TestCase):
    """A coordinator and its ranks started apart: a rank whose certificate the rank CA did not
    sign never attaches, and the service serves with the right ranks."""

    def test_rank_with_an_untrusted_certificate_is_refused(self):
        workdir = tempfile.mkdtemp(prefix="gcmoe-rank-tls-", dir=ARGS.workdir)
        pki = Pki(workdir)
        processes = ops.Processes(ARGS.gcmoe, workdir)

        def start(name, args):
            return processes.start(name, args)[1]

        try:
            # Every process holds the attach secret: the rogue differs in its certificate only.
            secret = ops.secret_settings(workdir)
            address_file = os.path.join(workdir, "coordinator.address")
            start("coordinator", ["coordinator", "--listen", "127.0.0.1:0", "--rank-listen",
                                  "127.0.0.1:0", "--address-file", address_file, "--set",
                                  "server.metrics_listen="] + pki.rank_settings() + secret)
            address, rank_address = ops.wait_for_lines(address_file, 2, 60)
            start("rank0", ["rank", "--rank", "0", "--coordinator", rank_address] +
                  pki.rank_settings() + secret)
            rogue_log = start("rogue", ["rank", "--rank", "1", "--coordinator", rank_address] +
                              pki.rank_settings("rogue-rank") + secret)
            channel = grpc.insecure_channel(address)
            # Rank 0 is in, and the rogue has been turned away at least once.
            ops.wait_for_text(os.path.join(workdir, "coordinator.log"), "attached (transport", 60)
            rogue = processes.started[-1][0]
            ops.wait_for_text(rogue_log, "cannot connect to the coordinator at " + rank_address,
                              60, rogue)
            with open(os.path.join(workdir, "coordinator.log")) as f:
                coordinator_log = f.read()
            self.assertEqual(ops.health(channel), (grpc.StatusCode.OK, 2),  # NOT_SERVING
                             coordinator_log)
            self.assertRegex(coordinator_log, r"rank 0 .*attached")
            self.assertNotRegex(coordinator_log, r"rank 1 .*attached")
            self.assertEqual(rogue.poll(), None, "the rogue rank gave up")
            # Rank 1's shared-memory segments are the rogue's until it has exited.
            rogue.terminate()
            self.assertEqual(rogue.wait(timeout=30), 0, "the rogue rank's exit on SIGTERM")
            # SIGTERM at any point of the refused attach (a TLS handshake may still be running
            # on one of gRPC's threads) is a clean exit: once, at exit, OpenSSL freed its state
            # under such a handshake and the rank crashed instead (about 1 exit in 20).
            for attempt in range(8):
                rogue, rogue_log = processes.start(f"rogue{attempt}", [
                    "rank", "--rank", "1", "--coordinator", rank_address] +
                    pki.rank_settings("rogue-rank") + secret)
                ops.wait_for_text(rogue_log, "weights loaded", 60, rogue)
                time.sleep(0.1 + 0.3 * attempt)
                rogue.terminate()
                with open(rogue_log) as f:
                    self.assertEqual(rogue.wait(timeout=30), 0, f.read())
            start("rank1", ["rank", "--rank", "1", "--coordinator", rank_address] +
                  pki.rank_settings() + secret)
            deadline = time.monotonic() + 60
            while ops.health(channel) != (grpc.StatusCode.OK, ops.HEALTH_SERVING):
                if time.monotonic() > deadline:
                    logs = {n: open(os.path.join(workdir, n + ".log")).read()
                            for n in ("coordinator", "rank0", "rank1")}
                    self.fail(f"not serving with the right ranks: {logs}")
                time.sleep(0.2)
            channel.close()
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
