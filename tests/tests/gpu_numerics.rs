//! IR.md §11 on the GPU: NaN, ±inf, ±0 and values near the f32 limits through every op, against
//! the interpreter. Each case feeds chosen special values (not random ones) and compares with the
//! interpreter's result rounded to f32: NaN must meet NaN, infinities must match exactly.

use std::collections::HashMap;

use sinter_ir::interp::Tensor;
use sinter_tests::{gpu_and_interpreter, relative_error, round_to_f32};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// Special values every elementwise op sees (f32-representable).
const SPECIAL: &[f64] = &[
    NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 88.0, -88.0, 100.0, -100.0, 1e30, -1e30,
    1e-30, 1e6,
];

/// Special values with arguments kept where WGSL's sin and cos are accurate (|x| ≤ π).
const SPECIAL_TRIG: &[f64] = &[NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0];

/// Runs `src` on `inputs` both ways and asserts every output agrees within `tol` (relative to
/// the largest finite |reference|), with specials matching exactly.
fn check(src: &str, inputs: &[(&str, Tensor)], tol: f64) {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    let inputs: HashMap<String, Tensor> = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    for (name, got, want) in gpu_and_interpreter(&graph, &inputs, &Default::default()) {
        let want = match want.ty.dtype {
            sinter_ir::DType::F32 => round_to_f32(&want.data),
            sinter_ir::DType::I32 | sinter_ir::DType::F16 => want.data,
        };
        let err = relative_error(&got.data, &want);
        assert!(
            err <= tol,
            "{src}\noutput `{name}` differs by {err:e}\n got  {:?}\n want {:?}",
            got.data,
            want
        );
    }
}

fn f32s(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor::f32(shape.to_vec(), data.to_vec())
}

#[test]
fn unary_ops_on_special_values() {
    let n = SPECIAL.len();
    for op in [
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "square",
        "relu",
        "sigmoid",
        "tanh",
        "silu",
        "gelu",
    ] {
        let src = format!("graph t {{\n  input x: f32[{n}]\n  y = {op}(x)\n  output y\n}}\n");
        check(&src, &[("x", f32s(&[n], SPECIAL))], 2e-5);
    }
    let src = format!(
        "graph t {{\n  input x: f32[{n}]\n  y = gelu(x, approximate=\"tanh\")\n  output y\n}}\n"
    );
    check(&src, &[("x", f32s(&[n], SPECIAL))], 2e-5);
    let m = SPECIAL_TRIG.len();
    for op in ["sin", "cos"] {
        let src = format!("graph t {{\n  input x: f32[{m}]\n  y = {op}(x)\n  output y\n}}\n");
        check(&src, &[("x", f32s(&[m], SPECIAL_TRIG))], 2e-5);
    }
}

/// Special values through a `concat` and `slice_grad`s fused into their consumers (read
/// through windows): each part's values come out where they belong, and the padding is zero.
#[test]
fn windowed_reads_carry_special_values() {
    let n = SPECIAL.len() / 2;
    let src = format!(
        "graph t {{
  input a: f32[2, {n}]
  input b: f32[2, {n}]
  y = mul(concat(neg(a), b, axis=1), 2.0)
  z = mul(add(slice_grad(a, shape=[2, {w}], axis=1, start=1, end={e}), slice_grad(b, shape=[2, {w}], axis=1, start={s2}, end={e2})), 2.0)
  output y, z
}}
",
        w = 2 * n + 2,
        e = n + 1,
        s2 = n + 2,
        e2 = 2 * n + 2,
    );
    let reversed: Vec<f64> = SPECIAL.iter().rev().copied().collect();
    check(
        &src,
        &[
            ("a", f32s(&[2, n], SPECIAL)),
            ("b", f32s(&[2, n], &reversed)),
        ],
        0.0,
    );
}

/// Every pair of a few special values, through every binary op and comparison: `a` varies
/// along axis 0, `b` along axis 1.
#[test]
fn binary_ops_on_every_pair_of_special_values() {
    let values = [
        NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5,
    ];
    let n = values.len();
    for op in [
        "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "lt", "le", "gt", "ge",
    ] {
        let src = format!(
            "graph t {{\n  input a: f32[{n}, 1]\n  input b: f32[{n}]\n  y = {op}(a, b)\n  output y\n}}\n"
        );
        check(
            &src,
            &[("a", f32s(&[n, 1], &values)), ("b", f32s(&[n], &values))],
            2e-5,
        );
    }
}

#[test]
fn where_takes_a_for_a_nan_condition_and_casts_saturate() {
    let cond = [NAN, 0.0, -0.0, 1.0, -INF];
    let src = "graph t {
  input c: f32[5]
  input a: f32[5]
  input x: f32[8]
  y = where(c, a, 7)
  i = cast(x, dtype=\"i32\")
  output y, i
}
";
    check(
        src,
        &[
            ("c", f32s(&[5], &cond)),
            ("a", f32s(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0])),
            (
                "x",
                f32s(&[8], &[NAN, INF, -INF, 3e9, -3e9, -2.5, 2.5, -0.0]),
            ),
        ],
        0.0,
    );
}

