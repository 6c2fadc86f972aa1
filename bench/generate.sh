#!/usr/bin/env bash
# Text generation with a key/value cache: sinter's derived prefill and step programs against a
# plain PyTorch KV-cache loop (eager fp32, torch.compile, CUDA graphs) in the same host session
# (see bench/README.md). Prefill of 512 random tokens, then 256 greedy tokens, batch 1 and 8.
# Expects .bench/sinter-bench and the Vulkan loaders in .gl/; writes the logs under $OUT.
#
#   bash bench/generate.sh                       # GPT-2 small's shape (12 x 768, vocab 2048)
#   PROGRAM=smollm.sir bash bench/generate.sh    # a Llama generator's SmolLM2-135M program
#                                                # (context >= 768); PyTorch runs --model smollm
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
B=.bench/sinter-bench
if [ -n "${PROGRAM:-}" ]; then
  model=smollm; sinter_model=(--program "$PROGRAM")
else
  model=gpt2; sinter_model=(--layers 12 --width 768 --heads 12 --context 1024 --vocab 2048)
fi
log="$OUT/generate-$model.txt"
: > "$log"
for attention in auto unfused; do
  $B --json generate "${sinter_model[@]}" --batch 1,8 --attention $attention --profile \
    --max-binding 2147483644 >> "$OUT/generate-$model.jsonl" 2>> "$log"
done
python3 bench/generate_torch.py --model $model --batch 1 8 --modes eager compile cudagraphs \
  --json >> "$OUT/generate-$model.jsonl" 2>> "$log"
python3 - "$OUT/generate-$model.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"generate"' in l]
print("%-18s %5s %11s %9s %9s" % ("impl", "batch", "prefill ms", "ms/token", "tokens/s"))
for r in rows:
    print("%-18s %5d %11.2f %9.3f %9.1f"
          % (r["impl"], r["batch"], r["prefill_ms"], r["token_ms"], r["tokens_per_s"]))
PY
