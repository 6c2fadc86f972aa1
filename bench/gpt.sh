#!/usr/bin/env bash
# GPT-2-style training steps, sinter (optimized, --no-opt, and with MIXED=1 in mixed precision on
# tensor cores, attention chosen and flash forced) against PyTorch (eager fp32, eager bf16
# autocast, torch.compile with bf16 autocast and fused AdamW) in the same host session (see
# bench/README.md). Expects .bench/sinter-bench and the Vulkan loaders in .gl/; writes one log
# per shape under $OUT.
#
#   bash bench/gpt.sh "4 256 4" "12 768 12"      # layers width heads, one shape per argument
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
STEPS=${STEPS:-10}
for shape in "$@"; do
  set -- $shape
  name=gpt-$1x$2
  dir=/tmp/$name
  mkdir -p "$dir"
  log="$OUT/$name.txt"
  : > "$dir/sinter.jsonl"
  # the f32 runs last: the folder keeps their step-1 params, which gpt_torch.py checks against
  opts=()
  [[ ${MIXED:-0} == 1 ]] && opts+=("--precision mixed --tensor-cores" "--precision mixed --tensor-cores --attention flash")
  opts+=("--no-opt" "")
  for opt in "${opts[@]}"; do
    $B --json gpt --layers "$1" --width "$2" --heads "$3" --steps "$STEPS" --profile 2 \
      --max-binding 2147483644 $opt --out "$dir" >> "$dir/sinter.jsonl" 2>> "$log"
  done
  for mode in eager-fp32 eager-bf16 compile-bf16; do
    python3 bench/gpt_torch.py "$dir" --mode "$mode" --steps "$STEPS" --json >> "$log" 2>&1
  done
  cat "$dir/sinter.jsonl" >> "$log"
done
grep -h "^#" "$OUT"/gpt-*.txt | grep -E "torch|ms per step|steps on"
