//! The emitted WGSL of every bundled example, committed under `snapshots/wgsl/` and reviewed
//! like code. Refresh with `INSTA_UPDATE=always cargo test -p sinter-tests --test wgsl_snapshots`
//! and read the diff.

use std::fmt::Write;

fn snapshot(name: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots/wgsl"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_snapshot!(name, text));
}

fn check(example: &str) {
    let path = format!(
        "{}/../ir-spec/examples/{example}.sir",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(&path).expect("example exists");
    snapshot(example, &kernels_text(&src));
}

/// Every kernel of `src` compiled with the default options, with its subgroup form after it
/// where it has one.
fn kernels_text(src: &str) -> String {
    kernels_text_with(src, &sinter_compiler::Options::default())
}

fn kernels_text_with(src: &str, options: &sinter_compiler::Options) -> String {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    let artifact = sinter_compiler::compile(&graph, options)
        .expect("compiles")
        .artifact;
    let mut text = String::new();
    writeln!(
        text,
        "{} kernels, {} dispatches",
        artifact.kernels.len(),
        artifact.dispatches.len()
    )
    .unwrap();
    for k in &artifact.kernels {
        writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
        if let Some(wgsl) = &k.subgroup_wgsl {
            writeln!(text, "\n===== {} with subgroups =====\n{wgsl}", k.name).unwrap();
        }
    }
    text
}

/// Rows of one workgroup each: the plain form combines in a workgroup-memory tree, the
/// subgroup form with `subgroupAdd` (sum) and shuffle butterflies (max with NaN, argmax with
/// ties), then one partial per subgroup.
#[test]
fn row_kernels_with_subgroups() {
    let src = "graph rows {
  input x: f32[8, 1000]
  p = softmax(x, axis=1)
  a = argmax(x, axis=1)
  output p, a
}
";
    snapshot("row_kernels_with_subgroups", &kernels_text(src));
}

/// A training step with `--precision mixed`: f16 products read and written through f16
/// storage (`array<f16>` arenas, `round_f16` before each store), the gradient scaler's guards
/// in the update kernels; and the same step for a target without f16 storage, whose f16 values
/// are f32 words holding f16 numbers.
#[test]
fn mixed_precision_step() {
    let src = "graph mixed {
  input x: f32[32, 64]
  input labels: i32[32]
  param w1: f32[64, 64] = normal(std=0.1, seed=1)
  param b1: f32[64] = zeros
  param w2: f32[64, 10] = normal(std=0.1, seed=2)
  h = relu(add(matmul(x, w1), b1))
  loss = cross_entropy(matmul(h, w2), labels)
  train loss with adamw(lr=0.01)
  output loss
}
";
    let mixed = sinter_compiler::Options {
        precision: sinter_compiler::precision::Precision::Mixed,
        ..Default::default()
    };
    snapshot("mixed_precision_step", &kernels_text_with(src, &mixed));
    let mut words = mixed;
    words.target.features.f16 = false;
    snapshot(
        "mixed_precision_step_in_words",
        &kernels_text_with(src, &words),
    );
}

#[test]
fn mlp() {
    check("mlp");
}

#[test]
fn transformer() {
    check("transformer");
}

#[test]
fn cnn() {
    check("cnn");
}

/// Every matmul block shape (forced; `tile_for` picks them by output size).
#[test]
fn matmul_tiles() {
    use sinter_compiler::matmul::{Forced, Tile};
    let src = "graph mm {\n  input a: f32[256, 256]\n  input b: f32[256, 256]\n  c = matmul(a, b)\n  output c\n}\n";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let mut text = String::new();
    for tile in [
        Tile::SMALL,
        Tile::MEDIUM,
        Tile::WIDE,
        Tile::WIDE_DEEP,
        Tile::LARGE,
    ] {
        let options = sinter_compiler::Options {
            matmul: Forced {
                tile: Some(tile),
                splits: None,
            },
            ..Default::default()
        };
        let artifact = sinter_compiler::compile(&graph, &options)
            .expect("compiles")
            .artifact;
        writeln!(text, "\n===== {tile} =====\n{}", artifact.kernels[0].wgsl).unwrap();
    }
    snapshot("matmul_tiles", &text);
}

