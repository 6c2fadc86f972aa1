//! f16 on the GPU against the interpreter's f16 model (IR.md, "Element types"): every op on f16
//! values computes in f32 and rounds its result once, so the interpreter predicts the GPU to the
//! rounding of f32 arithmetic, and exactly where a value is only rounded (casts, copies).
//!
//! Each program runs twice: for the default target, which stores f16 values in f16 arenas
//! (`SHADER_F16`; Mesa's software Vulkan has it), and for one without f16 storage, which keeps
//! them as f32 words holding f16 numbers (the browsers' form; its programs take f32 at their
//! interface).

use std::collections::HashMap;

use sinter_compiler::{CompileError, Options, Target};
use sinter_ir::interp::Tensor;
use sinter_ir::{DType, TensorType};
use sinter_tests::{Rng, check_graph_gpu, gpu_and_interpreter, random_inputs, relative_error};

/// A target without f16 storage.
fn words() -> Options {
    let mut target = Target::portable();
    target.features.f16 = false;
    Options {
        target,
        ..Options::default()
    }
}

/// `src` on the GPU (default target) against the interpreter on random inputs (f16 inputs hold
/// f16 numbers); every output within `tol` of the interpreter's, relative to its largest.
fn check(src: &str, tol: f64) {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    check_graph_gpu(&graph, tol, &[], 5, &Options::default());
}

/// `body` as a graph over `x, y: f32[shape]` cast to f16 first (`h`, `k`), on both targets.
fn check_internal(shape: &str, body: &str, outputs: &str, tol: f64) {
    let src = format!(
        "graph t {{\n  input x: f32[{shape}]\n  input y: f32[{shape}]\n  h = cast(x, dtype=\"f16\")\n  k = cast(y, dtype=\"f16\")\n{body}\n  output {outputs}\n}}\n"
    );
    check(&src, tol);
    let graph = sinter_ir::text::parse(&src).expect("valid");
    check_graph_gpu(&graph, tol, &[], 5, &words());
}

/// Rounding to f16 is exact on the GPU (the interpreter rounds ties to even through f32): a
/// cast of values around every kind of rounding case, normal, subnormal, past the largest
/// finite f16 and special, equals the interpreter's bit for bit.
#[test]
fn casts_round_exactly() {
    let mut values: Vec<f64> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        70000.0,
        1e-8,
        2.9802322e-8,
        2.9802326e-8,
        5.960464e-8,
        6.097555e-5,
        6.1035156e-5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    // halfway cases between neighbours, odd and even
    for m in [1025.0f64, 1026.0, 2047.0, 1536.0] {
        values.push(m + 0.5);
        values.push(-(m + 0.5) / 4096.0);
    }
    let mut rng = Rng::new(3);
    while values.len() < 256 {
        let e = rng.below(40) as i32 - 26;
        values.push(rng.nonzero(-1.0, 1.0) * 2f64.powi(e));
    }
    let values: Vec<f64> = values.iter().map(|&v| f64::from(v as f32)).collect();
    // f16 storage outputs `h` itself; without it the program's interface stays f32
    let with_h = "graph t {\n  input x: f32[256]\n  h = cast(x, dtype=\"f16\")\n  y = cast(h, dtype=\"f32\")\n  output h, y\n}\n";
    let without = "graph t {\n  input x: f32[256]\n  h = cast(x, dtype=\"f16\")\n  y = cast(h, dtype=\"f32\")\n  output y\n}\n";
    let inputs = HashMap::from([("x".to_string(), Tensor::f32(vec![256], values.clone()))]);
    for (src, options) in [(with_h, Options::default()), (without, words())] {
        let graph = sinter_ir::text::parse(src).expect("valid");
        let outputs = gpu_and_interpreter(&graph, &inputs, &options);
        for (name, got, want) in outputs {
            for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
                assert!(
                    g == w || (g.is_nan() && w.is_nan()),
                    "`{name}`[{i}] of {:e}: GPU {g:e}, interpreter {w:e}",
                    values[i]
                );
            }
        }
    }
}

#[test]
fn elementwise_ops_round_once() {
    let unary = [
        "neg",
        "abs",
        "exp",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "square",
        "relu",
        "sigmoid",
        "tanh",
        "silu",
        "sin",
        "cos",
        "gelu",
    ];
    let mut body = String::new();
    let mut outs = Vec::new();
    for (i, op) in unary.iter().enumerate() {
        body.push_str(&format!("  u{i} = cast({op}(h), dtype=\"f32\")\n"));
        outs.push(format!("u{i}"));
    }
    for (i, op) in ["add", "sub", "mul", "div", "maximum", "minimum"]
        .iter()
        .enumerate()
    {
        body.push_str(&format!("  b{i} = cast({op}(h, k), dtype=\"f32\")\n"));
        outs.push(format!("b{i}"));
    }
    // a chain: each op rounds, the fused kernel too
    body.push_str("  c = cast(mul(add(h, k), exp(neg(square(h)))), dtype=\"f32\")\n");
    // scalars do not widen: f32 literals with f16 tensors compute as f16
    body.push_str("  s = cast(add(mul(h, 0.125), 3.0), dtype=\"f32\")\n");
    // comparisons and where on f16
    body.push_str("  w = cast(where(lt(h, k), h, k), dtype=\"f32\")\n");
    outs.extend(["c".to_string(), "s".to_string(), "w".to_string()]);
    check_internal("3, 70", &body, &outs.join(", "), 2e-3);
}

