//! Every op on the GPU against the reference interpreter, on random non-zero inputs.
//! Tolerances are relative to the largest |reference| value (see `relative_error`); each case
//! states its own.

use sinter_compiler::matmul::{Forced, Tile};
use sinter_tests::check_gpu;

/// f32 arithmetic the GPU does differently only by rounding.
const EXACTISH: f64 = 1e-6;
/// Transcendentals (GPU exp/log/sin/tanh are a few ulp off) and short reductions.
const TRANSCENDENTAL: f64 = 2e-5;
/// Long dot products and reductions accumulated in f32.
const REDUCTION: f64 = 1e-4;

fn unary_program(op: &str, shape: &str, transform: &str) -> String {
    format!("graph t {{\n  input x: f32[{shape}]\n  y = {op}({transform})\n  output y\n}}\n")
}

#[test]
fn unary_ops() {
    let cases: &[(&str, &str, f64)] = &[
        ("neg", "x", EXACTISH),
        ("abs", "x", EXACTISH),
        ("exp", "x", TRANSCENDENTAL),
        ("log", "abs(x)", TRANSCENDENTAL),
        ("sqrt", "abs(x)", TRANSCENDENTAL),
        ("rsqrt", "abs(x)", TRANSCENDENTAL),
        ("reciprocal", "x", TRANSCENDENTAL),
        ("square", "x", EXACTISH),
        ("relu", "x", EXACTISH),
        ("sigmoid", "x", TRANSCENDENTAL),
        ("tanh", "x", TRANSCENDENTAL),
        ("silu", "x", TRANSCENDENTAL),
        ("sin", "x", TRANSCENDENTAL),
        ("cos", "x", TRANSCENDENTAL),
        ("gelu", "x", TRANSCENDENTAL),
    ];
    for &(op, arg, tol) in cases {
        for shape in ["1", "7, 13", "3, 1, 300"] {
            check_gpu(&unary_program(op, shape, arg), tol, &[], 1);
        }
    }
    let tanh_gelu = "graph t {\n  input x: f32[5, 11]\n  y = gelu(mul(x, 3), approximate=\"tanh\")\n  output y\n}\n";
    check_gpu(tanh_gelu, TRANSCENDENTAL, &[], 1);
}

#[test]
fn binary_ops_with_broadcasting() {
    let ops = [
        "add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt", "le", "gt", "ge",
    ];
    let shapes = [
        ("7, 13", "7, 13"),
        ("3, 1", "1, 4"),
        ("2, 5, 3", "3"),
        // three axes or more: 4 points per thread along the first, 9 of them ragged (3 chunks
        // of 3, the last thread's fourth point past the end)
        ("9, 5, 3", "5, 1"),
        ("4, 3, 2, 5", "3, 1, 5"),
        ("1", "6, 1"),
        ("", "2, 3"),
    ];
    for op in ops {
        for (sa, sb) in shapes {
            let src = format!(
                "graph t {{\n  input a: f32[{sa}]\n  input b: f32[{sb}]\n  y = {op}(a, b)\n  output y\n}}\n"
            );
            check_gpu(&src, EXACTISH, &[], 1);
        }
    }
    // Comparisons see equal values too; literals broadcast as scalars.
    let eq = "graph t {\n  input a: f32[4, 5]\n  y = eq(a, transpose(broadcast_to(slice(a, axis=1, start=0, end=4), shape=[4, 4]), dim0=0, dim1=1))\n  z = add(mul(a, 0.5), -1.25)\n  output y, z\n}\n";
    let _ = eq;
    let lit = "graph t {\n  input a: f32[4, 5]\n  z = add(mul(a, 0.5), -1.25)\n  output z\n}\n";
    check_gpu(lit, EXACTISH, &[], 1);
}

#[test]
fn pow_and_where() {
    let src = "graph t {
  input a: f32[6, 7]
  input b: f32[7]
  p = pow(abs(a), b)
  q = pow(a, 3)
  r = pow(a, 2)
  w = where(gt(a, 0), a, b)
  output p, q, r, w
}
";
    check_gpu(src, TRANSCENDENTAL, &[], 1);
}

