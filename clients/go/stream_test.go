package gcmoe

// ForwardStream against the real service of TestAgainstARealService: requests of several sizes,
// layers and dtypes, one at a time, pipelined and from goroutines sharing the stream, each
// output byte for byte unary Forward's for the same request; a bad layer and a bad expert id in
// the middle each get their own *Error and the requests after them are answered.

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"gcmoe/clients/go/gcmoev1"
)

type streamCase struct {
	layer   uint32
	bf16    bool
	shape   Shape
	hidden  []float32
	routing Routing
	opts    ForwardOptions
}

func (c streamCase) unary(ctx context.Context, client *Client) (*Output, error) {
	if c.bf16 {
		return client.ForwardBF16(ctx, c.layer, Float32ToBF16(c.hidden), c.shape, c.routing, c.opts)
	}
	return client.ForwardFloat32(ctx, c.layer, c.hidden, c.shape, c.routing, c.opts)
}

func (c streamCase) forward(s *Stream) (*Output, error) {
	if c.bf16 {
		return s.ForwardBF16(c.layer, Float32ToBF16(c.hidden), c.shape, c.routing, c.opts)
	}
	return s.ForwardFloat32(c.layer, c.hidden, c.shape, c.routing, c.opts)
}

func (c streamCase) send(s *Stream) error {
	if c.bf16 {
		return s.SendBF16(c.layer, Float32ToBF16(c.hidden), c.shape, c.routing, c.opts)
	}
	return s.SendFloat32(c.layer, c.hidden, c.shape, c.routing, c.opts)
}

// badCase is a request the server refuses, with the code and the field its error must name.
type badCase struct {
	streamCase
	code  codes.Code
	field string
}

func streamCases(info *gcmoev1.ModelInfo) ([]streamCase, []badCase) {
	H, E, k := int(info.GetHidden()), int(info.GetExperts()), int(info.GetTopK())
	var cases []streamCase
	for i, c := range []struct {
		layer      uint32
		bf16, fp32 bool
		tokens     int
	}{{1, false, true, 24}, {0, true, false, 1}, {1, false, false, 7}, {0, true, true, 24}} {
		hidden, routing := request(c.tokens, H, E, k, int64(100+i))
		cases = append(cases, streamCase{layer: c.layer, bf16: c.bf16, shape: Shape{c.tokens, H},
			hidden: hidden, routing: routing,
			opts: ForwardOptions{OutputFP32: c.fp32, RequestID: fmt.Sprintf("case-%d", i)}})
	}
	// One request names no id: the server makes one up, which the stream cannot predict.
	cases[2].opts.RequestID = ""
	badLayer := cases[0]
	badLayer.layer = info.GetLayers()
	badLayer.opts.RequestID = "bad-layer"
	badExpert := cases[0]
	badExpert.routing.IDs = append([]int32(nil), cases[0].routing.IDs...)
	badExpert.routing.IDs[0] = int32(E)
	badExpert.opts.RequestID = "bad-expert"
	return cases, []badCase{{badLayer, codes.NotFound, "layer"},
		{badExpert, codes.InvalidArgument, "topk_ids"}}
}

func sameOutput(t *testing.T, what string, got *Output, err error, want *Output) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got.DType != want.DType || got.Shape != want.Shape || !bytes.Equal(got.Data, want.Data) {
		t.Fatalf("%s: the stream's output (%v %v) is not byte for byte unary Forward's (%v %v)",
			what, got.DType, got.Shape, want.DType, want.Shape)
	}
	// A request sent without an id gets one the server made up, another each time.
	generated := strings.HasPrefix(want.RequestID, "gcmoe-")
	if got.RequestID != want.RequestID && !(generated && strings.HasPrefix(got.RequestID, "gcmoe-")) {
		t.Fatalf("%s: request id %q, expected %q", what, got.RequestID, want.RequestID)
	}
}

func refused(t *testing.T, what string, err error, bad badCase) {
	t.Helper()
	if !IsCode(err, bad.code) || !strings.Contains(err.Error(), bad.field) ||
		!strings.Contains(err.Error(), "ForwardStream") {
		t.Fatalf("%s: got %v, expected ForwardStream %v naming %s", what, err, bad.code, bad.field)
	}
}

