"""Integration-test driver of the installed gcmoe Python package (run by python_package_test).

    python python_package_check.py forward --addr HOST:PORT --out DIR [--tokens T] [--layer L]
                                           [TLS and token options]
    python python_package_check.py auth --addr HOST:PORT --tls-ca CA --token-file F [--tls-cert
                                        C --tls-key K]
    python python_package_check.py stream --addr HOST:PORT [--tokens T] [--layer L]
    python python_package_check.py fp8 --input X.npy --out DIR
    python python_package_check.py readme-registered-memory --addr HOST:PORT --readme README.md

forward: calls the service through gcmoe.Client and gcmoe.aio.Client with FP32, BF16 and FP8
activations (FP32 outputs), checks what needs no reference here (version, BF16 outputs, typed
errors) and saves every input and output as .npy for the C++ test to check against the float64
reference. stream: sends requests of several sizes, layers and dtypes through the ForwardStream
of both clients (one at a time, pipelined, from several threads or tasks, with bad requests in
the middle) and requires every output byte for byte equal to unary Forward's for the same request,
every bad request its typed error, and the stream to go on after it. TLS and token options
(--tls-ca, --tls-cert, --tls-key, --tls-server-name, --token-file) give forward's clients a
gcmoe.TLS and a token. auth: against a service on TLS with a tokens file (and client certificates
required when --tls-cert is given), checks what the connection options do: calls without the
token, with a wrong one, over plaintext, with a wrong server name or without the client
certificate fail with their typed errors and the server's message; the CA as bytes and a server
name override connect. fp8: encodes X [N, 32m] with
gcmoe.numerics.quantize_fp8 and saves the E4M3 codes and UE8M0 scales (as int32) for the C++ test
to compare with the server's quantizer. readme-registered-memory: runs the Python example of
README.md's "Registered memory" section (which asserts its own results) with ADDR set, then
checks that the shared-memory object it made is gone, that the asyncio client and a ForwardStream
give the same bytes through a region with a BF16 output, and that the client refuses an output
array of the wrong dtype.
"""
import argparse
import asyncio
import os
import sys
import threading

import grpc
import numpy as np

import gcmoe
from gcmoe import numerics

DTYPES = ("fp32", "bf16", "fp8")


def fail(message):
    print("python_package_check: " + message, file=sys.stderr)
    sys.exit(1)


def random_inputs(info, tokens, seed):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((tokens, info.hidden)).astype(np.float32)
    ids = np.argsort(rng.random((tokens, info.experts)), axis=1)[:, :info.top_k].astype(np.int32)
    ids[::3, info.top_k - 1] = -1  # unused slots
    weights = rng.uniform(0.05, 1.0, (tokens, info.top_k)).astype(np.float32)
    return hidden, ids, weights


def hidden_for(hidden, dtype):
    """The same activations in the form each dtype is given to the client: float32 as is, BF16
    as uint16 bit patterns, FP8 as an Fp8Hidden from the package's encoder."""
    if dtype == "fp32":
        return hidden
    if dtype == "bf16":
        return numerics.float32_to_bf16_bits(hidden)
    return gcmoe.Fp8Hidden.quantize(hidden)


def expect_error(call, error_type, words):
    try:
        call()
    except error_type as error:
        if words not in error.message:
            fail(f"{error_type.__name__} message {error.message!r} does not contain {words!r}")
        return
    except gcmoe.GcmoeError as error:
        fail(f"expected {error_type.__name__}, got {type(error).__name__}: {error}")
    fail(f"expected {error_type.__name__}, the call succeeded")


