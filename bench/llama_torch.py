#!/usr/bin/env python3
"""The Llama-family training step of `sinter-bench llama` in PyTorch, from the same initial
weights and batch: checked against sinter's first losses and its params after one AdamW step,
and timed per step (eager fp32 with TF32 off, eager bf16 autocast, or torch.compile with bf16
autocast and fused AdamW).

    sinter-bench --json llama --out DIR > DIR/sinter.jsonl
    python3 bench/llama_torch.py DIR [--mode eager-fp32|eager-bf16|compile-bf16] [--steps 20]
                                     [--device cuda|cpu] [--json]

`DIR` holds what `sinter-bench llama` wrote: config.json, llama.sir, init.safetensors (sinter's
initial params, by sinter's names), step1.safetensors (sinter's params after one step), ids.npy
and targets.npy. The model is the one `tools/src/llama.rs` generates, written as Hugging Face's
`LlamaForCausalLM` computes it: RMSNorm, rotary embeddings (rotate-half, inv_freq =
1 / theta^(arange(0, head_dim, 2) / head_dim) in f32), causal grouped-query SDPA, SwiGLU MLP,
final RMSNorm, output tied to the embedding; AdamW (lr and weight decay from config.json, betas
0.9/0.999, eps 1e-8, every parameter decayed).

The check (every mode runs it first, in fp32 with TF32 off): the first loss (before any
update) and the second (after one step) against sinter's (relative difference below 1e-5 and
1e-4), and every param after the first step against step1.safetensors in units of the
learning rate (the size of one AdamW update): at most one element in 1000 may differ by more
than 0.01 lr (an element whose gradient is near AdamW's eps moves by a ratio of two tiny
numbers, which f32 rounding changes). Exit status 1 when a check fails. With --json one JSON line on stdout; with DIR/sinter.jsonl also
the ratio of step times.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(cfg, device):
    hd = cfg["width"] // cfg["heads"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
    pos = torch.arange(cfg["context"], device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def forward(cfg, p, ids, targets, cos, sin):
    b, t = ids.shape
    d, h, kv = cfg["width"], cfg["heads"], cfg["kv_heads"]
    hd, eps = d // h, cfg["norm_eps"]
    x = p["embed"][ids]
    for l in range(cfg["layers"]):
        pre = f"l{l}."
        y = rms_norm(x, p[pre + "attn_norm"], eps)
        q = (y @ p[pre + "wq"]).reshape(b, t, h, hd).transpose(1, 2)
        k = (y @ p[pre + "wk"]).reshape(b, t, kv, hd).transpose(1, 2)
        v = (y @ p[pre + "wv"]).reshape(b, t, kv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # query head i reads key/value head i // (h // kv), as HF's repeat_kv
        k = k.repeat_interleave(h // kv, dim=1)
        v = v.repeat_interleave(h // kv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(b, t, h * hd) @ p[pre + "wo"]
        y = rms_norm(x, p[pre + "mlp_norm"], eps)
        x = x + (F.silu(y @ p[pre + "w_gate"]) * (y @ p[pre + "w_up"])) @ p[pre + "w_down"]
    x = rms_norm(x, p["final_norm"], eps).reshape(b * t, d)
    logits = x @ p["embed"].t()
    return F.cross_entropy(logits.float(), targets.reshape(b * t))


def setup(args, cfg, weights, device, fused):
    p = {name: torch.tensor(value, device=device, requires_grad=True) for name, value in weights.items()}
    opt = torch.optim.AdamW(p.values(), lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=cfg["weight_decay"], fused=fused)
    return p, opt


def load_batch(d, device):
    ids = torch.tensor(np.load(os.path.join(d, "ids.npy")).astype(np.int64), device=device)
    targets = torch.tensor(np.load(os.path.join(d, "targets.npy")).astype(np.int64), device=device)
    return ids, targets


def check(args, cfg, device, say):
    """fp32 losses and params after one step against sinter's; returns (loss0, loss1, ok)."""
    weights = load_file(os.path.join(args.dir, "init.safetensors"))
    ids, targets = load_batch(args.dir, device)
    cos, sin = rope_tables(cfg, device)
    p, opt = setup(args, cfg, weights, device, fused=False)
    losses = []
    for i in range(2):
        opt.zero_grad(set_to_none=True)
        loss = forward(cfg, p, ids, targets, cos, sin)
        loss.backward()
        if i == 0:
            opt.step()
        losses.append(loss.item())
    ok = True
    sinter = sinter_line(args.dir)
    if sinter is not None:
        rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
        r0, r1 = rel(sinter["loss0"], losses[0]), rel(sinter["loss1"], losses[1])
        good = r0 < 1e-5 and r1 < 1e-4
        ok &= good
        say(f"# losses: torch {losses[0]:.7f} then {losses[1]:.7f}; sinter {sinter['loss0']:.7f} then "
            f"{sinter['loss1']:.7f}: relative differences {r0:.1e}, {r1:.1e} {'ok' if good else 'MISMATCH'}")
    step1 = os.path.join(args.dir, "step1.safetensors")
    if os.path.exists(step1):
        # p was updated once (the second iteration only computed the loss)
        after = load_file(step1)
        worst, where, off, total = 0.0, None, 0, 0
        for name, value in after.items():
            diff = np.abs(p[name].detach().cpu().numpy().astype(np.float64) - value.astype(np.float64))
            off += int((diff > 0.01 * cfg["lr"]).sum())
            total += diff.size
            if diff.max() > worst:
                worst, where = diff.max(), name
        good = off <= 1e-3 * total
        ok &= good
        say(f"# params after one AdamW step: largest difference {worst:.2e} = {worst / cfg['lr']:.4f} lr "
            f"(in `{where}`); {off} of {total} elements differ by more than 0.01 lr "
            f"{'ok' if good else 'MISMATCH'}")
    return losses[0], losses[1], ok


