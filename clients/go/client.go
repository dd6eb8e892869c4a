package gcmoe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"gcmoe/clients/go/gcmoev1"
)

// DefaultMaxMessageBytes is the largest message the client sends or accepts unless Options
// says otherwise: [T, H] outputs of large batches are far past gRPC's 4 MiB default.
const DefaultMaxMessageBytes = 256 << 20

// Options of a connection. The zero value is plaintext, no token, the default message limit.
type Options struct {
	// Credentials for TLS: TLSCredentials(TLSFiles{...}) for a private CA, a client certificate
	// (mTLS) or another server name, or any credentials.TransportCredentials; nil is plaintext.
	Credentials credentials.TransportCredentials
	// Token, when set, is sent as "authorization: Bearer <token>" with every call. It needs
	// Credentials unless addr is a loopback address or a Unix socket: Dial refuses a token on
	// a plaintext connection that leaves the machine, where it would cross the network in the
	// clear.
	Token string
	// MaxMessageBytes is the send and receive limit; 0 is DefaultMaxMessageBytes.
	MaxMessageBytes int
	// DialOptions are appended to the client's own.
	DialOptions []grpc.DialOption
}

// Client is a connection to one gcmoe service; it is safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	stub gcmoev1.MoeServiceClient
}

// Shape is [tokens, hidden] for activations and outputs, [tokens, top-k] for the routing.
type Shape [2]int

// Routing is each token's top-k experts (-1 for an unused slot) and their weights, [T, k].
type Routing struct {
	IDs     []int32
	Weights []float32
	TopK    int
}

// ForwardOptions of one Forward call. The zero value asks for a BF16 output.
type ForwardOptions struct {
	OutputFP32 bool
	RequestID  string
}

// Output is a Forward call's [T, H] output and the server's statistics of the step.
type Output struct {
	DType     gcmoev1.DType // BF16 or FP32
	Shape     Shape
	Data      []byte // little-endian elements, row-major
	Stats     *gcmoev1.ForwardStats
	RequestID string // the request's ForwardOptions.RequestID
}

// Error is a failed call: the gRPC status code and the server's message.
type Error struct {
	RPC     string
	Code    codes.Code
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s: %s", e.RPC, e.Code, e.Message) }

// GRPCStatus lets status.FromError and status.Code see the server's status.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

func wrap(rpc string, err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return &Error{RPC: rpc, Code: codes.Unknown, Message: err.Error()}
	}
	return &Error{RPC: rpc, Code: s.Code(), Message: s.Message()}
}

// IsCode reports whether err is a call that failed with the given code.
func IsCode(err error, code codes.Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// bearerToken is the Options.Token of every call, as per-RPC credentials.
type bearerToken struct {
	header string // "Bearer <token>"
	tls    bool   // the connection has transport security
}

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": b.header}, nil
}

// With TLS, gRPC then sends the token only on a connection whose handshake gave privacy and
// integrity; without, Dial has checked that the connection stays on this machine.
func (b bearerToken) RequireTransportSecurity() bool { return b.tls }