/// The matmul on tensor cores (products of f16 operands on a target with cooperative
/// matrices): a linear layer's forward with its bias and gelu in the epilogue (`a` staged as
/// quads along k, `w` as scalars along n), and its weight gradient (`xᵀ · dy`: `a` a
/// transposed view, staged along m); then the same kernels in the emulated form
/// (`cooperative_emulated`) that CI runs; then, on tensor cores, with a block of two
/// accumulators per subgroup in two stages (one barrier per step, the epilogue passing both
/// accumulators per barrier pair).
#[test]
fn matmul_tensor_cores() {
    let src = "graph mm {
  input x: f16[96, 64]
  input w: f16[64, 130]
  input bias: f16[130]
  input dy: f16[96, 130]
  y = gelu(add(matmul(x, w), bias))
  dw = matmul(transpose(x, dim0=0, dim1=1), dy)
  output y, dw
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let mut text = String::new();
    let staged = sinter_compiler::matmul::Tile::parse("tc:64x64x32x16x32x2").expect("a tile");
    for (emulated, tile) in [(false, None), (true, None), (false, Some(staged))] {
        let mut options = sinter_compiler::Options::default();
        options.target.features.cooperative_matrix = true;
        options.target.features.cooperative_emulated = emulated;
        options.matmul.tile = tile;
        let artifact = sinter_compiler::compile(&graph, &options)
            .expect("compiles")
            .artifact;
        writeln!(
            text,
            "##### {}{}: requires {}",
            if emulated { "emulated" } else { "hardware" },
            tile.map(|t| format!(", tile {t}")).unwrap_or_default(),
            artifact.requirements.features.join(", ")
        )
        .unwrap();
        for k in &artifact.kernels {
            writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
        }
    }
    snapshot("matmul_tensor_cores", &text);
}

/// Split-K (forced): the products of K chunks into a partials buffer, then the sum over the
/// chunks, with the epilogue (scale, bias, relu) in the sum; quads where alignment allows
/// (`a`, `b`, `bias`) and scalars where it does not (`c`, whose rows start at odd offsets).
#[test]
fn matmul_split_k() {
    let src = "graph mm {
  input a: f32[2, 64, 256]
  input b: f32[256, 96]
  input bias: f32[96]
  input c: f32[33, 257]
  y = relu(add(mul(matmul(a, b), 0.5), bias))
  z = matmul(slice(c, axis=1, start=1, end=257), b)
  output y, z
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let options = sinter_compiler::Options {
        matmul: sinter_compiler::matmul::Forced {
            tile: None,
            splits: Some(4),
        },
        ..Default::default()
    };
    let artifact = sinter_compiler::compile(&graph, &options)
        .expect("compiles")
        .artifact;
    let mut text = String::new();
    writeln!(
        text,
        "{} kernels, {} dispatches",
        artifact.kernels.len(),
        artifact.dispatches.len()
    )
    .unwrap();
    for k in &artifact.kernels {
        writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
    }
    snapshot("matmul_split_k", &text);
}

/// The flash kernels of an attention's training step (causal, head dim 64, two blocks of 128
/// queries and keys, so that the heaviest-first launch order shows): the forward, and
/// the backward as one kernel (dQ through per-group partial sums) and as the dQ and dK/dV
/// kernels it replaces (`--flash-backward split`, what wider heads get).
#[test]
fn flash_attention_training() {
    let src = "graph a {
  input q: f32[1, 2, 200, 64]
  input k: f32[1, 2, 200, 64]
  input v: f32[1, 2, 200, 64]
  input w: f32[1, 2, 200, 64]
  o = attention(q, k, v, causal=true)
  loss = sum(mul(o, w))
  dq, dk, dv = grad(loss, q, k, v)
  output loss, dq, dk, dv
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let mut text = String::new();
    for merge in [true, false] {
        let mut options = sinter_compiler::Options {
            attention: sinter_compiler::optimize::AttentionPolicy::Flash,
            ..Default::default()
        };
        options.flash.merge_backward = merge;
        let artifact = sinter_compiler::compile(&graph, &options)
            .expect("compiles")
            .artifact;
        // the merged backward's dQ partial sums are added by a pass of their own name
        let sums = artifact
            .kernels
            .iter()
            .filter(|k| k.pattern == "flash_dq_sum")
            .count();
        assert_eq!(sums, usize::from(merge));
        for k in artifact.kernels.iter().filter(|k| {
            k.pattern.starts_with("flash_attention")
                && (merge || k.pattern != "flash_attention_fwd")
        }) {
            writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
        }
    }
    snapshot("flash_attention_training", &text);
}

