"""One rank of test_ranks_gpu.py, started by torchrun: normjit.torch's norms on this rank's GPU (or
GPU 0 when there are fewer GPUs than ranks), against torch, with the cache directory every rank
shares. Writes OUT/rank<R>.json: the device, the runtime's counters and the largest error."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import normjit.torch as nt

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])
device_index = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
torch.cuda.set_device(device_index)
dev = torch.device("cuda", device_index)
# gloo: a barrier for the ranks to start their compiles together; no NCCL needed.
dist.init_process_group("gloo")
dist.barrier()

torch.manual_seed(rank)
worst = 0.0
for n in (768, 2880, 5120):
    for norm in ("layernorm", "rmsnorm"):
        x = torch.randn(64, n, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, device=dev, dtype=torch.float32, requires_grad=True)
        if norm == "layernorm":
            y, want = nt.layer_norm(x, (n,), w, None), F.layer_norm(x.float(), (n,), w)
        else:
            y, want = nt.rms_norm(x, (n,), w, 1e-6), F.rms_norm(x.float(), (n,), w, 1e-6)
        y.float().sum().backward()
        worst = max(worst, (y.float() - want).abs().max().item())
torch.cuda.synchronize()

rt = nt.runtime(device_index)
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "device": rt.device_ordinal, "cache_dir": rt.cache_dir,
               "counters": rt.counters(), "worst_abs_error": worst}, f)
dist.barrier()
dist.destroy_process_group()
