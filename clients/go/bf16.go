package gcmoe

import "math"

// Float32ToBF16 rounds each value to BF16 (round to nearest even, as the server does; NaN stays
// NaN) and returns the bit patterns.
func Float32ToBF16(values []float32) []uint16 {
	out := make([]uint16, len(values))
	for i, v := range values {
		bits := math.Float32bits(v)
		if bits&0x7FFFFFFF > 0x7F800000 {
			out[i] = uint16(bits>>16) | 0x40 // quiet NaN
			continue
		}
		out[i] = uint16((bits + 0x7FFF + (bits>>16)&1) >> 16)
	}
	return out
}

// BF16ToFloat32 widens BF16 bit patterns to float32, exactly.
func BF16ToFloat32(bits []uint16) []float32 {
	out := make([]float32, len(bits))
	for i, b := range bits {
		out[i] = math.Float32frombits(uint32(b) << 16)
	}
	return out
}
