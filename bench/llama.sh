#!/usr/bin/env bash
# SmolLM2-135M-shaped Llama training steps (30 x 576, 9 heads over 3 key/value heads, MLP 1536,
# vocabulary 49152, batch 4), sinter (f32, and --precision mixed on tensor cores) against PyTorch (eager fp32, eager bf16 autocast,
# torch.compile with bf16 autocast and fused AdamW) in the same host session; every PyTorch
# run first checks its losses and its params after one step against sinter's. Expects
# .bench/sinter-bench and the Vulkan loaders in .gl/; writes one log per context under $OUT.
#
#   bash bench/llama.sh 512 128          # contexts, one run each
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
STEPS=${STEPS:-10}
for context in "$@"; do
  name=llama-smollm2-s$context
  dir=/tmp/$name
  mkdir -p "$dir"
  log="$OUT/$name.txt"
  : > "$dir/sinter.jsonl"
  # f32 last: the folder keeps its step-1 params, which llama_torch.py checks against
  for precision in "mixed --tensor-cores" f32; do
    $B --json llama --context "$context" --steps "$STEPS" --profile 2 --precision $precision \
      --max-binding 2147483644 --out "$dir" >> "$dir/sinter.jsonl" 2>> "$log"
  done
  for mode in eager-fp32 eager-bf16 compile-bf16; do
    python3 bench/llama_torch.py "$dir" --mode "$mode" --steps "$STEPS" --json >> "$log" 2>&1
  done
  cat "$dir/sinter.jsonl" >> "$log"
done
grep -h "^#" "$OUT"/llama-*.txt | grep -E "losses|params after|per step|llama 30x"
