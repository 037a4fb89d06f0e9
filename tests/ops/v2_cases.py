"""The randomised operator cases, per world size (run by test_ops_v2.py through v2_worker.py).

Keys: W, E, K, H, bs (or bs_list per world rank), S/NS (shared ranks / experts), Z/Cp/Cn
(zero/copy/const experts), tp, quant, yt (int8/e4m3/e5m2), xt (bf16/fp16), scales
(full/flat/one), mask (1 or 2), ws (dispatch expert_scales), sxx (shared_expert_x), comm_quant,
elastic, hier (hierarchy group size), alg, ent (expert_token_nums_type), perf, identity,
arn (combine_add_rms_norm, with comm_alg), global_bs, edge (corner blocks in the expert outputs:
zeros, tiny, huge, one outlier, signed zeros; for the MX transport, comm_quant 3 / 4).

Seeds come from the case name through zlib.crc32, never hash(): str hashes are randomised per
process (PYTHONHASHSEED), and a worker that imports these cases on every rank (the EP-subgroup
worker) must give every rank the same inputs; a failure also reruns with the same inputs.
"""
import zlib


def _c(name, **kw):
    kw.setdefault("seed", zlib.crc32(name.encode()) % 100000)
    kw["name"] = name
    return kw


CASES = {
    2: [
        _c("bf16_basic", W=2, E=4, K=2, H=32, bs=6, identity=True),
        _c("fp16_basic", W=2, E=6, K=3, H=24, bs=5, xt="fp16", identity=True),
        _c("ent_type0_L4_K3", W=2, E=8, K=3, H=16, bs=7, ent=0),
        _c("k_gt_local_experts", W=2, E=4, K=4, H=16, bs=5),
        _c("mask_1d", W=2, E=4, K=2, H=32, bs=8, mask=1),
        _c("mask_2d", W=2, E=8, K=3, H=32, bs=8, mask=2),
        _c("unequal_bs", W=2, E=4, K=2, H=32, bs_list=[3, 7], global_bs=14),
        _c("bs_zero_on_a_rank", W=2, E=4, K=2, H=16, bs_list=[0, 5], global_bs=10),
        _c("shared_1x1", W=2, E=4, K=2, H=32, bs=5, S=1, NS=1),
        _c("shared_sxx", W=2, E=4, K=2, H=32, bs=5, sxx=True),
        _c("zero_experts", W=2, E=4, K=3, H=32, bs=6, Z=2),
        _c("copy_experts", W=2, E=4, K=3, H=32, bs=6, Cp=2),
        _c("const_experts", W=2, E=4, K=3, H=48, bs=6, Cn=2),
        _c("all_special_mask2d", W=2, E=4, K=4, H=32, bs=6, Z=1, Cp=1, Cn=1, mask=2),
        _c("q1_full", W=2, E=4, K=2, H=40, bs=5, quant=1, scales="full"),
        _c("q1_flat", W=2, E=4, K=2, H=40, bs=5, quant=1, scales="flat"),
        _c("q1_one", W=2, E=4, K=2, H=40, bs=5, quant=1, scales="one"),
        _c("q2_int8", W=2, E=8, K=3, H=72, bs=6, quant=2, ws=True),
        _c("q2_int8_smooth_fp16", W=2, E=4, K=2, H=40, bs=5, quant=2, scales="full", xt="fp16"),
        _c("q2_e4m3", W=2, E=4, K=2, H=40, bs=5, quant=2, yt="e4m3"),
        _c("q2_e5m2_smooth", W=2, E=4, K=2, H=40, bs=5, quant=2, yt="e5m2", scales="full"),
        _c("q3_e4m3_smooth", W=2, E=4, K=2, H=300, bs=4, quant=3, yt="e4m3", scales="full"),
        _c("q3_e5m2", W=2, E=4, K=2, H=130, bs=4, quant=3, yt="e5m2"),
        _c("q4_e4m3", W=2, E=4, K=2, H=100, bs=4, quant=4, yt="e4m3"),
        _c("q4_e5m2_fp16", W=2, E=4, K=2, H=65, bs=4, quant=4, yt="e5m2", xt="fp16"),
        _c("comm_quant2", W=2, E=4, K=2, H=37, bs=6, comm_quant=2),
        _c("comm_quant2_fp16_shared", W=2, E=4, K=2, H=37, bs=6, comm_quant=2, xt="fp16", sxx=True),
        _c("comm_quant4_mx_e4m3", W=2, E=4, K=2, H=200, bs=6, comm_quant=4, edge=True),
        _c("comm_quant3_mx_e5m2_fp16_sxx", W=2, E=4, K=3, H=210, bs=6, comm_quant=3, xt="fp16",
           sxx=True, edge=True),
        _c("comm_quant4_mx_e4m3_fp16", W=2, E=4, K=2, H=192, bs=6, comm_quant=4, xt="fp16",
           edge=True),
        _c("comm_quant4_identity_specials_mask2", W=2, E=4, K=4, H=64, bs=6, comm_quant=4,
           identity=True, Z=1, Cp=1, Cn=1, mask=2),
        _c("comm_quant4_q4_dispatch", W=2, E=4, K=2, H=96, bs=5, quant=4, comm_quant=4),
        _c("add_rms_norm_comm_quant4", W=2, E=4, K=2, H=192, bs=6, arn=True, comm_quant=4,
           edge=True),
        _c("add_rms_norm_comm_quant3_fp16", W=2, E=4, K=2, H=40, bs=5, arn=True, comm_quant=3,
           xt="fp16"),
        _c("add_rms_norm_hierarchy", W=2, E=4, K=2, H=48, bs=5, arn=True, hier=1, quant=2),
        _c("add_rms_norm_fullmesh_v2", W=2, E=4, K=2, H=32, bs=5, arn=True, alg="fullmesh_v2"),
        _c("hierarchy_comm_quant4", W=2, E=4, K=3, H=200, bs=5, hier=1, comm_quant=4, edge=True),
        _c("fullmesh_v1", W=2, E=4, K=2, H=32, bs=5, alg="fullmesh_v1"),
        _c("fullmesh_v2", W=2, E=4, K=2, H=32, bs=5, alg="fullmesh_v2", mask=1),
        _c("perf_info", W=2, E=4, K=2, H=32, bs=5, perf=True),
        _c("add_rms_norm", W=2, E=4, K=2, H=64, bs=6, arn=True),
        _c("add_rms_norm_fp16_special", W=2, E=4, K=3, H=50, bs=6, arn=True, xt="fp16", Cp=1,
           Cn=1, mask=1),
        _c("hierarchy_one_group", W=2, E=4, K=2, H=32, bs=5, hier=2, quant=2, ws=True),
        _c("hierarchy_groups_of_1", W=2, E=4, K=3, H=32, bs=5, hier=1, Z=1, Cp=1, mask=2),
    ],
    3: [
        _c("w3_bf16", W=3, E=6, K=3, H=32, bs=5, identity=True),
        _c("w3_shared_1_of_3", W=3, E=4, K=2, H=32, bs=5, S=1, NS=1, quant=2),
        _c("w3_unequal_bs_q2", W=3, E=3, K=2, H=24, bs_list=[2, 6, 4], global_bs=18, quant=2),
        _c("w3_mask2d_specials", W=3, E=6, K=4, H=32, bs=6, mask=2, Z=1, Cn=1),
        _c("w3_comm_quant_fp16", W=3, E=6, K=2, H=29, bs=4, comm_quant=2, xt="fp16"),
        _c("w3_elastic_drop_rank1", W=3, E=6, K=2, H=32, bs=5,
           elastic=[1, 2, 0, 4, 0, -1, 1, 0, 2, 0]),
        _c("w3_hierarchy", W=3, E=6, K=3, H=32, bs=5, hier=2, quant=2, mask=1),
        _c("w3_shared_comm_quant4", W=3, E=4, K=2, H=192, bs=5, S=1, NS=1, comm_quant=4, edge=True),
    ],
    4: [
        _c("w4_tp2", W=2, tp=2, E=2, K=2, H=32, bs=5),
        _c("w4_tp2_q2_fp16", W=2, tp=2, E=2, K=2, H=40, bs=4, quant=2, xt="fp16"),
        _c("w4_tp2_shared_mask1", W=2, tp=2, E=1, K=1, H=32, bs=6, S=1, NS=1, mask=1),
        _c("w4_tp2_comm_quant_sxx", W=2, tp=2, E=2, K=2, H=24, bs=5, comm_quant=2, sxx=True),
        _c("w4_tp2_arn", W=2, tp=2, E=2, K=2, H=32, bs=4, arn=True),
        _c("w4_tp2_comm_quant4", W=2, tp=2, E=2, K=2, H=200, bs=4, comm_quant=4, edge=True),
        _c("w4_arn_hierarchy_comm_quant3", W=4, E=8, K=3, H=192, bs=4, arn=True, hier=2,
           comm_quant=3, edge=True),
        _c("w4_shared_2x2", W=4, E=4, K=2, H=32, bs=5, S=2, NS=2, quant=2, scales="full"),
        _c("w4_shared_2_ranks_1_expert", W=4, E=4, K=3, H=16, bs=5, S=2, NS=1, mask=2),
        _c("w4_all_quant3_e5m2", W=4, E=8, K=3, H=256, bs=3, quant=3, yt="e5m2"),
        _c("w4_q4_mask2", W=4, E=8, K=3, H=96, bs=4, quant=4, mask=2),
        _c("w4_elastic_shared", W=4, E=3, K=2, H=32, bs=5, S=1, NS=1,
           elastic=[1, 3, 1, 2, 0, 1, -1, 2, 0, 1, 3, 0]),
        _c("w4_elastic_not_scaled", W=4, E=8, K=2, H=32, bs=5,
           elastic=[0, 4, 0, 8, 0, 1, 2, 3, 0, 1, 2, 3]),
        _c("w4_hierarchy_2x2", W=4, E=8, K=3, H=40, bs=5, hier=2, ws=True, sxx=True),
        _c("w4_hierarchy_shared_cq", W=4, E=6, K=2, H=24, bs=4, hier=2, S=1, NS=1, comm_quant=2,
           quant=2, scales="full"),
        _c("w4_hierarchy_unequal", W=4, E=4, K=2, H=16, bs_list=[1, 4, 2, 3], global_bs=16, hier=3),
        _c("w4_tp2_hierarchy", W=2, tp=2, E=2, K=2, H=24, bs=4, hier=1, quant=2),
        _c("w4_hierarchy_elastic", W=4, E=8, K=3, H=24, bs=4, hier=2, mask=2,
           elastic=[1, 3, 0, 6, 0, 1, 2, -1, 0, 1, 2, 0]),
        _c("w4_unequal_bs_specials", W=4, E=4, K=3, H=16, bs_list=[4, 1, 3, 2], global_bs=16,
           Z=1, Cp=1, Cn=1),
    ],
}