def check_sync(connect, hidden, ids, weights, layer, out):
    with gcmoe.Client(**connect, timeout=30.0) as client:
        info = client.info()
        if info.version != gcmoe.__version__:
            fail(f"package version {gcmoe.__version__} != server version {info.version}")
        for dtype in DTYPES:
            y = client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer,
                               output_dtype="fp32")
            if y.dtype != np.float32 or y.shape != hidden.shape:
                fail(f"{dtype}: output {y.dtype} {y.shape}, expected float32 {hidden.shape}")
            np.save(os.path.join(out, f"output_{dtype}_sync.npy"), y)
            # BF16 output is the FP32 output rounded to nearest even.
            y16 = client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer)
            bits = np.asarray(y16).view(np.uint16)
            if not np.array_equal(bits, numerics.float32_to_bf16_bits(y)):
                fail(f"{dtype}: the BF16 output is not the FP32 output rounded to BF16")
        # Encoding in the client from float32 gives the same request as pre-encoded input.
        y_fp8 = client.forward(hidden, ids, weights, layer=layer, output_dtype="fp32",
                               hidden_dtype="fp8")
        if not np.array_equal(y_fp8, np.load(os.path.join(out, "output_fp8_sync.npy"))):
            fail("hidden_dtype='fp8' and Fp8Hidden.quantize gave different outputs")
        expect_error(lambda: client.forward(hidden, ids, weights, layer=info.layers),
                     gcmoe.NotFoundError, "layer")
        expect_error(lambda: client.forward(hidden, ids[:, :1], weights, layer=layer),
                     gcmoe.InvalidArgumentError, "topk_ids")
        bad_ids = ids.copy()
        bad_ids[0, 0] = info.experts
        expect_error(lambda: client.forward(hidden, bad_ids, weights, layer=layer),
                     gcmoe.InvalidArgumentError, "topk_ids")


async def check_async(connect, hidden, ids, weights, layer, out):
    async with gcmoe.aio.Client(**connect, timeout=30.0) as client:
        info = await client.info()
        if info.version != gcmoe.__version__:
            fail(f"aio: package version {gcmoe.__version__} != server version {info.version}")
        outputs = await asyncio.gather(*(
            client.forward(hidden_for(hidden, dtype), ids, weights, layer=layer,
                           output_dtype="fp32") for dtype in DTYPES))
        for dtype, y in zip(DTYPES, outputs):
            np.save(os.path.join(out, f"output_{dtype}_async.npy"), y)
        try:
            await client.forward(hidden, ids, weights, layer=info.layers)
        except gcmoe.NotFoundError as error:
            if "layer" not in error.message:
                fail(f"aio: NotFoundError message {error.message!r} does not name the layer")
        else:
            fail("aio: expected NotFoundError for a layer past the model")


def stream_cases(info, tokens, layer, seed):
    """Forward arguments of several requests: sizes, layers, activation and output dtypes."""
    shapes = [("fp32", "fp32", tokens, layer), ("bf16", "bf16", 1, 0), ("fp8", "fp32", 7, layer),
              ("fp32", "bf16", tokens, 0), ("bf16", "fp32", 3, layer), ("fp8", "bf16", tokens, 0)]
    cases = []
    for i, (dtype, output_dtype, t, l) in enumerate(shapes):
        hidden, ids, weights = random_inputs(info, t, seed + i)
        cases.append(dict(hidden=hidden_for(hidden, dtype), topk_ids=ids, topk_weights=weights,
                          layer=l, output_dtype=output_dtype, request_id=f"case-{i}"))
    return cases


def bad_cases(info, case):
    """(Forward arguments, expected error type, words its message must hold) of requests the
    server refuses: a layer past the model, an expert id past the experts."""
    bad_layer = dict(case, layer=info.layers, request_id="bad-layer")
    bad_ids = case["topk_ids"].copy()
    bad_ids[0, 0] = info.experts
    bad_expert = dict(case, topk_ids=bad_ids, request_id="bad-expert")
    return [(bad_layer, gcmoe.NotFoundError, "layer"),
            (bad_expert, gcmoe.InvalidArgumentError, "topk_ids")]


