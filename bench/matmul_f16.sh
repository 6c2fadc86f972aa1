#!/usr/bin/env bash
# Matmuls of f16 operands on tensor cores (`sinter-bench matmul --f16 --tensor-cores`, every
# tensor-core block shape and the chosen one) against cuBLAS in bf16 and f16 in the same host
# session, at 4096³ and the GPT-2-small training step's shapes (issue 27's first target:
# >= 0.5x cuBLAS bf16's TFLOP/s). Expects .bench/sinter-bench and the Vulkan loaders in .gl/;
# writes under $OUT.
#
#   bash bench/matmul_f16.sh
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
SHAPES=4096x4096x4096,2048x768x2304,2048x768x3072,2048x3072x768,2048x768x768,768x2048x2304:at,3072x2048x768:at,2048x2304x768:bt
for tile in "" "--tile tc:128x128x32x32x64" "--tile tc:64x128x32x32x32" "--tile tc:64x64x32x16x32"; do
  $B matmul --shapes "$SHAPES" --f16 --tensor-cores $tile --tolerance 2e-3 --repeats 20 \
    --max-binding 2147483644 --json >> "$OUT/sinter_matmul_f16.jsonl" 2>> "$OUT/sinter_matmul_f16.txt"
done
for dtype in bf16 f16; do
  python3 bench/torch_matmul.py --shapes "$SHAPES" --dtype $dtype --tolerance 1e-2 --repeats 20 \
    --json >> "$OUT/torch_matmul_f16.jsonl" 2>> "$OUT/torch_matmul_f16.txt"
done
python3 - "$OUT/sinter_matmul_f16.jsonl" "$OUT/torch_matmul_f16.jsonl" <<'PY' | tee "$OUT/matmul_f16_compare.txt"
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.startswith("{")]
cublas = {r["n"]: r["tflops"] for r in rows if r["impl"] == "torch" and r["dtype"] == "bf16"}
print(f"{'shape':>18} {'tile':>22} {'TFLOP/s':>8} {'cuBLAS bf16':>11} {'ratio':>6} {'ok':>3}")
for r in rows:
    if r["impl"] == "sinter":
        ref = cublas.get(r["n"], float("nan"))
        print(f"{r['n']:>18} {r['tile']:>22} {r['tflops']:8.1f} {ref:11.1f} {r['tflops'] / ref:6.2f} {'y' if r['ok'] else 'n':>3}")
PY
