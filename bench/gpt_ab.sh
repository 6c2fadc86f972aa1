#!/usr/bin/env bash
# Two sinter-bench binaries on the GPT-2-small-shaped step (and the 4 x 256 one), alternating
# twice, then PyTorch eager on the same weights and batch, all in one host session: the A/B
# comparison behind BENCHMARKS.md's step figures. Expects both binaries in .bench/ and the
# Vulkan loaders in .gl/; writes one log per run under $OUT.
#
#   bash bench/gpt_ab.sh sinter-bench-old sinter-bench-new
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
A="$1"; B="$2"
for round in 1 2; do
  for bin in "$A" "$B"; do
    .bench/$bin --json gpt --layers 12 --width 768 --heads 12 --steps 10 --profile 2 \
      --max-binding 2147483644 --out /tmp/g > "$OUT/gpt_${bin}_$round.txt" 2>&1
  done
done
python3 bench/gpt_torch.py /tmp/g --steps 10 > "$OUT/torch_gpt.txt" 2>&1
for bin in "$A" "$B"; do
  .bench/$bin --json gpt --layers 4 --width 256 --heads 4 --steps 20 --profile 2 \
    --max-binding 2147483644 --out /tmp/g4 > "$OUT/gpt4_${bin}.txt" 2>&1
done
python3 bench/gpt_torch.py /tmp/g4 --steps 20 > "$OUT/torch_gpt4.txt" 2>&1
grep -H "per step" "$OUT"/*.txt