/// Rows of a [6, 4] input, each with its own mix of specials.
const ROWS: [[f64; 4]; 6] = [
    [1.0, NAN, 3.0, 2.0],
    [-INF, -INF, -INF, -INF],
    [1.0, INF, -2.0, 0.5],
    [INF, -INF, 1.0, 2.0],
    [-1.0, 4.0, 4.0, -3.0],
    [NAN, 5.0, NAN, INF],
];

fn rows() -> Tensor {
    f32s(&[6, 4], ROWS.as_flattened())
}

#[test]
fn reductions_and_argmax_on_special_rows() {
    for op in ["sum", "mean", "max", "min", "logsumexp"] {
        let src = format!(
            "graph t {{\n  input x: f32[6, 4]\n  y = {op}(x, axes=[1])\n  z = {op}(x, axes=[0])\n  output y, z\n}}\n"
        );
        check(&src, &[("x", rows())], 2e-5);
    }
    for last in [false, true] {
        let src = format!(
            "graph t {{\n  input x: f32[6, 4]\n  y = argmax(x, axis=1, last={last})\n  z = argmax(x, axis=0, last={last})\n  output y, z\n}}\n"
        );
        check(&src, &[("x", rows())], 0.0);
    }
}

/// Ties and NaNs spread over long rows, which the kernels combine across lanes, subgroups and
/// workgroup memory: `argmax` keeps the first of the maxima (or NaNs), `last=true` the last, as
/// the interpreter does.
#[test]
fn argmax_ties_on_long_rows() {
    // rows of 1000 and 5000: values repeat every 7, so each row's maximum appears many times;
    // row 1 holds two NaNs
    for n in [1000usize, 5000] {
        let mut x: Vec<f64> = (0..3 * n).map(|i| (i % 7) as f64 - 3.0).collect();
        x[n + 17] = NAN;
        x[n + n / 2] = NAN;
        for last in [false, true] {
            let src = format!(
                "graph t {{\n  input x: f32[3, {n}]\n  y = argmax(x, axis=1, last={last})\n  output y\n}}\n"
            );
            check(&src, &[("x", f32s(&[3, n], &x))], 0.0);
        }
    }
}

/// `cumsum` carries NaN and infinities on as `+` does: a NaN poisons every later sum, `+inf`
/// and `-inf` in one prefix give NaN; the first inclusive sum keeps `-0`. Random values
/// around the specials, every form, along both axes.
#[test]
fn cumsum_propagates_special_values() {
    let (rows, cols) = (6, 9);
    let mut x: Vec<f64> = (0..rows * cols)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) * 0.25)
        .collect();
    for (at, v) in [
        (2, NAN),
        (10, INF),
        (14, -INF),
        (21, INF),
        (25, -INF),
        (30, -0.0),
        (40, NAN),
    ] {
        x[at] = v;
    }
    x[45] = 1e30;
    x[47] = -1e30;
    for exclusive in [false, true] {
        for reverse in [false, true] {
            let f = format!("exclusive={exclusive}, reverse={reverse}");
            let src = format!(
                "graph t {{\n  input x: f32[{rows}, {cols}]\n  y = cumsum(x, axis=1, {f})\n  z = cumsum(x, axis=0, {f})\n  output y, z\n}}\n"
            );
            check(&src, &[("x", f32s(&[rows, cols], &x))], 1e-6);
        }
    }
}

#[test]
fn softmax_norms_and_losses_on_special_rows() {
    let src = "graph t {
  input x: f32[6, 4]
  input g: f32[4]
  input labels: i32[6]
  s = softmax(x)
  l = log_softmax(x)
  n = layer_norm(x, g, g)
  r = rms_norm(x, g)
  ce = cross_entropy(x, labels, reduction=\"none\")
  m = mse_loss(x, transpose(reshape(x, shape=[4, 6]), dim0=0, dim1=1), reduction=\"none\")
  output s, l, n, r, ce, m
}
";
    check(
        src,
        &[
            ("x", rows()),
            ("g", f32s(&[4], &[1.0, -2.0, 0.5, 3.0])),
            // Row 2's label points at its +inf logit, row 3's at a finite one.
            ("labels", Tensor::i32(vec![6], vec![0, 1, 1, 2, 1, 0])),
        ],
        1e-5,
    );
}

#[test]
fn pooling_and_its_gradient_propagate_nan() {
    // One 4x4 image per channel: channel 0 holds a NaN, channel 1 an +inf and a -inf.
    let mut x = vec![0.0; 32];
    for (i, v) in x.iter_mut().enumerate() {
        *v = (i as f64 * 0.37).sin();
    }
    x[5] = NAN;
    x[16 + 2] = INF;
    x[16 + 9] = -INF;
    x[16 + 10] = NAN;
    let src = "graph t {
  input x: f32[1, 2, 4, 4]
  input dy: f32[1, 2, 3, 3]
  mp = max_pool2d(x, kernel=2, stride=1)
  ap = avg_pool2d(x, kernel=2, stride=1)
  g = max_pool2d_grad(x, dy, kernel=2, stride=1)
  output mp, ap, g
}
";
    let dy: Vec<f64> = (0..18).map(|i| 1.0 + i as f64).collect();
    check(
        src,
        &[
            ("x", f32s(&[1, 2, 4, 4], &x)),
            ("dy", f32s(&[1, 2, 3, 3], &dy)),
        ],
        1e-5,
    );
}

