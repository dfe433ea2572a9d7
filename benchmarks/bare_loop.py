"""A bare DDP training loop: the same model, data, optimizer and settings as the harness's
tiny DDP case, with none of the harness around it. Run under torchrun; prints tokens/s."""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.data import rank_batches
from harness.model import build_model
from harness.parallel import make_optimizer
from harness.spec import RunSpec

spec = RunSpec.from_preset("tiny", **{k: int(v) for k, v in (a.split("=") for a in sys.argv[1:])},
                           threads_per_rank=1, world_size=int(os.environ["WORLD_SIZE"]))
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(build_model(spec))
opt = make_optimizer(model, spec)
batches = rank_batches(spec, rank, spec.steps, torch.device("cpu"))
times = []
for micro in batches:
    start = time.perf_counter()
    for m, (x, y) in enumerate(micro):
        if m < len(micro) - 1:
            with model.no_sync():
                (model(x, y) / spec.grad_accum).backward()
        else:
            (model(x, y) / spec.grad_accum).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - start)
slowest = [None] * dist.get_world_size()
dist.all_gather_object(slowest, times[spec.warmup_steps:])
step_s = [max(step) for step in zip(*slowest, strict=True)]
if rank == 0:
    print(f"BARE tokens_per_s={spec.tokens_per_step / statistics.fmean(step_s):.1f}")
dist.barrier()  # avoid gloo tearing down while a peer still reads (rare abort at exit)
dist.destroy_process_group()
