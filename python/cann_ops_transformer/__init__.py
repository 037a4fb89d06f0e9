"""CANN ops-transformer's Python package name, served by megamoe on CPUs.

vLLM-Ascend takes its fused MegaMoE path when ``importlib.util.find_spec("cann_ops_transformer")``
succeeds and then imports ``cann_ops_transformer.ops``; Kimi-K3 (cann-recipes-infer) and
DeepEP-Ascend import ``get_symm_buffer_for_mega_moe`` / ``mega_moe`` from it directly. Here
``cann_ops_transformer.ops`` re-exports megamoe's implementation (docs/serve.md), as
``hyper_parallel`` does for MegaMoeExperts.
"""
from . import ops  # noqa: F401

__all__ = ["ops"]
