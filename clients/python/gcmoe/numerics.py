"""The number formats of the gcmoe API in NumPy, following the numerics spec (docs/DESIGN.md §4).

BF16 travels as its 16-bit patterns (a uint16 array, or ml_dtypes.bfloat16 when installed).
FP8 activations are E4M3 ("e4m3fn": bias 7, max 448, no infinities, NaN S.1111.111) with one
UE8M0 scale (value 2^(code - 127)) per block of 32 values along H:

    amax  = max(|v| over the block, 1e-4)             FP32
    ratio = amax / 448                                  FP32 division, round to nearest even
    e     = ceil(log2(ratio)), clamped to [-127, 127]   exact, from ratio's binary exponent
    q     = E4M3(v * 2^-e)                              FP32 product, round to nearest even,
                                                        saturating to +-448

The encoder works on exact float64 arithmetic rather than on bit fields, so it is an independent
implementation of the spec; the test suite checks it bit for bit against the server's quantizer.
"""
import numpy as np

E4M3_MAX = 448.0
BLOCK = 32

try:  # optional: a real bfloat16 dtype for users who have it
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None
    BFLOAT16 = None


def float32_to_bf16_bits(x):
    """Float32 values to BF16 bit patterns (uint16), rounding to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((bits >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)


def bf16_bits_to_float32(bits):
    """BF16 bit patterns (uint16, or an ml_dtypes.bfloat16 array) to float32, exactly."""
    bits = np.asarray(bits)
    if BFLOAT16 is not None and bits.dtype == BFLOAT16:
        bits = bits.view(np.uint16)
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_bf16(bits):
    """BF16 bits as an ml_dtypes.bfloat16 array when ml_dtypes is installed, else unchanged."""
    bits = np.asarray(bits, dtype=np.uint16)
    return bits.view(BFLOAT16) if BFLOAT16 is not None else bits


def block_scale_codes(amax):
    """UE8M0 codes of blocks whose largest magnitudes are `amax` (float32 array)."""
    floored = np.maximum(np.asarray(amax, dtype=np.float32), np.float32(1e-4))
    ratio = (floored / np.float32(E4M3_MAX)).astype(np.float64)  # the FP32 quotient, exactly
    mantissa, exponent = np.frexp(ratio)  # ratio = mantissa * 2^exponent, mantissa in [0.5, 1)
    e = np.where(mantissa == 0.5, exponent - 1, exponent)
    e = np.where(np.isinf(ratio), 127, e)
    return (np.clip(e, -127, 127) + 127).astype(np.uint8)


def encode_e4m3(x):
    """Float32 values (already divided by their scale) to E4M3 codes (uint8)."""
    x = np.asarray(x, dtype=np.float32)
    magnitude = np.abs(x).astype(np.float64)
    sign = np.signbit(x).astype(np.uint8) << 7
    finite = np.isfinite(magnitude)
    m = np.where(finite, magnitude, 0.0)
    # The grid step near m: 2^(exponent - 3) for normals (exponent >= -6), 2^-9 below 2^-6.
    _, exponent = np.frexp(m)
    exponent = np.maximum(exponent - 1, -6)
    step = np.ldexp(1.0, exponent - 3)
    rounded = np.rint(m / step) * step  # np.rint: ties to even, exact in float64
    # Back to a code: subnormals are multiples of 2^-9; normals 1.mmm * 2^E.
    frac, exp2 = np.frexp(rounded)
    normal = rounded >= 2.0 ** -6
    normal_code = ((exp2 - 1 + 7) << 3) | np.round((frac * 2 - 1) * 8).astype(np.int64)
    subnormal_code = np.round(rounded * 512).astype(np.int64)
    code = np.where(normal, normal_code, subnormal_code)
    code = np.where(magnitude >= E4M3_MAX, 0x7E, code)  # saturate, Inf included
    code = np.where(np.isnan(magnitude), 0x7F, code)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def decode_e4m3(codes):
    """E4M3 codes (uint8) to float32."""
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    exp = (codes >> 3) & 0xF
    man = codes & 0x7
    magnitude = np.where(exp == 0, np.ldexp(man.astype(np.float64), -9),
                         np.ldexp((8 + man).astype(np.float64), exp - 10))
    magnitude = np.where((exp == 0xF) & (man == 0x7), np.nan, magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


def quantize_fp8(x):
    """[..., H] float values to (E4M3 codes [..., H] uint8, UE8M0 scales [..., H/32] uint8).

    H must be a multiple of 32. NaN values are ignored for a block's scale, as on the server.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % BLOCK != 0:
        raise ValueError(f"quantize_fp8: the last dimension ({x.shape[-1] if x.ndim else 0}) must "
                         f"be a multiple of {BLOCK}, one UE8M0 scale per {BLOCK} values")
    blocks = x.reshape(x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK))
    amax = np.fmax.reduce(np.abs(blocks), axis=-1, initial=np.float32(0))
    scales = block_scale_codes(amax)
    # 2^-e as float32 (exact; 2^-127 is a float32 subnormal) and the FP32 product.
    inverse = np.ldexp(np.float32(1), 127 - scales.astype(np.int32)).astype(np.float32)
    scaled = (blocks * inverse[..., None]).astype(np.float32)
    return encode_e4m3(scaled).reshape(x.shape), scales


def dequantize_fp8(codes, scales):
    """The float32 values that FP8 codes and their UE8M0 scales stand for."""
    codes = np.asarray(codes, dtype=np.uint8)
    values = decode_e4m3(codes).reshape(codes.shape[:-1] + (-1, BLOCK))
    factor = np.ldexp(np.float32(1), np.asarray(scales, dtype=np.int32) - 127).astype(np.float32)
    return (values * factor[..., None]).reshape(codes.shape)
