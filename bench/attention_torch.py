#!/usr/bin/env python3
"""PyTorch's side of `sinter-bench attention`: the same step (O = attention(q, k, v), then dQ, dK,
dV for the output gradient w), fp32 with TF32 off, through scaled_dot_product_attention with
each backend that takes fp32:

- `torch`: the memory-efficient kernel (fused forward and backward, no [S, S] buffer; the
  FlashAttention backend itself takes only fp16/bf16);
- `torch-math`: the unfused reference (matmul, softmax, matmul, and autograd's backward).

With `--dtype bf16` the operands are bf16 and the one backend is `torch-flash`, FlashAttention-2
(`sdpa_kernel(FLASH_ATTENTION)`): what a PyTorch user's autocast training step runs, the
reference for sinter's `flash-tc` policy.

    python3 bench/attention_torch.py --seq 512,1024,2048,4096 --batch 4 --heads 12 --head-dim 64 \
        [--causal] [--repeats 10] [--json]

Timed with CUDA events around forward + backward after two warm-up steps; the median of the
repeats. `--kernels` also lists the CUDA kernels the memory-efficient backend launched for one
step, by `torch.profiler` (on sm80 and later they are CUTLASS's `fmha_cutlass{F,B}_f32_..._sm80`,
whose fp32 products run on tensor cores as three TF32 products each, `OpMultiplyAddFastF32`
in PyTorch's `mem_eff_attention/gemm_kernel_utils.h`, whatever `allow_tf32` says). TFLOP/s
counts as FlashAttention-2 does (forward 4·B·H·S²·D, backward 2.5 times that, halved when
causal). A backend that fails (out of memory) prints why and the others go on.
"""

import argparse
import json
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def label(b, h, s, d, causal):
    return f"{b}x{h}x{s}x{d}{'c' if causal else ''}"


def step(q, k, v, w, causal):
    for t in (q, k, v):
        t.grad = None
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(w)


def time_backend(backend, b, h, s, d, causal, repeats, dtype=torch.float32):
    gen = torch.Generator(device="cuda").manual_seed(s)
    shape = (b, h, s, d)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen, dtype=dtype, requires_grad=True)
               for _ in range(3))
    w = torch.randn(shape, device="cuda", generator=gen, dtype=dtype)
    with sdpa_kernel([backend]):
        for _ in range(2):
            step(q, k, v, w, causal)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(q, k, v, w, causal)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated()


def kernels(b, h, s, d, causal):
    """The CUDA kernels one step of the memory-efficient backend launches, with their times."""
    gen = torch.Generator(device="cuda").manual_seed(s)
    shape = (b, h, s, d)
    q, k, v = (torch.randn(shape, device="cuda", generator=gen, requires_grad=True) for _ in range(3))
    w = torch.randn(shape, device="cuda", generator=gen)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        step(q, k, v, w, causal)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step(q, k, v, w, causal)
            torch.cuda.synchronize()
    return [(e.device_time_total / 1000.0, e.key) for e in prof.key_averages() if e.device_time_total > 0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", default="512,1024,2048,4096")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: time FlashAttention-2 on bf16 operands instead of the fp32 backends")
    p.add_argument("--kernels", action="store_true", help="list the memory-efficient backend's CUDA kernels")
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    b, h, d, causal = args.batch, args.heads, args.head_dim, args.causal
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    print("S       backend      kernel ms  TFLOP/s  peak MiB  note", file=sys.stderr)
    for s in [int(x) for x in args.seq.split(",")]:
        flops = 3.5 * 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
        if args.dtype == "bf16":
            backends, dtype = [("torch-flash", SDPBackend.FLASH_ATTENTION)], torch.bfloat16
        else:
            backends = [("torch", SDPBackend.EFFICIENT_ATTENTION), ("torch-math", SDPBackend.MATH)]
            dtype = torch.float32
        for name, backend in backends:
            record = {"bench": "attention", "impl": name, "n": label(b, h, s, d, causal), "batch": b,
                      "heads": h, "seq": s, "head_dim": d, "causal": causal, "dtype": args.dtype,
                      "torch": torch.__version__}
            try:
                ms, peak = time_backend(backend, b, h, s, d, causal, args.repeats, dtype)
            except (RuntimeError, torch.OutOfMemoryError) as e:
                why = str(e).splitlines()[0]
                print(f"{s:<7} {name:<12} {'-':>9}  {'-':>7}  {'-':>8}  failed: {why}", file=sys.stderr)
                record["error"] = why
                torch.cuda.empty_cache()
            else:
                tflops = flops / (ms * 1e-3) / 1e12
                print(f"{s:<7} {name:<12} {ms:>9.3f}  {tflops:>7.2f}  {peak / 2**20:>8.1f}", file=sys.stderr)
                record.update(kernel_ms=ms, tflops=tflops, peak_bytes=peak)
            if args.json:
                print(json.dumps(record))
            sys.stdout.flush()
        if args.kernels:
            for ms, name in sorted(kernels(b, h, s, d, causal), reverse=True):
                print(f"        kernel {ms:>9.3f}  {name[:120]}", file=sys.stderr)


if __name__ == "__main__":
    main()