def same_bytes(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        fail(f"{what}: the stream's output ({got.dtype} {got.shape}) is not byte for byte unary "
             f"Forward's ({want.dtype} {want.shape})")


def expect_stream_error(what, error, error_type, words):
    if not isinstance(error, error_type):
        fail(f"{what}: expected {error_type.__name__}, got {type(error).__name__}: {error}")
    if words not in error.message or error.rpc != "ForwardStream":
        fail(f"{what}: {error!r} does not name {words!r} or the ForwardStream")


def check_stream_sync(addr, cases, bad, unary):
    with gcmoe.Client(addr, timeout=30.0) as client, client.forward_stream(timeout=120.0) as stream:
        # One at a time, with each bad request in the middle: it fails alone.
        for i, case in enumerate(cases):
            same_bytes(f"stream.forward case {i}", stream.forward(**case), unary[i])
            if i < len(bad):
                request, error_type, words = bad[i]
                try:
                    stream.forward(**request)
                except gcmoe.GcmoeError as error:
                    expect_stream_error(f"stream.forward {request['request_id']}", error,
                                        error_type, words)
                else:
                    fail(f"stream.forward {request['request_id']}: the bad request succeeded")
        response = stream.forward_response(**cases[0])
        if response.request_id != cases[0]["request_id"] or response.stats.engine_ns <= 0:
            fail(f"stream.forward_response: request_id {response.request_id!r}, engine_ns "
                 f"{response.stats.engine_ns}")

        # Pipelined: everything sent before the first reply is read, bad requests in between.
        sequence = [(case, unary[i], None) for i, case in enumerate(cases)]
        sequence.insert(2, (bad[0][0], None, bad[0][1:]))
        sequence.insert(4, (bad[1][0], None, bad[1][1:]))
        for request, _, _ in sequence:
            stream.send(**request)
        if stream.pending != len(sequence):
            fail(f"stream.pending {stream.pending} after {len(sequence)} sends")
        for n, (request, want, error) in enumerate(sequence):
            what = f"pipelined {request['request_id']} (reply {n})"
            try:
                got = stream.receive()
            except gcmoe.GcmoeError as raised:
                if error is None:
                    fail(f"{what}: {raised}")
                expect_stream_error(what, raised, *error)
            else:
                if error is not None:
                    fail(f"{what}: the bad request succeeded")
                same_bytes(what, got, want)
        try:
            stream.receive()
        except RuntimeError:
            pass
        else:
            fail("stream.receive() with nothing sent did not raise RuntimeError")

        # forward() while sent requests wait: each caller still gets its own reply.
        stream.send(**cases[0])
        stream.send(**cases[1])
        same_bytes("forward between sends", stream.forward(**cases[2]), unary[2])
        same_bytes("receive after forward (1st)", stream.receive(), unary[0])
        same_bytes("receive after forward (2nd)", stream.receive(), unary[1])

        # Threads sharing the stream.
        errors = []

        def worker(k):
            try:
                for r in range(3):
                    i = (k + r) % len(cases)
                    same_bytes(f"thread {k} call {r}", stream.forward(**cases[i]), unary[i])
            except BaseException as error:  # reported from the main thread
                errors.append(error)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            fail(f"a thread sharing the stream failed: {errors[0]!r}")

    # Closing with requests in flight cancels them; it neither hangs nor hands out outputs.
    with gcmoe.Client(addr) as client:
        stream = client.forward_stream(timeout=60.0)
        stream.send(**cases[0])
        stream.send(**cases[1])
        stream.close()
        try:
            stream.receive()
        except gcmoe.GcmoeError as error:
            if error.code != grpc.StatusCode.CANCELLED:
                fail(f"receive() after close(): {error}, expected CANCELLED")
        else:
            fail("receive() after close() with requests in flight returned an output")


async def check_stream_async(addr, cases, bad, unary):
    async with gcmoe.aio.Client(addr, timeout=30.0) as client:
        async with client.forward_stream(timeout=120.0) as stream:
            for i, case in enumerate(cases):
                same_bytes(f"aio stream.forward case {i}", await stream.forward(**case), unary[i])
                if i < len(bad):
                    request, error_type, words = bad[i]
                    try:
                        await stream.forward(**request)
                    except gcmoe.GcmoeError as error:
                        expect_stream_error(f"aio stream.forward {request['request_id']}", error,
                                            error_type, words)
                    else:
                        fail(f"aio stream.forward {request['request_id']}: the bad request "
                             "succeeded")

            # Pipelined, the bad layer in the middle.
            for case in cases[:2]:
                stream.send(**case)
            stream.send(**bad[0][0])
            for case in cases[2:]:
                stream.send(**case)
            for i in range(2):
                same_bytes(f"aio pipelined case {i}", await stream.receive(), unary[i])
            try:
                await stream.receive()
            except gcmoe.GcmoeError as error:
                expect_stream_error("aio pipelined bad layer", error, *bad[0][1:])
            else:
                fail("aio pipelined bad layer: the bad request succeeded")
            for i in range(2, len(cases)):
                same_bytes(f"aio pipelined case {i}", await stream.receive(), unary[i])

            # Tasks sharing the stream.
            outputs = await asyncio.gather(*(stream.forward(**case) for case in cases * 2))
            for n, y in enumerate(outputs):
                same_bytes(f"aio gathered call {n}", y, unary[n % len(cases)])

        stream = client.forward_stream(timeout=60.0)
        stream.send(**cases[0])
        await stream.close()
        try:
            await stream.receive()
        except gcmoe.GcmoeError as error:
            if error.code != grpc.StatusCode.CANCELLED:
                fail(f"aio receive() after close(): {error}, expected CANCELLED")
        else:
            fail("aio receive() after close() with a request in flight returned an output")


def stream(args):
    with gcmoe.Client(args.addr, timeout=30.0) as client:
        info = client.info()
        cases = stream_cases(info, args.tokens, args.layer, args.seed)
        unary = [client.forward(**case) for case in cases]
    bad = bad_cases(info, cases[0])
    check_stream_sync(args.addr, cases, bad, unary)
    asyncio.run(check_stream_async(args.addr, cases, bad, unary))
    print(f"python_package_check: {len(cases)} requests through the stream, sync and asyncio, "
          "byte for byte unary Forward's")


def check_typing_files():
    """The package ships its .pyi files (hand-written and protoc's) and the py.typed marker."""
    root = os.path.dirname(gcmoe.__file__)
    for name in ("__init__.pyi", "client.pyi", "aio.pyi", "stream.pyi", "numerics.pyi",
                 "channel.pyi", "errors.pyi", "tensors.pyi", "shm.pyi", "cuda_memory.pyi",
                 "py.typed",
                 os.path.join("v1", "moe_pb2.pyi")):
        if not os.path.isfile(os.path.join(root, name)):
            fail(f"the installed package has no {name}")


def read_token(path):
    """The first line of a tokens file that is not blank or a '#' comment."""
    with open(path) as f:
        return next(line.strip() for line in f if line.strip() and not line.startswith("#"))


def connection(args):
    """gcmoe.Client's arguments from the command line: the address, TLS and the token."""
    connect = dict(addr=args.addr)
    if args.tls_ca:
        connect["tls"] = gcmoe.TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key,
                                   server_name=args.tls_server_name)
    if args.token_file:
        connect["token"] = read_token(args.token_file)
    return connect