#[test]
fn matmul_and_conv_carry_infinities() {
    let a = [
        1.0, INF, 2.0, -1.0, NAN, 0.5, 3.0, -INF, 1.0, 2.0, 0.25, -3.0,
    ];
    let src = "graph t {
  input a: f32[3, 4]
  input b: f32[4, 2]
  input x: f32[1, 1, 3, 4]
  input w: f32[2, 1, 2, 2]
  c = matmul(a, b)
  d = conv2d(x, w)
  output c, d
}
";
    check(
        src,
        &[
            ("a", f32s(&[3, 4], &a)),
            (
                "b",
                f32s(&[4, 2], &[1.0, -1.0, 2.0, 0.5, -0.5, 3.0, 1.5, 2.0]),
            ),
            ("x", f32s(&[1, 1, 3, 4], &a)),
            (
                "w",
                f32s(&[2, 1, 2, 2], &[1.0, 2.0, -1.0, 0.5, 0.25, 1.0, 1.0, -2.0]),
            ),
        ],
        1e-5,
    );
}

/// The reproducer: an MLP fed an all-NaN batch has a NaN loss, not log(10).
#[test]
fn an_all_nan_batch_gives_a_nan_loss() {
    let src = sinter_tests::example_source("mlp");
    let graph = sinter_ir::text::parse(&src).unwrap();
    let mut inputs = HashMap::new();
    for v in graph.inputs() {
        let value = graph.value(v);
        let t = match value.ty.dtype {
            sinter_ir::DType::F32 | sinter_ir::DType::F16 => Tensor::full(value.ty.clone(), NAN),
            sinter_ir::DType::I32 => Tensor::full(value.ty.clone(), 1.0),
        };
        inputs.insert(value.name.clone(), t);
    }
    let outputs = gpu_and_interpreter(&graph, &inputs, &Default::default());
    let (_, loss, want) = outputs
        .iter()
        .find(|(n, _, _)| n == "loss")
        .expect("mlp outputs its loss");
    assert!(want.data[0].is_nan());
    assert!(loss.data[0].is_nan(), "GPU loss {:?}", loss.data);
}

/// Arithmetic that a driver's float optimizer would simplify keeps IEEE semantics (found by the
/// random-program test): lavapipe folds `x / 0.0`, `x * 0.0` and `0.0 / x` to 0 when the 0.0 is a
/// literal in the shader, so constants reach kernels through the param block; and it folds
/// `x - x` and `x + -x` to 0, so codegen hides that the two sides are one value; a comparison it
/// decides (`x > x`) must not hand it a literal 0 to divide by either.
#[test]
fn arithmetic_with_literal_zeros_and_infinities() {
    let src = "graph t {
  input x: f32[6]
  a = div(x, 0.0)
  b = mul(x, 0.0)
  c = div(0.0, x)
  d = add(x, inf)
  e = mul(sub(x, x), -inf)
  f = mul(0.0, reciprocal(x))
  g = sub(x, x)
  h = add(x, neg(x))
  k = mul(sub(x, x), x)
  m = div(x, gt(x, x))
  output a, b, c, d, e, f, g, h, k, m
}
";
    let x = f32s(&[6], &[NAN, INF, -INF, 0.0, -2.0, 3.0]);
    check(src, &[("x", x)], 0.0);
}

/// `iota` folds into the kernels that read it: as a value, a mask and an exponent.
#[test]
fn iota_as_value_mask_and_exponent() {
    let src = "graph t {
  input x: f32[2, 3]
  a = mul(x, iota(shape=[2, 3], axis=1))
  b = where(gt(iota(shape=[3], axis=0), 0.5), x, -inf)
  c = pow(x, iota(shape=[2, 1], axis=0))
  output a, b, c
}
";
    check(
        src,
        &[("x", f32s(&[2, 3], &[NAN, INF, -2.0, 0.0, -0.0, 3.0]))],
        1e-6,
    );
}
