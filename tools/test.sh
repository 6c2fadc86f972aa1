#!/usr/bin/env bash
# Every check sinter has, in one command, on a fresh Debian machine with Rust: installs or
# generates what the tests need (each step skipped when it is there already), then runs them.
#
#   tools/test.sh               set up, then: format, clippy, rustdoc, the workspace tests, the
#                               runtime's wasm tests in headless Chromium, the training page e2e
#   tools/test.sh --setup-only  set up only; afterwards plain `cargo test --workspace` works
#
# Set-up: a Vulkan driver (Mesa's software one, lavapipe, where none is installed); the ONNX
# backend node test suite of the pinned `onnx` package (generated into target/onnx-node-tests,
# or taken from $SINTER_ONNX_NODE_TESTS when that is set); Chromium and chromedriver; the
# wasm32 target; the wasm-bindgen CLI at the version runtime/web pins. System packages need
# root: run as another user, the script names what to install and exits with 1.
#
# .ci/run calls this script. Tests that need hardware CI lacks (the tensor-core checks) are
# reported as ignored; README, "Tests", says how to run them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

setup_only=false
case "${1:-}" in
  "") ;;
  --setup-only) setup_only=true ;;
  -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: tools/test.sh [--setup-only]" >&2; exit 2 ;;
esac

ONNX_VERSION=1.19.0
# The wasm-bindgen CLI must be the version of the crate sinter-web pins (`=x.y.z`).
WASM_BINDGEN_VERSION=$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' runtime/web/Cargo.toml)
[[ -n $WASM_BINDGEN_VERSION ]] || { echo "test.sh: no wasm-bindgen pin in runtime/web/Cargo.toml" >&2; exit 1; }
CHROMIUM=/usr/lib/chromium/chromium # the binary runtime/web/webdriver.json names

say() { echo "test.sh: $*"; }
# Runs a command with its output kept in a log, shown only when the command fails.
quietly() {
  local log
  log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    say "failed: $*" >&2
    return 1
  fi
  rm -f "$log"
}
is_root() { [[ $(id -u) -eq 0 ]]; }
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  quietly apt-get update -qq
  quietly apt-get install -y -qq "$@"
}

# ---------------------------------------------------------------------------------------------
# What is missing. System packages are gathered first, so that a user who is not root learns
# everything to install at once.