def forward(args):
    os.makedirs(args.out, exist_ok=True)
    check_typing_files()
    connect = connection(args)
    with gcmoe.Client(**connect) as client:
        info = client.info(timeout=10.0)
    hidden, ids, weights = random_inputs(info, args.tokens, args.seed)
    np.save(os.path.join(args.out, "hidden.npy"), hidden)
    np.save(os.path.join(args.out, "hidden_bf16.npy"),
            numerics.bf16_bits_to_float32(numerics.float32_to_bf16_bits(hidden)))
    np.save(os.path.join(args.out, "topk_ids.npy"), ids)
    np.save(os.path.join(args.out, "topk_weights.npy"), weights)
    check_sync(connect, hidden, ids, weights, args.layer, args.out)
    asyncio.run(check_async(connect, hidden, ids, weights, args.layer, args.out))
    print(f"python_package_check: gcmoe {gcmoe.__version__}: outputs saved to {args.out}")


def expect_unauthenticated(what, call, words):
    """`call` (a function returning a coroutine when awaited is needed) raises
    gcmoe.UnauthenticatedError whose message holds the server's `words`."""
    try:
        result = call()
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except gcmoe.UnauthenticatedError as error:
        if error.code != grpc.StatusCode.UNAUTHENTICATED or words not in error.message:
            fail(f"{what}: {error!r} does not carry the server's {words!r}")
        return
    except gcmoe.GcmoeError as error:
        fail(f"{what}: expected UnauthenticatedError, got {type(error).__name__}: {error}")
    fail(f"{what}: the call succeeded")