#[test]
fn integer_values_and_casts() {
    let src = "graph t {
  input ids: i32[3, 5]
  input x: f32[3, 5]
  f = cast(ids, dtype=\"f32\")
  i = cast(mul(x, 3), dtype=\"i32\")
  e = eq(ids, cast(f, dtype=\"i32\"))
  s = where(ids, x, neg(x))
  t = transpose(ids, dim0=0, dim1=1)
  output f, i, e, s, t
}
";
    check_gpu(src, EXACTISH, &[], 9);
}

#[test]
fn reductions() {
    for op in ["sum", "mean", "max", "min", "logsumexp"] {
        for (shape, attrs) in [
            ("7, 13", ""),
            ("7, 13", ", axes=[1]"),
            ("7, 13", ", axes=[0], keepdim=true"),
            ("3, 5, 2, 4", ", axes=[-1, 1]"),
            ("2, 3, 1000", ", axes=[2]"),
            ("1", ""),
            ("5, 1, 3", ", axes=[1]"),
            // outer axes over a few columns: the two reduce axes walk as one run, and the
            // segment widens past 8 lanes (37 rows would be one workgroup of 8)
            ("4, 300, 37", ", axes=[0, 1]"),
            // reduce axes that are not one run: the first and the last
            ("6, 50, 3", ", axes=[0, 2]"),
        ] {
            let src = format!(
                "graph t {{\n  input x: f32[{shape}]\n  y = {op}(x{attrs})\n  output y\n}}\n"
            );
            check_gpu(&src, REDUCTION, &[], 1);
        }
    }
    // reduce axes whose strides are not one run stay apart: a slice of the middle axis, and a
    // swap of the two
    for t in [
        "slice(x, axis=1, start=5, end=305)",
        "permute(slice(x, axis=1, start=5, end=305), perm=[1, 0, 2])",
    ] {
        let src = format!(
            "graph t {{\n  input x: f32[4, 310, 37]\n  t = {t}\n  y = sum(t, axes=[0, 1])\n  output y\n}}\n"
        );
        check_gpu(&src, REDUCTION, &[], 1);
    }
    let argmax = "graph t {\n  input x: f32[6, 37]\n  a = argmax(x, axis=1)\n  b = argmax(x, axis=0, keepdim=true)\n  output a, b\n}\n";
    check_gpu(argmax, 0.0, &[], 1);
}

#[test]
fn views_cost_no_kernels_and_read_right() {
    let src = "graph t {
  input x: f32[4, 6, 5]
  a = permute(x, perm=[2, 0, 1])
  b = slice(a, axis=2, start=1, end=6, step=2)
  c = unsqueeze(b, axis=0)
  d = squeeze(c, axis=0)
  e = broadcast_to(slice(x, axis=0, start=3, end=4), shape=[3, 6, 5])
  f = reshape(x, shape=[24, 5])
  g = reshape(permute(x, perm=[1, 0, 2]), shape=[6, 20])
  h = add(d, 1.5)
  k = transpose(x, dim0=0, dim1=-1)
  output h, e, f, g, k, d
}
";
    check_gpu(src, EXACTISH, &[], 1);
}

#[test]
fn concat_and_cast_layouts() {
    let src = "graph t {
  input a: f32[3, 2]
  input b: f32[3, 5]
  input c: f32[3, 1]
  y = concat(a, b, c, axis=1)
  z = concat(transpose(a, dim0=0, dim1=1), transpose(c, dim0=0, dim1=1), axis=0)
  output y, z
}
";
    check_gpu(src, EXACTISH, &[], 1);
}

/// A reshape that needs a copy (heads merged after a permute) feeding a `concat` is copied
/// straight into its part of the result: one copy per part, not two. Where the part cannot be
/// seen in the source's shape, or the reshaped value is read elsewhere too, it is materialized.
#[test]
fn reshaped_parts_are_copied_into_the_concat() {
    let merged = |x: &str| format!("reshape(permute({x}, perm=[0, 2, 1, 3]), shape=[2, 5, 12])");
    let direct = format!(
        "graph t {{\n  input q: f32[2, 3, 5, 4]\n  input k: f32[2, 3, 5, 4]\n  y = concat({}, {}, axis=2)\n  output y\n}}\n",
        merged("q"),
        merged("k")
    );
    // the merged q is also an output; a part that cannot take the source's shape ([2, 12]
    // columns of a [2, 24] result seen as [6, 4]) is materialized first
    let fallback = format!(
        "graph t {{\n  input q: f32[2, 3, 5, 4]\n  input a: f32[4, 6]\n  input b: f32[4, 6]\n  m = {}\n  y = concat(m, m, axis=1)\n  p = reshape(transpose(a, dim0=0, dim1=1), shape=[2, 12])\n  w = concat(p, reshape(transpose(b, dim0=0, dim1=1), shape=[2, 12]), axis=1)\n  output y, m, w\n}}\n",
        merged("q")
    );
    check_with_dispatches(&direct, 2);
    check_with_dispatches(&fallback, 2 + 1 + 4);
}

/// `src` on the GPU against the interpreter, compiled (with default options) to `dispatches`
/// dispatches.
fn check_with_dispatches(src: &str, dispatches: usize) {
    check_gpu(src, EXACTISH, &[], 1);
    let graph = sinter_ir::text::parse(src).expect("valid program");
    let compiled =
        sinter_compiler::compile(&graph, &sinter_compiler::Options::default()).expect("compiles");
    assert_eq!(compiled.artifact.dispatches.len(), dispatches, "{src}");
}

/// Computed operands of a `concat` whose parts are contiguous ranges of the result (along its
/// first axis) are written there by the kernels that compute them: no copies. An operand that
/// is an input, or whose part is strided (a later axis), is copied.
#[test]
fn computed_parts_are_written_into_the_concat() {
    let written = "graph t {
  input a: f32[3, 4]
  input b: f32[2, 4]
  s = sum(a, axes=[1])
  y = concat(relu(a), exp(b), axis=0)
  z = concat(s, sum(b, axes=[1]), axis=0)
  output y, z
}
";
    let copied = "graph t {
  input a: f32[3, 4]
  input b: f32[3, 2]
  y = concat(relu(a), exp(b), axis=1)
  z = concat(a, exp(a), axis=0)
  output y, z
}
";
    // written: relu, exp, two sums; copied: relu, exp and the exp written into `z`, then two
    // copies into `y`'s strided parts and one of the input `a`
    check_with_dispatches(written, 4);
    check_with_dispatches(copied, 3 + 3);
}

/// Rotate-half RoPE and its gradient, one kernel each: the `concat` of the rotated halves and
/// the gradient's `slice_grad`s are read through windows by the kernels that consume them, and
/// the `neg` of a half is computed inside the window it fills (they were 8 dispatches: two
/// `neg`s, two concat copies, two `slice_grad`s and the two consumers).
#[test]
fn rotate_half_fuses_into_its_consumers() {
    check_with_dispatches(include_str!("../programs/rotate_half.sir"), 2);
}

/// An assign whose source is a reshape that needs a copy: the copy is made where the assign
/// reads it (after every step), and the next run starts from the moved state.
#[test]
fn assign_of_a_reshape_that_needs_a_copy() {
    let src = "graph t {
  state s: f32[6] = normal(seed=3)
  assign s = reshape(transpose(reshape(s, shape=[2, 3]), dim0=0, dim1=1), shape=[6])
  output s
}
";
    let graph = sinter_ir::text::parse(src).expect("valid program");
    let compiled =
        sinter_compiler::compile(&graph, &sinter_compiler::Options::default()).expect("compiles");
    let mut session =
        sinter_runtime::Session::load(compiled.artifact).unwrap_or_else(|e| panic!("load: {e}"));
    let none = std::collections::HashMap::new();
    let first = sinter_tests::run_session(&mut session, &none)["s"]
        .data
        .clone();
    let second = sinter_tests::run_session(&mut session, &none)["s"]
        .data
        .clone();
    // s'[j, i] = s[i, j] over [2, 3]
    let moved: Vec<f64> = (0..3)
        .flat_map(|j| (0..2).map(move |i| (i, j)))
        .map(|(i, j)| first[i * 3 + j])
        .collect();
    assert!(first.iter().all(|&v| v != 0.0));
    assert_eq!(second, moved);
}

