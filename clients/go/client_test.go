package gcmoe

// Against a real `gcmoe serve` (the binary named by GCMOE_BINARY, which the project's ctest
// sets): Info, Forward on FP32 and BF16 activations byte for byte equal to what the C++ client
// (`gcmoe client forward --input DIR --save FILE`) gets for the same request, typed errors,
// context deadlines, and ForwardStream (stream_test.go).

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"gcmoe/clients/go/gcmoev1"
)

type service struct {
	binary  string
	addr    string
	process *exec.Cmd
}

// startServe starts `gcmoe serve` with the embedded default model and the given extra flags.
func startServe(t *testing.T, extra ...string) *service {
	t.Helper()
	binary := os.Getenv("GCMOE_BINARY")
	if binary == "" {
		t.Fatal("GCMOE_BINARY must name the gcmoe binary to test against (ctest sets it)")
	}
	dir := t.TempDir()
	addressFile := filepath.Join(dir, "address")
	log, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "serve", "--listen", "127.0.0.1:0", "--address-file", addressFile,
		"--set", "server.rank_listen=127.0.0.1:0", "--set", "server.metrics_listen=")
	cmd.Args = append(cmd.Args, extra...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s serve: %v", binary, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	s := &service{binary: binary, process: cmd}
	deadline := time.Now().Add(60 * time.Second)
	for s.addr == "" && time.Now().Before(deadline) {
		if text, err := os.ReadFile(addressFile); err == nil && strings.Contains(string(text), "\n") {
			s.addr = strings.SplitN(string(text), "\n", 2)[0]
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if s.addr == "" {
		serveLog, _ := os.ReadFile(log.Name())
		t.Fatalf("gcmoe serve wrote no address in 60 s; its log:\n%s", serveLog)
	}
	return s
}

// waitServing polls the standard health service until every rank is ready.
func waitServing(t *testing.T, client *Client) {
	t.Helper()
	health := healthpb.NewHealthClient(client.Conn())
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the service did not become SERVING within 60 s")
}

// writeNpy writes a little-endian array in NumPy's .npy format, version 1.0.
func writeNpy(t *testing.T, path, descr string, shape Shape, data []byte) {
	t.Helper()
	header := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }", descr,
		shape[0], shape[1])
	total := 10 + len(header) + 1
	header += strings.Repeat(" ", (64-total%64)%64) + "\n"
	var b bytes.Buffer
	b.WriteString("\x93NUMPY\x01\x00")
	_ = binary.Write(&b, binary.LittleEndian, uint16(len(header)))
	b.WriteString(header)
	b.Write(data)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readNpyData returns the element bytes of a version 1.0 .npy file.
func readNpyData(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < 10 || string(raw[:6]) != "\x93NUMPY" || raw[6] != 1 {
		t.Fatalf("%s: not a version 1 .npy file", path)
	}
	return raw[10+int(binary.LittleEndian.Uint16(raw[8:10])):]
}

func float32Bytes(values []float32) []byte {
	out := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// request is a seeded batch: N(0, 1) activations, k distinct experts per token, some slots
// unused, positive weights.
func request(tokens, hidden, experts, topK int, seed int64) ([]float32, Routing) {
	rng := rand.New(rand.NewSource(seed))
	x := make([]float32, tokens*hidden)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	routing := Routing{TopK: topK, IDs: make([]int32, tokens*topK), Weights: make([]float32, tokens*topK)}
	for t := 0; t < tokens; t++ {
		perm := rng.Perm(experts)
		for j := 0; j < topK; j++ {
			routing.IDs[t*topK+j] = int32(perm[j])
			if t%3 == 0 && j == topK-1 {
				routing.IDs[t*topK+j] = -1
			}
			routing.Weights[t*topK+j] = float32(0.05 + 0.95*rng.Float64())
		}
	}
	return x, routing
}

// cppForward sends the request saved in dir with `gcmoe client forward` (and the extra
// connection flags) and returns the bytes of the float32 output it saved.
func cppForward(t *testing.T, s *service, dir, dtype, outputDtype string, layer int,
	extra ...string) []byte {
	t.Helper()
	out := filepath.Join(dir, "cpp_"+dtype+"_"+outputDtype+".npy")
	cmd := exec.Command(s.binary, "client", "forward", "--addr", s.addr, "--input", dir,
		"--layer", fmt.Sprint(layer), "--dtype", dtype, "--output-dtype", outputDtype,
		"--requests", "1", "--warmup", "0", "--save", out)
	cmd.Args = append(cmd.Args, extra...)
	if text, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, text)
	}
	return readNpyData(t, out)
}

// saveRequest writes the request as the .npy files `gcmoe client forward --input DIR` reads
// and returns DIR.
func saveRequest(t *testing.T, hidden []float32, shape Shape, routing Routing) string {
	t.Helper()
	dir := t.TempDir()
	writeNpy(t, filepath.Join(dir, "hidden.npy"), "<f4", shape, float32Bytes(hidden))
	ids := make([]byte, 4*len(routing.IDs))
	for i, id := range routing.IDs {
		binary.LittleEndian.PutUint32(ids[4*i:], uint32(id))
	}
	routingShape := Shape{shape[0], routing.TopK}
	writeNpy(t, filepath.Join(dir, "topk_ids.npy"), "<i4", routingShape, ids)
	writeNpy(t, filepath.Join(dir, "topk_weights.npy"), "<f4", routingShape, float32Bytes(routing.Weights))
	return dir
}

