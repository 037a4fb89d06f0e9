"""One case per validation rule of the v2 operators (spec §6 semantic rules, plus ids out of
range, NaN in scales, elastic holes and attributes that differ between ranks).

A rule mutates the keyword arguments of a valid call on some ranks (`on`: a rank, or "all") and
expects `status` on EVERY rank, before any data moves; the message must contain `key` (on the
ranks that detected the problem: their own message; on the others: "rank R: ..."). Mismatch
rules expect CONFIG_MISMATCH everywhere (CALL_MISMATCH for operators called in a different
order). Rules named python_* break what only the Python binding checks (not a tensor, not on
the CPU): the binding still takes part in the call, so the other ranks get the error too. `world` 2 rules use EP = world (E = 4, K = 2, H = 16,
BS = 4); `world` 4 rules use 2 EP x 2 TP (E = 2: one expert per MoE rank).
"""
import torch

INV, MIS, ORDER = "INVALID_ARGUMENT", "CONFIG_MISMATCH", "CALL_MISMATCH"
BS, H, K = 4, 16, 2


def _set(**kw):
    def f(a, rank):
        a.update(kw)
    return f


def _ids(fn):
    def f(a, rank):
        ids = a["expert_ids"].clone()
        fn(ids)
        a["expert_ids"] = ids
    return f


def _x(fn):
    def f(a, rank):
        a["x"] = fn(a["x"])
    return f


def _ids_k(k, e_total):
    def f(a, rank):
        a["expert_ids"] = torch.arange(BS * k, dtype=torch.int32).reshape(BS, k) % e_total
    return f


def _elastic(values):
    def f(a, rank):
        a["elastic_info"] = torch.tensor(values, dtype=torch.int32)
    return f


def _swap_rank(a, rank):
    a["ep_rank_id"] = 1 - a["ep_rank_id"]


def _nan_scales(a, rank):
    s = torch.ones(a["moe_expert_num"], H)
    s[1, 3] = float("nan")
    a.update(scales=s, quant_mode=2)


def _nan_ws(a, rank):
    w = torch.full((BS, K), 0.5)
    w[0, 1] = float("nan")
    a["expert_scales"] = w


def _dup_ids(a, rank):
    # one expert per rank (L = 1 < K): a token naming expert 0 twice sends two rows to rank 0,
    # more than the capacity A = global_bs * min(L, K) that expand_x is sized for
    a.update(moe_expert_num=2, expert_ids=torch.zeros(BS, K, dtype=torch.int32))


def _tp_peer_rows(a, rank):
    # a larger expand_x fits A + 1 peer rows locally, but the peer's TP buffer holds only A
    rows = a["expand_x"].shape[0]  # T * A
    a["expand_x"] = torch.cat([a["expand_x"], torch.zeros_like(a["expand_x"])])
    a["tp_send_counts"][1 - a["tp_rank_id"]] = rows // 2 + 1


def _rule(name, op, mutate, status, key, on=1, world=2):
    return {"name": name, "op": op, "mutate": mutate, "status": status, "key": key, "on": on,
            "world": world}


def _d(name, mutate, key, status=INV, on=1):
    return _rule(name, "dispatch", mutate, status, key, on)


def _c(name, mutate, key, status=INV, on=1):
    return _rule(name, "combine", mutate, status, key, on)


