#!/usr/bin/python3
"""PyTorch's CPU training step for the models bench_train_step.c times:
   bench_train_torch.py mlp|gpt|albert THREADS STEPS   -> "ms_per_step <float>"
Same shapes, same batch, forward + backward + AdamW, fp32, with
torch.set_num_threads(THREADS). The GPT mirrors kernels/kern_tfm.c (pre-LN,
tanh-GELU, fused qkv, tied embedding)."""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH, Fd, post_ln=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc2 = nn.Linear(C, Fd), nn.Linear(Fd, C)
        self.NH, self.post_ln = NH, post_ln

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(x if self.post_ln else self.ln1(x)).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        if getattr(self, "causal", True):
            att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        y = (torch.softmax(att, -1) @ v).transpose(1, 2).reshape(B, T, C)
        if self.post_ln:  # BERT's block, ALBERT as published
            x = self.ln1(x + self.proj(y))
            return self.ln2(x + self.fc2(F.gelu(self.fc(x), approximate="tanh")))
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V=256, T=64, L=2, C=128, NH=4, Fd=512):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, Fd) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def forward(self, tok):
        x = self.wte(tok) + self.wpe(torch.arange(tok.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.lnf(x) @ self.wte.weight.t()


class Albert(nn.Module):
    """kernels/kern_tfm.c's ALBERT as published (post_ln, sentence_order):
    token + position + segment embeddings of width E, LayerNorm, projected
    to C; one post-LN block shared by all L layers (bidirectional
    attention); MLM head (dense C->E, tanh-GELU, LayerNorm, decoder tied to
    the embeddings + bias) and the sentence-order head (tanh pooler on
    [CLS], 2 logits)."""

    def __init__(self, V=8000, T=128, L=4, C=256, E=64, NH=4, Fd=1024):
        super().__init__()
        self.wte, self.wpe, self.wtt = nn.Embedding(V, E), nn.Embedding(T, E), nn.Embedding(2, E)
        self.eln = nn.LayerNorm(E)
        self.proj = nn.Linear(E, C)
        self.block = Block(C, NH, Fd, post_ln=True)
        self.block.causal = False
        self.L = L
        self.dense, self.ln = nn.Linear(C, E), nn.LayerNorm(E)
        self.bias = nn.Parameter(torch.zeros(V))
        self.pool, self.sop = nn.Linear(C, C), nn.Linear(C, 2)

    def forward(self, tok, seg):
        x = self.wte(tok) + self.wpe(torch.arange(tok.shape[1])) + self.wtt(seg)
        x = self.proj(self.eln(x))
        for _ in range(self.L):
            x = self.block(x)
        h = self.ln(F.gelu(self.dense(x), approximate="tanh"))
        return h @ self.wte.weight.t() + self.bias, self.sop(torch.tanh(self.pool(x[:, 0])))


def main():
    kind, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                              nn.Linear(128, 10))
        x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    elif kind == "albert":
        model = Albert()
        x, y = torch.randint(0, 8000, (16, 128)), torch.randint(0, 8000, (16, 128))
        y[torch.rand(16, 128) >= 0.15] = -1  # masked-LM targets on 15 % of the positions
        seg = (torch.arange(128) >= 64).long().expand(16, 128)
        sop = torch.arange(16) % 2
    else:
        model = GPT()
        x, y = torch.randint(0, 256, (32, 64)), torch.randint(0, 256, (32, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for s in range(steps + 3):
        if s == 3:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        if kind == "albert":
            out, sop_logits = model(x, seg)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=-1) + \
                F.cross_entropy(sop_logits, sop)
        else:
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
    print("ms_per_step %.3f" % ((time.perf_counter() - t0) / steps * 1e3))


if __name__ == "__main__":
    main()
