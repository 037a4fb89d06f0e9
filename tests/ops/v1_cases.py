"""The V1 operator cases, per world size (run by test_ops_v1.py through v1_worker.py).

Keys as in v2_cases.py; style = the caller whose keyword arguments and output unpacking the
case uses: vllm_a3 (vllm-ascend's TokenDispatcherWithMC2 on A3: group_tp = the EP group's name,
tp_world_size 1, the mc2 mask with global_bs 0, an empty tp_send_counts after a quantised
dispatch), vllm_a2 (no TP arguments, expert_scales to dispatch for hierarchical
communication), sglang (AscendDeepEPDispatcher: global_bs = 48 * ep, output[0:6]), omni (omni-infer
with V2 off: shared expert ranks, TP arguments, output[0:5] then output[5]), positional (the
torch_npu doc's positional form). tp = 1 where the caller passes tp_world_size 1 (a [1]
tp_recv_counts).
"""
import zlib


def _c(name, style, **kw):
    kw.update(name=name, style=style, seed=zlib.crc32(name.encode()) % 100000)  # same on every rank
    return kw


CASES = {
    2: [_c("vllm_ascend_a3", "vllm_a3", W=2, tp=1, E=4, K=2, H=64, bs=6, quant=2, mask=1),
        _c("vllm_ascend_a3_unquantised_gbs", "vllm_a3", W=2, tp=1, E=8, K=3, H=48, bs_list=[5, 3],
           global_bs=10, ent=0),
        _c("vllm_ascend_a2_hierarchy_scales", "vllm_a2", W=2, E=4, K=2, H=32, bs=5, quant=2,
           ws=True),
        _c("sglang_deepep_ascend", "sglang", W=2, tp=1, E=4, K=2, H=64, bs_list=[3, 5], global_bs=96,
           quant=2),
        _c("torch_npu_doc_positional", "positional", W=2, E=4, K=2, H=32, bs=4)],
    4: [_c("omni_infer_shared_rank", "omni", W=4, tp=1, E=3, K=2, H=32, bs=5, S=1, NS=1, quant=2,
           mask=1),
        _c("omni_infer_tp2", "omni", W=2, tp=2, E=2, K=2, H=32, bs=4)],
}
