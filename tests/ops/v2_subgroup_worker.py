"""One rank of the operator EP-subgroup test (hosts_ops_v2_cases.py), under `megamoe launch -n 4`:
4 ranks = 2 data-parallel replicas x EP 2. For each layout (block: EP groups {0,1} {2,3};
strided: {0,2} {1,3}) the replicas run DIFFERENT case lists of v2_cases.py (other shapes,
quant modes, comm_alg, and a different number of operator calls) on their own group_ep, each
output compared bit for bit with the numpy model, exactly as v2_worker.py does for a world of
2; ranks outside a group never call into it.

usage: v2_subgroup_worker.py OUT_PREFIX  ->  OUT_PREFIX.<rank>.json {"<layout> <case>": "ok" | error}
The first failing case ends the rank with status 1.
"""
import json
import os
import sys
import traceback

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v2_worker  # noqa: E402
from v2_cases import CASES  # noqa: E402

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402

BY_NAME = {c["name"]: c for c in CASES[2]}
# replica 0: 4 cases, replica 1: 2 cases (other shapes and modes)
PLAN = [["bf16_basic", "q2_int8", "comm_quant4_mx_e4m3", "hierarchy_groups_of_1"],
        ["fullmesh_v2", "add_rms_norm_comm_quant3_fp16"]]
LAYOUTS = {"block": [[0, 1], [2, 3]], "strided": [[0, 2], [1, 3]]}


def main():
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=4)
    results = {}
    for layout, members in LAYOUTS.items():
        pgs = [dist.new_group(m) for m in members]  # torch: every rank makes every group
        g = 0 if rank in members[0] else 1
        name = mcomm.group_name(pgs[g])  # made by the group's two members only
        # v2_worker runs a case for "its world": here the EP group
        v2_worker.RANK, v2_worker.WORLD = members[g].index(rank), 2
        v2_worker.groups = lambda T, name=name: (name, "")
        for case in PLAN[g]:
            key = f"{layout} {case}"
            try:
                v2_worker.run_case(BY_NAME[case])
                results[key] = "ok"
            except Exception:  # noqa: BLE001 - reported per case
                results[key] = traceback.format_exc()
            with open(f"{out}.{rank}.json", "w") as f:
                json.dump(results, f)
            if results[key] != "ok":
                # the first failure ends the job at once (the launcher stops the other ranks)
                # instead of leaving the others to time out, one case after another
                os._exit(1)
    ops.release()
    mcomm.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