/// Updates in place (`in_place.rs`): `u` and `q` are written over by the kernels that read them
/// at the same element; `q`'s update reads the old `p` and the new one, so unoptimized (each op
/// its own kernel) `p` keeps its copy, and optimized (one kernel) it need not; `r`'s update is
/// a reduction over rows that reads `r` per row (a bias's moment); `s`'s reads `s` transposed
/// (which must keep its copy: another thread's element would be overwritten before it is
/// read). Two runs, with and without the optimizer; the second run's outputs follow from the
/// first's.
#[test]
fn updates_in_place_keep_the_values_of_copied_ones() {
    let src = "graph t {
  input g: f32[64, 48]
  param p: f32[64, 48] = normal(seed=1)
  state q: f32[64, 48] = normal(seed=2)
  state s: f32[48, 48] = normal(seed=3)
  state r: f32[48] = normal(seed=4)
  param u: f32[64, 48] = normal(seed=5)
  un = sub(u, mul(g, 0.25))
  pn = sub(p, mul(g, 0.5))
  qn = add(q, mul(p, pn))
  sn = add(transpose(s, dim0=0, dim1=1), 1)
  rn = add(mul(r, 0.5), sum(g, axes=[0]))
  assign p = pn
  assign q = qn
  assign s = sn
  assign r = rn
  assign u = un
  output pn, qn, sn, rn, un
}
";
    let graph = sinter_ir::text::parse(src).expect("valid program");
    let inputs = sinter_tests::random_inputs(&graph, 7, 1, &[]);
    for optimize in [true, false] {
        let options = sinter_compiler::Options {
            optimize,
            ..Default::default()
        };
        let compiled = sinter_compiler::compile(&graph, &options).expect("compiles");
        let targets: Vec<&str> = compiled
            .artifact
            .assigns
            .iter()
            .map(|a| a.target.as_str())
            .collect();
        assert!(
            !targets.contains(&"u"),
            "u is updated in place ({optimize})"
        );
        assert!(
            !targets.contains(&"q"),
            "q is updated in place ({optimize})"
        );
        assert_eq!(
            targets.contains(&"p"),
            !optimize,
            "the old p read after p's update"
        );
        if optimize {
            assert!(!targets.contains(&"r"), "r is updated in place");
        }
        assert!(targets.contains(&"s"), "s is read transposed ({optimize})");
        let mut session = sinter_runtime::Session::load(compiled.artifact).expect("loads");
        let first = sinter_tests::run_session(&mut session, &inputs);
        let second = sinter_tests::run_session(&mut session, &inputs);
        // the first run against the interpreter
        for (name, got, want) in sinter_tests::gpu_and_interpreter(&graph, &inputs, &options) {
            let err = sinter_tests::relative_error(&first[&name].data, &want.data);
            assert!(err <= EXACTISH, "{name}: {err:e}, {:?}", &got.data[..4]);
        }
        let g = &inputs["g"].data;
        let (p1, q1, s1) = (&first["pn"].data, &first["qn"].data, &first["sn"].data);
        let r2: Vec<f64> = first["rn"]
            .data
            .iter()
            .enumerate()
            .map(|(j, r)| r * 0.5 + (0..64).map(|i| g[i * 48 + j]).sum::<f64>())
            .collect();
        let p2: Vec<f64> = p1.iter().zip(g).map(|(p, g)| p - g * 0.5).collect();
        let u2: Vec<f64> = first["un"]
            .data
            .iter()
            .zip(g)
            .map(|(u, g)| u - g * 0.25)
            .collect();
        let q2: Vec<f64> = (0..q1.len()).map(|i| q1[i] + p1[i] * p2[i]).collect();
        let s2: Vec<f64> = (0..48 * 48)
            .map(|at| s1[(at % 48) * 48 + at / 48] + 1.0)
            .collect();
        for (name, want, tol) in [
            ("pn", p2, EXACTISH),
            ("un", u2, EXACTISH),
            ("qn", q2, EXACTISH),
            ("sn", s2, EXACTISH),
            ("rn", r2, REDUCTION),
        ] {
            let got = &second[name].data;
            let err = sinter_tests::relative_error(got, &sinter_tests::round_to_f32(&want));
            assert!(err <= tol, "second run, {name} ({optimize}): {err:e}");
        }
    }
}

/// A state read along a reduced axis (a broadcast, stride 0) in the row kernel that also
/// computes its per-row update: the load is element-level, made again after lane 0 stores the
/// row's new value, so the update keeps its copy (found in review: `z` came out wrong in 3071
/// of 3072 elements when it was made in place).
#[test]
fn an_update_read_along_a_reduced_axis_keeps_its_copy() {
    let src = "graph t {
  input g: f32[48, 8, 8]
  state r: f32[48] = normal(seed=4)
  rb = broadcast_to(unsqueeze(r, axis=1), shape=[48, 64])
  rr = reshape(rb, shape=[48, 8, 8])
  y = mul(g, rr)
  z = sub(y, max(y, axes=[1, 2], keepdim=true))
  rn = add(mul(r, 0.5), sum(g, axes=[1, 2]))
  assign r = rn
  output z, rn
}
";
    check_gpu(src, REDUCTION, &[], 1);
}

#[test]
fn matmul_shapes() {
    for (sa, sb) in [
        ("13", "13"),
        ("5, 13", "13"),
        ("13", "13, 7"),
        ("1, 1", "1, 1"),
        ("17, 31", "31, 23"),
        ("65, 130", "130, 67"),
        ("257, 129", "129, 300"),
        ("2, 3, 9, 11", "11, 5"),
        ("3, 1, 9, 11", "4, 11, 5"),
    ] {
        let src = format!(
            "graph t {{\n  input a: f32[{sa}]\n  input b: f32[{sb}]\n  y = matmul(a, b)\n  output y\n}}\n"
        );
        check_gpu(&src, REDUCTION, &[], 1);
    }
    // Transposed operands are read through strides.
    let t = "graph t {\n  input a: f32[70, 33]\n  input b: f32[65, 33]\n  y = matmul(transpose(a, dim0=0, dim1=1), a)\n  z = matmul(a, transpose(b, dim0=0, dim1=1))\n  output y, z\n}\n";
    check_gpu(t, REDUCTION, &[], 1);
}