func testForwardStream(t *testing.T, client *Client, info *gcmoev1.ModelInfo) {
	ctx := context.Background()
	cases, bad := streamCases(info)
	unary := make([]*Output, len(cases))
	for i, c := range cases {
		var err error
		if unary[i], err = c.unary(ctx, client); err != nil {
			t.Fatalf("unary case %d: %v", i, err)
		}
	}

	stream, err := client.ForwardStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("one at a time, bad requests in the middle", func(t *testing.T) {
		for i, c := range cases {
			out, err := c.forward(stream)
			sameOutput(t, fmt.Sprintf("case %d", i), out, err, unary[i])
			if i < len(bad) {
				_, err := bad[i].forward(stream)
				refused(t, bad[i].opts.RequestID, err, bad[i])
			}
		}
	})
	t.Run("pipelined, bad requests in the middle", func(t *testing.T) {
		type step struct {
			c    streamCase
			want *Output
			bad  *badCase
		}
		var steps []step
		for i, c := range cases {
			steps = append(steps, step{c: c, want: unary[i]})
			if i < len(bad) {
				steps = append(steps, step{c: bad[i].streamCase, bad: &bad[i]})
			}
		}
		for _, s := range steps {
			if err := s.c.send(stream); err != nil {
				t.Fatal(err)
			}
		}
		if stream.Pending() != len(steps) {
			t.Fatalf("Pending() = %d after %d sends", stream.Pending(), len(steps))
		}
		for n, s := range steps {
			out, err := stream.Recv()
			what := fmt.Sprintf("reply %d (%s)", n, s.c.opts.RequestID)
			if s.bad != nil {
				refused(t, what, err, *s.bad)
			} else {
				sameOutput(t, what, out, err, s.want)
			}
		}
		if _, err := stream.Recv(); err == nil {
			t.Fatal("Recv with every sent request received returned no error")
		}
	})
	t.Run("Forward between sends", func(t *testing.T) {
		for _, c := range cases[:2] {
			if err := c.send(stream); err != nil {
				t.Fatal(err)
			}
		}
		out, err := cases[2].forward(stream)
		sameOutput(t, "Forward", out, err, unary[2])
		for i := 0; i < 2; i++ {
			out, err := stream.Recv()
			sameOutput(t, fmt.Sprintf("Recv %d", i), out, err, unary[i])
		}
	})
	t.Run("goroutines sharing the stream", func(t *testing.T) {
		var wg sync.WaitGroup
		failures := make(chan string, 12)
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for r := 0; r < 3; r++ {
					i := (g + r) % len(cases)
					out, err := cases[i].forward(stream)
					if err != nil || !bytes.Equal(out.Data, unary[i].Data) {
						failures <- fmt.Sprintf("goroutine %d call %d: %v", g, r, err)
					}
				}
			}(g)
		}
		wg.Wait()
		close(failures)
		for f := range failures {
			t.Error(f, ": not unary Forward's bytes")
		}
	})
	t.Run("Close answers the requests in flight", func(t *testing.T) {
		for _, c := range cases[:2] {
			if err := c.send(stream); err != nil {
				t.Fatal(err)
			}
		}
		if err := stream.Close(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			out, err := stream.Recv()
			sameOutput(t, fmt.Sprintf("Recv %d after Close", i), out, err, unary[i])
		}
		if err := cases[0].send(stream); err == nil {
			t.Fatal("Send after Close returned no error")
		}
	})
	t.Run("cancelling the context ends the stream", func(t *testing.T) {
		streamCtx, cancel := context.WithCancel(ctx)
		s, err := client.ForwardStream(streamCtx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, c := range cases[:2] {
			if err := c.send(s); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		// A reply that came before the cancel is the request's; none is anything else.
		for i := 0; i < 2; i++ {
			out, err := s.Recv()
			if err != nil {
				if !IsCode(err, codes.Canceled) {
					t.Fatalf("Recv %d after cancel: %v, expected CANCELED", i, err)
				}
			} else {
				sameOutput(t, fmt.Sprintf("Recv %d after cancel", i), out, nil, unary[i])
			}
		}
		if _, err := cases[0].forward(s); !IsCode(err, codes.Canceled) {
			t.Fatalf("Forward after cancel: %v, expected CANCELED", err)
		}
	})
}
