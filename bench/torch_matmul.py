#!/usr/bin/env python3
"""PyTorch fp32 matmul (TF32 off), timed like `sinter-bench matmul`, for the ratio table.

    python3 bench/torch_matmul.py --sizes 1024,2048,4096 --repeats 20 [--json]
    python3 bench/torch_matmul.py --sizes 4096 --dtype bf16 --tolerance 1e-2   # cuBLAS on tensor cores
    python3 bench/torch_matmul.py --shapes 2048x768x2304,48*512x64x512:bt,768x2048x768:at --json

`--shapes` takes `[B*]MxKxN[:at][:bt]` like `sinter-bench matmul --shapes`: B batch entries, and
`:at` / `:bt` make that operand a transposed view of its storage (`[.., K, M]` / `[.., N, K]`);
the JSON `n` is then that label.

Per size: random inputs (never zero: magnitude in [0.25, 1], either sign), `warmup` untimed
calls, then `repeats` calls each timed with a pair of `torch.cuda.Event`s; the median is the
kernel time. Every timed result is checked against a float64 product on the GPU (error relative
to max |ref|). `wall_ms` is the median host time of one call plus `torch.cuda.synchronize()`;
`wall_copy_ms` adds what `sinter-bench`'s wall time includes: copying a and b from host memory and
c back (sinter's `Session::run` writes its inputs and reads its outputs every run).

With --json, one JSON line per size on stdout (the table goes to stderr), in the format
`bench/compare.py` reads next to `sinter-bench matmul --json`.
"""

import argparse
import json
import statistics
import sys
import time

import torch

PEAK_FLOPS = 67e12  # H200 fp32 FMA peak on paper (GPU.md)
PEAK_TENSOR_FLOPS = 989e12  # H200 dense f16/bf16 tensor-core peak on paper
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
PEAK_BYTES = 4.26e12  # measured device copy bandwidth, read + write (GPU.md)


def nonzero(shape, generator, device, dtype=torch.float32):
    magnitude = 0.25 + 0.75 * torch.rand(*shape, generator=generator, device=device)
    sign = torch.randint(0, 2, shape, generator=generator, device=device) * 2 - 1
    return (magnitude * sign).to(dtype)


def parse_shape(text):
    """`[B*]MxKxN[:at][:bt]` -> (batch, m, k, n, at, bt)."""
    dims, *flags = text.split(":")
    batch, _, dims = dims.rpartition("*")
    m, k, n = (int(d) for d in dims.split("x"))
    if any(f not in ("at", "bt") for f in flags):
        raise SystemExit(f"torch_matmul.py: flags in `{text}` are `at` and `bt`")
    return int(batch or 1), m, k, n, "at" in flags, "bt" in flags


def bench(label, shape, repeats, warmup, seed, tolerance, dtype="f32"):
    """One shape; `dtype` f16 or bf16 runs cuBLAS on tensor cores (operands and result in it,
    f32 accumulation), checked against the float64 product of the rounded operands."""
    batch, m, k, n, at, bt = shape
    torch_dtype = DTYPES[dtype]
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(seed + m)
    lead = (batch,) if batch > 1 else ()
    a = nonzero(lead + ((k, m) if at else (m, k)), gen, device, torch_dtype)
    b = nonzero(lead + ((n, k) if bt else (k, n)), gen, device, torch_dtype)
    if at:
        a = a.transpose(-2, -1)
    if bt:
        b = b.transpose(-2, -1)
    c = torch.empty(lead + (m, n), device=device, dtype=torch_dtype)
    ref = a.double() @ b.double()
    max_ref = ref.abs().max().item()
    mm = torch.bmm if batch > 1 else torch.mm

    for _ in range(warmup):
        mm(a, b, out=c)
    torch.cuda.synchronize()

    times, worst = [], 0.0
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        mm(a, b, out=c)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))  # ms
        worst = max(worst, ((c.double() - ref).abs().max().item()) / max_ref)

    walls = []
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a, b, out=c)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)

    a_host, b_host = a.cpu(), b.cpu()
    copies = []
    for _ in range(repeats):
        t = time.perf_counter()
        ga, gb = a_host.to(device), b_host.to(device)
        c_host = mm(ga, gb).cpu()  # .cpu() synchronizes
        copies.append((time.perf_counter() - t) * 1e3)
    del c_host

    kernel_ms = statistics.median(times)
    flops = 2.0 * batch * m * k * n
    peak = PEAK_FLOPS if dtype == "f32" else PEAK_TENSOR_FLOPS
    flop_floor = flops / peak * 1e3
    element = 4 if dtype == "f32" else 2
    byte_floor = element * batch * (m * k + k * n + m * n) / PEAK_BYTES * 1e3
    return {
        "bench": "matmul",
        "impl": "torch",
        "dtype": dtype,
        "n": label,
        "batch": batch,
        "m": m,
        "k": k,
        "cols": n,
        "repeats": repeats,
        "kernel_ms": kernel_ms,
        "wall_ms": statistics.median(walls),
        "wall_copy_ms": statistics.median(copies),
        "tflops": flops / (kernel_ms * 1e-3) / 1e12,
        "floor_ms": max(flop_floor, byte_floor),
        "flop_floor_ms": flop_floor,
        "byte_floor_ms": byte_floor,
        "max_rel_err": worst,
        "checked": batch * m * n,
        "ok": worst <= tolerance,
        "adapter": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,2048,4096", help="comma-separated n")
    p.add_argument("--shapes", default="", help="comma-separated [B*]MxKxN[:at][:bt]; replaces --sizes")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=1e-4, help="max error / max |ref|")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout, table on stderr")
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES), help="operands and result; f16 and bf16 run on tensor cores")
    args = p.parse_args()

    if not torch.cuda.is_available():
        sys.exit("torch_matmul.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    table = sys.stderr if args.json else sys.stdout
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, TF32 off", file=table)
    print(f"{'n':>18}  {'kernel ms':>10}  {'TFLOP/s':>8}  {'wall ms':>9}  {'+copy ms':>9}  "
          f"{'floor ms':>9}  {'%peak':>6}  {'max rel err':>11}", file=table)
    wrong = False
    if args.shapes:
        runs = [(s, parse_shape(s)) for s in args.shapes.split(",") if s.strip()]
    else:
        runs = [(int(s), (1, int(s), int(s), int(s), False, False))
                for s in args.sizes.split(",") if s.strip()]
    for label, shape in runs:
        r = bench(label, shape, args.repeats, args.warmup, args.seed, args.tolerance, args.dtype)
        wrong |= not r["ok"]
        print(f"{str(label):>18}  {r['kernel_ms']:>10.4f}  {r['tflops']:>8.2f}  {r['wall_ms']:>9.4f}  "
              f"{r['wall_copy_ms']:>9.3f}  {r['floor_ms']:>9.4f}  "
              f"{100 * r['floor_ms'] / r['kernel_ms']:>6.1f}  {r['max_rel_err']:>11.2e}", file=table)
        if args.json:
            print(json.dumps(r), flush=True)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
