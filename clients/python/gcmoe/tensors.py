"""NumPy arrays <-> gcmoe.v1 tensors: how a Forward request is encoded and its output decoded.
Shared by the blocking and the asyncio client."""
import numpy as np

from gcmoe import numerics
from gcmoe.shm import RegionArray
from gcmoe.v1 import moe_pb2

_HIDDEN_DTYPES = {"bf16": moe_pb2.BF16, "fp32": moe_pb2.FP32, "fp8": moe_pb2.FP8_E4M3}
_OUTPUT_DTYPES = {"bf16": moe_pb2.BF16, "fp32": moe_pb2.FP32}


class Fp8Hidden:
    """Activations already in FP8: E4M3 codes [T, H] and UE8M0 scales [T, H/32], both uint8
    (from numerics.quantize_fp8, or any encoder that follows the numerics spec)."""

    def __init__(self, codes, scales):
        self.codes = np.ascontiguousarray(codes, dtype=np.uint8)
        self.scales = np.ascontiguousarray(scales, dtype=np.uint8)

    @classmethod
    def quantize(cls, hidden):
        return cls(*numerics.quantize_fp8(hidden))


def _tensor(array, dtype):
    array = np.ascontiguousarray(array)
    return moe_pb2.Tensor(dtype=dtype, shape=list(array.shape),
                          data=array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())


def _region_tensor(field, region_array, allowed):
    """A Tensor naming `region_array`'s bytes; `allowed` maps NumPy dtypes to gcmoe dtypes."""
    dtype = allowed.get(region_array.dtype.newbyteorder("="))
    if dtype is None:
        names = ", ".join(str(d) for d in allowed)
        raise ValueError(f"{field}: a region array of {region_array.dtype}, expected {names}")
    return moe_pb2.Tensor(dtype=dtype, shape=list(region_array.shape),
                          region=region_array.reference())


def _is_bf16(array):
    return numerics.BFLOAT16 is not None and array.dtype == numerics.BFLOAT16


def encode_hidden(hidden, hidden_dtype=None):
    """(hidden Tensor, hidden_scales Tensor or None) for the request.

    hidden: an Fp8Hidden; a uint16 array (BF16 bit patterns) or ml_dtypes.bfloat16 array; or a
    float array, sent as FP32 or, with hidden_dtype "bf16" / "fp8", encoded here first.
    """
    if isinstance(hidden, RegionArray):
        tensor = _region_tensor("hidden", hidden, {np.dtype(np.float32): moe_pb2.FP32,
                                                   np.dtype(np.uint16): moe_pb2.BF16})
        if hidden_dtype not in (None, {moe_pb2.FP32: "fp32", moe_pb2.BF16: "bf16"}[tensor.dtype]):
            raise ValueError(f"hidden_dtype: {hidden_dtype!r} with a {hidden.dtype} region array; "
                             "region bytes are sent as they are, not encoded")
        return tensor, None
    if isinstance(hidden, Fp8Hidden):
        if hidden_dtype not in (None, "fp8"):
            raise ValueError(f"hidden_dtype: {hidden_dtype!r} with FP8 activations, expected "
                             "'fp8' or None")
        return (_tensor(hidden.codes, moe_pb2.FP8_E4M3), _tensor(hidden.scales, moe_pb2.UE8M0))
    array = np.asarray(hidden)
    if hidden_dtype is not None and hidden_dtype not in _HIDDEN_DTYPES:
        raise ValueError(f"hidden_dtype: {hidden_dtype!r}, expected 'bf16', 'fp32' or 'fp8'")
    if array.dtype == np.uint16 or _is_bf16(array):
        if hidden_dtype not in (None, "bf16"):
            raise ValueError(f"hidden_dtype: {hidden_dtype!r} with BF16 activations (uint16 or "
                             "bfloat16 array), expected 'bf16' or None")
        return _tensor(array.view(np.uint16), moe_pb2.BF16), None
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"hidden: dtype {array.dtype}, expected float32 (or float64/float16), "
                         "uint16 BF16 bit patterns, bfloat16, or gcmoe.Fp8Hidden")
    values = array.astype(np.float32, copy=False)
    if hidden_dtype == "bf16":
        return _tensor(numerics.float32_to_bf16_bits(values), moe_pb2.BF16), None
    if hidden_dtype == "fp8":
        codes, scales = numerics.quantize_fp8(values)
        return _tensor(codes, moe_pb2.FP8_E4M3), _tensor(scales, moe_pb2.UE8M0)
    return _tensor(values, moe_pb2.FP32), None


def forward_request(hidden, topk_ids, topk_weights, layer=0, output_dtype="bf16",
                    hidden_dtype=None, request_id="", out=None):
    """A complete gcmoe.v1.ForwardRequest. hidden, topk_ids and topk_weights may each be a
    gcmoe.RegionArray (registered memory: only its reference is sent); with `out` (a RegionArray
    of float32 for "fp32" or uint16 for "bf16") the service writes the output there."""
    if output_dtype not in _OUTPUT_DTYPES:
        raise ValueError(f"output_dtype: {output_dtype!r}, expected 'bf16' or 'fp32'")
    hidden_tensor, scales = encode_hidden(hidden, hidden_dtype)
    if isinstance(topk_ids, RegionArray):
        ids_tensor = _region_tensor("topk_ids", topk_ids, {np.dtype(np.int32): moe_pb2.INT32})
    else:
        ids = np.asarray(topk_ids)
        if not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"topk_ids: dtype {ids.dtype}, expected an integer array (sent as "
                             "int32)")
        ids_tensor = _tensor(ids.astype(np.int32), moe_pb2.INT32)
    if isinstance(topk_weights, RegionArray):
        weights_tensor = _region_tensor("topk_weights", topk_weights,
                                        {np.dtype(np.float32): moe_pb2.FP32})
    else:
        weights_tensor = _tensor(np.asarray(topk_weights, dtype=np.float32), moe_pb2.FP32)
    request = moe_pb2.ForwardRequest(
        layer=int(layer),
        hidden=hidden_tensor,
        topk_ids=ids_tensor,
        topk_weights=weights_tensor,
        output_dtype=_OUTPUT_DTYPES[output_dtype],
        request_id=request_id)
    if scales is not None:
        request.hidden_scales.CopyFrom(scales)
    if out is not None:
        expected = np.dtype(np.float32) if output_dtype == "fp32" else np.dtype(np.uint16)
        if not isinstance(out, RegionArray) or out.dtype.newbyteorder("=") != expected:
            raise ValueError(f"out: expected a gcmoe.RegionArray of {expected} for output_dtype "
                             f"{output_dtype!r}")
        request.output_region.CopyFrom(out.reference())
    return request


def decode_output(tensor):
    """The output as a NumPy array: float32 for FP32; for BF16, ml_dtypes.bfloat16 when installed,
    else its uint16 bit patterns (numerics.bf16_bits_to_float32 widens them exactly)."""
    shape = tuple(tensor.shape)
    if tensor.dtype == moe_pb2.FP32:
        return np.frombuffer(tensor.data, dtype="<f4").astype(np.float32).reshape(shape)
    if tensor.dtype == moe_pb2.BF16:
        return numerics.as_bf16(np.frombuffer(tensor.data, dtype="<u2").reshape(shape).copy())
    raise ValueError(f"output.dtype: {moe_pb2.DType.Name(tensor.dtype)} is not an output dtype")
