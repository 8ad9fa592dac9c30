"""Run by test_torchrun.py under torchrun (gloo, CPU): a small
FluxTransformer2DModel with the libsdpa attention backend under diffusers'
own context parallelism (enable_parallelism(ContextParallelConfig(...))),
against the same model (same seed, same weights) in one process, for each
grid the world size allows. Prints its counts, exits non-zero on failure.

What it patches, and why: diffusers 0.42's ModelMixin._resolve_parallel_config
computes `rank % torch.accelerator.device_count()` to pick each rank's
device, which is a ZeroDivisionError on a machine without an accelerator,
so diffusers has no context parallelism on CPUs at all. The test calls
libsdpa.diffusers.enable_parallelism(model, config), which replaces
torch.accelerator.device_count by a function returning 1 while diffusers'
enable_parallelism runs (every rank then names device "cpu:0", which is
what a CPU tensor is on anyway), and nothing else.
"""
import os
import sys

import torch

import libsdpa
import libsdpa.diffusers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workerlib import Checks  # noqa: E402

check = Checks()
rank, size = check.rank, check.size
from diffusers import ContextParallelConfig, FluxTransformer2DModel  # noqa: E402

libsdpa.diffusers.enable()
torch.set_grad_enabled(False)


def model_and_inputs():
    torch.manual_seed(0)  # the same weights and inputs on every rank
    heads, hd, side, T = 4, 16, 8, 8
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=hd,
        num_attention_heads=heads, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(4, 6, 6)).eval()
    S = side * side
    ids = torch.zeros(S, 3)
    ids[:, 1], ids[:, 2] = torch.arange(S) // side, torch.arange(S) % side
    inputs = dict(hidden_states=torch.randn(1, S, 16), encoder_hidden_states=torch.randn(1, T, 32),
                  pooled_projections=torch.randn(1, 32), timestep=torch.tensor([0.5]),
                  img_ids=ids, txt_ids=torch.zeros(T, 3))
    model.set_attention_backend("libsdpa")
    return model, inputs


steps = 0  # local attention steps through libsdpa's forward_op


def counting_forward_op(*args, **kwargs):
    global steps
    steps += 1
    return real_forward_op(*args, **kwargs)


real_forward_op = libsdpa.diffusers.forward_op
libsdpa.diffusers.forward_op = counting_forward_op  # the backend looks it up per call


def parallel(config):
    model, inputs = model_and_inputs()
    # the patch (see the module's docstring), as users get it
    libsdpa.diffusers.enable_parallelism(model, config)
    return model(**inputs, return_dict=False)[0]  # diffusers' CP hooks take tensors, not its output class


model, inputs = model_and_inputs()
want = model(**inputs).sample
model.set_attention_backend("native")
native = model(**inputs).sample
check((want - native).abs().max().item() <= 1e-5, "one process: libsdpa vs native")
grids = [(size, 1), (1, size)] + ([(2, 2)] if size == 4 else [])
for ring, ulysses in grids:
    steps = 0
    got = parallel(ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses))
    err = (got - want).abs().max().item()
    check(got.shape == want.shape and err <= 1e-5 and steps > 0,
          f"ring {ring} x ulysses {ulysses}: |context parallel - one process| {err:.3g}, "
          f"{steps} local steps on libsdpa")
    if rank == 0:
        print(f"ring {ring} x ulysses {ulysses} on {size} ranks: max |difference| {err:.2e}, "
              f"{steps} local attention steps on libsdpa (rank 0)")
check.finish()