#[test]
fn softmax_and_norms() {
    let src = "graph t {
  input x: f32[5, 7, 33]
  input g: f32[33]
  input b: f32[33]
  s = softmax(x)
  s0 = softmax(x, axis=0)
  l = log_softmax(x, axis=1)
  n = layer_norm(x, g, b)
  r = rms_norm(x, g, eps=0.001)
  output s, s0, l, n, r
}
";
    check_gpu(src, TRANSCENDENTAL, &[], 1);
    // Many rows: a segment narrower than its row (1100 rows of 600 take 64 lanes, 1040 of 100
    // take 32), several rows per workgroup.
    let many = "graph t {
  input x: f32[1100, 600]
  input y: f32[2, 520, 100]
  input g: f32[100]
  input b: f32[100]
  s = softmax(x)
  l = log_softmax(x)
  m = max(x, axes=[1])
  n = layer_norm(y, g, b)
  r = rms_norm(y, g, eps=0.001)
  output s, l, m, n, r
}
";
    check_gpu(many, TRANSCENDENTAL, &[], 1);
    let gn = "graph t {
  input x: f32[2, 6, 5, 3]
  input g: f32[6]
  input b: f32[6]
  y = group_norm(x, g, b, groups=3)
  z = group_norm(x, g, b, groups=1)
  output y, z
}
";
    check_gpu(gn, TRANSCENDENTAL, &[], 1);
}

/// A layer norm whose backward keeps its statistics runs its forward as one row kernel writing
/// the mean, 1/std and normalized rows (`merge-reader`), on few odd rows (a whole workgroup per
/// row) and on many (several rows per workgroup), forward and backward.
#[test]
fn layer_norm_statistics_and_rows_in_one_kernel() {
    for shape in ["3, 7, 37", "2, 520, 100"] {
        let features = shape.rsplit(", ").next().expect("last extent");
        let src = format!(
            "graph t {{
  input x: f32[{shape}]
  input r: f32[{shape}]
  input g: f32[{features}]
  input b: f32[{features}]
  y = layer_norm(add(x, r), g, b)
  loss = sum(mul(y, y))
  dx, dg, db = grad(loss, x, g, b)
  output y, dx, dg, db
}}
"
        );
        let graph = sinter_ir::text::parse(&src).expect("valid");
        let artifact = sinter_compiler::compile(&graph, &Default::default())
            .expect("compiles")
            .artifact;
        assert!(
            artifact.kernels.iter().any(|k| k.pattern == "row_map"
                && k.rules.iter().any(|r| r == "merge-reader")
                && k.ops.iter().any(|o| o.ends_with("= rsqrt"))
                && k.ops.iter().any(|o| o == "y = add")),
            "{shape}: the statistics and y should be one row kernel"
        );
        check_gpu(&src, TRANSCENDENTAL, &[], 1);
    }
}

/// A residual stream re-added inside every layer norm is stored by the first kernel computing
/// it at every point and loaded by the later ones (`store-recomputed`), forward and backward,
/// with the stored value written from inside a row kernel's loop over the row.
#[test]
fn a_stored_residual_stream_on_the_gpu() {
    let mut src = String::from("graph t {\n  input x0: f32[3, 7, 37]\n");
    for l in 1..=4 {
        src.push_str(&format!(
            "  input h{l}: f32[3, 7, 37]\n  input g{l}: f32[37]\n  x{l} = add(x{}, h{l})\n  n{l} = layer_norm(x{l}, g{l}, g{l})\n  s{l} = sum(mul(n{l}, n{l}))\n",
            l - 1
        ));
    }
    src.push_str("  loss = add(add(s1, s2), add(s3, s4))\n  dx0, dg4 = grad(loss, x0, g4)\n  output loss, n4, dx0, dg4\n}\n");
    let graph = sinter_ir::text::parse(&src).expect("valid");
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .expect("compiles")
        .artifact;
    assert!(
        artifact
            .kernels
            .iter()
            .any(|k| k.rules.iter().any(|r| r == "store-recomputed")),
        "the stream should be stored"
    );
    check_gpu(&src, TRANSCENDENTAL, &[], 1);
}

#[test]
fn conv_and_pool() {
    let src = "graph t {
  input x: f32[2, 4, 11, 9]
  input w: f32[6, 2, 3, 3]
  input b: f32[6]
  y = conv2d(x, w, b, stride=[2, 1], padding=[1, 2], dilation=[1, 2], groups=2)
  m = max_pool2d(x, kernel=[3, 2], stride=[2, 2], padding=[1, 1])
  a = avg_pool2d(x, kernel=[2, 3], padding=[1, 1])
  output y, m, a
}
";
    check_gpu(src, REDUCTION, &[], 1);
    let plain = "graph t {\n  input x: f32[1, 3, 7, 7]\n  input w: f32[5, 3, 1, 1]\n  y = conv2d(x, w)\n  output y\n}\n";
    check_gpu(plain, REDUCTION, &[], 1);
}