# The Vulkan drivers installed (their loader manifests' names); fails where there are none.
vulkan_drivers() {
  local f found=()
  for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json \
    /usr/local/share/vulkan/icd.d/*.json ${VK_ICD_FILENAMES:+${VK_ICD_FILENAMES//:/ }} \
    ${VK_DRIVER_FILES:+${VK_DRIVER_FILES//:/ }}; do
    [[ -e $f ]] && found+=("$(basename "$f" .json)")
  done
  ((${#found[@]})) && echo "${found[*]}"
}
# (Whole outputs are captured before matching: `grep -q` stops reading early, and under pipefail
# the writer's SIGPIPE would read as a failure.)
vulkan_loader() {
  [[ $({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null) == *"libvulkan.so.1 "* ]]
}

node_suite=${SINTER_ONNX_NODE_TESTS:-$root/target/onnx-node-tests}
# The generated suite carries a stamp naming the onnx version that wrote it.
node_suite_present() {
  if [[ -n ${SINTER_ONNX_NODE_TESTS:-} ]]; then
    [[ -d $node_suite/node ]] && [[ -n $(ls -A "$node_suite/node") ]]
  else
    [[ $(cat "$node_suite/onnx-version" 2>/dev/null) == "$ONNX_VERSION" ]]
  fi
}
onnx_present() {
  [[ $(python3 -c 'import onnx; print(onnx.__version__)' 2>/dev/null) == "$ONNX_VERSION" ]]
}

packages=()
if vulkan_drivers >/dev/null && vulkan_loader; then
  vulkan_state="present ($(vulkan_drivers)), skipped"
else
  packages+=(mesa-vulkan-drivers libvulkan1)
  vulkan_state="none found: installing Mesa's software Vulkan (mesa-vulkan-drivers libvulkan1)"
fi
command -v python3 >/dev/null || packages+=(python3)
if ! node_suite_present && ! onnx_present \
  && ! python3 -m pip --version >/dev/null 2>&1; then
  packages+=(python3-pip)
fi
if [[ -x $CHROMIUM ]] && command -v chromedriver >/dev/null; then
  chromium_state="present, skipped"
else
  packages+=(chromium chromium-driver)
  chromium_state="installing (chromium chromium-driver)"
fi

if ((${#packages[@]})) && ! is_root; then
  say "missing system packages; install them (as root), then run this again:" >&2
  echo "  sudo apt-get install -y ${packages[*]}" >&2
  exit 1
fi
if ((${#packages[@]})) && ! command -v apt-get >/dev/null; then
  say "missing, and no apt-get to install them with: ${packages[*]}" >&2
  exit 1
fi

# ---------------------------------------------------------------------------------------------
# Set-up

say "Vulkan driver: $vulkan_state"
say "Chromium and chromedriver: $chromium_state"
if ((${#packages[@]})); then
  apt_install "${packages[@]}"
fi

if node_suite_present; then
  say "ONNX node suite: $node_suite holds it, skipped"
else
  if onnx_present; then
    say "onnx $ONNX_VERSION (Python): present, skipped"
  else
    say "onnx $ONNX_VERSION (Python): installing (pip)"
    # Debian marks its Python as externally managed (PEP 668); as root, install into it anyway.
    is_root && export PIP_BREAK_SYSTEM_PACKAGES=1
    if ! quietly python3 -m pip install --quiet "onnx==$ONNX_VERSION"; then
      say "install onnx $ONNX_VERSION for python3 (in a virtual environment, or with" \
        "--user --break-system-packages on Debian's Python), then run this again:" >&2
      echo "  python3 -m pip install onnx==$ONNX_VERSION" >&2
      exit 1
    fi
  fi
  say "ONNX node suite: generating into $node_suite"
  # generate-data expects its node/ folder to exist already.
  mkdir -p "$node_suite/node"
  quietly python3 -m onnx.backend.test.cmd_tools generate-data -o "$node_suite"
  [[ -n ${SINTER_ONNX_NODE_TESTS:-} ]] || echo "$ONNX_VERSION" >"$node_suite/onnx-version"
fi

if cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; then
  say "rustfmt and clippy: present, skipped"
else
  say "rustfmt and clippy: installing (rustup component add rustfmt clippy)"
  quietly rustup component add rustfmt clippy
fi

if [[ $'\n'$(rustup target list --installed 2>/dev/null)$'\n' == *$'\nwasm32-unknown-unknown\n'* ]]; then
  say "wasm32 target: present, skipped"
else
  say "wasm32 target: installing (rustup target add wasm32-unknown-unknown)"
  quietly rustup target add wasm32-unknown-unknown
fi

if [[ $(wasm-bindgen-test-runner --version 2>/dev/null) == "wasm-bindgen-test-runner $WASM_BINDGEN_VERSION" ]] \
  && [[ $(wasm-bindgen --version 2>/dev/null) == "wasm-bindgen $WASM_BINDGEN_VERSION" ]]; then
  say "wasm-bindgen CLI $WASM_BINDGEN_VERSION: present, skipped"
else
  say "wasm-bindgen CLI $WASM_BINDGEN_VERSION: installing (cargo install, a few minutes)"
  # --locked first; some registry mirrors lack a crate version its lock file names, and then the
  # newest compatible versions do.
  cargo install -q wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --locked >/dev/null 2>&1 \
    || quietly cargo install -q wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi

if $setup_only; then
  say "set up; \`cargo test --workspace\` finds the node suite in $node_suite"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# The checks, cheapest first. Each step prints one line, then its tool's own output.

export SINTER_ONNX_NODE_TESTS=$node_suite
# Mesa's window-system code warns on every device creation when this is unset.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

times=()
current=
trap 'say "FAILED: $current" >&2' ERR
# `step LABEL COMMAND...`: says LABEL, runs COMMAND, records how long it took.
step() {
  local start=$SECONDS
  current=$1
  say "$1"
  shift
  "$@"
  times+=("${current%% (*} $((SECONDS - start))s")
}

# The wasm tests' fixtures: artifacts of the bundled examples and the interpreter's outputs for
# them, written by the sinter binary that the workspace tests built and ran (`cargo build -p
# sinter-cli` would build its dependencies again, with the features of that package alone).
browser_fixtures() {
  [[ -x target/debug/sinter ]] || cargo build -q --profile test -p sinter-cli --bin sinter
  SINTER=target/debug/sinter runtime/web/tests/fixtures.sh "$fixtures"
}
# The wasm tests in headless Chromium (WebGPU on SwiftShader, on the CPU) through chromedriver.
browser_tests() {
  SINTER_WEB_FIXTURES="$fixtures" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    CHROMEDRIVER="$(command -v chromedriver)" \
    WASM_BINDGEN_TEST_TIMEOUT=600 WASM_BINDGEN_TEST_DRIVER_TIMEOUT=60 \
    cargo test -p sinter-web --target wasm32-unknown-unknown
}
# The training page end to end: trains the digits MLP in the browser to >= 90% held-out
# accuracy; screenshots of the loss curve and the page go to target/ci-artifacts/.
training_page() {
  SINTER=target/debug/sinter tools/web/build.sh --profile test
  python3 tools/web/e2e.py --chromedriver "$(command -v chromedriver)" \
    --screenshots target/ci-artifacts
}

step "format (cargo fmt --all --check)" cargo fmt --all --check
step "clippy (cargo clippy --workspace --all-targets -- -D warnings)" \
  cargo clippy -q --workspace --all-targets -- -D warnings
# Private items too, so that intra-doc links to them resolve and are checked (and
# private-intra-doc-links, which warns of such links, is off).
step "rustdoc (cargo doc --no-deps --workspace --document-private-items, warnings denied)" \
  env RUSTDOCFLAGS="-D warnings -A rustdoc::private-intra-doc-links" \
  cargo doc -q --no-deps --workspace --document-private-items
step "workspace tests (cargo test --workspace)" cargo test --workspace
fixtures=$(mktemp -d)
step "browser fixtures (runtime/web/tests/fixtures.sh)" browser_fixtures
step "browser tests (cargo test -p sinter-web --target wasm32-unknown-unknown)" browser_tests
rm -rf "$fixtures"
step "training page (tools/web/e2e.py)" training_page

trap - ERR
say "all passed in $((SECONDS / 60))m$((SECONDS % 60))s ($(IFS=,; echo "${times[*]}" | sed 's/,/, /g'))"
