#!/usr/bin/env python3
"""The GPT-2-style training step of `sinter-bench gpt` in PyTorch, from the same initial weights
and batch, timed per step and checked against sinter's losses.

    sinter-bench gpt --layers 12 --width 768 --out DIR --json > DIR/sinter.jsonl
    python3 bench/gpt_torch.py DIR [--mode eager-fp32|eager-bf16|compile-bf16] [--steps 20] [--json]

`--mode`: eager fp32 (TF32 off; the default), eager with bf16 autocast, or `torch.compile` with
bf16 autocast and the fused AdamW (what a PyTorch user runs for speed). The check always runs
first, in eager fp32: sinter's f32 lines must agree to 1e-4 (first loss) and 1e-3 (second),
its `--precision mixed` lines (f16 products) to 1e-2; then the mode's steps are timed from the
same initial weights.

`DIR` holds what `sinter-bench gpt` wrote: config.json, init.safetensors (sinter's initial
weights, by sinter's names), ids.npy and targets.npy. The model is the one `tools/src/gpt.rs`
generates: pre-norm blocks, fused q/k/v projection, causal `scaled_dot_product_attention`, GELU
(tanh) MLP of width 4d, final layer norm, output tied to the token embedding, AdamW (lr 3e-4,
weight decay 0.1 on every parameter, betas 0.9/0.999, eps 1e-8).

Prints the first two losses (before and after one step; sinter's should agree to about 1e-4,
relative), the wall time per step (steps queued back to back, one synchronize at the end,
as `sinter-bench gpt` does) and the CUDA-event time of one step. With --json, one JSON line on
stdout; with a sinter JSON line in DIR/sinter.jsonl, also the ratio.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file


def build(cfg, weights, device):
    """Parameters as leaf tensors, by sinter's names."""
    params = {}
    for name, value in weights.items():
        params[name] = torch.tensor(value, device=device, requires_grad=True)
    return params


def forward(cfg, p, ids, targets):
    b, t = ids.shape
    d, h = cfg["width"], cfg["heads"]
    hd = d // h
    x = p["wte"][ids] + p["wpe"]
    for l in range(cfg["layers"]):
        pre = f"h{l}."
        y = F.layer_norm(x, (d,), p[pre + "ln1.g"], p[pre + "ln1.b"], eps=1e-5)
        qkv = y @ p[pre + "attn.w"] + p[pre + "attn.b"]
        q, k, v = qkv.split(d, dim=2)
        q = q.reshape(b, t, h, hd).transpose(1, 2)
        k = k.reshape(b, t, h, hd).transpose(1, 2)
        v = v.reshape(b, t, h, hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, d)
        x = x + (a @ p[pre + "proj.w"] + p[pre + "proj.b"])
        y = F.layer_norm(x, (d,), p[pre + "ln2.g"], p[pre + "ln2.b"], eps=1e-5)
        m = F.gelu(y @ p[pre + "fc.w"] + p[pre + "fc.b"], approximate="tanh")
        x = x + (m @ p[pre + "fc2.w"] + p[pre + "fc2.b"])
    x = F.layer_norm(x, (d,), p["lnf.g"], p["lnf.b"], eps=1e-5).reshape(b * t, d)
    logits = x @ p["wte"].t()
    return F.cross_entropy(logits, targets.reshape(b * t))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--mode", choices=["eager-fp32", "eager-bf16", "compile-bf16"], default="eager-fp32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    weights = load_file(os.path.join(args.dir, "init.safetensors"))
    ids = torch.tensor(np.load(os.path.join(args.dir, "ids.npy")).astype(np.int64), device=device)
    targets = torch.tensor(np.load(os.path.join(args.dir, "targets.npy")).astype(np.int64), device=device)
    p = build(cfg, weights, device)
    opt = torch.optim.AdamW(p.values(), lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=cfg["weight_decay"])

    def plain_step():
        opt.zero_grad(set_to_none=True)
        loss = forward(cfg, p, ids, targets)
        loss.backward()
        opt.step()
        return loss

    # the check, in eager fp32 whatever the mode
    loss0 = plain_step().item()
    loss1 = plain_step().item()

    bf16 = args.mode in ("eager-bf16", "compile-bf16")
    p = build(cfg, weights, device)
    opt = torch.optim.AdamW(p.values(), lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=cfg["weight_decay"], fused=args.mode == "compile-bf16")
    fwd = torch.compile(forward) if args.mode == "compile-bf16" else forward

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(cfg, p, ids, targets)
        loss.backward()
        opt.step()
        return loss

    # warm-up (and compilation): three steps, so that the timed steps start at the fourth
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()
    step_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    events = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        e.synchronize()
        events.append(s.elapsed_time(e))
    gpu_ms = statistics.median(events)
    result = {
        "bench": "gpt", "impl": f"torch-{args.mode}", "mode": args.mode, **{k: cfg[k] for k in ("layers", "width", "heads", "context", "batch", "vocab")},
        "loss0": loss0, "loss1": loss1, "loss_last": last, "steps": args.steps, "step_ms": step_ms, "gpu_ms": gpu_ms, "torch": torch.__version__,
    }
    print(f"# torch {torch.__version__} {args.mode}: loss {loss0:.6f} then {loss1:.6f} (fp32 check); "
          f"{args.mode} {args.steps + 3} steps on {last:.4f}; "
          f"{step_ms:.3f} ms per step (wall), {gpu_ms:.3f} ms (CUDA events)", file=sys.stderr if args.json else sys.stdout)
    sinter_path = os.path.join(args.dir, "sinter.jsonl")
    if os.path.exists(sinter_path):
        with open(sinter_path) as f:
            for line in f:
                s = json.loads(line)
                if s.get("bench") != "gpt" or "step_ms" not in s:
                    continue
                rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
                mixed = s["impl"].endswith("-mixed")
                tol0, tol1 = (1e-2, 1e-2) if mixed else (1e-4, 1e-3)
                ok = rel(s["loss0"], loss0) < tol0 and rel(s["loss1"], loss1) < tol1
                print(f"# {s['impl']}: {s['step_ms']:.3f} ms per step = {s['step_ms'] / step_ms:.2f}x torch {args.mode}'s; "
                      f"loss0 rel. diff {rel(s['loss0'], loss0):.1e}, loss1 {rel(s['loss1'], loss1):.1e} "
                      f"{'ok' if ok else 'MISMATCH'}", file=sys.stderr if args.json else sys.stdout)
                if "loss_last" in s and s.get("steps") == args.steps:
                    print(f"#   its loss {args.steps + 3} steps on {s['loss_last']:.4f}: "
                          f"{rel(s['loss_last'], last):.1e} from torch {args.mode}'s", file=sys.stderr if args.json else sys.stdout)
                result[f"ratio_{s['impl']}"] = s["step_ms"] / step_ms
                result[f"check_{s['impl']}"] = ok
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
