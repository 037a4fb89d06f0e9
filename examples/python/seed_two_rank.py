"""The two-rank sample of the MegaMoE guide (seed 000), with only "npu" changed to "cpu".

    HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT=tcp://127.0.0.1:<free port> \
    PYTHONPATH=python /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 \
        examples/python/seed_two_rank.py

The guide's text around it: select the device, initialise the process group, then build the
experts with the EP group = the whole world. The router outputs below are made up (any ids in
[0, num_experts) and weights work); the guide's second form passes the exact counts too.
"""
import torch
import torch.distributed as dist
from hyper_parallel.core.multicore import MegaMoeExperts

dist.init_process_group("gloo")  # the guide initialises HCCL on the NPU

experts = MegaMoeExperts(
    local_num_tokens=1024,
    hidden_size=512,
    intermediate_size=128,
    num_experts=4,
    top_k=2,
    ep_size=dist.get_world_size(),
    ep_group=dist.group.WORLD,
).to(device="cpu", dtype=torch.bfloat16)

# router outputs for this rank's 1024 tokens
torch.manual_seed(dist.get_rank())
hidden_states = torch.randn(1024, 512, dtype=torch.bfloat16, requires_grad=True)
logits = torch.randn(1024, 4)
topk_weights, topk_ids = torch.softmax(logits, dim=-1).topk(2, dim=-1)
topk_weights = topk_weights.requires_grad_()

output = experts(hidden_states, topk_ids, topk_weights)

# the guide's second form: the router already has exact counts
tokens_per_expert = torch.bincount(topk_ids.flatten(), minlength=4)
output2 = experts(hidden_states, topk_ids, topk_weights, tokens_per_expert=tokens_per_expert)
assert torch.equal(output, output2)

output.float().pow(2).mean().backward()
assert hidden_states.grad is not None and topk_weights.grad is not None
assert experts.gate_up_weight.grad is not None and experts.down_weight.grad is not None
print(f"rank {dist.get_rank()}: output {tuple(output.shape)} {output.dtype}, "
      f"|output| {output.float().norm():.3f}, |grad gate_up| "
      f"{experts.gate_up_weight.grad.float().norm():.3f}", flush=True)

experts.close()  # every rank, same order, after all backwards, before the process group goes
dist.destroy_process_group()
