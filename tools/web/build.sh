#!/usr/bin/env bash
# Builds the training page's files into tools/web/: the runtime for the browser (pkg/: wasm and
# its JS glue from the wasm-bindgen CLI), the artifacts (artifacts/: the digits MLP's training
# step and scoring, the character model's training step and generation) and the data (data/:
# the digits, the text's windows and vocabulary). Needs the wasm32 target and wasm-bindgen-cli 0.2.130:
#
#   rustup target add wasm32-unknown-unknown
#   cargo install wasm-bindgen-cli --version 0.2.130 --locked
#
# `tools/web/build.sh --release` builds an optimized wasm (slower to build); `--profile NAME`
# builds with another cargo profile (CI: `test`, which the wasm tests have built already). SINTER
# is the sinter binary to compile with (default: cargo run).
set -euo pipefail
web=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$web/../.." && pwd)
case "${1:-}" in
  --release) profile=release ;;
  --profile) profile=${2:?--profile needs a name} ;;
  "") profile=dev ;;
  *) echo "usage: build.sh [--release | --profile NAME]" >&2; exit 2 ;;
esac
case $profile in
  dev | test) out_dir=debug ;;
  *) out_dir=$profile ;;
esac

cargo build --manifest-path "$root/Cargo.toml" -p sinter-web --target wasm32-unknown-unknown \
  --profile "$profile"
wasm-bindgen --target web --out-dir "$web/pkg" \
  "$root/target/wasm32-unknown-unknown/$out_dir/sinter_web.wasm"

if [[ -n "${SINTER:-}" ]]; then
  sinter=("$SINTER")
else
  sinter=(cargo run -q --manifest-path "$root/Cargo.toml" -p sinter-cli --bin sinter --)
fi
mkdir -p "$web/artifacts"
for program in digits_mlp digits_mlp_eval; do
  "${sinter[@]}" compile --browser "$root/ir-spec/examples/$program.sir" \
    -o "$web/artifacts/$program.sart"
done
# the character model: its training step, and the prefill and step programs that write text;
# attention unfused: headless Chromium's WebGPU (SwiftShader) loses its device on the
# flash-attention kernels (ARCHITECTURE.md, runtime/web)
"${sinter[@]}" compile --browser --attention unfused "$root/ir-spec/examples/transformer_train.sir" \
  -o "$web/artifacts/text_train.sart"
"${sinter[@]}" compile --browser --attention unfused --generate \
  "$root/ir-spec/examples/transformer_train.sir" -o "$web/artifacts/text_generate.sart"
for split in train test; do
  mkdir -p "$web/data/$split"
  cp "$root/ir-spec/examples/data/digits/$split/"*.npy "$web/data/$split/"
done
mkdir -p "$web/data/text"
cp "$root/ir-spec/examples/data/text/"{ids.npy,targets.npy,vocab.txt} "$web/data/text/"
echo "built $web (serve it: python3 -m http.server -d $web 8000)"