RULES = [
    # ---- dispatch inputs
    _d("x_not_2d", _x(lambda x: x.reshape(-1)), "x must be 2-D"),
    _d("x_dtype", _x(lambda x: x.float()), "x must be bf16 or fp16"),
    _d("ids_dtype", lambda a, r: a.update(expert_ids=a["expert_ids"].long()), "expert_ids must be int32"),
    _d("ids_not_2d", lambda a, r: a.update(expert_ids=a["expert_ids"].reshape(-1)), "expert_ids must be 2-D"),
    _d("bs_differs_x_ids", _x(lambda x: x[:BS - 1]), "both are BS"),
    _d("h_zero", _x(lambda x: x[:, :0]), "H must be >= 1"),
    _d("k_above_16", lambda a, r: (a.update(moe_expert_num=32),
                                  _ids_k(17, 32)(a, r)), "must be in [1, 16]", on="all"),
    _d("k_above_expert_total", lambda a, r: (a.update(moe_expert_num=2), _ids_k(3, 2)(a, r)),
       "must be <= moe_expert_num + zero", on="all"),
    _d("fullmesh_v2_k_above_12", lambda a, r: (a.update(moe_expert_num=16, comm_alg="fullmesh_v2"),
                                               _ids_k(13, 16)(a, r)), "needs K <= 12", on="all"),
    _d("scales_with_quant0", lambda a, r: a.update(scales=torch.ones(4, H)), "quant_mode 0"),
    _d("scales_shape", lambda a, r: a.update(scales=torch.ones(3, H), quant_mode=2), "scales must be ["),
    _d("scales_dtype", lambda a, r: a.update(scales=torch.ones(4, H, dtype=torch.float64), quant_mode=2),
       "scales must be fp32"),
    _d("scales_with_mx", lambda a, r: a.update(scales=torch.ones(4, H), quant_mode=4), "quant_mode 4"),
    _d("static_quant_without_scales", _set(quant_mode=1), "needs scales"),
    _d("scales_nan", _nan_scales, "scales contain NaN"),
    _d("expert_scales_nan", _nan_ws, "expert_scales contain NaN"),
    _d("expert_scales_shape", lambda a, r: a.update(expert_scales=torch.ones(BS, K + 1)), "expert_scales must be [BS, K]"),
    _d("ids_negative", _ids(lambda i: i.__setitem__((0, 0), -1)), "out of range"),
    _d("ids_too_large", _ids(lambda i: i.__setitem__((1, 1), 4)), "out of range"),
    _d("ids_duplicate_moe_expert", _dup_ids, "twice", on="all"),
    _d("mask_not_bool", lambda a, r: a.update(x_active_mask=torch.ones(BS, dtype=torch.int32)), "must be bool"),
    _d("mask_len", lambda a, r: a.update(x_active_mask=torch.ones(BS + 1, dtype=torch.bool)), "x_active_mask must be [BS]"),
    _d("mask_2d_cols", lambda a, r: a.update(x_active_mask=torch.ones(BS, K + 1, dtype=torch.bool)), "x_active_mask must be [BS]"),
    _d("mask_not_prefix", lambda a, r: a.update(x_active_mask=torch.tensor([True, False, True, False])),
       "every true before the first false"),
    _d("fullmesh_v2_mask_2d", lambda a, r: a.update(comm_alg="fullmesh_v2",
                                                   x_active_mask=torch.ones(BS, K, dtype=torch.bool)),
       "not allowed with comm_alg fullmesh_v2"),
    _d("fullmesh_v2_special_experts", _set(comm_alg="fullmesh_v2", zero_expert_num=1),
       "does not allow zero/copy/const", on="all"),
    _d("ep_world_size_below_2", _set(ep_world_size=1), "must be >= 2"),
    _d("ep_world_size_not_group_size", _set(ep_world_size=3, moe_expert_num=3), "does not match the size"),
    _d("ep_rank_out_of_range", _set(ep_rank_id=2), "ep_rank_id 2 must be in [0"),
    _d("ep_rank_not_own_rank", _swap_rank, "is not this process's rank", on="all"),
    _d("group_ep_missing", _set(group_ep=""), "group_ep: a communicator is required"),
    _d("group_ep_unknown_name", _set(group_ep="no-such-group"), "group_ep: a communicator is required"),
    _d("shared_rank_num_range", _set(shared_expert_rank_num=2), "shared_expert_rank_num 2 must be in [0"),
    _d("shared_expert_num_range", _set(shared_expert_num=5, shared_expert_rank_num=1, moe_expert_num=2),
       "shared_expert_num 5 must be in [0, 4]"),
    _d("shared_ranks_without_shared_experts", _set(shared_expert_num=0, shared_expert_rank_num=1, moe_expert_num=2),
       "needs shared_expert_num >= 1"),
    _d("shared_experts_without_shared_ranks", _set(shared_expert_num=2), "needs shared_expert_rank_num > 0"),
    _d("shared_ranks_not_multiple", _set(shared_expert_num=2, shared_expert_rank_num=1, moe_expert_num=2),
       "must be a multiple of shared_expert_num"),
    _d("expert_shard_type", _set(expert_shard_type=1), "expert_shard_type must be 0"),
    _d("moe_expert_num_not_divisible", _set(moe_expert_num=3), "divisible by ep_world_size"),
    _d("moe_expert_num_zero", _set(moe_expert_num=0), "must be > 0"),
    _d("special_counts_negative", _set(zero_expert_num=-1), "must be >= 0"),
    _d("special_counts_overflow", _set(zero_expert_num=2 ** 31), "INT32_MAX"),
    _d("tp_world_size_range", _set(tp_world_size=3), "tp_world_size 3 must be 0, 1 or 2"),
    _d("tp_rank_without_tp", _set(tp_rank_id=1), "tp_rank_id must be 0 without TP"),
    _d("quant_mode_range", _set(quant_mode=5), "quant_mode 5 must be in [0, 4]"),
    _d("y_dtype_fp8_with_static", lambda a, r: a.update(quant_mode=1, scales=torch.ones(H),
                                                       y_dtype="fp8"), "does not fit quant_mode"),
    _d("y_dtype_int8_with_mx", _set(quant_mode=4, y_dtype=torch.int8), "does not fit quant_mode"),
    _d("expert_token_nums_type", _set(expert_token_nums_type=2), "expert_token_nums_type must be 0"),
    _d("comm_alg_unknown", _set(comm_alg="ring"), "comm_alg \"ring\" must be"),
    _d("global_bs_too_small", _set(global_bs=BS * 2 - 2), "global_bs 6 must be 0 or a multiple"),
    _d("global_bs_not_multiple", _set(global_bs=BS * 2 + 1), "global_bs 9 must be 0 or a multiple"),
    _d("global_bs_too_large", _set(global_bs=2**40), "global_bs must be <= INT32_MAX"),
    _d("global_bs_varied_with_mask", lambda a, r: a.update(global_bs=BS * 4,
                                                           x_active_mask=torch.ones(BS, dtype=torch.bool)),
       "not allowed when ranks have different BS"),
    _d("global_bs_varied_with_fullmesh_v2", _set(global_bs=BS * 4, comm_alg="fullmesh_v2"),
       "needs the same BS on every rank", on="all"),
    _d("elastic_length", _elastic([1, 2, 0, 4, 0, 1, 0]), "elastic_info must have 4 + 2"),
    _d("elastic_flag", _elastic([2, 2, 0, 4, 0, 1, 0, 1]), "isScaled) must be 0 or 1"),
    _d("elastic_world", _elastic([1, 3, 0, 4, 0, 1, 0, 1]), "new ep world size) 3 must be in [1, 2]"),
    _d("elastic_local_experts_change", _elastic([1, 1, 0, 4, 0, -1, 0, 0]), "local expert count may not change"),
    _d("elastic_tables", _elastic([1, 2, 0, 4, 0, 1, 1, 0]), "table 2 entry 0 (1) is not the inverse"),
    _d("elastic_table1_count", _elastic([1, 2, 0, 4, 0, -1, 0, 0]), "table 1 maps 1 ranks"),
    _d("elastic_id_on_removed_rank", lambda a, r: (_elastic([1, 1, 0, 2, 0, -1, 0, 0])(a, r),
                                                   _ids(lambda i: i.__setitem__((0, 0), 3))(a, r)),
       "names a MoE expert of a rank removed", on=0),
    _d("elastic_with_fullmesh_v2", lambda a, r: (a.update(comm_alg="fullmesh_v2"),
                                                 _elastic([0, 2, 0, 4, 0, 1, 0, 1])(a, r)),
       "not allowed with comm_alg fullmesh_v2"),
    _d("performance_info_shape", lambda a, r: a.update(performance_info=torch.zeros(3, dtype=torch.int64)),
       "performance_info must have ep_world_size"),
    _d("performance_info_dtype", lambda a, r: a.update(performance_info=torch.zeros(2, dtype=torch.int32)),
       "performance_info must be int64"),
    # ---- attributes that differ between ranks
    _d("mismatch_moe_experts_special", _set(zero_expert_num=2), "zero_expert_num differs", status=MIS),
    _d("mismatch_quant_mode", lambda a, r: a.update(quant_mode=2), "quant_mode differs", status=MIS),
    _d("mismatch_h", _x(lambda x: torch.zeros(BS, H + 16, dtype=x.dtype)), "H differs", status=MIS),
    _d("mismatch_k", _ids_k(3, 4), "K (expert_ids dim 1) differs", status=MIS),
    _d("mismatch_bs_without_global_bs", lambda a, r: a.update(x=a["x"][:2], expert_ids=a["expert_ids"][:2]),
       "global_bs", status=MIS),
    _d("mismatch_token_dtype", _x(lambda x: x.half()), "token dtype differs", status=MIS),
    _d("mismatch_comm_alg", _set(comm_alg="hierarchy"), "comm_alg differs", status=MIS),
    _d("mismatch_elastic_info", lambda a, r: _elastic([0, 2, 0, 4, 0, 1, 0, 1] if r == 1 else [0, 2, 0, 4, 1, 0, 1, 0])(a, r),
       "elastic_info differs", status=MIS, on="all"),
    _rule("mismatch_operator_order", "order", None, ORDER, "same order", on=1),
    # ---- what only the Python binding checks: still every rank's error
    _d("python_x_not_a_tensor", _x(lambda x: x.tolist()), "x must be a torch.Tensor"),
    _d("python_x_not_on_the_cpu", _x(lambda x: torch.empty(x.shape, dtype=x.dtype, device="meta")),
       "x must be a CPU tensor"),
    # ---- combine inputs
    _c("python_expert_scales_not_a_tensor", _set(expert_scales=[0.5] * (BS * K)),
       "expert_scales must be a torch.Tensor"),
    _c("combine_expert_scales_missing", _set(expert_scales=None), "expert_scales is required"),
    _c("combine_expert_scales_shape", lambda a, r: a.update(expert_scales=torch.ones(BS, K + 1)), "expert_scales must be [BS, K]"),
    _c("combine_expert_scales_nan", _nan_ws, "expert_scales contain NaN"),
    _c("combine_expand_x_dtype", lambda a, r: a.update(expand_x=a["expand_x"].float()), "expand_x must be bf16 or fp16"),
    _c("combine_assist_short", lambda a, r: a.update(assist_info_for_combine=a["assist_info_for_combine"][:100]),
       "at least A * 128"),
    _c("combine_assist_bad_triple", lambda a, r: a["assist_info_for_combine"].__setitem__(1, 999),
       "is not a (rank"),
    _c("combine_counts_short", lambda a, r: a.update(ep_send_counts=a["ep_send_counts"][:1]), "ep_send_counts must have at least"),
    _c("combine_counts_above_capacity", lambda a, r: a["ep_send_counts"].__setitem__(-1, 1000), "rows this rank received"),
    _c("combine_shared_x_with_shared_ranks", lambda a, r: a.update(shared_expert_x=torch.zeros(BS, H, dtype=torch.bfloat16),
                                                                    shared_expert_rank_num=1, moe_expert_num=2,
                                                                    expert_ids=a["expert_ids"] % 2,
                                                                    assist_info_for_combine=torch.zeros(4096, dtype=torch.int32)),
       "only allowed without shared expert ranks", on="all"),
    _c("combine_shared_x_shape", lambda a, r: a.update(shared_expert_x=torch.zeros(BS, H + 1, dtype=torch.bfloat16)),
       "shared_expert_x must be [BS, H]"),
    _c("combine_ori_x_missing", _set(copy_expert_num=1), "ori_x is required", on="all"),
    _c("combine_const_alpha_missing", lambda a, r: a.update(const_expert_num=1, ori_x=torch.zeros(BS, H, dtype=torch.bfloat16),
                                                            const_expert_alpha_1=torch.zeros(1, H, dtype=torch.bfloat16),
                                                            const_expert_v=torch.zeros(1, H, dtype=torch.bfloat16)),
       "const_expert_alpha_2 is required", on="all"),
    _c("combine_const_v_shape", lambda a, r: a.update(const_expert_num=1, ori_x=torch.zeros(BS, H, dtype=torch.bfloat16),
                                                      const_expert_alpha_1=torch.zeros(1, H, dtype=torch.bfloat16),
                                                      const_expert_alpha_2=torch.zeros(1, H, dtype=torch.bfloat16),
                                                      const_expert_v=torch.zeros(2, H, dtype=torch.bfloat16)),
       "const_expert_v must be [const_expert_num, H]", on="all"),
    _c("combine_comm_quant_mode", _set(comm_quant_mode=1), "comm_quant_mode must be 0, 2 (int8"),
    _c("combine_comm_quant_mode_5", _set(comm_quant_mode=5), "3 (MX fp8_e5m2) or 4 (MX fp8_e4m3fn)"),
    _c("combine_mismatch_comm_quant", _set(comm_quant_mode=2), "comm_quant_mode differs", status=MIS),
    _c("combine_mismatch_comm_quant_mx", _set(comm_quant_mode=4), "comm_quant_mode differs", status=MIS),
    _rule("arn_reserved_tensor", "arn", lambda a, r: a.update(activation_scale=torch.ones(1)), INV, "reserved and must be absent"),
    _rule("arn_out_dtype", "arn", _set(out_dtype=1), INV, "out_dtype is reserved"),
    _rule("arn_residual_shape", "arn", lambda a, r: a.update(residual_x=a["residual_x"].reshape(BS, H)), INV,
          "residual_x must be [BS, 1, H]"),
    _rule("arn_gamma_shape", "arn", lambda a, r: a.update(gamma=a["gamma"][:H - 1]), INV, "gamma must be [H]"),
    _rule("arn_norm_eps_nan", "arn", _set(norm_eps=float("nan")), INV, "norm_eps must be finite"),
    _rule("arn_comm_quant_mode", "arn", _set(comm_quant_mode=6), INV, "comm_quant_mode must be 0, 2"),
    _rule("arn_mismatch_comm_quant_mx", "arn", _set(comm_quant_mode=3), MIS, "comm_quant_mode differs"),
    _rule("arn_comm_alg_unknown", "arn", _set(comm_alg="ring"), INV,
          'comm_alg "ring" must be "", "fullmesh_v1", "fullmesh_v2", "hierarchy" or "fullmesh" (A2)'),
    _rule("arn_mismatch_comm_alg", "arn", _set(comm_alg="hierarchy"), MIS, "comm_alg differs"),
    # ---- TP (2 EP x 2 TP)
    _rule("tp_rank_range", "dispatch", _set(tp_rank_id=2), INV, "tp_rank_id 2 must be 0 or 1", world=4),
    _rule("tp_group_missing", "dispatch", _set(group_tp=""), INV, "group_tp is required", world=4),
    _rule("tp_group_same_as_ep", "dispatch", lambda a, r: a.update(group_tp=a["group_ep"]), INV,
          "group_tp must differ from group_ep", world=4),
    _rule("tp_rank_not_own", "dispatch", lambda a, r: a.update(tp_rank_id=1 - a["tp_rank_id"]), INV,
          "is not this process's rank", world=4, on="all"),
    _rule("tp_needs_one_expert_per_rank", "dispatch", lambda a, r: a.update(moe_expert_num=4), INV,
          "needs one expert per MoE rank", world=4, on="all"),
    _rule("tp_with_elastic", "dispatch", _elastic([0, 2, 0, 2, 0, 1, 0, 1]), INV,
          "elastic_info is not allowed with tp_world_size 2", world=4),
    _rule("tp_with_fullmesh_v2", "dispatch", _set(comm_alg="fullmesh_v2"), INV, "fullmesh_v2", world=4, on="all"),
    _rule("tp_group_wrong_size", "dispatch", lambda a, r: a.update(group_tp=a["group_world"]), INV,
          "group_tp must have 2 ranks", world=4),
    _rule("tp_send_counts_missing", "combine", _set(tp_send_counts=None), INV,
          "tp_send_counts is required", world=4),
    _rule("tp_send_counts_above_capacity", "combine", _tp_peer_rows, INV, "rows of the TP peer",
          world=4),
    _rule("tp_mismatch_quant", "dispatch", _set(quant_mode=2), MIS, "differs", world=4),
]

NAMES = [r["name"] for r in RULES]
assert len(NAMES) == len(set(NAMES))
