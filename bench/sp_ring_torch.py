"""sp_ring_torch.py - ring attention over torch.distributed, two ways, on the
same tensors in one run: diffusers' templated ring (an all_gather of every
rank's K/V, then the local steps, each on libsdpa through
libsdpa.diffusers.forward_op, merged by diffusers in float32) and
libsdpa.distributed's ring (the next K/V block sent and received while the
current one is computed, merged by sdpa_merge). Medians of --reps
interleaved rounds; outputs checked against each other.

    torchrun --nproc-per-node 2 bench/sp_ring_torch.py [--reps 5]

Run on one machine the ranks share its cores and memory: the figures say
which scheme does less work here, not how either scales on a network.
"""
import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist

import libsdpa
import libsdpa.diffusers
import libsdpa.distributed as ld

p = argparse.ArgumentParser()
p.add_argument("--reps", type=int, default=5)
args = p.parse_args()
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_grad_enabled(False)
from diffusers.models import attention_dispatch as ad  # noqa: E402
from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig  # noqa: E402

mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (size, 1), mesh_dim_names=("ring",
                                                                                       "ulysses"))
cp = ContextParallelConfig(ring_degree=size, ulysses_degree=1)
cp.setup(rank, size, torch.device("cpu"), mesh)
pc = ParallelConfig(context_parallel_config=cp)
if rank == 0:
    print(f"# bench/sp_ring_torch.py --reps {args.reps}, {size} ranks (gloo, one machine), "
          f"libsdpa {libsdpa.__version__}, torch {torch.__version__}, "
          f"{libsdpa.info()['cpu']['model']}, {torch.get_num_threads()} threads per rank, "
          f"{datetime.date.today()}; ms per call, medians; x = diffusers' time / libsdpa's")
    print(f"{'shape (per rank: B, S, H, D)':30} {'dtype':6} {'diffusers ring':>15} "
          f"{'libsdpa ring':>13} {'x':>6} {'max diff':>9}")
for B, S, H, D in ((1, 1024, 8, 64), (1, 2048, 8, 128), (2, 1024, 24, 64)):
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(rank * 7 + S)
        q, k, v = ((torch.rand(B, S, H, D, generator=g) * 2 - 1).to(dtype) for _ in range(3))

        def diffusers_ring():
            return ad._templated_context_parallel_attention(
                q, k, v, forward_op=libsdpa.diffusers.forward_op,
                backward_op=libsdpa.diffusers.backward_op, _parallel_config=pc)

        def libsdpa_ring():
            return ld.attention(q, k, v)

        arms = {"diffusers": diffusers_ring, "libsdpa": libsdpa_ring}
        outs = {n: f() for n, f in arms.items()}  # warm-up, and the outputs compared
        diff = (outs["diffusers"].float() - outs["libsdpa"].float()).abs().max().item()
        t = {n: [] for n in arms}
        for r in range(args.reps):
            for n in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                dist.barrier()
                t0 = time.perf_counter()
                arms[n]()
                dist.barrier()
                t[n].append((time.perf_counter() - t0) * 1e3)
        m = {n: statistics.median(x) for n, x in t.items()}
        if rank == 0:
            print(f"{str((B, S, H, D)):30} {str(dtype)[6:]:6} {m['diffusers']:15.2f} "
                  f"{m['libsdpa']:13.2f} {m['diffusers'] / m['libsdpa']:6.2f} {diff:9.2e}")
dist.destroy_process_group()