def expect_unreachable(what, **connect):
    """A client made with `connect` cannot reach the service: UnavailableError."""
    try:
        with gcmoe.Client(**connect, timeout=5.0) as client:
            client.info()
    except gcmoe.UnavailableError:
        return
    except gcmoe.GcmoeError as error:
        fail(f"{what}: expected UnavailableError, got {type(error).__name__}: {error}")
    fail(f"{what}: the call succeeded")


async def aio_info(connect):
    async with gcmoe.aio.Client(**connect, timeout=30.0) as client:
        return await client.info()


def auth(args):
    connect = connection(args)
    token = connect["token"]
    tls = connect["tls"]
    with gcmoe.Client(**connect, timeout=30.0) as client:
        info = client.info()
        hidden, ids, weights = random_inputs(info, 5, args.seed)
        want = client.forward(hidden, ids, weights, output_dtype="fp32")

    missing = 'no "authorization: Bearer TOKEN" metadata'
    wrong = "not one of server.auth.tokens_file's"
    anonymous = dict(connect, token=None)
    impostor = dict(connect, token="not-" + token)
    for what, kwargs, words in (("no token", anonymous, missing),
                                ("a wrong token", impostor, wrong)):
        with gcmoe.Client(**kwargs, timeout=30.0) as client:
            expect_unauthenticated(f"info with {what}", client.info, words)
            expect_unauthenticated(f"forward with {what}",
                                   lambda: client.forward(hidden, ids, weights), words)
            with client.forward_stream(timeout=30.0) as stream:
                expect_unauthenticated(f"forward_stream with {what}",
                                       lambda: stream.forward(hidden, ids, weights), words)
        expect_unauthenticated(f"aio info with {what}", lambda: aio_info(kwargs), words)

    # The CA as bytes instead of a path; the name the certificate carries instead of the
    # address's IP.
    with open(args.tls_ca, "rb") as f:
        ca = f.read()
    named = gcmoe.TLS(ca=ca, cert=args.tls_cert, key=args.tls_key, server_name="localhost")
    with gcmoe.Client(args.addr, tls=named, token=token, timeout=30.0) as client:
        if not np.array_equal(client.forward(hidden, ids, weights, output_dtype="fp32"), want):
            fail("the same request over a TLS(ca=bytes, server_name=...) connection differs")
    misnamed = gcmoe.TLS(ca=ca, cert=args.tls_cert, key=args.tls_key,
                         server_name="gcmoe.example")
    expect_unreachable("a server name the certificate does not carry", addr=args.addr,
                       tls=misnamed, token=token)
    expect_unreachable("plaintext", addr=args.addr, token=token)
    expect_unreachable("the system's roots, not the test CA", addr=args.addr, tls=True,
                       token=token)
    if args.tls_cert:
        expect_unreachable("no client certificate (mTLS)", addr=args.addr,
                           tls=gcmoe.TLS(ca=ca), token=token)
    try:
        gcmoe.TLS(ca=ca, cert=args.tls_cert or args.tls_ca)
    except ValueError as error:
        if "cert and key go together" not in str(error):
            fail(f"TLS(cert without key): {error}")
    else:
        fail("TLS(cert without key) was accepted")
    # A token on plaintext: refused before any connection unless the address is this machine's.
    for addr in ("192.0.2.1:50051", "dns:///gcmoe.example:50051", "[2001:db8::1]:1"):
        for make in (gcmoe.Client, gcmoe.aio.Client):
            try:
                make(addr, token=token)
            except ValueError as error:
                if "token: needs tls= to reach" not in str(error):
                    fail(f"{make.__qualname__}({addr!r}, token=...) without tls: {error}")
            else:
                fail(f"{make.__qualname__}({addr!r}, token=...) without tls was accepted")
    for addr in ("127.0.0.1:1", "127.8.9.10:1", "localhost:1", "[::1]:1", "ipv4:127.0.0.1:1",
                 "unix:/nonexistent/gcmoe.sock"):
        gcmoe.Client(addr, token=token).close()
    mtls = " with client certificates" if args.tls_cert else ""
    print(f"python_package_check: tokens and TLS{mtls} refused and accepted as they should "
          f"({tls!r})")


