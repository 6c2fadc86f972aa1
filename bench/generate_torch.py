#!/usr/bin/env python3
"""Text generation with a plain PyTorch key/value cache, timed as `sinter-bench generate` times
sinter: random weights, a prompt of --prompt-tokens random tokens through one forward pass (the
prefill, which writes preallocated key/value caches), then --new-tokens greedy tokens, one
forward pass of one token per step writing its keys and values into the caches at its position.

    python3 bench/generate_torch.py --model gpt2 --batch 1 8 --modes eager compile [--json]
    python3 bench/generate_torch.py --model smollm --batch 1 8 --modes eager compile [--json]

Models (fp32, TF32 off, weights normal(0, 0.02), biases and norm shifts 0, norm scales 1):
  gpt2    GPT-2 small's shape as `sinter-bench generate` builds it (tools/src/gpt.rs): 12
          layers, width 768, 12 heads, vocabulary 2048, context 1024; pre-norm, fused q/k/v
          with bias, GELU (tanh) MLP of 4x, final layer norm, output tied to the token embedding,
          learned positions.
  smollm  SmolLM2-135M's shape: 30 layers, width 576, 9 query heads over 3 key/value heads of
          64, SwiGLU of 1536, RMSNorm (eps 1e-5), rotary positions (theta 100000), vocabulary
          49152, output tied to the embedding; context 2048.
--layers, --width, --vocab, --context override a shape (a quick check on the CPU:
`--device cpu --layers 2 --width 64 --vocab 100 --context 64 --prompt-tokens 16 --new-tokens 8`).

Modes:
  eager       the step reads the caches up to its position (a slice that grows by one key per
              token), SDPA without a mask; the prefill uses SDPA's causal mask.
  compile     torch.compile (default mode) of the prefill and of the step; the step reads the
              whole cache under a mask of the positions up to its own (static shapes, so one
              compilation serves every position), the position a tensor on the device.
  cudagraphs  as `compile` with mode="reduce-overhead": the step replays as one CUDA graph.

Timing (wall clock, after a warm-up run; median of --repeats runs): the prefill, synchronized;
the decoding: --new-tokens - 1 steps, each feeding back the argmax of the last logits computed
on the GPU, one synchronize at the end (the fastest a PyTorch loop runs: no host round trip per
token, where sinter reads each token's logits back); tokens/s = batch x steps / time.
Correctness: the logits after 16 prompt tokens fed one at a time through the step must equal
the prefill's over the same 16 (relative error below 1e-3), in every mode.
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {
    "gpt2": dict(kind="gpt2", layers=12, width=768, heads=12, kv_heads=12, ffn=3072,
                 vocab=2048, context=1024),
    "smollm": dict(kind="llama", layers=30, width=576, heads=9, kv_heads=3, ffn=1536,
                   vocab=49152, context=2048, rope_theta=100000.0, eps=1e-5),
}


def make_params(cfg, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(device)

    d, f, v = cfg["width"], cfg["ffn"], cfg["vocab"]
    hd = d // cfg["heads"]
    kv = cfg["kv_heads"] * hd
    p = {"emb": normal(v, d)}
    ones, zeros = (lambda n: torch.ones(n, device=device)), (lambda n: torch.zeros(n, device=device))
    if cfg["kind"] == "gpt2":
        p["pos"] = normal(cfg["context"], d)
        proj_std = 0.02 / math.sqrt(2 * cfg["layers"])
        for l in range(cfg["layers"]):
            p.update({
                f"{l}.ln1.g": ones(d), f"{l}.ln1.b": zeros(d),
                f"{l}.qkv.w": normal(d, 3 * d), f"{l}.qkv.b": zeros(3 * d),
                f"{l}.proj.w": normal(d, d, std=proj_std), f"{l}.proj.b": zeros(d),
                f"{l}.ln2.g": ones(d), f"{l}.ln2.b": zeros(d),
                f"{l}.fc.w": normal(d, f), f"{l}.fc.b": zeros(f),
                f"{l}.fc2.w": normal(f, d, std=proj_std), f"{l}.fc2.b": zeros(d),
            })
        p["lnf.g"], p["lnf.b"] = ones(d), zeros(d)
    else:
        for l in range(cfg["layers"]):
            p.update({
                f"{l}.attn_norm": ones(d), f"{l}.wq": normal(d, d), f"{l}.wk": normal(d, kv),
                f"{l}.wv": normal(d, kv), f"{l}.wo": normal(d, d), f"{l}.ffn_norm": ones(d),
                f"{l}.w_gate": normal(d, f), f"{l}.w_up": normal(d, f), f"{l}.w_down": normal(f, d),
            })
        p["norm"] = ones(d)
        inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.arange(cfg["context"], dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=1)
        p["cos"], p["sin"] = ang.cos().float().to(device), ang.sin().float().to(device)
    return p


def make_caches(cfg, batch, device):
    hd = cfg["width"] // cfg["heads"]
    shape = (batch, cfg["kv_heads"], cfg["context"], hd)
    return [(torch.zeros(shape, device=device), torch.zeros(shape, device=device))
            for _ in range(cfg["layers"])]


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def attend(q, k_cache, v_cache, k, v, start, n, static):
    """Writes `k`, `v` (n positions from `start`) into the caches and attends over them:
    `static` reads the whole cache under a mask of the positions each query may see;
    otherwise it reads the cache up to the last new position (start a Python int)."""
    if static:
        idx = start + torch.arange(n, device=q.device)
        k_cache.index_copy_(2, idx, k)
        v_cache.index_copy_(2, idx, v)
        keys = torch.arange(k_cache.shape[2], device=q.device)
        mask = keys[None, :] <= idx[:, None]
        kk, vv = k_cache, v_cache
    else:
        k_cache[:, :, start:start + n] = k
        v_cache[:, :, start:start + n] = v
        kk, vv = k_cache[:, :, :start + n], v_cache[:, :, :start + n]
        mask = None
    groups = q.shape[1] // kk.shape[1]
    if groups > 1:
        kk = kk.repeat_interleave(groups, dim=1)
        vv = vv.repeat_interleave(groups, dim=1)
    if mask is None and n > 1:
        # the prefill (start 0): causal among the prompt's own positions
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)


def forward(cfg, p, caches, ids, start, static):
    """Logits of the last of the `n` tokens `ids` [B, n] at positions start..start+n."""
    b, n = ids.shape
    d, h, kvh = cfg["width"], cfg["heads"], cfg["kv_heads"]
    hd = d // h
    positions = start + torch.arange(n, device=ids.device)
    x = p["emb"][ids]
    if cfg["kind"] == "gpt2":
        x = x + p["pos"][positions]
    else:
        cos, sin = p["cos"][positions], p["sin"][positions]
    for l in range(cfg["layers"]):
        kc, vc = caches[l]
        if cfg["kind"] == "gpt2":
            y = F.layer_norm(x, (d,), p[f"{l}.ln1.g"], p[f"{l}.ln1.b"], eps=1e-5)
            q, k, v = (y @ p[f"{l}.qkv.w"] + p[f"{l}.qkv.b"]).split(d, dim=2)
            q = q.reshape(b, n, h, hd).transpose(1, 2)
            k = k.reshape(b, n, h, hd).transpose(1, 2)
            v = v.reshape(b, n, h, hd).transpose(1, 2)
            a = attend(q, kc, vc, k, v, start, n, static)
            x = x + (a.transpose(1, 2).reshape(b, n, d) @ p[f"{l}.proj.w"] + p[f"{l}.proj.b"])
            y = F.layer_norm(x, (d,), p[f"{l}.ln2.g"], p[f"{l}.ln2.b"], eps=1e-5)
            m = F.gelu(y @ p[f"{l}.fc.w"] + p[f"{l}.fc.b"], approximate="tanh")
            x = x + (m @ p[f"{l}.fc2.w"] + p[f"{l}.fc2.b"])
        else:
            y = F.rms_norm(x, (d,), p[f"{l}.attn_norm"], eps=cfg["eps"])
            q = (y @ p[f"{l}.wq"]).reshape(b, n, h, hd).transpose(1, 2)
            k = (y @ p[f"{l}.wk"]).reshape(b, n, kvh, hd).transpose(1, 2)
            v = (y @ p[f"{l}.wv"]).reshape(b, n, kvh, hd).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            a = attend(q, kc, vc, k, v, start, n, static)
            x = x + a.transpose(1, 2).reshape(b, n, d) @ p[f"{l}.wo"]
            y = F.rms_norm(x, (d,), p[f"{l}.ffn_norm"], eps=cfg["eps"])
            x = x + (F.silu(y @ p[f"{l}.w_gate"]) * (y @ p[f"{l}.w_up"])) @ p[f"{l}.w_down"]
    if cfg["kind"] == "gpt2":
        x = F.layer_norm(x[:, -1], (d,), p["lnf.g"], p["lnf.b"], eps=1e-5)
    else:
        x = F.rms_norm(x[:, -1], (d,), p["norm"], eps=cfg["eps"])
    return x @ p["emb"].t()


class Generator:
    """The prefill and the step of one mode over one model's caches."""

    def __init__(self, cfg, p, batch, mode, device):
        self.cfg, self.p, self.mode = cfg, p, mode
        self.caches = make_caches(cfg, batch, device)
        static = mode != "eager"
        if static:
            for kc, vc in self.caches:
                torch._dynamo.mark_static_address(kc)
                torch._dynamo.mark_static_address(vc)

        def prefill(ids):
            return forward(cfg, p, self.caches, ids, 0, False)

        def step(ids, pos):
            return forward(cfg, p, self.caches, ids, pos, static)

        if mode == "eager":
            self.prefill, self.step = prefill, step
        else:
            opts = {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}
            self.prefill = torch.compile(prefill, **opts)
            self.step = torch.compile(step, **opts)
        self.static = static
        self.device = device

    def position(self, pos):
        return torch.tensor(pos, device=self.device) if self.static else pos

    def decode(self, logits, start, steps):
        """`steps` greedy tokens after `logits`, the first at position `start`."""
        pos = self.position(start)
        for _ in range(steps):
            tok = logits.argmax(-1, keepdim=True)
            logits = self.step(tok, pos)
            if self.static:
                pos = pos + 1
            else:
                pos += 1
        return logits


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check(gen, prompt):
    """The step against the prefill after 16 tokens: relative error of the logits."""
    n = min(16, prompt.shape[1])
    whole = gen.prefill(prompt[:, :n]).clone()
    logits = gen.prefill(prompt[:, :1]).clone()
    for i in range(1, n):
        logits = gen.step(prompt[:, i:i + 1], gen.position(i)).clone()
    err = (whole - logits).abs().max().item() / max(1.0, whole.abs().max().item())
    if not math.isfinite(err) or err > 1e-3:
        sys.exit(f"wrong result: the step's logits after {n} tokens differ from the "
                 f"prefill's by {err:.2e}")
    return err


