#!/usr/bin/python3
"""Exports PyTorch reference values for the kernels tests.

Writes small binary fixtures into tests/fixtures/kernels/ so that `make test`
checks our models against PyTorch without needing PyTorch: for the MLP, a
tiny GPT, a tiny ALBERT (factorized embedding, shared layers, MLM head) and
ALBERT as published (albert_sop.bin: segment embeddings, embedding LayerNorm,
post-LN blocks, no final LayerNorm, MLM plus sentence-order loss on the
tanh-pooled [CLS] position), each file holds the inputs, the initial flat parameter buffer (in our tensor
order, kernels/kern_mlp.c and kern_tfm.c), the logits, the mean loss, the
flat gradient, and the parameters after 3 AdamW steps and after 3 LAMB steps
(fresh optimizer each, same batch every step; the key part of each qkv bias's
gradient, zero in exact arithmetic, set to exactly zero before each step:
zero_key_bias_grads).

The models here mirror ours op for op: pre-LayerNorm blocks (eps 1e-5; post-LN
for albert_sop),
tanh-GELU, fused qkv (3C, C) with heads contiguous inside q, k and v,
attention scaled by 1/sqrt(head size), tied output embedding, mean
cross-entropy over targets != -1. Weight decay applies to tensors of rank 2.

Run with Debian's interpreter (python3-torch): /usr/bin/python3 scripts/make_torch_fixtures.py

File format (little-endian): b"CTFX", u32 version = 1, u32 count, then per
tensor: u32 name length, name bytes, u32 dtype (0 float32, 1 int32), u32 ndim,
ndim x u32 dims, the data.
"""
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "kernels")


def save(path, items):
    with open(path, "wb") as f:
        f.write(b"CTFX")
        f.write(struct.pack("<II", 1, len(items)))
        for name, t in items:
            t = t.detach().contiguous()
            if t.dtype in (torch.int64, torch.int32):
                dtype, t = 1, t.to(torch.int32)
            else:
                dtype, t = 0, t.to(torch.float32)
            nb = name.encode()
            dims = list(t.shape) if t.dim() else [1]
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", dtype, len(dims)))
            f.write(struct.pack("<%dI" % len(dims), *dims))
            f.write(t.numpy().tobytes())


def xent(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)