def sinter_line(d):
    path = os.path.join(d, "sinter.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            if s.get("bench") == "llama" and "loss0" in s and s.get("impl") in ("sinter", "sinter-flash"):
                return s
    return None


def time_steps(args, cfg, device, say):
    bf16 = args.mode in ("eager-bf16", "compile-bf16")
    weights = load_file(os.path.join(args.dir, "init.safetensors"))
    ids, targets = load_batch(args.dir, device)
    cos, sin = rope_tables(cfg, device)
    p, opt = setup(args, cfg, weights, device, fused=args.mode == "compile-bf16")
    fwd = forward
    if args.mode == "compile-bf16":
        fwd = torch.compile(forward)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(cfg, p, ids, targets, cos, sin)
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()
    step_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    gpu_ms = None
    if device.type == "cuda":
        events = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            e.synchronize()
            events.append(s.elapsed_time(e))
        gpu_ms = statistics.median(events)
    say(f"# torch {torch.__version__} {args.mode}: {step_ms:.3f} ms per step (wall)"
        + (f", {gpu_ms:.3f} ms (CUDA events)" if gpu_ms is not None else "")
        + f"; loss {args.steps + 3} steps on {last:.4f}")
    return step_ms, gpu_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--mode", choices=["eager-fp32", "eager-bf16", "compile-bf16"], default="eager-fp32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--check-only", action="store_true", help="only the check against sinter, no timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    out = sys.stderr if args.json else sys.stdout
    say = lambda line: print(line, file=out)
    loss0, loss1, ok = check(args, cfg, device, say)
    result = {"bench": "llama", "impl": f"torch-{args.mode}", "torch": torch.__version__,
              **{k: cfg[k] for k in ("layers", "width", "heads", "kv_heads", "mlp", "context", "batch", "vocab")},
              "loss0": loss0, "loss1": loss1, "check": ok}
    if not args.check_only:
        step_ms, gpu_ms = time_steps(args, cfg, device, say)
        result.update({"step_ms": step_ms, "gpu_ms": gpu_ms})
        path = os.path.join(args.dir, "sinter.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    s = json.loads(line)
                    if s.get("bench") == "llama" and "step_ms" in s:
                        say(f"# {s['impl']}: {s['step_ms']:.3f} ms per step = {s['step_ms'] / step_ms:.2f}x torch {args.mode}'s")
                        result[f"ratio_{s['impl']}"] = s["step_ms"] / step_ms
    if args.json:
        print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