def fp8(args):
    x = np.load(args.input)
    codes, scales = numerics.quantize_fp8(x)
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, "codes.npy"), codes.astype(np.int32))
    np.save(os.path.join(args.out, "scales.npy"), scales.astype(np.int32))
    # The decoder inverts the encoder on every code it produced.
    finite = codes[~np.isnan(numerics.decode_e4m3(codes))]
    if not np.array_equal(numerics.encode_e4m3(numerics.decode_e4m3(finite)), finite):
        fail("decode_e4m3 then encode_e4m3 does not give the codes back")
    print(f"python_package_check: encoded {x.shape} values")


def add_connection_options(parser):
    parser.add_argument("--tls-ca", help="TLS: the CA certificate that signed the server's")
    parser.add_argument("--tls-cert", help="mTLS: the client certificate")
    parser.add_argument("--tls-key", help="mTLS: the client key")
    parser.add_argument("--tls-server-name", help="TLS: the name to check the server against")
    parser.add_argument("--token-file", help="the bearer token")


def readme_registered_memory(args):
    """Runs the README's registered-memory example as written."""
    with open(args.readme) as f:
        text = f.read()
    section = text[text.index("### Registered memory"):]
    start = section.index("```python\n") + len("```python\n")
    code = section[start:section.index("```", start)]
    before = set(os.listdir("/dev/shm"))
    exec(compile(code, "README.md (Registered memory)", "exec"), {"ADDR": args.addr})
    left = [n for n in set(os.listdir("/dev/shm")) - before if n.startswith("gcmoe_py-")]
    if left:
        fail(f"the example left shared-memory objects behind: {left}")
    with gcmoe.Client(args.addr, timeout=30.0) as client:
        info = client.info()
        hidden, ids, weights = random_inputs(info, 5, 23)
        expected = client.forward(hidden, ids, weights, output_dtype="bf16")
        with gcmoe.SharedMemoryRegion(1 << 20, name="aio-check") as shm:
            views = [shm.array(a.shape, a.dtype) for a in (hidden, ids.astype(np.int32), weights)]
            for view, a in zip(views, (hidden, ids, weights)):
                view.array[:] = a
            out = shm.array((5, info.hidden), np.uint16)

            async def run():
                async with gcmoe.aio.Client(args.addr, timeout=30.0) as aio_client:
                    await aio_client.register_memory(shm)
                    y = await aio_client.forward(*views, output_dtype="bf16", out=out)
                    same_bytes("aio region", np.asarray(y).view(np.uint16),
                               np.asarray(expected).view(np.uint16))
                    out.array[:] = 0
                    async with aio_client.forward_stream() as stream:
                        y = await stream.forward(*views, output_dtype="bf16", out=out)
                        same_bytes("aio stream region", y, np.asarray(expected).view(np.uint16))
                        out.array[:] = 0
                        stream.send(*views, output_dtype="bf16", out=out)
                        await stream.receive_response()
                        same_bytes("aio stream region, sent", out.array,
                                   np.asarray(expected).view(np.uint16))
            asyncio.run(run())
            if "posix_shm" not in list(client.info().memory_kinds):
                fail(f"ModelInfo.memory_kinds {list(client.info().memory_kinds)} lacks posix_shm")
            out.array[:] = 0
            with client.forward_stream() as stream:
                y = stream.forward(*views, output_dtype="bf16", out=out)
            same_bytes("stream region", y, np.asarray(expected).view(np.uint16))
            client.unregister_memory("aio-check")
    with gcmoe.SharedMemoryRegion(4096) as shm:
        try:
            gcmoe.tensors.forward_request(shm.array((1, 8), np.float32),
                                          shm.array((1, 2), np.int32),
                                          shm.array((1, 2), np.float32),
                                          output_dtype="bf16", out=shm.array((1, 8), np.float32))
        except ValueError as error:
            if "out:" not in str(error):
                fail(f"a float32 out= for BF16 output: {error}")
        else:
            fail("a float32 out= for BF16 output was accepted")
    # GPU memory: the references a call sends, and this service's refusal (it runs the cpu
    # backend; tests/server/cuda_ipc_memory_test.cc registers real GPU memory on a GPU).
    gpu = gcmoe.CudaMemory(bytes(range(64)), 0, 1 << 20, offset=512, name="gpu-check")
    registration = gcmoe.shm.register_request(gpu)
    if (registration.name != "gpu-check" or registration.cuda_ipc.ipc_handle != bytes(range(64))
            or registration.cuda_ipc.offset != 512
            or registration.cuda_ipc.byte_size != 1 << 20):
        fail(f"CudaMemory's registration: {registration}")
    hidden, out = gpu.array((3, 8), "bf16"), gpu.array((3, 8), "bf16")
    request = gcmoe.tensors.forward_request(hidden, np.zeros((3, 2), np.int32),
                                            np.ones((3, 2), np.float32), output_dtype="bf16",
                                            out=out)
    if (request.hidden.dtype != gcmoe.v1.moe_pb2.BF16 or list(request.hidden.shape) != [3, 8]
            or request.hidden.data or request.hidden.region.region != "gpu-check"
            or request.hidden.region.offset != 0 or request.hidden.region.byte_size != 48
            or request.output_region.offset != 256 or request.output_region.byte_size != 48):
        fail(f"a request with DeviceArrays: {request}")
    with gcmoe.Client(args.addr, timeout=30.0) as client:
        try:
            client.register_memory(gpu)
        except gcmoe.GcmoeError as error:
            if "needs the cuda backend" not in error.message:
                fail(f"CudaMemory registered with the cpu backend: {error}")
        else:
            fail("CudaMemory was registered with a cpu-backend service")
    print("python_package_check: the README's registered-memory example ran")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--addr", required=True)
    f.add_argument("--out", required=True)
    f.add_argument("--tokens", type=int, default=40)
    f.add_argument("--layer", type=int, default=1)
    f.add_argument("--seed", type=int, default=5)
    add_connection_options(f)
    a = sub.add_parser("auth")
    a.add_argument("--addr", required=True)
    a.add_argument("--seed", type=int, default=17)
    add_connection_options(a)
    s = sub.add_parser("stream")
    s.add_argument("--addr", required=True)
    s.add_argument("--tokens", type=int, default=40)
    s.add_argument("--layer", type=int, default=1)
    s.add_argument("--seed", type=int, default=11)
    q = sub.add_parser("fp8")
    q.add_argument("--input", required=True)
    q.add_argument("--out", required=True)
    r = sub.add_parser("readme-registered-memory")
    r.add_argument("--addr", required=True)
    r.add_argument("--readme", required=True)
    args = parser.parse_args()
    {"forward": forward, "auth": auth, "stream": stream, "fp8": fp8,
     "readme-registered-memory": readme_registered_memory}[args.mode](args)


if __name__ == "__main__":
    main()