def mlp_forward(P, x, dims):
    h = x
    n = len(dims) - 1
    for l in range(n):
        h = h @ P["layers.%d.weight" % l].t() + P["layers.%d.bias" % l]
        if l + 1 < n:
            h = torch.relu(h)
    return h


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def tfm_forward(P, tok, cfg, seg=None):
    """MLM or next-token logits, and with cfg["sop"] the sentence-order logits."""
    kind, L, NH = cfg["kind"], cfg["n_layer"], cfg["n_head"]
    post, sop = cfg.get("post_ln", 0), cfg.get("sop", 0)
    B, T = tok.shape
    x = P["wte"][tok] + P["wpe"][:T]
    if sop:
        x = x + P["wtt"][seg]
    if post:
        x = layernorm(x, P["emb_ln.weight"], P["emb_ln.bias"])
    if kind == "albert":
        x = x @ P["emb_proj.weight"].t() + P["emb_proj.bias"]
    C = x.shape[-1]
    hs = C // NH
    for l in range(L):
        k = 0 if cfg["share"] else l
        p = lambda n: P["blocks.%d.%s" % (k, n)]
        h = x if post else layernorm(x, p("ln1.weight"), p("ln1.bias"))
        qkv = h @ p("attn.qkv.weight").t() + p("attn.qkv.bias")
        q, kk, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        kk = kk.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ kk.transpose(-2, -1)) / math.sqrt(hs)
        if kind == "gpt":
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.proj.weight").t() + p("attn.proj.bias")
        if post:
            x = layernorm(x, p("ln1.weight"), p("ln1.bias"))
        h = x if post else layernorm(x, p("ln2.weight"), p("ln2.bias"))
        h = F.gelu(h @ p("mlp.fc.weight").t() + p("mlp.fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.proj.weight").t() + p("mlp.proj.bias")
        if post:
            x = layernorm(x, p("ln2.weight"), p("ln2.bias"))
    if not post:
        x = layernorm(x, P["ln_f.weight"], P["ln_f.bias"])
    sop_logits = None
    if sop:
        pooled = torch.tanh(x[:, 0] @ P["pooler.weight"].t() + P["pooler.bias"])
        sop_logits = pooled @ P["sop.weight"].t() + P["sop.bias"]
    if kind == "albert":
        h = F.gelu(x @ P["mlm.dense.weight"].t() + P["mlm.dense.bias"], approximate="tanh")
        h = layernorm(h, P["mlm.ln.weight"], P["mlm.ln.bias"])
        return h @ P["wte"].t() + P["mlm.decoder.bias"], sop_logits
    return x @ P["wte"].t(), sop_logits


def tfm_layout(cfg):
    V, T, C, E, Fd = cfg["vocab"], cfg["max_T"], cfg["C"], cfg["E"], cfg["F"]
    post, sop = cfg.get("post_ln", 0), cfg.get("sop", 0)
    names = [("wte", (V, E)), ("wpe", (T, E))]
    if sop:
        names += [("wtt", (2, E))]
    if post:
        names += [("emb_ln.weight", (E,)), ("emb_ln.bias", (E,))]
    if cfg["kind"] == "albert":
        names += [("emb_proj.weight", (C, E)), ("emb_proj.bias", (C,))]
    for l in range(1 if cfg["share"] else cfg["n_layer"]):
        b = "blocks.%d." % l
        names += [(b + "ln1.weight", (C,)), (b + "ln1.bias", (C,)),
                  (b + "attn.qkv.weight", (3 * C, C)), (b + "attn.qkv.bias", (3 * C,)),
                  (b + "attn.proj.weight", (C, C)), (b + "attn.proj.bias", (C,)),
                  (b + "ln2.weight", (C,)), (b + "ln2.bias", (C,)),
                  (b + "mlp.fc.weight", (Fd, C)), (b + "mlp.fc.bias", (Fd,)),
                  (b + "mlp.proj.weight", (C, Fd)), (b + "mlp.proj.bias", (C,))]
    if not post:
        names += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    if cfg["kind"] == "albert":
        names += [("mlm.dense.weight", (E, C)), ("mlm.dense.bias", (E,)),
                  ("mlm.ln.weight", (E,)), ("mlm.ln.bias", (E,)), ("mlm.decoder.bias", (V,))]
    if sop:
        names += [("pooler.weight", (C, C)), ("pooler.bias", (C,)),
                  ("sop.weight", (2, C)), ("sop.bias", (2,))]
    return names


def make_params(layout, gen):
    P = {}
    for name, shape in layout:
        t = torch.randn(shape, generator=gen) * (0.3 if len(shape) == 2 else 0.1)
        if name.endswith("ln1.weight") or name.endswith("ln2.weight") or "ln_f.weight" in name \
                or name in ("mlm.ln.weight", "emb_ln.weight"):
            t = 1.0 + t
        P[name] = t.requires_grad_(True)
    return P


def flat(P, layout, grad=False):
    return torch.cat([(P[n].grad if grad else P[n]).detach().reshape(-1) for n, _ in layout])


def lamb_step(P, layout, state, t, lr, b1, b2, eps, wd):
    with torch.no_grad():
        for n, shape in layout:
            p, g = P[n], P[n].grad
            m, v = state.setdefault(n, (torch.zeros_like(p), torch.zeros_like(p)))
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
            if len(shape) == 2:
                u = u + wd * p
            pn, un = p.norm().item(), u.norm().item()
            ratio = pn / un if pn > 0 and un > 0 else 1.0
            p.sub_(lr * ratio * u)


def zero_key_bias_grads(P, layout):
    """The key third of each attention's qkv bias has a gradient that is zero
    in exact arithmetic (it adds one constant to every score of a softmax
    row), so both frameworks hold rounding noise there, and which elements
    are noise and which are exactly zero depends on the CPU's BLAS kernels.
    Adam turns noise into full-size steps of either sign, and LAMB's
    per-tensor norm carries them into the rest of the bias. Before each
    optimizer step the test and this script set it to the exact zero."""
    with torch.no_grad():
        for n, shape in layout:
            if n.endswith("attn.qkv.bias"):
                c = shape[0] // 3
                P[n].grad[c:2 * c] = 0


def train_steps(make, layout, loss_fn, kind, steps=3, lr=1e-2, wd=0.01):
    P = make()
    if kind == "adamw":
        decay = [P[n] for n, s in layout if len(s) == 2]
        nodecay = [P[n] for n, s in layout if len(s) != 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                 {"params": nodecay, "weight_decay": 0.0}],
                                lr=lr, betas=(0.9, 0.999), eps=1e-8)
    state = {}
    for t in range(1, steps + 1):
        for p in P.values():
            p.grad = None
        loss_fn(P).backward()
        zero_key_bias_grads(P, layout)
        if kind == "adamw":
            opt.step()
        else:
            lamb_step(P, layout, state, t, lr, 0.9, 0.999, 1e-8, wd)
    return flat(P, layout)


