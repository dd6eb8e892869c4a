package gcmoe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"

	"gcmoe/clients/go/gcmoev1"
)

const streamRPC = "ForwardStream"

// Stream is Forward calls on one long-lived ForwardStream RPC, answered in the order they were
// sent: for a frontend that calls once per MoE layer, so a decode step does not pay call setup
// once per layer.
//
//	stream, err := client.ForwardStream(ctx)
//	defer stream.Close()
//	out, err := stream.ForwardFloat32(0, hidden, gcmoe.Shape{T, H}, routing, opts) // one call
//	for layer := 0; layer < L; layer++ {                                            // pipelined
//		err = stream.SendFloat32(uint32(layer), hidden, gcmoe.Shape{T, H}, routing, opts)
//	}
//	for layer := 0; layer < L; layer++ {
//		out, err = stream.Recv() // in send order
//	}
//
// A request the server refuses returns its *Error (NOT_FOUND for a layer past the model, ...)
// from the Forward or Recv that answers it, and the stream goes on. An error of the stream itself
// (the context was cancelled, its deadline passed, the service went away) fails every request in
// flight and every later one. Goroutines may share a Stream; each Forward gets its own reply.
type Stream struct {
	rpc    gcmoev1.MoeService_ForwardStreamClient
	cancel context.CancelFunc
	// sendMu makes a request's place in waiting its place on the wire.
	sendMu sync.Mutex
	closed bool // CloseSend done; guarded by sendMu

	mu         sync.Mutex
	waiting    []*reply // every request in flight, in send order
	unreceived []*reply // those of Send not yet returned by Recv, in send order
	err        error    // set once the stream has ended
	done       chan struct{}
}

// reply is one request's answer, ready once its channel is closed.
type reply struct {
	requestID string
	ready     chan struct{}
	out       *Output
	err       error
}

// ForwardStream opens a stream. ctx bounds the whole stream: cancel it to abandon the requests
// in flight; its deadline is every request's deadline on the server.
func (c *Client) ForwardStream(ctx context.Context) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	rpc, err := c.stub.ForwardStream(ctx)
	if err != nil {
		cancel()
		return nil, wrap(streamRPC, err)
	}
	s := &Stream{rpc: rpc, cancel: cancel, done: make(chan struct{})}
	// Replies are read as they come, whether or not anyone waits for them yet, so the server
	// never blocks writing a reply and a caller may send any number of requests before it reads.
	go s.read()
	return s, nil
}

func (s *Stream) read() {
	defer close(s.done)
	for {
		message, err := s.rpc.Recv()
		if err != nil {
			s.mu.Lock()
			unanswered := len(s.waiting)
			s.mu.Unlock()
			switch {
			case err != io.EOF:
				err = wrap(streamRPC, err)
			case unanswered > 0:
				err = &Error{RPC: streamRPC, Code: codes.Internal, Message: fmt.Sprintf(
					"the server ended the stream with %d request(s) unanswered", unanswered)}
			default:
				err = errors.New("gcmoe: ForwardStream: the stream is closed")
			}
			s.fail(err)
			return
		}
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.mu.Unlock()
			s.fail(&Error{RPC: streamRPC, Code: codes.Internal,
				Message: "a reply came with no request in flight"})
			s.cancel()
			return
		}
		r := s.waiting[0]
		s.waiting = s.waiting[1:]
		s.mu.Unlock()
		// A request sent without an id gets one the server made up, which the client cannot
		// predict: only a request the caller named can be matched.
		if r.requestID != "" && message.GetRequestId() != r.requestID {
			// Only a server that breaks the in-order contract gets here; no later reply can be
			// trusted to belong to its request either.
			r.err = &Error{RPC: streamRPC, Code: codes.Internal, Message: fmt.Sprintf(
				"reply for request_id %q where %q was next: the server answered out of order",
				message.GetRequestId(), r.requestID)}
			close(r.ready)
			s.fail(r.err)
			s.cancel()
			return
		}
		if message.GetCode() != int32(codes.OK) {
			r.err = &Error{RPC: streamRPC, Code: codes.Code(message.GetCode()), Message: message.GetMessage()}
		} else {
			r.out, r.err = output(streamRPC, message.GetResponse())
		}
		close(r.ready)
	}
}

// fail ends the stream with err: every request in flight gets it, and so does every later call.
func (s *Stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	for _, r := range s.waiting {
		r.err = s.err
		close(r.ready)
	}
	s.waiting = nil
}

