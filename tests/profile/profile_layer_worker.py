"""One rank of the end-to-end profiling test (test_profile_layer.py, under torchrun with gloo):
a small MegaMoeExperts (schedule O1, one cube and one vector worker) trains 4 steps inside
megamoe.profiler.mega_kernel_profile(schedule(wait=1, warmup=0, active=2, repeat=1), dir=OUT,
max_pending_calls=1, detailed_task_names=True) so steps 1 and 2 are recorded (drained after
each launch); after the block the rank exports the same cycle again to
OUT/after_<rank>.json. Usage: profile_layer_worker.py OUT"""
import sys

import torch
import torch.distributed as dist

import megamoe
from megamoe import MegaMoeExperts, profiler

T, H, I, E, K = 128, 64, 32, 4, 2


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank, ep = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7 + rank)
    layer = MegaMoeExperts(local_num_tokens=T, hidden_size=H, intermediate_size=I,
                           num_experts=E, top_k=K, ep_size=ep, ep_group=dist.group.WORLD,
                           schedule="O1", cube_workers=1, vector_workers=1)
    layer = layer.to(dtype=torch.bfloat16)
    x = (torch.rand(T, H, generator=g) - 0.5).bfloat16()
    ids = torch.stack([(torch.arange(T) + k) % E for k in range(K)], 1).int()
    w = torch.softmax(torch.rand(T, K, generator=g), 1)
    sched = profiler.schedule(wait=1, warmup=0, active=2, repeat=1)
    # max_pending_calls=1: the rings are drained into the window after every launch;
    # detailed_task_names: event names carry the owner expert and the task index
    with profiler.mega_kernel_profile(schedule=sched, dir=out, max_pending_calls=1,
                                      detailed_task_names=True) as prof:
        for _ in range(4):
            xi = x.clone().requires_grad_()
            layer(xi, ids, w).float().sum().backward()
            prof.step()
    prof.export_chrome_trace(f"{out}/after_{rank}.json")
    s = prof.summary()
    print(f"rank {rank}: {s['invocations']} invocations, {s['records']} records, "
          f"{s['dropped']} dropped, wait share {s['wait_share']:.3f}", flush=True)
    layer.close()
    megamoe.comm.shutdown()
    dist.destroy_process_group()
    sys.exit(0 if s["invocations"] == 4 and s["records"] > 0 and prof.drains == 4 else 1)


if __name__ == "__main__":
    main()
