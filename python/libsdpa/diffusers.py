"""libsdpa as an attention backend of diffusers, under the name "libsdpa".

    import libsdpa.diffusers
    libsdpa.diffusers.enable()
    pipe.transformer.set_attention_backend("libsdpa")   # or:
    with diffusers.models.attention_dispatch.attention_backend("libsdpa"): ...

diffusers has no public way to add a backend: its names are a closed Enum
(AttentionBackendName) and its registry (_AttentionBackendRegistry) is
private. enable() patches exactly two things in
diffusers.models.attention_dispatch, and nothing else:
  1. AttentionBackendName gains the member LIBSDPA = "libsdpa" (added to the
     Enum's member maps, as NVIDIA Model-Optimizer adds its backends);
  2. _AttentionBackendRegistry.register(LIBSDPA, constraints=[_check_device,
     _check_shape]) registers attention() below, as diffusers registers its
     own backends.
Tested with diffusers 0.42 (TESTED_DIFFUSERS); another minor version is
refused unless enable(force=True), because both patched names are private.

The backend takes diffusers' [B, S, H, D] tensors and every argument
diffusers passes (so dispatch_attention_fn never drops one): attn_mask
(boolean or additive; [B, Skv] is a key mask), is_causal, scale,
enable_gqa, return_lse (diffusers' LSE layout [B, S, H]). It raises for
what it cannot honour (dropout_p > 0), never ignores it.

Gradients: with inputs that require grad (training, LoRA fine-tuning,
gradient checkpointing, or a forward call made without torch.no_grad()),
attention() is libsdpa's custom operator with libsdpa's backward
(libsdpa.attention under autograd), so gradients flow through.

Context parallelism: the backend is registered as supporting it, and under
model.enable_parallelism(ContextParallelConfig(ring_degree=..., ulysses_degree=...))
diffusers' own templated ring, Ulysses and unified attention run with
forward_op() below doing each local step on libsdpa (output and LSE in
diffusers' layouts) and backward_op() each step's gradients, from the
global output and LSE diffusers hands it (exact for a block of keys:
P = exp(S - lse) with the merged LSE). diffusers 0.42's
enable_parallelism assumes an accelerator (rank % device_count() with no
GPU is a ZeroDivisionError): enable_parallelism(model, config) below gets
past it on a CPU, and says how.
"""
import libsdpa

TESTED_DIFFUSERS = ((0, 42),)
NAME = "libsdpa"


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, return_lse=False, _parallel_config=None):
    """diffusers' backend signature (as _native_attention): [B, S, H, D]."""
    if dropout_p:
        raise libsdpa.InvalidArgumentError(
            f"libsdpa: dropout_p is {dropout_p}, expected 0 (libsdpa has no dropout)")
    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape[0] == query.shape[0] \
            and attn_mask.shape[1] == key.shape[1]:
        attn_mask = attn_mask[:, None, None, :]  # [B, Skv] -> [B, 1, 1, Skv], as native does
    if _parallel_config is not None:  # diffusers' own ring / Ulysses, libsdpa per step
        from diffusers.models import attention_dispatch as ad
        return ad._templated_context_parallel_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
            forward_op=forward_op, backward_op=backward_op, _parallel_config=_parallel_config)
    result = libsdpa.attention(query, key, value, attn_mask=attn_mask, is_causal=bool(is_causal),
                               scale=scale, enable_gqa=True if enable_gqa else None,
                               return_lse=return_lse)
    if return_lse:
        out, lse = result
        return out, lse.transpose(1, 2)  # [B, H, S] -> diffusers' [B, S, H]
    return result


def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
               scale=None, enable_gqa=False, return_lse=False, _save_ctx=True,
               _parallel_config=None):
    """One local step of diffusers' templated context-parallel attention
    (the signature of its _native_attention_forward_op): [B, S, H, D] in,
    out and, with return_lse, the LSE as [B, S, H]. With _save_ctx, what
    backward_op needs is kept on ctx."""
    out, lse = attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa,
                         return_lse=True)
    if _save_ctx:
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.libsdpa_args = dict(attn_mask=attn_mask, is_causal=bool(is_causal), scale=scale,
                                enable_gqa=True if enable_gqa else None)
    return (out, lse) if return_lse else out


def backward_op(ctx, grad_out, *args, query=None, key=None, value=None, out=None, lse=None,
                **kwargs):
    """The gradients of one local step (diffusers' backward_op signature):
    the saved tensors, or the ones diffusers' ring passes for this step
    (its key block, the merged out and LSE, [B, S, H] layout)."""
    saved_q, saved_k, saved_v, saved_out, saved_lse = ctx.saved_tensors
    query = saved_q if query is None else query
    key = saved_k if key is None else key
    value = saved_v if value is None else value
    out = saved_out if out is None else out
    lse = saved_lse if lse is None else lse
    a = dict(ctx.libsdpa_args)
    mask = a.pop("attn_mask")
    if mask is not None and mask.ndim == 2 and mask.shape == (query.shape[0], key.shape[1]):
        mask = mask[:, None, None, :]
    import torch
    lse = lse.transpose(1, 2).to(torch.float32).contiguous()  # [B, H, S]
    return libsdpa.backward(query, key, value, out, lse, grad_out, attn_mask=mask, **a)


def enable_parallelism(model, config):
    """model.enable_parallelism(config=config), also on a machine without an
    accelerator: diffusers 0.42 picks each rank's device as
    `rank % torch.accelerator.device_count()`, a ZeroDivisionError on a
    CPU-only machine, so while the call runs device_count() says 1 (every
    rank then names "cpu:0", which CPU tensors are on anyway). With an
    accelerator it is diffusers' call, unchanged."""
    import torch
    if torch.accelerator.device_count() > 0:
        return model.enable_parallelism(config=config)
    real = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        return model.enable_parallelism(config=config)
    finally:
        torch.accelerator.device_count = real


def enable(force=False):
    """Makes "libsdpa" a diffusers attention backend (idempotent)."""
    import diffusers
    from diffusers.models import attention_dispatch as ad

    version = tuple(int(x) for x in diffusers.__version__.split(".")[:2])
    if version not in TESTED_DIFFUSERS and not force:
        raise RuntimeError(
            f"libsdpa.diffusers: diffusers {diffusers.__version__} is not a tested version "
            f"({', '.join('%d.%d' % v for v in TESTED_DIFFUSERS)}); enable() patches its private "
            "AttentionBackendName and _AttentionBackendRegistry, so it refuses other versions. "
            "enable(force=True) patches anyway.")
    names = ad.AttentionBackendName
    if NAME not in names._value2member_map_:
        member = str.__new__(names, NAME)
        member._name_, member._value_ = "LIBSDPA", NAME
        member.__objclass__ = names
        names._member_map_["LIBSDPA"] = member
        names._value2member_map_[NAME] = member
        names._member_names_.append("LIBSDPA")
        type.__setattr__(names, "LIBSDPA", member)
    member = names(NAME)
    if member not in ad._AttentionBackendRegistry._backends:
        ad._AttentionBackendRegistry.register(
            member, constraints=[ad._check_device, ad._check_shape],
            supports_context_parallel=True)(attention)
    return member
