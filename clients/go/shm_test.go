package gcmoe

// Registered memory against a real `gcmoe serve --set server.allow_registered_memory=true`:
// the same requests with their tensors in a registered POSIX shared-memory object, unary and
// streamed, get exactly the bytes of the inline calls; bad references are refused with the
// service's codes, naming the field, and the service keeps serving.

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"gcmoe/clients/go/gcmoev1"
)

// bytesOf is the little-endian bytes of a Region (what the service wrote there).
func bytesOf(r Region) []byte {
	return append([]byte(nil), r.Memory.Bytes()[r.Offset:r.Offset+r.Size]...)
}

func TestRegisteredMemory(t *testing.T) {
	_, client, info := serveAndConnect(t, "--set", "server.allow_registered_memory=true")
	ctx := context.Background()
	if kinds := info.GetMemoryKinds(); len(kinds) != 1 || kinds[0] != "posix_shm" {
		t.Fatalf("ModelInfo.memory_kinds %v, expected [posix_shm]", kinds)
	}
	H, E, k := int(info.GetHidden()), int(info.GetExperts()), int(info.GetTopK())
	const T, layer = 19, 1
	hidden, routing := request(T, H, E, k, 11)

	shm, err := NewSharedMemory(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	if st, err := os.Stat("/dev/shm" + shm.Key); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the object %s: %v, mode %v; expected one readable by this user only", shm.Key, err, st.Mode())
	}
	if err := client.RegisterMemory(ctx, shm); err != nil {
		t.Fatal(err)
	}
	if err := client.RegisterMemory(ctx, shm); !IsCode(err, codes.AlreadyExists) {
		t.Fatalf("registering the name twice: got %v, expected ALREADY_EXISTS", err)
	}

	x, xAt, err := shm.Float32s(T * H)
	if err != nil {
		t.Fatal(err)
	}
	copy(x, hidden)
	xb, xbAt, err := shm.Uint16s(T * H)
	if err != nil {
		t.Fatal(err)
	}
	copy(xb, Float32ToBF16(hidden))
	ids, idsAt, err := shm.Int32s(T * k)
	if err != nil {
		t.Fatal(err)
	}
	copy(ids, routing.IDs)
	weights, weightsAt, err := shm.Float32s(T * k)
	if err != nil {
		t.Fatal(err)
	}
	copy(weights, routing.Weights)
	_, yAt, err := shm.Float32s(T * H)
	if err != nil {
		t.Fatal(err)
	}
	_, ybAt, err := shm.Uint16s(T * H)
	if err != nil {
		t.Fatal(err)
	}
	if xAt.Offset%64 != 0 || idsAt.Offset%64 != 0 || yAt.Offset%64 != 0 || idsAt.Offset < xbAt.Offset+xbAt.Size {
		t.Fatalf("views not 64-byte aligned one after the other: %v %v %v %v", xAt, xbAt, idsAt, yAt)
	}
	fp32 := ForwardOptions{OutputFP32: true}
	inline, err := client.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, routing, fp32)
	if err != nil {
		t.Fatal(err)
	}
	inlineBF16, err := client.ForwardBF16(ctx, layer, Float32ToBF16(hidden), Shape{T, H}, routing, ForwardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	in := Registered{Hidden: xAt, HiddenDType: gcmoev1.DType_FP32, Shape: Shape{T, H},
		IDs: idsAt, Weights: weightsAt, TopK: k}

	t.Run("output into the region", func(t *testing.T) {
		with := in
		with.Output = &yAt
		out, err := client.ForwardRegistered(ctx, layer, with, fp32)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Data) != 0 || out.Shape != (Shape{T, H}) || out.DType != gcmoev1.DType_FP32 {
			t.Fatalf("output %v %v with %d bytes inline, expected FP32 [T, H] and none", out.DType, out.Shape, len(out.Data))
		}
		if !bytes.Equal(bytesOf(yAt), inline.Data) {
			t.Fatal("the output written into the region differs from the inline call's")
		}
	})
	t.Run("BF16 activations, output inline", func(t *testing.T) {
		bf16 := in
		bf16.Hidden, bf16.HiddenDType = xbAt, gcmoev1.DType_BF16
		out, err := client.ForwardRegistered(ctx, layer, bf16, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Data, inlineBF16.Data) {
			t.Fatal("BF16 activations from the region gave other bytes than inline")
		}
	})
	t.Run("streamed", func(t *testing.T) {
		stream, err := client.ForwardStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer stream.Close()
		bf16 := in
		bf16.Hidden, bf16.HiddenDType, bf16.Output = xbAt, gcmoev1.DType_BF16, &ybAt
		if err := stream.SendRegistered(layer, in, fp32); err != nil {
			t.Fatal(err)
		}
		if err := stream.SendRegistered(layer, bf16, ForwardOptions{}); err != nil {
			t.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil || !bytes.Equal(first.Data, inline.Data) {
			t.Fatalf("first streamed reply: %v; equal to inline: %v", err, first != nil && bytes.Equal(first.Data, inline.Data))
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytesOf(ybAt), inlineBF16.Data) {
			t.Fatal("the streamed BF16 output in the region differs from the inline call's")
		}
		// A refused reference does not end the stream.
		bad := in
		bad.IDs = Region{Memory: shm, Offset: shm.Size() - 8, Size: 4 * T * k}
		if _, err := stream.ForwardRegistered(layer, bad, fp32); !IsCode(err, codes.InvalidArgument) ||
			!strings.Contains(err.Error(), "topk_ids") {
			t.Fatalf("ids past the object's end on the stream: got %v, expected INVALID_ARGUMENT naming topk_ids", err)
		}
		again, err := stream.ForwardRegistered(layer, in, fp32)
		if err != nil || !bytes.Equal(again.Data, inline.Data) {
			t.Fatalf("after a refused request the stream answered %v", err)
		}
	})
	t.Run("bad references", func(t *testing.T) {
		past := in
		past.Hidden = Region{Memory: shm, Offset: shm.Size() - 64, Size: 4 * T * H}
		if _, err := client.ForwardRegistered(ctx, layer, past, fp32); !IsCode(err, codes.InvalidArgument) ||
			!strings.Contains(err.Error(), "hidden") {
			t.Fatalf("hidden past the object's end: got %v, expected INVALID_ARGUMENT naming hidden", err)
		}
		other, err := NewSharedMemory(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		unknown := in
		unknown.Weights = Region{Memory: other, Offset: 0, Size: 4 * T * k}
		if _, err := client.ForwardRegistered(ctx, layer, unknown, fp32); !IsCode(err, codes.NotFound) ||
			!strings.Contains(err.Error(), "topk_weights") {
			t.Fatalf("weights in an unregistered object: got %v, expected NOT_FOUND naming topk_weights", err)
		}
		short := in
		short.Hidden.Size -= 4
		if _, err := client.ForwardRegistered(ctx, layer, short, fp32); err == nil ||
			!strings.Contains(err.Error(), "Registered.Hidden") {
			t.Fatalf("a hidden region one value short: got %v, expected the client to refuse it", err)
		}
		if _, err := shm.At(shm.Size()-4, 8); err == nil {
			t.Fatal("At accepted 8 bytes at 4 before the end")
		}
	})
	t.Run("unregistered", func(t *testing.T) {
		if err := client.UnregisterMemory(ctx, shm.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := client.ForwardRegistered(ctx, layer, in, fp32); !IsCode(err, codes.NotFound) {
			t.Fatalf("after UnregisterMemory: got %v, expected NOT_FOUND", err)
		}
		if err := client.UnregisterMemory(ctx, shm.Name); !IsCode(err, codes.NotFound) {
			t.Fatalf("unregistering twice: got %v, expected NOT_FOUND", err)
		}
		out, err := client.ForwardFloat32(ctx, layer, hidden, Shape{T, H}, routing, fp32)
		if err != nil || !bytes.Equal(out.Data, inline.Data) {
			t.Fatalf("the service after the refusals: %v", err)
		}
	})
	if err := shm.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/dev/shm" + shm.Key); !os.IsNotExist(err) {
		t.Fatalf("the object %s after Close: %v, expected it gone", shm.Key, err)
	}
	if _, err := shm.Alloc(4); err == nil {
		t.Fatal("Alloc after Close succeeded")
	}
}
