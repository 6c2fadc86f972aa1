#!/usr/bin/env bash
# Everything measured on the H200 host in one session (see bench/README.md). Expects release
# binaries in .bench/ (sinter, sinter-bench, gpu_ops: the GPU test binary of tests/gpu_ops.rs)
# and the Vulkan loaders in .gl/; writes every result under $OUT.
set -u
source .gl/vulkan-env.sh > /dev/null
export XDG_RUNTIME_DIR=/tmp
# Tests read the bundled examples through the path they were built at.
mkdir -p /work && ln -sfn "$(pwd)" /work/main
S=.bench/sinter
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"

# 1. Matmul against PyTorch fp32 (TF32 off), same session.
.bench/sinter-bench matmul --sizes 1024,2048,4096 --repeats 20 --max-binding 2147483648 --json \
    > "$OUT/sinter_matmul.jsonl" 2> "$OUT/sinter_matmul.txt"
python3 bench/torch_matmul.py --sizes 1024,2048,4096 --repeats 20 --json > "$OUT/torch_matmul.jsonl" 2>&1
python3 bench/compare.py "$OUT/sinter_matmul.jsonl" "$OUT/torch_matmul.jsonl" > "$OUT/matmul_compare.txt" 2>&1

# 2. The GPU test suite.
.bench/gpu_ops --test-threads 4 > "$OUT/gpu_ops.txt" 2>&1

# 3. The examples, compiled and run; the transformer 100 steps.
for ex in mlp cnn transformer; do
  $S compile ir-spec/examples/$ex.sir -o /tmp/$ex.sart > "$OUT/example_$ex.txt" 2>&1
  args=$($S inspect /tmp/$ex.sart --json | python3 bench/random_inputs.py /tmp/in_$ex)
  steps=1; [ $ex = transformer ] && steps=100
  $S run /tmp/$ex.sart $args --steps $steps --verbose >> "$OUT/example_$ex.txt" 2>&1
done

# 4. The training demos.
$S train ir-spec/examples/digits_mlp.sir --data ir-spec/examples/data/digits/train --steps 1000 \
    --shuffle-seed 1 --eval ir-spec/examples/digits_mlp_eval.sir \
    --eval-data ir-spec/examples/data/digits/test --accuracy logits=labels > "$OUT/train_digits.txt" 2>&1
$S train ir-spec/examples/transformer_train.sir --data ir-spec/examples/data/text --steps 1500 \
    --shuffle-seed 1 --log-every 5 --log "$OUT/train_text_loss.csv" > "$OUT/train_text.txt" 2>&1

# 5. Where a training step spends its time.
.bench/sinter-bench run ir-spec/examples/transformer_train.sir --repeats 20 > "$OUT/profile_transformer_train.txt" 2>&1

cat "$OUT/gpu.txt" "$OUT/matmul_compare.txt"; grep "test result" "$OUT/gpu_ops.txt"
tail -n 3 "$OUT"/example_*.txt "$OUT"/train_*.txt
