"""megamoe: expert-parallel Mixture-of-Experts layers on CPUs (Python/PyTorch binding).

The package wraps libmegamoe.so (an installed package's own megamoe/_native/ payload; in a source
checkout the build tree, or $MEGAMOE_LIB) with ctypes, and registers its operators as
torch.ops.megamoe.* (megamoe/_library.py: fake kernels, autograd and torch.compile on torch 2.x;
C++ CPU kernels from the optional Torch adapter, megamoe/_adapter.py).
Every failing call raises :class:`MegaMoeError`, which carries the C status and the library's
message naming the fix.
"""
from . import _lib
from .errors import MegaMoeError, check, status_name, status_str

__version__ = _lib.lib.megamoe_version().decode()
library_path = _lib.path

__all__ = ["MegaMoeError", "check", "status_name", "status_str", "__version__", "library_path"]

from .experts import MegaMoeExperts  # noqa: E402  the torch layer (seed 000)
__all__ += ["MegaMoeExperts"]

from ._dtypes import float8_e4m3fn, float8_e5m2  # noqa: E402  torch's fp8 (1.13: tokens)
__all__ += ["float8_e4m3fn", "float8_e5m2"]

from . import ops  # noqa: E402,F401  defines torch.ops.megamoe.* (dispatch/combine V2 and V1)

from . import profiler  # noqa: E402  megamoe.profiler.mega_kernel_profile (docs/profiling.md)
__all__ += ["profiler"]

float4_e2m1fn_x2 = 296  # torch_npu's packed-fp4 dtype enum (mega_moe weight types, docs/serve.md)
__all__ += ["float4_e2m1fn_x2"]