#[test]
fn reductions_and_row_ops_compute_in_f32() {
    let body = "  s = cast(sum(h, axes=[1]), dtype=\"f32\")\n  m = cast(max(h, axes=[0], keepdim=true), dtype=\"f32\")\n  a = argmax(h, axis=1)\n  sm = cast(softmax(h, axis=1), dtype=\"f32\")\n  lse = cast(logsumexp(h, axes=[1]), dtype=\"f32\")";
    check_internal("5, 300", body, "s, m, a, sm, lse", 2e-3);
    // norms with f16 weights (one f16 program: no interface concern on the default target)
    let norms = "graph t {
  input x: f16[6, 40]
  input g: f16[40]
  input b: f16[40]
  ln = layer_norm(x, g, b)
  rn = rms_norm(x, g)
  ce = cross_entropy(x, argmax(x, axis=1))
  output ln, rn, ce
}
";
    check(norms, 3e-3);
}

#[test]
fn matmuls_accumulate_in_f32_and_round_once() {
    // a product with an epilogue (bias, gelu), a batched one and a transposed operand
    let src = "graph t {
  input a: f16[2, 37, 96]
  input w: f16[96, 70]
  input bias: f16[70]
  input v: f16[96, 70]
  y = gelu(add(matmul(a, w), bias))
  z = matmul(y, transpose(v, dim0=0, dim1=1))
  output y, z
}
";
    check(src, 2e-3);
    // long K: split into chunks whose partial sums stay f32
    let long = "graph t {
  input a: f16[4, 4096]
  input b: f16[4096, 8]
  c = matmul(a, b)
  output c
}
";
    check(long, 2e-3);
}

#[test]
fn f32_kernels_read_and_write_f16_through_conversions() {
    // convolution, pooling, embedding and attention read f32: their f16 operands are copied
    let src = "graph t {
  input x: f16[2, 3, 9, 9]
  input w: f16[4, 3, 3, 3]
  input table: f16[10, 16]
  input ids: i32[2, 5]
  input q: f16[1, 2, 20, 16]
  input k: f16[1, 2, 20, 16]
  input vv: f16[1, 2, 20, 16]
  c = max_pool2d(relu(conv2d(x, w, padding=[1, 1])), kernel=[2, 2])
  e = embedding(table, ids)
  o = attention(q, k, vv, causal=true)
  output c, e, o
}
";
    check(src, 3e-3);
}

#[test]
fn gradients_flow_through_f16() {
    // a small training step: the product and the loss in f16, the param's f32 master copy
    let step = |dtype: &str| {
        format!(
            "graph t {{
  input x: f32[8, 12]
  input labels: i32[8]
  param w: f32[12, 5] = normal(std=0.3, seed=4)
  param b: f32[5] = normal(std=0.1, seed=5)
  h = add(matmul(cast(x, dtype=\"{dtype}\"), cast(w, dtype=\"{dtype}\")), cast(b, dtype=\"{dtype}\"))
  loss = cast(cross_entropy(relu(h), labels), dtype=\"f32\")
  dw, db = grad(loss, w, b)
  output loss, dw, db
}}
"
        )
    };
    check(&step("f16"), 3e-3);
    // the f16 step's gradients are the f32 step's to f16 precision (not zeros)
    let inputs = random_inputs(
        &sinter_ir::text::parse(&step("f32")).expect("valid"),
        9,
        5,
        &[],
    );
    let run = |dtype: &str| {
        let g = sinter_ir::text::parse(&step(dtype)).expect("valid");
        gpu_and_interpreter(&g, &inputs, &Options::default())
    };
    for ((name, half, _), (_, single, _)) in run("f16").into_iter().zip(run("f32")) {
        assert!(single.data.iter().any(|&v| v != 0.0), "`{name}` is zero");
        let err = relative_error(&half.data, &single.data);
        assert!(err < 2e-2, "`{name}`: f16 differs from f32 by {err:e}");
    }
}

/// A target without f16 storage refuses f16 at the program's interface, naming the tensor.
#[test]
fn word_targets_refuse_f16_interfaces() {
    let src = "graph t {\n  input x: f16[4]\n  y = mul(x, 2.0)\n  output y\n}\n";
    let graph = sinter_ir::text::parse(src).expect("valid");
    match sinter_compiler::compile(&graph, &words()) {
        Err(e @ CompileError::Storage { .. }) => {
            let text = e.to_string();
            assert!(text.contains("input `x` is f16"), "{text}");
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    // the same program's artifact for the default target asks for f16
    let artifact = sinter_compiler::compile(&graph, &Options::default())
        .expect("compiles")
        .artifact;
    assert!(
        artifact
            .requirements
            .features
            .contains(&"SHADER_F16".to_string())
    );
    assert_eq!(artifact.tensors[0].ty, TensorType::new(DType::F16, vec![4]));
}
