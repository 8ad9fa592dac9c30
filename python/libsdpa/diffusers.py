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
what it cannot honour (dropout_p > 0, context parallelism), never
ignores it.
"""
import libsdpa

TESTED_DIFFUSERS = ((0, 42),)
NAME = "libsdpa"


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, return_lse=False, _parallel_config=None):
    """diffusers' backend signature (as _native_attention): [B, S, H, D]."""
    if dropout_p:
        raise libsdpa.InvalidArgumentError(
            f"libsdpa: dropout_p is {dropout_p}, expected 0 (libsdpa runs inference only)")
    if _parallel_config is not None:
        raise libsdpa.UnsupportedError("libsdpa: diffusers' context parallelism is not "
                                       "supported by the libsdpa backend")
    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape[0] == query.shape[0] \
            and attn_mask.shape[1] == key.shape[1]:
        attn_mask = attn_mask[:, None, None, :]  # [B, Skv] -> [B, 1, 1, Skv], as native does
    result = libsdpa.attention(query, key, value, attn_mask=attn_mask, is_causal=bool(is_causal),
                               scale=scale, enable_gqa=True if enable_gqa else None,
                               return_lse=return_lse)
    if return_lse:
        out, lse = result
        return out, lse.transpose(1, 2)  # [B, H, S] -> diffusers' [B, S, H]
    return result


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
            member, constraints=[ad._check_device, ad._check_shape])(attention)
    return member
