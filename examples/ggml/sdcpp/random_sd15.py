"""random_sd15.py OUT_DIR - a Stable Diffusion 1.5 pipeline with random
weights, in diffusers' folder layout (unet/, vae/, text_encoder/
safetensors, float16), for running stable-diffusion.cpp here without
downloading a model: the same architecture and tensor names as SD 1.5 (so
sd.cpp detects VERSION_SD1), seeded, 2.0 GB. Its images are noise; what
they are for is comparing two attention paths at the same seed.

UNet and VAE from diffusers' classes with SD 1.5's configuration (their
default initialisation); the CLIP text encoder (which needs transformers,
not installed here) written directly with HF's tensor names, N(0, 0.02)."""
import json
import os
import sys

import numpy as np
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from safetensors.numpy import save_file


def main(out):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
        block_out_channels=(128, 256, 512, 512),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    for name, model in (("unet", unet), ("vae", vae)):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        tensors = {k: v.detach().half().numpy() for k, v in model.state_dict().items()}
        save_file(tensors, os.path.join(out, name, "diffusion_pytorch_model.safetensors"))
        with open(os.path.join(out, name, "config.json"), "w") as f:
            json.dump(dict(model.config), f, default=str)
    te = {}
    d, ff = 768, 3072

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    te["text_model.embeddings.token_embedding.weight"] = w(49408, d)
    te["text_model.embeddings.position_embedding.weight"] = w(77, d)
    for i in range(12):
        p = f"text_model.encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            te[p + f"self_attn.{proj}.weight"] = w(d, d)
            te[p + f"self_attn.{proj}.bias"] = np.zeros(d, np.float16)
        for ln in ("layer_norm1", "layer_norm2"):
            te[p + f"{ln}.weight"] = np.ones(d, np.float16)
            te[p + f"{ln}.bias"] = np.zeros(d, np.float16)
        te[p + "mlp.fc1.weight"], te[p + "mlp.fc1.bias"] = w(ff, d), np.zeros(ff, np.float16)
        te[p + "mlp.fc2.weight"], te[p + "mlp.fc2.bias"] = w(d, ff), np.zeros(d, np.float16)
    te["text_model.final_layer_norm.weight"] = np.ones(d, np.float16)
    te["text_model.final_layer_norm.bias"] = np.zeros(d, np.float16)
    os.makedirs(os.path.join(out, "text_encoder"), exist_ok=True)
    save_file(te, os.path.join(out, "text_encoder", "model.safetensors"))
    print(f"random SD 1.5 in {out}: unet {sum(p.numel() for p in unet.parameters()) / 1e6:.0f}M, "
          f"vae {sum(p.numel() for p in vae.parameters()) / 1e6:.0f}M parameters")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: random_sd15.py OUT_DIR")
    main(sys.argv[1])
