//! Views and layout ops, `iota` and `constant`, against index arithmetic written here.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, Attrs, Op};

fn check(op: Op, attrs: Attrs, inputs: &[Tensor], expected: &Tensor) {
    let got = run1(op, attrs, inputs);
    assert_close(&got, expected, 0.0, op.name());
}

/// A tensor whose shape is `shape` and whose element `k` is `f(index of k)`.
fn build(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> Tensor {
    let n = shape.iter().product();
    Tensor::f32(
        shape.to_vec(),
        (0..n).map(|k| f(&unravel(k, shape))).collect(),
    )
}

fn ints(name: &str, v: &[i64]) -> Attrs {
    Attrs::new().with(name, Attr::ints(v))
}

#[test]
fn reshape_unsqueeze_squeeze_keep_c_order() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let want = f(&[3, 2], &x.data);
    check(
        Op::Reshape,
        ints("shape", &[3, -1]),
        std::slice::from_ref(&x),
        &want,
    );
    let un = Attrs::new().with("axis", Attr::Int(-1));
    check(
        Op::Unsqueeze,
        un,
        std::slice::from_ref(&x),
        &f(&[2, 3, 1], &x.data),
    );
    let one = f(&[1, 7], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let sq = Attrs::new().with("axis", Attr::Int(-2));
    check(
        Op::Squeeze,
        sq,
        std::slice::from_ref(&one),
        &f(&[7], &one.data),
    );
}

#[test]
fn permute_and_transpose() {
    let mut rng = Rng::new(6);
    let x = rng.tensor(&[2, 3, 5]);
    let at = |i: usize, j: usize, k: usize| x.data[(i * 3 + j) * 5 + k];
    // out axis 0 = in axis 2, out 1 = in 0, out 2 = in 1 (written -2).
    let want = build(&[5, 2, 3], |o| at(o[1], o[2], o[0]));
    check(
        Op::Permute,
        ints("perm", &[2, 0, -2]),
        std::slice::from_ref(&x),
        &want,
    );
    let tr = Attrs::new()
        .with("dim0", Attr::Int(-1))
        .with("dim1", Attr::Int(0));
    let want = build(&[5, 3, 2], |o| at(o[2], o[1], o[0]));
    check(Op::Transpose, tr, std::slice::from_ref(&x), &want);
    let ix = i(&[2, 2], &[1, 2, 3, 4]);
    let swap = Attrs::new()
        .with("dim0", Attr::Int(0))
        .with("dim1", Attr::Int(1));
    check(Op::Transpose, swap, &[ix], &i(&[2, 2], &[1, 3, 2, 4]));
}

#[test]
fn broadcast_to_extends_rank_and_size_one_axes() {
    let x = f(&[3, 1], &[1.0, 2.0, 3.0]);
    let want = build(&[2, 3, 4], |o| [1.0, 2.0, 3.0][o[1]]);
    check(Op::BroadcastTo, ints("shape", &[2, 3, 4]), &[x], &want);
    let s = f(&[], &[7.5]);
    check(
        Op::BroadcastTo,
        ints("shape", &[13]),
        &[s],
        &f(&[13], &[7.5; 13]),
    );
}

#[test]
fn slices() {
    let x = build(&[7, 13], |o| (o[0] * 100 + o[1]) as f64);
    let slice = |axis: i64, start: i64, end: i64, step: i64| {
        Attrs::new()
            .with("axis", Attr::Int(axis))
            .with("start", Attr::Int(start))
            .with("end", Attr::Int(end))
            .with("step", Attr::Int(step))
    };
    let want = build(&[7, 3], |o| (o[0] * 100 + 2 + 3 * o[1]) as f64);
    check(
        Op::Slice,
        slice(1, 2, 11, 3),
        std::slice::from_ref(&x),
        &want,
    );
    // Negative axis, start and end: rows 2, 4 of 7 (start -5 = 2, end -1 = 6).
    let want = build(&[2, 13], |o| ((2 + 2 * o[0]) * 100 + o[1]) as f64);
    check(
        Op::Slice,
        slice(-2, -5, -1, 2),
        std::slice::from_ref(&x),
        &want,
    );
    let want = build(&[7, 1], |o| (o[0] * 100 + 12) as f64);
    check(Op::Slice, slice(1, 12, 13, 5), &[x], &want);
}

#[test]
fn concat_of_three() {
    let parts = [
        build(&[2, 1, 3], |o| (o[0] * 1000 + o[2]) as f64),
        build(&[2, 4, 3], |o| {
            (o[0] * 1000 + 100 + o[1] * 10 + o[2]) as f64
        }),
        build(&[2, 2, 3], |o| {
            (o[0] * 1000 + 500 + o[1] * 10 + o[2]) as f64
        }),
    ];
    let want = build(&[2, 7, 3], |o| {
        let (b, r, c) = (o[0], o[1], o[2]);
        let base = (b * 1000 + c) as f64;
        match r {
            0 => base,
            1..=4 => base + 100.0 + ((r - 1) * 10) as f64,
            _ => base + 500.0 + ((r - 5) * 10) as f64,
        }
    });
    let axis = |a: i64| Attrs::new().with("axis", Attr::Int(a));
    check(Op::Concat, axis(-2), &parts, &want);
    let ints3 = [i(&[1], &[1]), i(&[2], &[2, 3]), i(&[1], &[4])];
    check(Op::Concat, axis(0), &ints3, &i(&[4], &[1, 2, 3, 4]));
}

#[test]
fn iota_and_constant() {
    let iota = |axis: i64| ints("shape", &[2, 3]).with("axis", Attr::Int(axis));
    check(
        Op::Iota,
        iota(1),
        &[],
        &f(&[2, 3], &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0]),
    );
    check(
        Op::Iota,
        iota(-2),
        &[],
        &f(&[2, 3], &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
    );
    let c = Attrs::new().with("value", Attr::Float(f64::NEG_INFINITY));
    check(Op::Constant, c, &[], &f(&[], &[f64::NEG_INFINITY]));
}

#[test]
fn repeats_written_as_ir_md_says() {
    // IR.md, "Repeating along an axis": repeat_interleave and tiling from unsqueeze,
    // broadcast_to and reshape, on x [2, 3, 2] repeated r = 2 times along axis 1
    let x = build(&[2, 3, 2], |i| (100 * i[0] + 10 * i[1] + i[2]) as f64);
    let src = "graph t {
  input x: f32[2, 3, 2]
  interleaved = reshape(broadcast_to(unsqueeze(x, axis=2), shape=[2, 3, 2, 2]), shape=[2, 6, 2])
  tiled = reshape(broadcast_to(unsqueeze(x, axis=1), shape=[2, 2, 3, 2]), shape=[2, 6, 2])
  output interleaved, tiled
}
";
    let g = sinter_ir::text::parse(src).expect("valid program");
    let feed = std::collections::HashMap::from([("x".to_string(), x.clone())]);
    let out = sinter_ir::interp::evaluate(&g, &feed, &std::collections::HashMap::new())
        .expect("evaluates");
    // torch.repeat_interleave(x, 2, dim=1): row j of the result is row j / 2 of x
    let interleaved = build(&[2, 6, 2], |i| x.at(&[i[0], i[1] / 2, i[2]]));
    // x.repeat(1, 2, 1): row j is row j % 3
    let tiled = build(&[2, 6, 2], |i| x.at(&[i[0], i[1] % 3, i[2]]));
    assert_close(&out.outputs[0].1, &interleaved, 0.0, "repeat_interleave");
    assert_close(&out.outputs[1].1, &tiled, 0.0, "repeat");
}
