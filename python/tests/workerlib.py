"""What the torchrun workers share: a gloo group, checks counted per rank,
and one summary line for all ranks (test_torchrun.py reads it)."""
import sys

import torch
import torch.distributed as dist


class Checks:
    def __init__(self):
        dist.init_process_group("gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.passed = self.failed = 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print(f"FAIL rank {self.rank}: {what}", flush=True)

    def finish(self):
        counts = torch.tensor([self.passed, self.failed])
        dist.all_reduce(counts)
        if self.rank == 0:
            print(f"{counts[0].item()} passed, {counts[1].item()} failed, 0 skipped "
                  f"(on {self.size} ranks)")
        dist.destroy_process_group()
        sys.exit(1 if counts[1].item() else 0)