/// Convolutions whose consumers fuse into their store (scale, activation, residual add of a
/// broadcast and of another tensor), forward and backward, against the interpreter.
#[test]
fn conv_epilogues() {
    let src = "graph t {
  input x: f32[2, 4, 9, 7]
  input res: f32[2, 6, 9, 7]
  input s: f32[6, 1, 1]
  param w: f32[6, 2, 3, 3] = normal(std=0.3, seed=1)
  param b: f32[6] = normal(std=0.1, seed=2)
  c = conv2d(x, w, b, padding=[1, 1], groups=2)
  y = relu(add(mul(c, s), res))
  z = tanh(conv2d(x, w, padding=[1, 1], groups=2))
  loss = add(sum(mul(y, y)), sum(z))
  dw, db = grad(loss, w, b)
  output y, z, loss, dw, db
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let options = sinter_compiler::Options::default();
    let artifact = sinter_compiler::compile(&graph, &options)
        .expect("compiles")
        .artifact;
    let epilogues: Vec<&Vec<String>> = artifact
        .kernels
        .iter()
        .filter(|k| k.pattern == "conv2d_epilogue")
        .map(|k| &k.rules)
        .collect();
    assert!(!epilogues.is_empty(), "no conv2d epilogue kernel");
    assert!(
        epilogues
            .iter()
            .all(|r| r.iter().any(|r| r == "fuse-conv2d-epilogue")),
        "{epilogues:?}"
    );
    sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
}

#[test]
fn embedding_and_losses() {
    let src = "graph t {
  input table: f32[11, 6]
  input ids: i32[3, 4]
  input logits: f32[7, 11]
  input labels: i32[7]
  input a: f32[4, 5]
  input b: f32[4, 5]
  e = embedding(table, ids)
  ce = cross_entropy(logits, labels)
  cs = cross_entropy(logits, labels, reduction=\"sum\")
  cn = cross_entropy(logits, labels, reduction=\"none\")
  ci = cross_entropy(logits, labels, ignore_index=4)
  cis = cross_entropy(logits, labels, reduction=\"sum\", ignore_index=4)
  m = mse_loss(a, b)
  ms = mse_loss(a, b, reduction=\"sum\")
  mn = mse_loss(a, b, reduction=\"none\")
  output e, ce, cs, cn, ci, cis, m, ms, mn
}
";
    check_gpu(src, TRANSCENDENTAL, &[], 11);
}

/// The embedding's gradient over several chunks of positions (600 ids, 256 a chunk) and two
/// column blocks (300 columns, 256 a block), ids repeating often (5 rows).
#[test]
fn embedding_gradient_over_chunks_and_column_blocks() {
    let src = "graph t {
  input dy: f32[2, 300, 300]
  input ids: i32[2, 300]
  g = embedding_grad(dy, ids, num_embeddings=5)
  output g
}
";
    check_gpu(src, REDUCTION, &[], 5);
}

#[test]
fn attention_every_mask_kind() {
    let cases = [
        "",
        ", causal=true",
        ", window=3",
        ", causal=true, window=2",
        ", m, mask_kind=\"additive\"",
        ", keep",
    ];
    for extra in cases {
        let src = format!(
            "graph t {{
  input q: f32[2, 3, 9, 8]
  input k: f32[2, 3, 9, 8]
  input v: f32[2, 3, 9, 5]
  input m: f32[1, 1, 9, 9]
  input keep: f32[2, 1, 1, 9]
  y = attention(q, k, v{extra})
  output y
}}
"
        );
        check_gpu(&src, TRANSCENDENTAL, &[], 1);
    }
    // key/value heads shared by groups of query heads (two groups of two, one of four)
    for (kv, extra) in [(2, ", causal=true"), (1, ", m, mask_kind=\"additive\"")] {
        let src = format!(
            "graph t {{
  input q: f32[2, 4, 9, 8]
  input k: f32[2, {kv}, 9, 8]
  input v: f32[2, {kv}, 9, 5]
  input m: f32[1, 4, 9, 9]
  y = attention(q, k, v{extra})
  output y
}}
"
        );
        check_gpu(&src, TRANSCENDENTAL, &[], 1);
    }
}

#[test]
fn optimizers() {
    let src = "graph t {
  input g: f32[5, 3]
  input t: f32[]
  input lr_raw: f32[]
  input bc_raw: f32[2]
  param w: f32[5, 3] = normal(std=0.5, seed=3)
  state m: f32[5, 3] = full(0.1)
  state v: f32[5, 3] = full(0.2)
  state buf: f32[5, 3] = ones
  w1 = sgd(w, g, lr=0.1, weight_decay=0.01)
  w2, b2 = sgd(w, g, buf, lr=0.1, momentum=0.9, nesterov=true)
  w3, m3, v3 = adam(w, g, m, v, t, lr=0.01, weight_decay=0.1)
  w4, m4, v4 = adamw(w, g, m, v, t)
  lr = abs(lr_raw)
  bc = add(abs(bc_raw), 0.05)
  w5, m5, v5 = adamw(w, g, m, v, t, lr, bc, weight_decay=0.1)
  w6 = sgd(w, g, lr, weight_decay=0.01)
  w7, b7 = sgd(w, g, buf, lr, momentum=0.9)
  output w1, w2, b2, w3, m3, v3, w4, m4, v4, w5, m5, v5, w6, w7, b7
}
";
    let t = sinter_ir::interp::Tensor::scalar(3.0);
    check_gpu(src, TRANSCENDENTAL, &[("t", t)], 1);
}

#[test]
fn plans_split_over_several_arenas_under_a_low_binding_limit() {
    let src = "graph t {
  input x: f32[64, 64]
  param w: f32[64, 64] = normal(std=0.1, seed=1)
  h = relu(matmul(x, w))
  y = softmax(matmul(h, w))
  output y
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    // Each tensor is 16 KiB: a 40 KiB limit fits at most two per arena.
    let options = sinter_compiler::Options {
        target: sinter_compiler::Target::portable().with_max_binding(40 << 10),
        ..Default::default()
    };
    let compiled = sinter_compiler::compile(&graph, &options).expect("compiles");
    assert!(
        compiled.artifact.arenas.len() >= 2,
        "{} arenas",
        compiled.artifact.arenas.len()
    );
    assert!(
        compiled
            .artifact
            .kernels
            .iter()
            .any(|k| k.arena_bindings >= 2)
    );
    sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
}