// serveAndConnect starts `gcmoe serve` with the extra flags, connects to it in plaintext, waits
// until it serves, and returns the service, the client (closed when t ends) and its ModelInfo.
func serveAndConnect(t *testing.T, extra ...string) (*service, *Client, *gcmoev1.ModelInfo) {
	t.Helper()
	s := startServe(t, extra...)
	client, err := Dial(context.Background(), s.addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	waitServing(t, client)
	info, err := client.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s, client, info
}

func TestAgainstARealService(t *testing.T) {
	s, client, info := serveAndConnect(t)
	ctx := context.Background()
	if info.GetHidden() == 0 || info.GetTopK() == 0 || info.GetExperts() == 0 || info.GetVersion() == "" {
		t.Fatalf("incomplete ModelInfo: %v", info)
	}
	H, E, k := int(info.GetHidden()), int(info.GetExperts()), int(info.GetTopK())
	const T, layer = 24, 1
	hidden, routing := request(T, H, E, k, 7)
	dir := saveRequest(t, hidden, Shape{T, H}, routing)

	t.Run("FP32 in, FP32 out", func(t *testing.T) {
		out, err := client.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, routing, ForwardOptions{OutputFP32: true})
		if err != nil {
			t.Fatal(err)
		}
		if out.Shape != (Shape{T, H}) || len(out.Data) != 4*T*H {
			t.Fatalf("output shape %v with %d bytes", out.Shape, len(out.Data))
		}
		if !bytes.Equal(out.Data, cppForward(t, s, dir, "fp32", "fp32", layer)) {
			t.Fatal("the Go and C++ clients got different outputs for the same request")
		}
	})
	t.Run("BF16 in, FP32 out", func(t *testing.T) {
		out, err := client.ForwardBF16(ctx, layer, Float32ToBF16(hidden), Shape{T, H}, routing, ForwardOptions{OutputFP32: true})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Data, cppForward(t, s, dir, "bf16", "fp32", layer)) {
			t.Fatal("the Go and C++ clients got different outputs for the same BF16 request")
		}
	})
	t.Run("BF16 in, BF16 out", func(t *testing.T) {
		out, err := client.ForwardBF16(ctx, layer, Float32ToBF16(hidden), Shape{T, H}, routing, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out.DType.String() != "BF16" || len(out.Data) != 2*T*H {
			t.Fatalf("output %v with %d bytes, expected BF16", out.DType, len(out.Data))
		}
		// The C++ client saves a BF16 output widened to float32, which is exact.
		if !bytes.Equal(float32Bytes(out.Float32()), cppForward(t, s, dir, "bf16", "bf16", layer)) {
			t.Fatal("the Go and C++ clients got different BF16 outputs for the same request")
		}
	})
	t.Run("errors keep the server's code and message", func(t *testing.T) {
		_, err := client.ForwardFloat32(ctx, info.GetLayers(), hidden, Shape{T, H}, routing, ForwardOptions{})
		if !IsCode(err, codes.NotFound) || !strings.Contains(err.Error(), "layer") {
			t.Fatalf("a layer past the model: got %v, expected NOT_FOUND naming the layer", err)
		}
		bad := routing
		bad.IDs = append([]int32(nil), routing.IDs...)
		bad.IDs[0] = int32(E)
		_, err = client.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, bad, ForwardOptions{})
		if !IsCode(err, codes.InvalidArgument) || !strings.Contains(err.Error(), "topk_ids") {
			t.Fatalf("an expert id out of range: got %v, expected INVALID_ARGUMENT naming topk_ids", err)
		}
	})
	t.Run("registered memory is off by default", func(t *testing.T) {
		if len(info.GetMemoryKinds()) != 0 {
			t.Fatalf("ModelInfo.memory_kinds %v, expected none", info.GetMemoryKinds())
		}
		shm, err := NewSharedMemory(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer shm.Close()
		if err := client.RegisterMemory(ctx, shm); !IsCode(err, codes.FailedPrecondition) ||
			!strings.Contains(err.Error(), "server.allow_registered_memory") {
			t.Fatalf("RegisterMemory: got %v, expected FAILED_PRECONDITION naming the key", err)
		}
	})
	t.Run("ForwardStream", func(t *testing.T) { testForwardStream(t, client, info) })
	t.Run("context deadline", func(t *testing.T) {
		expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		_, err := client.ForwardFloat32(expired, layer, hidden, Shape{T, H}, routing, ForwardOptions{})
		if !IsCode(err, codes.DeadlineExceeded) {
			t.Fatalf("an expired context: got %v, expected DEADLINE_EXCEEDED", err)
		}
	})
}

func TestBF16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1.0, 0x3F80},
		{1.00390625, 0x3F80}, // halfway, even stays
		{1.01171875, 0x3F82}, // halfway, odd rounds up
		{1.0078125, 0x3F81},  // exact
		{-2.0, 0xC000},
		{float32(math.Inf(1)), 0x7F80},
		{3.4028235e38, 0x7F80}, // rounds past the largest BF16 to Inf
	}
	for _, c := range cases {
		if got := Float32ToBF16([]float32{c.in})[0]; got != c.want {
			t.Errorf("Float32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
		if c.want&0x7F80 != 0x7F80 && BF16ToFloat32([]uint16{c.want})[0] != BF16ToFloat32(Float32ToBF16([]float32{c.in}))[0] {
			t.Errorf("BF16ToFloat32 disagrees for %v", c.in)
		}
	}
	if nan := Float32ToBF16([]float32{float32(math.NaN())})[0]; nan&0x7F80 != 0x7F80 || nan&0x7F == 0 {
		t.Errorf("NaN became %#04x, expected a NaN", nan)
	}
}
