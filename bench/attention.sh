#!/usr/bin/env bash
# Attention forward + backward, sinter (flash kernels, unfused, the cost model's pick) against
# PyTorch's scaled_dot_product_attention (memory-efficient and math backends, fp32, TF32 off) in
# the same host session (see bench/README.md). Expects .bench/sinter-bench and the Vulkan loaders
# in .gl/; writes logs and JSON lines under $OUT.
#
#   bash bench/attention.sh                    # GPT-2-small heads: batch 4, 12 heads, head dim 64
#   SEQ=512,1024 LONG=4096 bash bench/attention.sh
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
SEQ=${SEQ:-512,1024,2048}
LONG=${LONG:-4096,8192}
SHAPE=${SHAPE:-"--batch 4 --heads 12 --head-dim 64"}
REPEATS=${REPEATS:-10}
for causal in "" "--causal"; do
  tag=attention${causal:+-causal}
  # every policy where the unfused scores fit a binding; flash alone beyond
  $B --json attention $SHAPE $causal --seq "$SEQ" --repeats "$REPEATS" \
    --max-binding 2147483644 > "$OUT/$tag.jsonl" 2> "$OUT/$tag.txt"
  $B --json attention $SHAPE $causal --seq "$LONG" --policies flash,auto --repeats 3 \
    --max-binding 2147483644 >> "$OUT/$tag.jsonl" 2>> "$OUT/$tag.txt"
  python3 bench/attention_torch.py $SHAPE $causal --seq "$SEQ,$LONG" --repeats "$REPEATS" --json \
    > "$OUT/$tag-torch.jsonl" 2> "$OUT/$tag-torch.txt"
  python3 bench/compare.py "$OUT/$tag.jsonl" "$OUT/$tag-torch.jsonl" > "$OUT/$tag-compare.txt" 2>&1
  cat "$OUT/$tag.txt" "$OUT/$tag-torch.txt" "$OUT/$tag-compare.txt"
done