/// `cumsum` in every form along every axis, on contiguous and strided (transposed) operands,
/// and on lines long enough that the scan loop is unrolled to stay within the loop budget.
#[test]
fn cumsum_every_form_axis_and_stride() {
    for exclusive in [false, true] {
        for reverse in [false, true] {
            let f = format!("exclusive={exclusive}, reverse={reverse}");
            let src = format!(
                "graph t {{
  input x: f32[7, 13]
  input z: f32[3, 1, 300]
  a = cumsum(x, axis=0, {f})
  b = cumsum(x, axis=-1, {f})
  c = cumsum(transpose(x, dim0=0, dim1=1), axis=1, {f})
  d = cumsum(z, axis=2, {f})
  e = cumsum(z, axis=1, {f})
  output a, b, c, d, e
}}
"
            );
            check_gpu(&src, EXACTISH * 10.0, &[], 1);
        }
    }
    // 70000 > 65535: two elements per loop iteration
    for reverse in [false, true] {
        let src = format!(
            "graph t {{\n  input x: f32[2, 70000]\n  y = cumsum(x, axis=1, reverse={reverse})\n  output y\n}}\n"
        );
        check_gpu(&src, REDUCTION, &[], 1);
    }
}

/// A line longer than one invocation scans within the loop budget (16 elements per iteration,
/// 65535 iterations) is refused at compile time, not cut short on lavapipe.
#[test]
fn cumsum_past_the_loop_budget_is_refused() {
    let src = "graph t {\n  input x: f32[1048561]\n  y = cumsum(x, axis=0)\n  output y\n}\n";
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    let msg = match sinter_compiler::compile(&graph, &sinter_compiler::Options::default()) {
        Ok(_) => panic!("a line of 1048561 elements compiles"),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains("cumsum") && msg.contains("1048561") && msg.contains("loop budget"),
        "{msg}"
    );
    let fits = "graph t {\n  input x: f32[1048560]\n  y = cumsum(x, axis=0)\n  output y\n}\n";
    let graph = sinter_ir::text::parse(fits).unwrap_or_else(|d| panic!("{}", d.render("t", fits)));
    sinter_compiler::compile(&graph, &sinter_compiler::Options::default())
        .unwrap_or_else(|e| panic!("a line of 1048560 elements: {e}"));
}

#[test]
fn backward_primitives() {
    let src = "graph t {
  input x: f32[2, 4, 9, 8]
  input w: f32[6, 2, 3, 3]
  input dy: f32[2, 6, 5, 4]
  input pdy: f32[2, 4, 5, 5]
  input table_dy: f32[3, 5, 7]
  input ids: i32[3, 5]
  input sdy: f32[2, 4, 3, 8]
  gx = conv2d_grad_input(dy, w, input_shape=[2, 4, 9, 8], stride=[2, 2], padding=[1, 2], dilation=[1, 2], groups=2)
  gw = conv2d_grad_weight(x, dy, weight_shape=[6, 2, 3, 3], stride=[2, 2], padding=[1, 2], dilation=[1, 2], groups=2)
  mp = max_pool2d_grad(x, pdy, kernel=[3, 2], stride=[2, 2], padding=[1, 1])
  ap = avg_pool2d_grad(pdy, input_shape=[2, 4, 9, 8], kernel=[3, 2], stride=[2, 2], padding=[1, 1])
  eg = embedding_grad(table_dy, ids, num_embeddings=6)
  sg = slice_grad(sdy, shape=[2, 4, 9, 8], axis=2, start=1, end=9, step=3)
  output gx, gw, mp, ap, eg, sg
}
";
    check_gpu(src, REDUCTION, &[], 6);
}

/// Every bundled example with the gradient of its loss with respect to every param: the whole
/// backward pass on the GPU against the interpreter.
#[test]
fn example_gradients() {
    for name in ["mlp", "cnn", "transformer"] {
        let src = sinter_tests::with_param_grads(&sinter_tests::example_source(name));
        // i32 inputs (labels, token ids) get values below 10, the smallest class count.
        let errors = check_gpu(&src, REDUCTION, &[], 10);
        assert!(
            errors.iter().any(|(n, _)| n.starts_with("d_")),
            "{name}: no gradients compared"
        );
    }
}

