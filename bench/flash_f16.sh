#!/usr/bin/env bash
# Attention forward + backward on f16 storage (`sinter-bench attention --f16`: q, k, v, dO
# and the results in f16, as autocast gives attention) on tensor cores, beside the same
# kernels on f32 storage and PyTorch's FlashAttention-2 on bf16, in one host session: head
# dims 64 and 128, causal and not. Expects .bench/sinter-bench and the Vulkan loaders in .gl/;
# writes logs and JSON lines under $OUT.
#
#   bash bench/flash_f16.sh
#   SEQ=1024,2048 DIMS=64 bash bench/flash_f16.sh
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
SEQ=${SEQ:-1024,2048,4096,8192}
DIMS=${DIMS:-"64 128"}
REPEATS=${REPEATS:-5}
for d in $DIMS; do
  heads=$((768 / d))
  shape="--batch 4 --heads $heads --head-dim $d"
  for causal in "" "--causal"; do
    tag=d$d${causal:+-causal}
    $B --json attention $shape $causal --seq "$SEQ" --policies flash-tc --f16 --repeats "$REPEATS" \
      --max-binding 2147483644 > "$OUT/$tag-f16.jsonl" 2> "$OUT/$tag.txt"
    $B --json attention $shape $causal --seq "$SEQ" --policies flash-tc --repeats "$REPEATS" \
      --max-binding 2147483644 > "$OUT/$tag-f32.jsonl" 2>> "$OUT/$tag.txt"
    python3 bench/attention_torch.py $shape $causal --seq "$SEQ" --repeats "$REPEATS" \
      --dtype bf16 --json > "$OUT/$tag-torch.jsonl" 2>> "$OUT/$tag.txt"
    cat "$OUT/$tag.txt"
  done
done
