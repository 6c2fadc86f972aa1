#!/usr/bin/env bash
# Mixed precision against f32 on the byte-level transformer (issue 27: "the byte-level GPT
# trained 4000 steps mixed ends within 1% of f32's held-out loss"): data/text split into its
# first 90% of windows for training and the windows after a 16-character gap for held-out
# evaluation, `transformer_train.sir` trained 4000 steps in each precision from the same seed,
# the held-out loss every 1000 steps. Extra arguments go to both `sinter train` runs (e.g.
# `--tensor-cores` on the H200, or a `--target FILE.json`). Needs numpy; writes under $OUT.
#
#   OUT=/tmp/conv SINTER=target/release/sinter bash bench/text_convergence.sh [--tensor-cores]
set -eu
OUT=${OUT:-/tmp/text-convergence}
SINTER=${SINTER:-.bench/sinter}
STEPS=${STEPS:-4000}
mkdir -p "$OUT/train" "$OUT/eval"
python3 - "$OUT" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
ids = np.load("ir-spec/examples/data/text/ids.npy")
targets = np.load("ir-spec/examples/data/text/targets.npy")
cut = int(len(ids) * 0.9) // 4 * 4          # whole batches of 4
first = cut + 16                            # no character shared with the training windows
count = (len(ids) - first) // 4 * 4
np.save(f"{out}/train/ids.npy", ids[:cut]); np.save(f"{out}/train/targets.npy", targets[:cut])
np.save(f"{out}/eval/ids.npy", ids[first:first + count])
np.save(f"{out}/eval/targets.npy", targets[first:first + count])
print(f"# {cut} training windows, {count} held out from window {first}")
PY
grep -v "^  train loss" ir-spec/examples/transformer_train.sir \
  | sed 's/graph transformer_train/graph transformer_eval/' > "$OUT/eval.sir"
for precision in f32 mixed; do
  "$SINTER" train ir-spec/examples/transformer_train.sir --data "$OUT/train" --steps "$STEPS" \
    --shuffle-seed 1 --log-every 50 --log "$OUT/loss_$precision.csv" --precision $precision \
    --eval "$OUT/eval.sir" --eval-data "$OUT/eval" --eval-every 1000 "$@" \
    > "$OUT/train_$precision.txt" 2>&1
  echo "# $precision: $(grep -E '^eval' "$OUT/train_$precision.txt" | tr '\n' ';')"
done