// isLoopback reports whether addr ("host:port", "[v6]:port", "unix:PATH", with gRPC's
// "dns:///", "ipv4:" or "ipv6:" scheme) can only reach this machine.
func isLoopback(addr string) bool {
	for _, scheme := range []string{"dns:///", "dns:", "ipv4:", "ipv6:"} {
		addr = strings.TrimPrefix(addr, scheme)
	}
	if strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "unix-abstract:") {
		return true
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Dial connects to addr ("host:port"). The connection is made lazily; ctx bounds only the dial.
func Dial(ctx context.Context, addr string, opts Options) (*Client, error) {
	limit := opts.MaxMessageBytes
	if limit == 0 {
		limit = DefaultMaxMessageBytes
	}
	dial := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(limit), grpc.MaxCallSendMsgSize(limit)),
	}
	if opts.Credentials != nil {
		dial = append(dial, grpc.WithTransportCredentials(opts.Credentials))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	if opts.Token != "" {
		if opts.Credentials == nil && !isLoopback(addr) {
			return nil, fmt.Errorf("gcmoe: dial %s: Options.Token needs TLS Options.Credentials "+
				"(a token on a plaintext connection crosses the network in the clear; only a "+
				"loopback address may go without)", addr)
		}
		dial = append(dial, grpc.WithPerRPCCredentials(
			bearerToken{header: "Bearer " + opts.Token, tls: opts.Credentials != nil}))
	}
	conn, err := grpc.DialContext(ctx, addr, append(dial, opts.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("gcmoe: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, stub: gcmoev1.NewMoeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection (for the health service, or the KServe v2 stubs).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Info returns the served model: hidden size, experts, top-k, layers, dtypes, version, ...
func (c *Client) Info(ctx context.Context) (*gcmoev1.ModelInfo, error) {
	info, err := c.stub.GetModelInfo(ctx, &gcmoev1.GetModelInfoRequest{})
	return info, wrap("GetModelInfo", err)
}

// ForwardFloat32 runs one MoE layer on FP32 activations hidden of the given [T, H] shape.
func (c *Client) ForwardFloat32(ctx context.Context, layer uint32, hidden []float32, shape Shape,
	routing Routing, opts ForwardOptions) (*Output, error) {
	h, err := float32Tensor(hidden, shape)
	if err != nil {
		return nil, err
	}
	request, err := forwardRequest(layer, h, shape, routing, opts)
	if err != nil {
		return nil, err
	}
	return c.forward(ctx, request)
}

// ForwardBF16 runs one MoE layer on BF16 activations (bit patterns, see Float32ToBF16).
func (c *Client) ForwardBF16(ctx context.Context, layer uint32, hidden []uint16, shape Shape,
	routing Routing, opts ForwardOptions) (*Output, error) {
	h, err := bf16Tensor(hidden, shape)
	if err != nil {
		return nil, err
	}
	request, err := forwardRequest(layer, h, shape, routing, opts)
	if err != nil {
		return nil, err
	}
	return c.forward(ctx, request)
}

// forward sends a request built by forwardRequest or Registered.request.
func (c *Client) forward(ctx context.Context, request *gcmoev1.ForwardRequest) (*Output, error) {
	response, err := c.stub.Forward(ctx, request)
	if err != nil {
		return nil, wrap("Forward", err)
	}
	return output("Forward", response)
}

func tensor(dtype gcmoev1.DType, shape Shape, data []byte) *gcmoev1.Tensor {
	return &gcmoev1.Tensor{Dtype: dtype, Shape: []int64{int64(shape[0]), int64(shape[1])}, Data: data}
}

func float32Tensor(hidden []float32, shape Shape) (*gcmoev1.Tensor, error) {
	if len(hidden) != shape[0]*shape[1] {
		return nil, fmt.Errorf("gcmoe: hidden: %d values, shape %v needs %d", len(hidden), shape,
			shape[0]*shape[1])
	}
	data := make([]byte, 4*len(hidden))
	for i, v := range hidden {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return tensor(gcmoev1.DType_FP32, shape, data), nil
}

func bf16Tensor(hidden []uint16, shape Shape) (*gcmoev1.Tensor, error) {
	if len(hidden) != shape[0]*shape[1] {
		return nil, fmt.Errorf("gcmoe: hidden: %d values, shape %v needs %d", len(hidden), shape,
			shape[0]*shape[1])
	}
	data := make([]byte, 2*len(hidden))
	for i, v := range hidden {
		binary.LittleEndian.PutUint16(data[2*i:], v)
	}
	return tensor(gcmoev1.DType_BF16, shape, data), nil
}

// forwardRequest is the ForwardRequest of activations hidden of the given [T, H] shape.
func forwardRequest(layer uint32, hidden *gcmoev1.Tensor, shape Shape, routing Routing,
	opts ForwardOptions) (*gcmoev1.ForwardRequest, error) {
	n := shape[0] * routing.TopK
	if routing.TopK <= 0 || len(routing.IDs) != n || len(routing.Weights) != n {
		return nil, fmt.Errorf("gcmoe: routing: %d ids and %d weights, expected [T, k] = [%d, %d]",
			len(routing.IDs), len(routing.Weights), shape[0], routing.TopK)
	}
	ids := make([]byte, 4*n)
	weights := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(ids[4*i:], uint32(routing.IDs[i]))
		binary.LittleEndian.PutUint32(weights[4*i:], math.Float32bits(routing.Weights[i]))
	}
	routingShape := Shape{shape[0], routing.TopK}
	return newForwardRequest(layer, hidden, tensor(gcmoev1.DType_INT32, routingShape, ids),
		tensor(gcmoev1.DType_FP32, routingShape, weights), opts), nil
}

// newForwardRequest is the ForwardRequest of the three tensors, inline or in registered memory,
// with the output dtype and request id of opts.
func newForwardRequest(layer uint32, hidden, ids, weights *gcmoev1.Tensor,
	opts ForwardOptions) *gcmoev1.ForwardRequest {
	request := &gcmoev1.ForwardRequest{
		Layer:       layer,
		Hidden:      hidden,
		TopkIds:     ids,
		TopkWeights: weights,
		OutputDtype: gcmoev1.DType_BF16,
		RequestId:   opts.RequestID,
	}
	if opts.OutputFP32 {
		request.OutputDtype = gcmoev1.DType_FP32
	}
	return request
}

// output is the Output of a ForwardResponse that rpc returned.
func output(rpc string, response *gcmoev1.ForwardResponse) (*Output, error) {
	out := response.GetOutput()
	if len(out.GetShape()) != 2 {
		return nil, fmt.Errorf("gcmoe: %s: output shape %v, expected [T, H]", rpc, out.GetShape())
	}
	return &Output{
		DType:     out.GetDtype(),
		Shape:     Shape{int(out.GetShape()[0]), int(out.GetShape()[1])},
		Data:      out.GetData(),
		Stats:     response.GetStats(),
		RequestID: response.GetRequestId(),
	}, nil
}

// Float32 returns the output's values as float32 (BF16 widened exactly).
func (o *Output) Float32() []float32 {
	if o.DType == gcmoev1.DType_BF16 {
		return BF16ToFloat32(o.BF16())
	}
	values := make([]float32, len(o.Data)/4)
	for i := range values {
		values[i] = math.Float32frombits(binary.LittleEndian.Uint32(o.Data[4*i:]))
	}
	return values
}

// BF16 returns a BF16 output's bit patterns (nil for an FP32 output).
func (o *Output) BF16() []uint16 {
	if o.DType != gcmoev1.DType_BF16 {
		return nil
	}
	bits := make([]uint16, len(o.Data)/2)
	for i := range bits {
		bits[i] = binary.LittleEndian.Uint16(o.Data[2*i:])
	}
	return bits
}
