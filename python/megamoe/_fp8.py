"""fp8 dtype tokens for megamoe.ops (torch 1.13 has no fp8 dtypes).

``megamoe.float8_e4m3fn`` / ``megamoe.float8_e5m2`` select an fp8 output type (``y_dtype`` of
``npu_moe_distribute_dispatch_v2``); the tensors come back as ``torch.uint8`` holding the fp8
bytes (OCP FP8: e4m3fn has no Inf and max 448, e5m2 has Inf and max 57344).
"""


class Float8Dtype:
    """A dtype token: compares by identity, prints like the torch dtype it stands for."""

    def __init__(self, name, code):
        self.name = name
        self.code = code  # megamoe_dtype_t

    def __repr__(self):
        return f"megamoe.{self.name}"


float8_e4m3fn = Float8Dtype("float8_e4m3fn", 3)
float8_e5m2 = Float8Dtype("float8_e5m2", 4)
