package gcmoe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"gcmoe/clients/go/gcmoev1"
)

// Registered memory: a frontend on the same host as a service started with
// server.allow_registered_memory puts its tensors in a POSIX shared-memory object the service
// maps once, and a Forward call names where they lie instead of carrying their bytes.
//
//	shm, err := gcmoe.NewSharedMemory(1 << 20)
//	defer shm.Close()
//	err = client.RegisterMemory(ctx, shm)
//	hidden, hiddenAt, err := shm.Float32s(T * H)  // views of the shared memory: fill them
//	ids, idsAt, err := shm.Int32s(T * k)
//	weights, weightsAt, err := shm.Float32s(T * k)
//	y, yAt, err := shm.Float32s(T * H)
//	out, err := client.ForwardRegistered(ctx, layer, gcmoe.Registered{
//		Hidden: hiddenAt, HiddenDType: gcmoev1.DType_FP32, Shape: gcmoe.Shape{T, H},
//		IDs: idsAt, Weights: weightsAt, TopK: k, Output: &yAt}, gcmoe.ForwardOptions{OutputFP32: true})
//	// y holds the output now; out.Data is empty.
//	err = client.UnregisterMemory(ctx, shm.Name)

// regionAlignment is where SharedMemory's views start: a multiple of 64 bytes.
const regionAlignment = 64

// SharedMemory is a POSIX shared-memory object this process created, mapped into it. Linux: the
// object lies in /dev/shm, where shm_open puts it, created new (never an existing one) and
// readable and writable by this user only.
type SharedMemory struct {
	// Key is the object's name as shm_open takes it ("/gcmoe_go-<16 hex digits>"): what
	// RegisterMemory asks the service to map.
	Key string
	// Name is the registration's name, what a Region's reference names: Key without its slash
	// unless changed before RegisterMemory.
	Name string
	path string
	data []byte
	next int // the first byte no view has used
}

// NewSharedMemory creates an object of byteSize bytes, zero-filled.
func NewSharedMemory(byteSize int) (*SharedMemory, error) {
	if byteSize <= 0 {
		return nil, fmt.Errorf("gcmoe: shared memory: %d bytes, expected at least 1", byteSize)
	}
	var random [8]byte
	if _, err := rand.Read(random[:]); err != nil {
		return nil, fmt.Errorf("gcmoe: shared memory: %w", err)
	}
	base := "gcmoe_go-" + hex.EncodeToString(random[:]) // "gcmoe-" is the service's own prefix
	path := "/dev/shm/" + base
	file, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("gcmoe: shared memory: %w", err)
	}
	defer file.Close() // the mapping outlives the descriptor
	if err := file.Truncate(int64(byteSize)); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("gcmoe: shared memory: %s: %w", path, err)
	}
	data, err := syscall.Mmap(int(file.Fd()), 0, byteSize, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("gcmoe: shared memory: mapping %s: %w", path, err)
	}
	return &SharedMemory{Key: "/" + base, Name: base, path: path, data: data}, nil
}

// Size is the object's size in bytes.
func (m *SharedMemory) Size() int { return len(m.data) }

// Bytes is the whole mapping; it stays valid until Close.
func (m *SharedMemory) Bytes() []byte { return m.data }

// Close removes the object's name and unmaps it from this process: every view of it is invalid
// from then on. The service keeps its own mapping until the registration is dropped and the
// last call using it has finished.
func (m *SharedMemory) Close() error {
	if m.data == nil {
		return nil
	}
	removeErr := os.Remove(m.path)
	if errors.Is(removeErr, os.ErrNotExist) {
		removeErr = nil
	}
	unmapErr := syscall.Munmap(m.data)
	m.data = nil
	if removeErr != nil {
		return fmt.Errorf("gcmoe: shared memory: %w", removeErr)
	}
	if unmapErr != nil {
		return fmt.Errorf("gcmoe: shared memory: unmapping %s: %w", m.path, unmapErr)
	}
	return nil
}

// Region is bytes [Offset, Offset + Size) of a SharedMemory.
type Region struct {
	Memory *SharedMemory
	Offset int
	Size   int
}

// Alloc is a Region of size bytes at the next multiple of 64 bytes no earlier view used.
func (m *SharedMemory) Alloc(size int) (Region, error) {
	offset := (m.next + regionAlignment - 1) / regionAlignment * regionAlignment
	return m.At(offset, size)
}

// At is the Region of size bytes at offset, checked against the object's size.
func (m *SharedMemory) At(offset, size int) (Region, error) {
	if m.data == nil {
		return Region{}, errors.New("gcmoe: shared memory: used after Close")
	}
	if offset < 0 || size < 0 || offset+size > len(m.data) {
		return Region{}, fmt.Errorf("gcmoe: shared memory: %d bytes at offset %d do not fit in "+
			"the object's %d bytes", size, offset, len(m.data))
	}
	if offset+size > m.next {
		m.next = offset + size
	}
	return Region{Memory: m, Offset: offset, Size: size}, nil
}

// Float32s allocates n float32 values (the service reads them little-endian: this process's
// order on the x86-64 and arm64 hosts it runs on) and returns them with their Region.
func (m *SharedMemory) Float32s(n int) ([]float32, Region, error) { return allocView[float32](m, n) }

// Uint16s allocates n BF16 bit patterns (see Float32ToBF16) and returns them with their Region.
func (m *SharedMemory) Uint16s(n int) ([]uint16, Region, error) { return allocView[uint16](m, n) }

