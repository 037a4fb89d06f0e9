"""megamoe.ops mirrors torch_npu: names, argument order, keyword defaults, aliases, fp8 tokens."""
import inspect

import megamoe
import megamoe.ops as ops

DISPATCH = ("x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None, "
            "x_active_mask=None, expert_scales=None, elastic_info=None, performance_info=None, "
            "group_tp='', tp_world_size=0, tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, "
            "shared_expert_rank_num=0, quant_mode=0, global_bs=0, expert_token_nums_type=1, "
            "comm_alg='', zero_expert_num=0, copy_expert_num=0, const_expert_num=0, y_dtype=None, "
            "x_dtype=None, scales_dtype=None")
COMBINE = ("expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep, "
           "ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None, "
           "expand_scales=None, shared_expert_x=None, elastic_info=None, ori_x=None, "
           "const_expert_alpha_1=None, const_expert_alpha_2=None, const_expert_v=None, "
           "performance_info=None, group_tp='', tp_world_size=0, tp_rank_id=0, expert_shard_type=0, "
           "shared_expert_num=1, shared_expert_rank_num=0, global_bs=0, comm_quant_mode=0, "
           "comm_alg='', zero_expert_num=0, copy_expert_num=0, const_expert_num=0")
ADD_RMS_NORM = ("expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, residual_x, gamma, "
                "group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, "
                "x_active_mask=None, activation_scale=None, weight_scale=None, group_list=None, "
                "expand_scales=None, shared_expert_x=None, elastic_info=None, ori_x=None, "
                "const_expert_alpha_1=None, const_expert_alpha_2=None, const_expert_v=None, "
                "group_tp='', tp_world_size=0, tp_rank_id=0, expert_shard_type=0, "
                "shared_expert_num=1, shared_expert_rank_num=0, global_bs=0, out_dtype=0, "
                "comm_quant_mode=0, group_list_type=0, comm_alg='', norm_eps=1e-06, "
                "zero_expert_num=0, copy_expert_num=0, const_expert_num=0")
# torch_npu's V1 operators (op-plugin op_plugin_functions.yaml)
DISPATCH_V1 = ("x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None, "
               "x_active_mask=None, expert_scales=None, group_tp='', tp_world_size=0, tp_rank_id=0, "
               "expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0, "
               "global_bs=0, expert_token_nums_type=1")
COMBINE_V1 = ("expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep, "
              "ep_world_size, ep_rank_id, moe_expert_num, *, tp_send_counts=None, "
              "x_active_mask=None, activation_scale=None, weight_scale=None, group_list=None, "
              "expand_scales=None, shared_expert_x=None, group_tp='', tp_world_size=0, "
              "tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, "
              "global_bs=0, out_dtype=0, comm_quant_mode=0, group_list_type=0")


def _sig(fn):
    return str(inspect.signature(fn))[1:-1]


def test_signatures_match_torch_npu():
    assert _sig(ops.npu_moe_distribute_dispatch_v2) == DISPATCH
    assert _sig(ops.npu_moe_distribute_combine_v2) == COMBINE
    assert _sig(ops.npu_moe_distribute_combine_add_rms_norm) == ADD_RMS_NORM
    assert _sig(ops.npu_moe_distribute_dispatch) == DISPATCH_V1
    assert _sig(ops.npu_moe_distribute_combine) == COMBINE_V1


def test_aliases_without_npu_prefix():
    assert ops.moe_distribute_dispatch_v2 is ops.npu_moe_distribute_dispatch_v2
    assert ops.moe_distribute_combine_v2 is ops.npu_moe_distribute_combine_v2
    assert ops.moe_distribute_combine_add_rms_norm is ops.npu_moe_distribute_combine_add_rms_norm
    assert ops.moe_distribute_dispatch is ops.npu_moe_distribute_dispatch
    assert ops.moe_distribute_combine is ops.npu_moe_distribute_combine


def test_fp8_tokens():
    import torch
    assert megamoe.float8_e4m3fn is ops.float8_e4m3fn
    assert megamoe.float8_e5m2 is ops.float8_e5m2
    assert ops.float8_e4m3fn is not ops.float8_e5m2
    if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1: the torch dtypes themselves
        assert ops.float8_e4m3fn is torch.float8_e4m3fn and ops.float8_e5m2 is torch.float8_e5m2
    else:  # 1.13: tokens carrying torch_npu's codes (what an int dtype argument takes)
        assert repr(ops.float8_e4m3fn) == "megamoe.float8_e4m3fn"
        assert (ops.float8_e4m3fn.code, ops.float8_e5m2.code) == (24, 23)


def test_quant_modes_come_from_the_library_table():
    import torch
    modes = {m.mode: m for m in ops.quant_modes()}
    assert sorted(modes) == [0, 1, 2, 3, 4]
    assert modes[0].name == "none" and modes[0].out_dtypes == ()
    assert modes[1].smoothing == "required" and modes[1].out_dtypes == (torch.int8,)
    assert set(modes[3].out_dtypes) == {ops.float8_e4m3fn, ops.float8_e5m2}
    assert modes[4].smoothing == "none" and modes[4].scale_group == 32
    assert [m.mode for m in ops.comm_quant_modes()] == [0, 2, 3, 4]
    assert ops.comm_quant_modes()[1].scale_dtype is None  # int8 transport: x's own dtype
    # the y_dtype a caller may pass is exactly what some mode accepts (or x's own dtype)
    from megamoe import _dtypes
    for m in ops.quant_modes():
        for d in m.out_dtypes:
            assert ops._y_code(_dtypes.npu_code(d)) in (3, 4, 6)
    # torch_npu's integer codes (ScalarType values and torch_npu's own fp8 codes) work too
    assert [ops._y_code(c) for c in (1, 24, 23, 292, 291)] == [6, 3, 4, 3, 4]
    assert _dtypes.npu_code(torch.float64) == -1  # refused by the library, naming the rule
    assert ops._y_code(-1) == _dtypes.INVALID
