#!/usr/bin/env bash
# The browser tests' fixtures: artifacts of the bundled examples (`sinter compile`) and the
# reference interpreter's outputs for them (`sinter eval`), written to OUT_DIR, which the tests
# embed at build time through SINTER_WEB_FIXTURES:
#
#   runtime/web/tests/fixtures.sh /tmp/web-fixtures
#   SINTER_WEB_FIXTURES=/tmp/web-fixtures cargo test -p sinter-web --target wasm32-unknown-unknown
#
# SINTER is the sinter binary to use (default: cargo run).
set -euo pipefail
out=${1:?usage: fixtures.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../../.." && pwd)
examples=$root/ir-spec/examples
inputs=$root/runtime/web/tests/data
if [[ -n "${SINTER:-}" ]]; then
  sinter=("$SINTER")
else
  sinter=(cargo run -q --manifest-path "$root/Cargo.toml" -p sinter-cli --bin sinter --)
fi
mkdir -p "$out"
# compiled for native GPUs (a matmul binds its arena twice), which a browser must refuse
"${sinter[@]}" compile "$examples/mlp.sir" -o "$out/mlp_native.sart"
# fixture name, example program, folder with x.npy and labels.npy
while read -r name program data; do
  "${sinter[@]}" compile --browser "$examples/$program.sir" -o "$out/$name.sart"
  "${sinter[@]}" eval "$examples/$program.sir" --input "x=$data/x.npy" \
    --input "labels=$data/labels.npy" --out "$out/$name" >/dev/null
  cp "$data/x.npy" "$data/labels.npy" "$out/$name/"
done <<LIST
mlp mlp $inputs/batch32
cnn cnn $inputs/cnn
digits_mlp digits_mlp $inputs/batch32
digits_mlp_eval digits_mlp_eval $examples/data/digits/test
LIST
# a generation artifact of a small Llama-shaped model (one sequence, a prefill of 4 tokens) and
# the interpreter's logits of its forward program at every position of two sequences; attention
# unfused: headless Chromium's WebGPU (SwiftShader) loses its device on the flash-attention
# kernels (ARCHITECTURE.md, runtime/web)
llama=$root/ir-spec/tests/decode/llama_tiny.sir
"${sinter[@]}" compile --browser --attention unfused --generate "$llama" --batch 1 --prefill 4 \
  -o "$out/lm_generate.sart" >/dev/null
"${sinter[@]}" eval "$llama" --input "ids=$inputs/decode/ids.npy" --out "$out/lm" >/dev/null
cp "$inputs/decode/ids.npy" "$out/lm/"
