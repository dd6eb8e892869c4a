"""The container builds: .dockerignore, the CPU and CUDA Dockerfiles, their runtime packages.

    /usr/bin/python3 tests/deploy/containers_test.py --gcmoe build/gcmoe

No image can be built offline, so the test reads the Dockerfiles and checks them against this
machine: the CPU image's runtime stage (Debian 12, like this machine) must install every
package that holds a library the built binary links (deploy/runtime-packages.sh), the CUDA
image must build on NVIDIA's devel image and run on the matching runtime image for Ubuntu,
and both must run as a numeric non-root user with a HEALTHCHECK.
"""
import argparse
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
ARGS = None
# In debian:12 itself: apt and the shell need them.
BASE_IMAGE_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def read(name):
    with open(os.path.join(REPO, name)) as f:
        return f.read()


def stages(dockerfile):
    """[(FROM line, the stage's text)], RUN continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile)
    parts = re.split(r"^(FROM .*)$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]


class Containers(unittest.TestCase):
    def test_dockerignore_keeps_build_directories_out(self):
        patterns = [line.strip() for line in read(".dockerignore").splitlines()
                    if line.strip() and not line.startswith("#")]
        for pattern in ("build", "build-*", ".git"):
            self.assertIn(pattern, patterns)

    def test_cpu_image_installs_every_linked_library(self):
        r = subprocess.run([os.path.join(REPO, "deploy", "runtime-packages.sh"), ARGS.gcmoe],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        needed = set(r.stdout.split()) - BASE_IMAGE_PACKAGES
        self.assertIn("libgrpc++1.51", needed)
        (_, build), (runtime_from, runtime) = stages(read("deploy/Dockerfile"))
        self.assertEqual(runtime_from.split()[1], "debian:12")
        install = re.search(r"apt-get install ([^&]*)", runtime).group(1).split()
        self.assertLessEqual(needed, set(install))
        self.assertIn("install-deps.sh --build-only", build)

    def test_cuda_image_runs_on_nvidias_runtime_image_for_ubuntu(self):
        text = read("deploy/Dockerfile.cuda")
        (build_from, build), (runtime_from, runtime) = stages(text)
        self.assertRegex(build_from, r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu\d+\.\d+ AS build$")
        self.assertRegex(runtime_from, r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu\d+\.\d+$")
        self.assertEqual(build_from.split("-ubuntu")[1].split()[0],
                         runtime_from.split("-ubuntu")[1])
        # The runtime stage installs what the build stage's binary links, by that release's names.
        self.assertIn("runtime-packages.sh /build/gcmoe > /build/runtime-packages.txt", build)
        self.assertIn("xargs -a /tmp/runtime-packages.txt", runtime)

    def test_images_run_unprivileged_with_a_healthcheck(self):
        for name in ("deploy/Dockerfile", "deploy/Dockerfile.cuda"):
            runtime = stages(read(name))[-1][1]
            self.assertRegex(runtime, r"useradd --system --uid 10001 ", name)
            self.assertIn("\nUSER 10001\n", runtime, name)
            health = re.search(r"HEALTHCHECK (.*)", runtime)
            self.assertIsNotNone(health, name)
            self.assertIn('"client", "health"', health.group(1), name)
            self.assertIn("--start-period=15m", health.group(1), name)
            self.assertIn("EXPOSE 50051 50052 9464", runtime, name)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gcmoe", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v"] + rest)


if __name__ == "__main__":
    main()