/// The backward graph autodiff derives for each op family, on the GPU against the interpreter:
/// `loss = sum(y * r)` for a random `r`, gradients with respect to every input (declarations
/// separated by `;`).
#[test]
fn op_gradients() {
    let cases: &[(&str, &str)] = &[
        ("a: f32[3, 5]", "sin(a)"),
        ("a: f32[3, 5]", "mul(tanh(a), sigmoid(a))"),
        (
            "a: f32[3, 5]",
            "add(silu(a), gelu(a, approximate=\"tanh\"))",
        ),
        (
            "a: f32[3, 5]",
            "add(rsqrt(add(abs(a), 1)), reciprocal(add(square(a), 1)))",
        ),
        ("a: f32[3, 5]; b: f32[5]", "div(a, add(abs(b), 1))"),
        ("a: f32[3, 5]; b: f32[5]", "pow(add(abs(a), 1), b)"),
        ("a: f32[3, 5]; b: f32[3, 1]", "maximum(a, b)"),
        (
            "a: f32[3, 5]; b: f32[3, 5]",
            "where(gt(a, b), exp(a), log(add(abs(b), 1)))",
        ),
        ("a: f32[4, 6]", "max(a, axes=[1], keepdim=true)"),
        ("a: f32[4, 6]", "logsumexp(a, axes=[0])"),
        ("a: f32[4, 6]", "log_softmax(a, axis=0)"),
        (
            "a: f32[4, 6]",
            "mul(cumsum(a, axis=1), cumsum(exp(a), axis=0, exclusive=true, reverse=true))",
        ),
        ("a: f32[2, 3, 8]; g: f32[8]", "rms_norm(a, g)"),
        (
            "a: f32[4, 6]",
            "concat(slice(a, axis=1, start=1, end=6, step=2), transpose(slice(a, axis=0, start=0, end=3), dim0=0, dim1=1), axis=0)",
        ),
        (
            "a: f32[2, 3, 4]",
            "reshape(permute(a, perm=[2, 0, 1]), shape=[4, 6])",
        ),
        (
            "a: f32[4, 5]; b: f32[4, 5]",
            "mse_loss(a, b, reduction=\"none\")",
        ),
        ("a: f32[3, 7]; b: f32[7, 2]", "matmul(a, b)"),
        ("a: f32[7]", "matmul(a, a)"),
        // a tensor split in three parts (attention's q, k, v): its gradient is the three parts'
        // gradients joined, which `slice-grad-add` and `concat-concat` turn into one concat
        (
            "a: f32[2, 3, 9]",
            "mul(mul(slice(a, axis=2, start=0, end=3), slice(a, axis=2, start=3, end=6)), slice(a, axis=2, start=6, end=9))",
        ),
    ];
    for (i, (decls, expr)) in cases.iter().enumerate() {
        let inputs: Vec<(&str, &str)> = decls
            .split("; ")
            .map(|d| d.split_once(": ").expect("NAME: TYPE"))
            .collect();
        let probe = format!(
            "graph g {{\n{}\n  y = {expr}\n  output y\n}}\n",
            inputs
                .iter()
                .map(|(n, t)| format!("  input {n}: {t}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let graph = sinter_ir::text::parse(&probe)
            .unwrap_or_else(|d| panic!("{}", d.render("probe", &probe)));
        let y = graph.lookup("y").expect("y");
        let names: Vec<&str> = inputs.iter().map(|(n, _)| *n).collect();
        let grads: Vec<String> = names.iter().map(|n| format!("d_{n}")).collect();
        let src = format!(
            "graph g {{\n{}\n  input r: {}\n  y = {expr}\n  loss = sum(mul(y, r))\n  {} = grad(loss, {})\n  output loss, {}\n}}\n",
            inputs
                .iter()
                .map(|(n, t)| format!("  input {n}: {t}"))
                .collect::<Vec<_>>()
                .join("\n"),
            graph.ty(y),
            grads.join(", "),
            names.join(", "),
            grads.join(", ")
        );
        let errors = check_gpu(&src, REDUCTION, &[], 1);
        assert_eq!(errors.len(), 1 + names.len(), "case {i}: {expr}");
    }
}

/// The automatic choice, then every block shape forced.
const EVERY_TILE: [Option<Tile>; 6] = [
    None,
    Some(Tile::LARGE),
    Some(Tile::WIDE),
    Some(Tile::WIDE_DEEP),
    Some(Tile::MEDIUM),
    Some(Tile::SMALL),
];

/// Every matmul block shape on odd sizes (edges in every direction), transposed operands and
/// batch broadcasting; `tile_for` picks these by size, so small tests force them.
#[test]
fn every_matmul_tile() {
    let src = "graph t {
  input a: f32[2, 133, 70]
  input b: f32[259, 70]
  input c: f32[70, 259]
  y = matmul(a, transpose(b, dim0=0, dim1=1))
  z = matmul(a, c)
  output y, z
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    for tile in EVERY_TILE.into_iter().flatten() {
        let options = sinter_compiler::Options {
            matmul: Forced {
                tile: Some(tile),
                splits: None,
            },
            ..Default::default()
        };
        sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
    }
}

/// Every staging layout (a and b each plain or a transposed view, so `k` is the unit stride or
/// not and the staged slabs are padded or not), odd extents (1, 17, 129, 33), batch
/// broadcasting of either operand and a fused epilogue, under every block shape.
#[test]
fn matmul_layouts_and_odd_sizes() {
    let src = "graph t {
  input a: f32[3, 17, 129]
  input at: f32[129, 17]
  input b: f32[129, 33]
  input bt: f32[3, 33, 129]
  input bias: f32[33]
  input r: f32[1, 129]
  y1 = matmul(a, b)
  y2 = matmul(transpose(at, dim0=0, dim1=1), transpose(bt, dim0=-2, dim1=-1))
  y3 = add(mul(matmul(a, transpose(bt, dim0=-2, dim1=-1)), 0.5), bias)
  y4 = matmul(r, b)
  y5 = matmul(transpose(at, dim0=0, dim1=1), b)
  output y1, y2, y3, y4, y5
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    for tile in EVERY_TILE {
        let options = sinter_compiler::Options {
            matmul: Forced { tile, splits: None },
            ..Default::default()
        };
        let compiled = sinter_compiler::compile(&graph, &options).expect("compiles");
        assert!(
            compiled
                .artifact
                .kernels
                .iter()
                .any(|k| k.wgsl.contains("epilogue(")),
            "y3's scale and bias should be a matmul epilogue"
        );
        sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
    }
}

/// `graph` compiled with `tile` (or the automatic block shape) and `split` K chunks forced.
fn forced_matmul(
    graph: &sinter_ir::Graph,
    tile: Option<Tile>,
    split: usize,
) -> (sinter_compiler::Options, sinter_ir::artifact::Artifact) {
    let options = sinter_compiler::Options {
        matmul: Forced {
            tile,
            splits: Some(split),
        },
        ..Default::default()
    };
    let artifact = sinter_compiler::compile(graph, &options)
        .expect("compiles")
        .artifact;
    (options, artifact)
}

/// A batched product whose `b` is shared by the batch runs as one product over every row (the
/// batch axis folded into m) where that moves no address, its epilogue's tensors folded alike:
/// `y1` (a residual laid out like the output), `y4` and `y5` (a batch of 1, with an epilogue for
/// `y5`) fold; `y2` stays batched
/// (its epilogue's `pos` repeats over the batch), and so does `y3` (its `a` is a permuted view
/// whose batch stride is not 17 rows). Under every block shape and split.
#[test]
fn batch_axes_fold_into_rows_where_addresses_allow() {
    let src = "graph t {
  input a: f32[3, 17, 132]
  input x: f32[17, 3, 132]
  input b1: f32[132, 33]
  input b2: f32[132, 34]
  input b3: f32[132, 35]
  input b4: f32[132, 36]
  input res: f32[3, 17, 33]
  input pos: f32[17, 34]
  input one: f32[1, 5, 132]
  input b5: f32[132, 37]
  input c5: f32[1, 5, 37]
  y1 = add(mul(matmul(a, b1), 0.5), res)
  y2 = add(mul(matmul(a, b2), 0.5), pos)
  y3 = matmul(transpose(x, dim0=0, dim1=1), b3)
  y4 = matmul(one, b4)
  y5 = add(mul(matmul(one, b5), 0.5), c5)
  output y1, y2, y3, y4, y5
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    for tile in EVERY_TILE {
        for split in [1, 4] {
            let (options, artifact) = forced_matmul(&graph, tile, split);
            // whether the product kernels of `output` index a batch (besides split-K's chunks)
            let batched = |output: &str| {
                let products: Vec<&str> = artifact
                    .kernels
                    .iter()
                    .filter(|k| k.pattern.starts_with("matmul"))
                    .filter(|k| k.ops.iter().any(|o| o.contains(&format!("{output} = "))))
                    .map(|k| k.wgsl.as_str())
                    .collect();
                assert!(
                    !products.is_empty(),
                    "{tile:?} split {split}: no product of {output}"
                );
                let batch_axis = if split > 1 {
                    "var brem = wid.z;"
                } else {
                    "let b0 = wid.z;"
                };
                products.iter().all(|w| w.contains(batch_axis))
            };
            assert!(!batched("y1"), "{tile:?} split {split}: y1 should fold");
            assert!(
                batched("y2"),
                "{tile:?} split {split}: y2 should stay batched"
            );
            assert!(
                batched("y3"),
                "{tile:?} split {split}: y3 should stay batched"
            );
            assert!(!batched("y4"), "{tile:?} split {split}: y4 should fold");
            assert!(!batched("y5"), "{tile:?} split {split}: y5 should fold");
            sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
        }
    }
}

/// Split-K and quad loads under every block shape: each staging layout loading quads where the
/// unit stride, extents and offsets allow (`a` and `bt` along k, `b` along n, `at` along m) and
/// scalars where they do not (`u`'s slice starts at an odd offset; extents 1, 17 and 33; split
/// into 4 the chunks' stride 33 is not a multiple of 4), batch broadcasting and epilogues
/// (summed as quads for y3, as scalars for y7), unsplit and split into 3 or 4 chunks of
/// K = 132.
#[test]
fn matmul_split_k_and_quad_loads() {
    let src = "graph t {
  input a: f32[3, 17, 132]
  input at: f32[132, 20]
  input b: f32[132, 36]
  input b2: f32[132, 36]
  input bt: f32[3, 33, 132]
  input bias: f32[36]
  input bias2: f32[33]
  input r: f32[1, 132]
  input c: f32[132, 1]
  input u: f32[20, 133]
  y1 = matmul(a, b)
  y2 = matmul(transpose(at, dim0=0, dim1=1), transpose(bt, dim0=-2, dim1=-1))
  y3 = relu(add(mul(matmul(a, b2), 0.5), bias))
  y4 = matmul(r, b)
  y5 = matmul(a, c)
  y6 = matmul(slice(u, axis=1, start=1, end=133), b)
  y7 = add(matmul(a, transpose(bt, dim0=-2, dim1=-1)), bias2)
  output y1, y2, y3, y4, y5, y6, y7
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    for tile in EVERY_TILE {
        for split in [1, 3, 4] {
            let (options, artifact) = forced_matmul(&graph, tile, split);
            let matmuls: Vec<&str> = artifact
                .kernels
                .iter()
                .filter(|k| k.pattern.starts_with("matmul"))
                .map(|k| k.wgsl.as_str())
                .collect();
            let loads = |what: &str| matmuls.iter().filter(|w| w.contains(what)).count();
            assert!(
                loads("select(vec4<f32>(0.0), ") > 0,
                "{tile:?} split {split}: no quad loads"
            );
            assert!(
                loads("select(0.0, ") > 0,
                "{tile:?} split {split}: no scalar loads"
            );
            let sums = artifact
                .kernels
                .iter()
                .filter(|k| k.pattern.starts_with("splitk_sum"))
                .count();
            assert_eq!(sums > 0, split > 1, "{tile:?} split {split}");
            let epilogues = |pattern: &str| {
                artifact
                    .kernels
                    .iter()
                    .filter(|k| k.pattern == pattern)
                    .count()
            };
            // y3's and y7's (quads and scalars of the sum)
            if split > 1 {
                assert_eq!(
                    epilogues("splitk_sum_epilogue"),
                    2,
                    "{tile:?} split {split}"
                );
            } else {
                assert_eq!(epilogues("matmul_epilogue"), 2, "{tile:?} split {split}");
            }
            sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
        }
    }
}

/// The default choice splits a long K over few blocks (a weight gradient's shape: `x^T dy`),
/// with batch broadcasting and an epilogue.
#[test]
fn matmul_split_k_by_default() {
    let src = "graph t {
  input x: f32[2048, 40]
  input dy: f32[2, 2048, 36]
  input bias: f32[36]
  y = add(matmul(transpose(x, dim0=0, dim1=1), dy), bias)
  z = matmul(transpose(x, dim0=0, dim1=1), slice(dy, axis=0, start=0, end=1))
  output y, z
}
";
    let graph = sinter_ir::text::parse(src).expect("valid");
    let options = sinter_compiler::Options::default();
    let artifact = sinter_compiler::compile(&graph, &options)
        .expect("compiles")
        .artifact;
    let patterns: Vec<&str> = artifact
        .dispatches
        .iter()
        .map(|d| artifact.kernels[d.kernel as usize].pattern.as_str())
        .collect();
    assert_eq!(
        patterns,
        ["matmul", "splitk_sum_epilogue", "matmul", "splitk_sum"]
    );
    sinter_tests::check_graph_gpu(&graph, REDUCTION, &[], 1, &options);
}

/// An output that is an input, param or state itself (an ONNX `Identity` graph, a training
/// program that also reports a weight) shares its name with that tensor in the manifest: the
/// runtime tells them apart by role, and the output is the value at the start of the run.
#[test]
fn outputs_that_are_inputs_params_or_states() {
    let src = "graph t {
  input x: f32[3, 2]
  param p: f32[4] = normal(seed=5)
  state s: f32[2] = ones
  y = add(x, s)
  assign s = mul(s, 2)
  output x, p, s, y
}
";
    check_gpu(src, EXACTISH, &[], 1);
}