func (s *Stream) send(request *gcmoev1.ForwardRequest, forReceive bool) (*reply, error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.closed {
		return nil, errors.New("gcmoe: ForwardStream: send after Close")
	}
	r := &reply{requestID: request.GetRequestId(), ready: make(chan struct{})}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.waiting = append(s.waiting, r)
	if forReceive {
		s.unreceived = append(s.unreceived, r)
	}
	s.mu.Unlock()
	// A failed SendMsg means the stream has ended; Recv reports how, and fails r with it.
	_ = s.rpc.Send(request)
	return r, nil
}

func (r *reply) wait() (*Output, error) {
	<-r.ready
	return r.out, r.err
}

// SendFloat32 sends a request on FP32 activations without waiting for its reply; Recv returns
// the replies of the requests sent so, in send order.
func (s *Stream) SendFloat32(layer uint32, hidden []float32, shape Shape, routing Routing,
	opts ForwardOptions) error {
	h, err := float32Tensor(hidden, shape)
	if err != nil {
		return err
	}
	return s.sendRequest(forwardRequest(layer, h, shape, routing, opts))
}

// SendBF16 is SendFloat32 on BF16 activations (bit patterns, see Float32ToBF16).
func (s *Stream) SendBF16(layer uint32, hidden []uint16, shape Shape, routing Routing,
	opts ForwardOptions) error {
	h, err := bf16Tensor(hidden, shape)
	if err != nil {
		return err
	}
	return s.sendRequest(forwardRequest(layer, h, shape, routing, opts))
}

// SendRegistered is SendFloat32 on tensors in registered memory (see Client.ForwardRegistered):
// leave them untouched until Recv has returned the reply.
func (s *Stream) SendRegistered(layer uint32, in Registered, opts ForwardOptions) error {
	return s.sendRequest(in.request(layer, opts))
}

// sendRequest sends a request built for Recv.
func (s *Stream) sendRequest(request *gcmoev1.ForwardRequest, err error) error {
	if err != nil {
		return err
	}
	_, err = s.send(request, true)
	return err
}

// Recv waits for the reply of the oldest request of SendFloat32, SendBF16 or SendRegistered not
// yet received.
func (s *Stream) Recv() (*Output, error) {
	s.mu.Lock()
	if len(s.unreceived) == 0 {
		s.mu.Unlock()
		return nil, errors.New("gcmoe: ForwardStream: Recv with every sent request received")
	}
	r := s.unreceived[0]
	s.unreceived = s.unreceived[1:]
	s.mu.Unlock()
	return r.wait()
}

// ForwardFloat32 runs one MoE layer on the stream (see Client.ForwardFloat32) and waits for its
// reply; requests sent before it keep their replies for Recv.
func (s *Stream) ForwardFloat32(layer uint32, hidden []float32, shape Shape, routing Routing,
	opts ForwardOptions) (*Output, error) {
	h, err := float32Tensor(hidden, shape)
	if err != nil {
		return nil, err
	}
	return s.forward(forwardRequest(layer, h, shape, routing, opts))
}

// ForwardBF16 is ForwardFloat32 on BF16 activations (bit patterns, see Float32ToBF16).
func (s *Stream) ForwardBF16(layer uint32, hidden []uint16, shape Shape, routing Routing,
	opts ForwardOptions) (*Output, error) {
	h, err := bf16Tensor(hidden, shape)
	if err != nil {
		return nil, err
	}
	return s.forward(forwardRequest(layer, h, shape, routing, opts))
}

// ForwardRegistered is ForwardFloat32 on tensors in registered memory (see
// Client.ForwardRegistered).
func (s *Stream) ForwardRegistered(layer uint32, in Registered, opts ForwardOptions) (*Output, error) {
	return s.forward(in.request(layer, opts))
}

// forward sends a request and waits for its reply.
func (s *Stream) forward(request *gcmoev1.ForwardRequest, err error) (*Output, error) {
	if err != nil {
		return nil, err
	}
	r, err := s.send(request, false)
	if err != nil {
		return nil, err
	}
	return r.wait()
}

// Pending is the number of sent requests whose replies Recv has not returned yet.
func (s *Stream) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.unreceived)
}

// Close ends the requests and waits until the server has answered those in flight (Recv still
// returns their replies), then releases the stream. Cancel the stream's context first to
// abandon them instead.
func (s *Stream) Close() error {
	s.sendMu.Lock()
	var err error
	if !s.closed {
		s.closed = true
		err = s.rpc.CloseSend()
	}
	s.sendMu.Unlock()
	<-s.done
	s.cancel()
	return err
}
