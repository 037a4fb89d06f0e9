"""``cann_ops_transformer.ops``: the serving MegaMoE of megamoe (docs/serve.md)."""
from megamoe.serve import SymmBuffer, float4_e2m1fn_x2, get_symm_buffer_for_mega_moe, mega_moe

__all__ = ["SymmBuffer", "get_symm_buffer_for_mega_moe", "mega_moe", "float4_e2m1fn_x2"]
