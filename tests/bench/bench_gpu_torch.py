#!/usr/bin/env python3
"""PyTorch's GPU training step for GPT-2 small, the reference bench_gpu_train.c
is compared with (tests/bench/bench_gpu.sh prints the ratio):
   bench_gpu_torch.py gpt2-small [MICRO_BATCH [STEPS]] [--tiny]
prints "torch tokens_per_s <float> ms_per_step <float>" and the model FLOPs
utilisation with bench_gpu_train.c's FLOPs formula.

The model mirrors kernels/kern_tfm.c (pre-LN blocks, fused qkv, biases,
tanh-GELU, tied token embedding as the LM head) with the shapes of
examples/gpt2-small.json; bf16 autocast, F.scaled_dot_product_attention
(is_causal) where this PyTorch has it, AdamW (fused on CUDA where available)
with that example's settings and weight decay on matrices and embeddings
only, gradient clipping at 1.0; 3 warm-up steps, then STEPS (10) timed,
torch.cuda.synchronize() at both ends. Eager mode, no torch.compile.

--tiny uses small shapes and runs on the CPU when there is no GPU, to check
the script itself (e.g. with Debian's /usr/bin/python3). Without --tiny and
without CUDA it prints "SKIP: ..." and exits 77."""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, C, NH, Fd):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc2 = nn.Linear(C, Fd), nn.Linear(Fd, C)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch < 2.0 (Debian's 1.13): the plain masked softmax
            att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = torch.softmax(att.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, NH, C, Fd):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, Fd) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def forward(self, tok):
        pos = torch.arange(tok.shape[1], device=tok.device)
        x = self.wte(tok) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        return F.linear(self.lnf(x), self.wte.weight)  # tied head C -> V


def train_flops_per_token(V, T, L, C, Fd):
    """bench_gpu_train.c's definition: 3 x forward; forward = 2 x the matrix
    products' in x out (qkv, attention projection, MLP, tied head C->V) +
    2 x 2 x T x C per layer for QK^T and AV over the full T x T."""
    mm = 2 * (L * (3 * C * C + C * C + C * Fd + Fd * C) + C * V)
    return 3 * (mm + 2 * 2 * T * C * L)


def main():
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    tiny = len(args) != len(sys.argv) - 1
    if not args or args[0] != "gpt2-small" or len(args) > 3:
        print("usage: bench_gpu_torch.py gpt2-small [MICRO_BATCH [STEPS]] [--tiny]",
              file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if not cuda and not tiny:
        print("SKIP: PyTorch %s sees no CUDA device" % torch.__version__)
        return 77
    dev = "cuda" if cuda else "cpu"
    if tiny:
        V, T, L, NH, C, Fd, B = 512, 64, 2, 4, 128, 512, 2
    else:  # examples/gpt2-small.json
        V, T, L, NH, C, Fd, B = 50257, 1024, 12, 12, 768, 3072, 8
    B = int(args[1]) if len(args) > 1 else B
    steps = int(args[2]) if len(args) > 2 else (2 if tiny else 10)
    peak = float(os.environ.get("BENCH_PEAK_TFLOPS", "989.4"))

    torch.manual_seed(0)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(V, T, L, NH, C, Fd).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
        fused = cuda
    except (TypeError, RuntimeError):  # no fused AdamW in this PyTorch
        opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
        fused = False
    x = torch.randint(0, V, (B, T), device=dev)
    y = torch.randint(0, V, (B, T), device=dev)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for s in range(3 + steps):
        if s == 3:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, V), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sync()
    sec = (time.perf_counter() - t0) / steps
    nparams = sum(p.numel() for p in model.parameters())
    fpt = train_flops_per_token(V, T, L, C, Fd)
    tps = B * T / sec
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    print("torch %s on %s: params %d, micro batch %d x T %d, bf16 autocast, sdpa %s, "
          "fused adamw %s%s" % (torch.__version__, name, nparams, B, T, HAVE_SDPA, fused,
                                ", --tiny shapes" if tiny else ""))
    if cuda:
        print("torch peak memory allocated %.2f GiB" % (torch.cuda.max_memory_allocated() / 2**30))
    print("torch tokens_per_s %.1f ms_per_step %.3f" % (tps, sec * 1e3))
    print("torch model_tflops %.3f mfu %.1f %% of %.1f TFLOP/s (model_flops_per_token %d)"
          % (fpt * tps / 1e12, 100 * fpt * tps / 1e12 / peak, peak, fpt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