/// The flash kernels on tensor cores (`--tensor-cores`): a causal attention's training step at
/// head dim 64 over two blocks of 64, the forward, the dQ and the dK/dV kernels with their
/// products as cooperative matrices (the backward kept split).
#[test]
fn flash_attention_tensor_cores() {
    snapshot("flash_attention_tensor_cores", &tensor_core_kernels(64));
}

/// The same at head dim 128: the forward's key and value blocks in turn in one array and
/// `P·V` in two passes; the backward walking blocks of 32, the row block staged in turn, the
/// results leaving in passes.
#[test]
fn flash_attention_tensor_cores_d128() {
    snapshot(
        "flash_attention_tensor_cores_d128",
        &tensor_core_kernels(128),
    );
}

/// Flash attention as a mixed-precision step feeds it: `f16` q, k, v and dO read from `f16`
/// storage (widened as they load), and the gradients of those `f16` values stored in `f16` by
/// the backward (`flash-f16-result`: rounded as the casts it replaces round); `O` stays `f32`
/// (the delta and the output read it). The plain form, then the tensor-core form.
#[test]
fn flash_attention_f16() {
    let src = "graph a {
  input x: f16[1, 2, 128, 64]
  input kx: f16[1, 2, 128, 64]
  input vx: f16[1, 2, 128, 64]
  input w: f32[1, 2, 128, 64]
  o = attention(cast(x, dtype=\"f32\"), cast(kx, dtype=\"f32\"), cast(vx, dtype=\"f32\"), causal=true)
  loss = sum(mul(o, w))
  dx, dk, dv = grad(loss, x, kx, vx)
  output loss, dx, dk, dv
}
";
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    let mut text = String::new();
    for tensor_cores in [false, true] {
        let artifact = sinter_compiler::compile(&graph, &flash_options(tensor_cores))
            .expect("compiles")
            .artifact;
        writeln!(
            text,
            "##### tensor cores: {tensor_cores}; requires {}",
            artifact.requirements.features.join(", ")
        )
        .unwrap();
        for k in artifact
            .kernels
            .iter()
            .filter(|k| k.pattern.starts_with("flash"))
        {
            writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
        }
    }
    snapshot("flash_attention_f16", &text);
}

/// `--attention flash`, and with `tensor_cores` `--tensor-cores`.
fn flash_options(tensor_cores: bool) -> sinter_compiler::Options {
    let mut options = sinter_compiler::Options {
        attention: sinter_compiler::optimize::AttentionPolicy::Flash,
        ..Default::default()
    };
    if tensor_cores {
        options.target = options.target.with_tensor_cores();
        options.flash.tensor_cores = true;
    }
    options
}

/// The flash kernels of a causal attention's training step at head dim `d` over two blocks of
/// 64 queries, compiled with `--tensor-cores`, after the features the artifact requires.
fn tensor_core_kernels(d: usize) -> String {
    let src = format!(
        "graph attention_step {{
  input q: f32[1, 2, 128, {d}]
  input k: f32[1, 2, 128, {d}]
  input v: f32[1, 2, 128, {d}]
  input w: f32[1, 2, 128, {d}]
  o = attention(q, k, v, causal=true)
  loss = sum(mul(o, w))
  dq, dk, dv = grad(loss, q, k, v)
  output o, dq, dk, dv
}}
"
    );
    let graph = sinter_ir::text::parse(&src).unwrap_or_else(|d| panic!("{}", d.render("t", &src)));
    let artifact = sinter_compiler::compile(&graph, &flash_options(true))
        .expect("compiles")
        .artifact;
    let mut text = format!("requires {}\n", artifact.requirements.features.join(", "));
    for k in artifact
        .kernels
        .iter()
        .filter(|k| k.pattern.starts_with("flash_attention"))
    {
        writeln!(text, "\n===== {} ({}) =====\n{}", k.name, k.pattern, k.wgsl).unwrap();
    }
    text
}