// Int32s allocates n int32 values (expert ids) and returns them with their Region.
func (m *SharedMemory) Int32s(n int) ([]int32, Region, error) { return allocView[int32](m, n) }

// allocView allocates n values of E (Alloc) and returns them as a slice of the mapping.
func allocView[E float32 | uint16 | int32](m *SharedMemory, n int) ([]E, Region, error) {
	var zero E
	r, err := m.Alloc(int(unsafe.Sizeof(zero)) * n)
	if err != nil {
		return nil, Region{}, err
	}
	return unsafe.Slice((*E)(unsafe.Pointer(&m.data[r.Offset])), n), r, nil
}

// reference is the TensorRegion a request sends for r.
func (r Region) reference() *gcmoev1.TensorRegion {
	return &gcmoev1.TensorRegion{Region: r.Memory.Name, Offset: uint64(r.Offset),
		ByteSize: uint64(r.Size)}
}

// RegisterMemory asks the service to map the whole of m under m.Name. It fails with
// FAILED_PRECONDITION where the service runs without server.allow_registered_memory (ModelInfo's
// MemoryKinds then lacks "posix_shm"), and with ALREADY_EXISTS for a name in use.
func (c *Client) RegisterMemory(ctx context.Context, m *SharedMemory) error {
	if m.data == nil {
		return errors.New("gcmoe: RegisterMemory: shared memory used after Close")
	}
	_, err := c.stub.RegisterMemory(ctx, &gcmoev1.RegisterMemoryRequest{
		Name: m.Name,
		Kind: &gcmoev1.RegisterMemoryRequest_PosixShm{PosixShm: &gcmoev1.PosixShmMemory{
			Key: m.Key, Offset: 0, ByteSize: uint64(len(m.data))}},
	})
	return wrap("RegisterMemory", err)
}

// UnregisterMemory drops the registration name; calls already using it finish first on the
// service's side.
func (c *Client) UnregisterMemory(ctx context.Context, name string) error {
	_, err := c.stub.UnregisterMemory(ctx, &gcmoev1.UnregisterMemoryRequest{Name: name})
	return wrap("UnregisterMemory", err)
}

// Registered is a Forward call whose tensors lie in registered memory: [T, H] activations
// (HiddenDType FP32 or BF16) and [T, TopK] routing (IDs int32, Weights float32). With Output
// set the service writes the [T, H] output there (ForwardOptions says FP32 or BF16) and the
// call's Output has no Data; without, the output comes back in the reply as usual.
type Registered struct {
	Hidden      Region
	HiddenDType gcmoev1.DType
	Shape       Shape
	IDs         Region
	Weights     Region
	TopK        int
	Output      *Region
}

// request is the ForwardRequest naming in's regions. The service checks every reference
// (registration, bounds, exact size); the client checks what it can see locally first.
func (in Registered) request(layer uint32, opts ForwardOptions) (*gcmoev1.ForwardRequest, error) {
	var itemSize int
	switch in.HiddenDType {
	case gcmoev1.DType_FP32:
		itemSize = 4
	case gcmoev1.DType_BF16:
		itemSize = 2
	default:
		return nil, fmt.Errorf("gcmoe: Registered.HiddenDType: %v, expected FP32 or BF16", in.HiddenDType)
	}
	T, H := in.Shape[0], in.Shape[1]
	outputSize := 2 * T * H
	if opts.OutputFP32 {
		outputSize = 4 * T * H
	}
	check := func(field string, r *Region, want int) error {
		if r.Memory == nil {
			return fmt.Errorf("gcmoe: Registered.%s: no shared memory", field)
		}
		if r.Size != want {
			return fmt.Errorf("gcmoe: Registered.%s: %d bytes, shape and dtype need %d", field, r.Size, want)
		}
		return nil
	}
	if err := check("Hidden", &in.Hidden, itemSize*T*H); err != nil {
		return nil, err
	}
	if in.TopK <= 0 {
		return nil, fmt.Errorf("gcmoe: Registered.TopK: %d, expected at least 1", in.TopK)
	}
	if err := check("IDs", &in.IDs, 4*T*in.TopK); err != nil {
		return nil, err
	}
	if err := check("Weights", &in.Weights, 4*T*in.TopK); err != nil {
		return nil, err
	}
	routingShape := []int64{int64(T), int64(in.TopK)}
	request := newForwardRequest(layer,
		&gcmoev1.Tensor{Dtype: in.HiddenDType, Shape: []int64{int64(T), int64(H)},
			Region: in.Hidden.reference()},
		&gcmoev1.Tensor{Dtype: gcmoev1.DType_INT32, Shape: routingShape, Region: in.IDs.reference()},
		&gcmoev1.Tensor{Dtype: gcmoev1.DType_FP32, Shape: routingShape, Region: in.Weights.reference()},
		opts)
	if in.Output != nil {
		if err := check("Output", in.Output, outputSize); err != nil {
			return nil, err
		}
		request.OutputRegion = in.Output.reference()
	}
	return request, nil
}

// ForwardRegistered runs one MoE layer on tensors in registered memory (see Registered).
func (c *Client) ForwardRegistered(ctx context.Context, layer uint32, in Registered,
	opts ForwardOptions) (*Output, error) {
	request, err := in.request(layer, opts)
	if err != nil {
		return nil, err
	}
	return c.forward(ctx, request)
}
