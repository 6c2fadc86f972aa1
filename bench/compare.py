#!/usr/bin/env python3
"""Ratio table of sinter against PyTorch from JSON-line results.

    python3 bench/compare.py sinter.jsonl torch.jsonl

Reads every line that is a JSON object with "bench", "impl" and "n" (other lines are skipped, so
mixed logs work), pairs results of the same bench, dtype and n, and prints per size both kernel
times, both TFLOP/s, and the ratios: `time x` = sinter kernel time / torch kernel time (above 1:
sinter is slower), `% torch` = sinter TFLOP/s as a share of torch's. Where one file holds several
results for the same key, the last wins. Exits 1 when any result says "ok": false.
"""

import json
import sys


def load(paths):
    results = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not all(k in r for k in ("bench", "impl", "n")):
                    continue
                key = (r["bench"], r.get("dtype", "f32"), r["n"])
                results.setdefault(key, {})[r["impl"]] = r
    return results


def fmt(x, spec):
    """`x` formatted as `spec` ("10.4f"), or a dash as wide."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return format(x, spec)
    return "-".rjust(int(spec.split(".")[0]))


def order(item):
    # square sizes (numbers) by size first, then shape labels (strings) by text
    bench, dtype, n = item[0]
    return (bench, dtype, isinstance(n, str), n if isinstance(n, int) else 0, str(n))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    results = load(sys.argv[1:])
    if not results:
        sys.exit("compare.py: no results found")
    header = (f"{'bench':<8} {'dtype':<5} {'n':>6}  {'sinter ms':>10} {'torch ms':>10} {'time x':>7}  "
              f"{'sinter TF/s':>11} {'torch TF/s':>10} {'% torch':>7}  {'sinter wall':>11} {'torch wall':>10}  "
              f"{'floor ms':>9}")
    print(header)
    bad = False
    for (bench, dtype, n), by_impl in sorted(results.items(), key=order):
        s, t = by_impl.get("sinter", {}), by_impl.get("torch", {})
        bad |= any(r.get("ok") is False for r in by_impl.values())
        sk, tk = s.get("kernel_ms"), t.get("kernel_ms")
        sf, tf = s.get("tflops"), t.get("tflops")
        ratio = sk / tk if sk and tk else None
        share = 100 * sf / tf if sf and tf else None
        floor = s.get("floor_ms", t.get("floor_ms"))
        flags = "".join(f" [{impl} WRONG]" for impl, r in by_impl.items() if r.get("ok") is False)
        print(f"{bench:<8} {dtype:<5} {str(n):>6}  {fmt(sk, '10.4f')} {fmt(tk, '10.4f')} {fmt(ratio, '7.2f')}  "
              f"{fmt(sf, '11.2f')} {fmt(tf, '10.2f')} {fmt(share, '7.1f')}  "
              f"{fmt(s.get('wall_ms'), '11.3f')} {fmt(t.get('wall_copy_ms', t.get('wall_ms')), '10.3f')}  "
              f"{fmt(floor, '9.4f')}{flags}")
    print("time x: sinter / torch kernel time (GPU timestamps vs CUDA events, medians); "
          "walls: sinter's Session::run vs torch with host copies (wall_copy_ms)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