def run(cfg, name, batch, mode, args):
    device = args.device
    p = make_params(cfg, device, seed=1)
    gen = Generator(cfg, p, batch, mode, device)
    g = torch.Generator(device="cpu").manual_seed(2)
    prompt = torch.randint(cfg["vocab"], (batch, args.prompt_tokens), generator=g).to(device)
    steps = args.new_tokens - 1
    with torch.inference_mode():
        t = time.perf_counter()
        err = check(gen, prompt)
        prefill_ms, token_ms = [], []
        for r in range(args.repeats + 1):
            sync(device)
            t0 = time.perf_counter()
            logits = gen.prefill(prompt)
            sync(device)
            t1 = time.perf_counter()
            logits = gen.decode(logits, args.prompt_tokens, steps)
            sync(device)
            t2 = time.perf_counter()
            if r > 0:
                prefill_ms.append((t1 - t0) * 1e3)
                token_ms.append((t2 - t1) * 1e3 / max(1, steps))
        setup_s = time.perf_counter() - t
    prefill = statistics.median(prefill_ms)
    token = statistics.median(token_ms)
    rec = {
        "bench": "generate", "impl": f"torch-{mode}", "model": name, "batch": batch,
        "context": cfg["context"], "vocab": cfg["vocab"], "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens, "prefill_ms": prefill, "token_ms": token,
        "tokens_per_s": batch * 1e3 / token, "check_error": err, "setup_s": setup_s,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "torch": torch.__version__,
    }
    print(f"{name} batch {batch} {mode}: prefill {prefill:.3f} ms "
          f"({batch * args.prompt_tokens * 1e3 / prefill:.0f} tokens/s); "
          f"{token:.3f} ms per step, {rec['tokens_per_s']:.1f} tokens/s; check {err:.1e}",
          file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(rec), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="gpt2")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--modes", nargs="+", choices=["eager", "compile", "cudagraphs"],
                    default=["eager", "compile"])
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for key in ("layers", "width", "vocab", "context"):
        ap.add_argument(f"--{key}", type=int)
    ap.add_argument("--json", action="store_true", help="one JSON line per result on stdout")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = dict(SHAPES[args.model])
    for key in ("layers", "width", "vocab", "context"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.width is not None and args.model == "gpt2":
        cfg["heads"] = cfg["kv_heads"] = max(1, args.width // 64)
    if args.width is not None:
        cfg["ffn"] = 4 * args.width if args.model == "gpt2" else (8 * args.width) // 3
    if cfg["width"] % cfg["heads"] or cfg["heads"] % cfg["kv_heads"]:
        sys.exit(f"the width {cfg['width']} does not split into {cfg['heads']} heads over "
                 f"{cfg['kv_heads']} key/value heads")
    if args.prompt_tokens + args.new_tokens > cfg["context"]:
        sys.exit(f"{args.prompt_tokens} + {args.new_tokens} tokens pass the context "
                 f"{cfg['context']}")
    for batch in args.batch:
        for mode in args.modes:
            run(cfg, args.model, batch, mode, args)


if __name__ == "__main__":
    main()
