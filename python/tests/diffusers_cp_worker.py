"""Run by test_torchrun.py under torchrun (gloo, CPU): a small
FluxTransformer2DModel with the libsdpa attention backend under diffusers'
own context parallelism (enable_parallelism(ContextParallelConfig(...))),
against the same model (same seed, same weights) in one process, for each
grid the world size allows: the output, and the gradients of a loss on it
(the input's and every parameter's, summed over the ranks, each of which
holds its shard's part), through libsdpa's backward_op on every ring and
Ulysses step. Prints its counts, exits non-zero on failure.

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


# Gradients: each rank's input and parameter gradients are its shard's part
# of the one-process gradients; summed over the ranks they must equal them.
def gradients(config=None):
    model, inputs = model_and_inputs()
    if config is not None:
        libsdpa.diffusers.enable_parallelism(model, config)
    with torch.enable_grad():
        x = inputs["hidden_states"].clone().requires_grad_()
        out = model(**dict(inputs, hidden_states=x), return_dict=False)[0]
        weight = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        (out * weight).sum().backward()
    return [x.grad] + [p.grad for _, p in sorted(model.named_parameters()) if p.grad is not None]


def relative(got, want):
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)


# diffusers 0.42's TemplatedRingAttention.backward sends each step's gradient
# accumulator for dK, dV from rank j to rank j + 1 (permute_tensor with
# src_dst[j] = j + 1), but the key block rank j works on next moved the other
# way: rank j's block at step i is rank j - 1's at step i + 1. With two ranks
# the two directions are one; with more the accumulators reach the wrong
# ranks and the gradients are wrong whatever the attention backend (2.19 of
# their scale here with 4 ranks). For ring degrees above 2 the test sends the
# accumulators the right way (j -> j - 1, also for the final rotation), so
# that what it checks is libsdpa's backward_op on every step.
class ring_gradients_rotated_right:
    def __init__(self, ring):
        self.on = ring > 2

    def __enter__(self):
        if not self.on:
            return
        from diffusers.models import attention_dispatch as ad
        self.ad, original = ad, ad.funcol
        self.original = original

        def inverse(t, src_dst, group=None, tag=""):
            back = [0] * len(src_dst)
            for src, dst in enumerate(src_dst):
                back[dst] = src
            return original.permute_tensor(t, back, group=group)
        ad.funcol = type("funcol", (), {"__getattr__": lambda self, n: getattr(original, n),
                                        "permute_tensor": staticmethod(inverse)})()

    def __exit__(self, *exc):
        if self.on:
            self.ad.funcol = self.original


want_grads = gradients()
for ring, ulysses in grids:
    steps = 0
    with ring_gradients_rotated_right(ring):
        got = gradients(ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses))
    for g in got:
        torch.distributed.all_reduce(g)
    err = max(relative(g, w) for g, w in zip(got, want_grads))
    check(len(got) == len(want_grads) and err <= 2e-5 and steps > 0,
          f"ring {ring} x ulysses {ulysses}: gradients summed over ranks vs one process: "
          f"{err:.3g} of their scale ({len(got)} tensors, {steps} steps on libsdpa)")
    if rank == 0:
        print(f"ring {ring} x ulysses {ulysses} on {size} ranks: gradients (input and "
              f"{len(got) - 1} parameters) within {err:.2e} of one process" +
              (" (diffusers' ring gradient rotation reversed, see above)" if ring > 2 else ""))
check.finish()
