"""One home for dtypes: megamoe_dtype_t codes, torch dtypes, torch_npu's integer codes, fp8.

Three spellings of a dtype meet in megamoe:

* ``megamoe_dtype_t`` (include/megamoe/dtype.h): what the C library takes in its descriptors;
* torch dtypes: ``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` exist from torch 2.1,
  ``torch.float8_e8m0fnu`` from 2.7; torch 1.13 has none of them, so there ``megamoe.float8_e4m3fn``
  / ``megamoe.float8_e5m2`` are tokens standing for them;
* torch_npu's integer codes, what an ``int`` dtype argument of a torch_npu schema (``int? y_dtype``)
  carries: the c10::ScalarType values (0 uint8, 1 int8, 3 int32, 4 int64, 5 float16, 6 float32,
  11 bool, 15 bfloat16, 23 float8_e5m2, 24 float8_e4m3fn, 44 float8_e8m0fnu) and torch_npu's
  own (291 float8_e5m2, 292 float8_e4m3fn, 293 float8_e8m0, as uint8 bytes).

Outputs: fp8 results are real float8 tensors where torch has the type (uint8 bytes on 1.13);
e8m0 scales are uint8 bytes on every torch (torch_npu's form).
"""
import torch

__all__ = ["float8_e4m3fn", "float8_e5m2", "FP8_TORCH", "Float8Dtype", "code_of", "torch_dtype",
           "npu_code", "from_npu_code", "FP32", "BF16", "FP16", "E4M3", "E5M2", "E8M0", "INT8",
           "UINT8", "INT32", "INT64", "BOOL", "INVALID"]

# megamoe_dtype_t (include/megamoe/dtype.h)
FP32, BF16, FP16, E4M3, E5M2, E8M0, INT8, UINT8, INT32, INT64, BOOL = range(11)
INVALID = 99  # a code the library rejects with a message naming the parameter

_F8E4 = getattr(torch, "float8_e4m3fn", None)
_F8E5 = getattr(torch, "float8_e5m2", None)
_F8E8 = getattr(torch, "float8_e8m0fnu", None)  # torch >= 2.7
FP8_TORCH = _F8E4 is not None  # fp8 outputs are real float8 tensors


class Float8Dtype:
    """torch 1.13's stand-in for a torch fp8 dtype (compares by identity). ``code`` is the
    torch_npu / c10::ScalarType integer an ``int`` dtype argument of a torch.ops schema takes."""

    def __init__(self, name, code, megamoe_code):
        self.name = name
        self.code = code
        self.megamoe_code = megamoe_code

    def __repr__(self):
        return f"megamoe.{self.name}"


# what megamoe.float8_e4m3fn / float8_e5m2 are: the torch dtypes where they exist
float8_e4m3fn = _F8E4 if FP8_TORCH else Float8Dtype("float8_e4m3fn", 24, E4M3)
float8_e5m2 = _F8E5 if FP8_TORCH else Float8Dtype("float8_e5m2", 23, E5M2)

_FROM_TORCH = {torch.float32: FP32, torch.bfloat16: BF16, torch.float16: FP16,
               torch.int8: INT8, torch.uint8: UINT8, torch.int32: INT32, torch.int64: INT64,
               torch.bool: BOOL}
if FP8_TORCH:
    _FROM_TORCH.update({_F8E4: E4M3, _F8E5: E5M2})
if _F8E8 is not None:
    _FROM_TORCH[_F8E8] = E8M0

_TO_TORCH = {FP32: torch.float32, BF16: torch.bfloat16, FP16: torch.float16,
             E4M3: _F8E4 or torch.uint8, E5M2: _F8E5 or torch.uint8, E8M0: torch.uint8,
             INT8: torch.int8, UINT8: torch.uint8, INT32: torch.int32, INT64: torch.int64,
             BOOL: torch.bool}

# torch_npu integer codes -> megamoe_dtype_t
_FROM_NPU = {0: UINT8, 1: INT8, 3: INT32, 4: INT64, 5: FP16, 6: FP32, 11: BOOL, 15: BF16,
             23: E5M2, 24: E4M3, 44: E8M0, 291: E5M2, 292: E4M3, 293: E8M0}
# megamoe_dtype_t -> the torch_npu code a caller would pass (the ScalarType value where torch
# has the type; torch_npu's own code for e8m0, which older torch lacks)
_TO_NPU = {UINT8: 0, INT8: 1, INT32: 3, INT64: 4, FP16: 5, FP32: 6, BOOL: 11, BF16: 15,
           E5M2: 23, E4M3: 24, E8M0: 293}


def code_of(dtype):
    """megamoe_dtype_t of a torch dtype or fp8 token; INVALID for anything else."""
    if isinstance(dtype, Float8Dtype):
        return dtype.megamoe_code
    return _FROM_TORCH.get(dtype, INVALID)


def torch_dtype(code):
    """The torch dtype megamoe returns for an output of megamoe_dtype_t ``code``."""
    return _TO_TORCH[code]


def from_npu_code(code):
    """megamoe_dtype_t of a torch_npu integer dtype code; INVALID when megamoe has no such type."""
    return _FROM_NPU.get(int(code), INVALID)


def npu_code(dtype):
    """A dtype argument as the torch_npu integer code a schema's ``int`` takes: torch dtypes,
    megamoe fp8 tokens and integer codes (returned as they are) are accepted; None stays None.
    A dtype megamoe has no code for gives -1, which the operator refuses naming the argument."""
    if dtype is None or (type(dtype) is int):
        return dtype
    if isinstance(dtype, Float8Dtype):
        return dtype.code
    code = _FROM_TORCH.get(dtype)
    return -1 if code is None else _TO_NPU[code]