def export(path, layout, make, loss_and_logits, inputs):
    P = make()
    out = loss_and_logits(P)
    loss, logits = out[0], out[1]
    loss.backward()
    items = list(inputs) + [("params", flat(P, layout)), ("logits", logits), ("loss", loss.reshape(1)),
                            ("grads", flat(P, layout, grad=True))]
    if len(out) > 2:
        items.append(("sop_logits", out[2]))
    lf = lambda Q: loss_and_logits(Q)[0]
    items.append(("adamw3", train_steps(make, layout, lf, "adamw")))
    items.append(("lamb3", train_steps(make, layout, lf, "lamb")))
    save(path, items)
    print("wrote %s (loss %.6f)" % (os.path.relpath(path), loss.item()))


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)

    # MLP 12-10-8-5, batch 6, one ignored row
    dims = [12, 10, 8, 5]
    layout = []
    for l in range(3):
        layout += [("layers.%d.weight" % l, (dims[l + 1], dims[l])), ("layers.%d.bias" % l, (dims[l + 1],))]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 12, generator=g)
    y = torch.tensor([0, 4, 2, -1, 1, 3])
    init = make_params(layout, torch.Generator().manual_seed(2))
    make = lambda: {n: t.detach().clone().requires_grad_(True) for n, t in init.items()}

    def mlp_ll(P):
        logits = mlp_forward(P, x, dims)
        return xent(logits, y), logits
    export(os.path.join(OUT, "mlp.bin"), layout, make, mlp_ll,
           [("config", torch.tensor(dims)), ("x", x), ("y", y)])

    for name, kind, share, E, L, post in (("gpt", "gpt", 0, 16, 2, 0), ("albert", "albert", 1, 8, 3, 0),
                                          ("albert_sop", "albert", 1, 8, 3, 1)):
        cfg = {"kind": kind, "share": share, "vocab": 13, "max_T": 8, "n_layer": L, "n_head": 2,
               "C": 16, "E": E, "F": 32, "post_ln": post, "sop": post}
        layout = tfm_layout(cfg)
        g = torch.Generator().manual_seed(3)
        B, T = 2, 7   # T < max_T: the model must handle shorter sequences
        tok = torch.randint(0, 13, (B, T), generator=g)
        if kind == "gpt":
            tgt = torch.roll(tok, -1, dims=1)
            tgt[:, -1] = -1
        else:
            tgt = torch.full((B, T), -1, dtype=torch.long)
            tgt[0, 1], tgt[0, 4], tgt[1, 0], tgt[1, 5] = 3, 7, 12, 0
        # [CLS] A [SEP] | B [SEP]: segment 0 up to the first [SEP], then 1; one pair swapped
        seg = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
        sop = torch.tensor([1, 0])
        init = make_params(layout, torch.Generator().manual_seed(4))
        make = lambda: {n: t.detach().clone().requires_grad_(True) for n, t in init.items()}

        def tfm_ll(P, tok=tok, tgt=tgt, cfg=cfg, seg=seg, sop=sop):
            logits, sop_logits = tfm_forward(P, tok, cfg, seg)
            if sop_logits is None:
                return xent(logits, tgt), logits
            # ALBERT's loss: the masked-LM mean plus the sentence-order mean
            return xent(logits, tgt) + F.cross_entropy(sop_logits, sop), logits, sop_logits
        conf = [cfg["vocab"], cfg["max_T"], cfg["n_layer"], cfg["n_head"], cfg["C"], cfg["E"], cfg["F"],
                share]
        conf = torch.tensor(conf + [post, post] if post else conf)  # + post_ln, sentence_order
        inputs = [("config", conf), ("tokens", tok), ("targets", tgt)]
        if post:
            inputs += [("segments", seg), ("sop", sop)]
        export(os.path.join(OUT, "%s.bin" % name), layout, make, tfm_ll, inputs)


if __name__ == "__main__":
    sys.exit(main())
