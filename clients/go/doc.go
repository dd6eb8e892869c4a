// Package gcmoe is a Go client of the gcmoe MoE-layer inference service (gcmoe.v1.MoeService).
//
//	client, err := gcmoe.Dial(ctx, "127.0.0.1:50051", gcmoe.Options{})
//	info, err := client.Info(ctx)
//	out, err := client.ForwardFloat32(ctx, 0, hidden, gcmoe.Shape{T, H}, routing, gcmoe.ForwardOptions{})
//	y := out.Float32()
//
// Client.ForwardStream opens a Stream: the same Forward calls on one long-lived stream, answered
// in order, with Send and Recv to pipeline them.
//
// Activations go in as FP32 ([]float32) or BF16 bit patterns ([]uint16, see Float32ToBF16);
// outputs come back as BF16 (the default) or FP32. Every call takes a context: its deadline is
// the call's deadline on the server. Failed calls return *Error, which keeps the server's status
// code and its message (it names the field at fault).
//
// The gRPC stubs (package gcmoe/clients/go/gcmoev1) are generated from proto/gcmoe/v1/moe.proto
// with protoc-gen-go and protoc-gen-go-grpc and checked in, so `go build` needs no protoc.
package gcmoe
