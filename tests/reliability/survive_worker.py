"""One rank of test_serve_survive_python.py: mega_moe from Python through a lost rank.

Launched ranks 0..2 are PEs 0..2 of a job of 4; rank 0 also starts PE 3 (this script with
SURVIVE_VICTIM=1), which dies with SIGKILL before its call of iteration DIE_AT. Every PE calls
mega_moe (bf16, E = 8, K = 2) with fresh tokens each iteration; a survivor whose call fails
with PEER_LOST repeats the iteration (then among the survivors). Outputs are checked against the
fp32 reference of the masked routing (pairs routed to PE 3's experts add nothing once it is
gone), and the Python API through the loss: query_mask_buffer shows the lost rank, the world
communicator is broken, Comm.rank_alive / Comm.survivors. Writes a JSON result per PE."""
import json
import math
import os
import signal
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

VICTIM = os.environ.get("SURVIVE_VICTIM") == "1"
if VICTIM:
    os.environ["RANK"] = "3"
os.environ["WORLD_SIZE"] = "4"

import megamoe.comm as mcomm  # noqa: E402
import megamoe.ops as ops  # noqa: E402
from megamoe import serve_reference as R  # noqa: E402
from megamoe.errors import MegaMoeError  # noqa: E402

W, E, K, H, I, T, ITERS, DIE_AT = 4, 8, 2, 64, 32, 5, 10, 4
L = E // W


def experts():
    out = {}
    for e in range(E):
        g = torch.Generator().manual_seed(1000 + e)
        l1 = (torch.randn(H, 2 * I, generator=g) / math.sqrt(H)).to(torch.bfloat16)
        l2 = (torch.randn(I, H, generator=g) / math.sqrt(I)).to(torch.bfloat16)
        out[e] = (l1, l2)
    return out


def tokens(pe, it):
    g = torch.Generator().manual_seed(pe * 7919 + it * 104729 + 1)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, K, generator=g) * 0.5 + 0.25
    return x, ids, w


def main():
    out_path = sys.argv[1]
    me = int(os.environ["RANK"])
    if me == 0 and not VICTIM:  # the victim: PE 3, started here so the launcher ignores its death
        env = dict(os.environ, SURVIVE_VICTIM="1")
        victim = subprocess.Popen([sys.executable, __file__, out_path], env=env)
    world = mcomm.world()
    buf = ops.get_symm_buffer_for_mega_moe(None, E, T, K, H, 2 * I)
    ex = experts()
    dec = {e: R.decode_expert(l1, l2, "bf16") for e, (l1, l2) in ex.items()}
    mine = [ex[e] for e in range(me * L, (me + 1) * L)]
    res = {"pe": me, "failed": [], "ok": True}
    it = 0
    while it < ITERS:
        if VICTIM and it == DIE_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        x, ids, w = tokens(me, it)
        try:
            y, etn = ops.mega_moe(x, ids, w, [a for a, _ in mine], [b for _, b in mine], buf)
        except MegaMoeError as err:
            assert err.name == "PEER_LOST", str(err)
            assert len(res["failed"]) == 0 or res["failed"][-1] != it, "twice the same call"
            res["failed"].append(it)
            continue  # the same iteration again, among the survivors
        masked = {3} if it >= DIE_AT else set()
        ref, _ = R.mega_moe_reference(x, ids, w, dec, {"kind": "swiglu", "clamp": None},
                                      masked_ranks=masked, L=L)
        rel = float((y.double() - ref).norm() / ref.norm())
        assert rel < 1e-2, (it, rel)
        it += 1
    q = torch.zeros(W, dtype=torch.int32)
    buf.query_mask_buffer(q)
    res["mask"] = q.tolist()
    res["world_rank3_alive"] = world.rank_alive(3)
    try:
        world.barrier()
        res["world_barrier"] = "OK"
    except MegaMoeError as err:
        res["world_barrier"] = err.name
    s = world.survivors()
    s.barrier()
    res["survivors"] = list(s.world_ranks)
    buf.destroy()
    mcomm.shutdown()
    if me == 0:
        victim.wait()
        res["victim_signal"] = -victim.returncode
    with open(f"{out_path}.{me}.json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
