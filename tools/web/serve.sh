#!/usr/bin/env bash
# Builds the training page (build.sh; pass --release for an optimized wasm) and serves it at
# http://localhost:${PORT:-8000}/ (WebGPU needs https or localhost).
set -euo pipefail
web=$(cd "$(dirname "$0")" && pwd)
"$web/build.sh" "$@"
exec python3 -m http.server --bind 127.0.0.1 --directory "$web" "${PORT:-8000}"
