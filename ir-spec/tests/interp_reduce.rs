//! Reductions, `argmax`, `softmax` and `log_softmax` against hand values and naive loops.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, Attrs, Op};

fn check(op: Op, attrs: Attrs, x: &Tensor, expected: &Tensor) {
    let got = run1(op, attrs, std::slice::from_ref(x));
    assert_close(&got, expected, 1e-14, op.name());
}

fn axes(a: &[i64], keepdim: bool) -> Attrs {
    Attrs::new()
        .with("axes", Attr::ints(a))
        .with("keepdim", Attr::Bool(keepdim))
}

fn axis(a: i64) -> Attrs {
    Attrs::new().with("axis", Attr::Int(a))
}

#[test]
fn hand_values() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check(Op::Sum, axes(&[1], false), &x, &f(&[2], &[6.0, 15.0]));
    check(Op::Sum, Attrs::new(), &x, &f(&[], &[21.0]));
    check(Op::Sum, axes(&[-1], true), &x, &f(&[2, 1], &[6.0, 15.0]));
    check(Op::Mean, axes(&[0], false), &x, &f(&[3], &[2.5, 3.5, 4.5]));
    check(Op::Mean, axes(&[-2, -1], true), &x, &f(&[1, 1], &[3.5]));
    check(Op::Max, axes(&[0], false), &x, &f(&[3], &[4.0, 5.0, 6.0]));
    check(Op::Min, axes(&[1], true), &x, &f(&[2, 1], &[1.0, 4.0]));
    let l = f(
        &[2, 2],
        &[0.0, 3f64.ln(), f64::NEG_INFINITY, f64::NEG_INFINITY],
    );
    check(
        Op::Logsumexp,
        axes(&[1], false),
        &l,
        &f(&[2], &[4f64.ln(), f64::NEG_INFINITY]),
    );
    let big = f(&[2], &[1000.0, 1000.0 + 3f64.ln()]);
    check(
        Op::Logsumexp,
        Attrs::new(),
        &big,
        &f(&[], &[1000.0 + 4f64.ln()]),
    );
    check(Op::Sum, Attrs::new(), &f(&[], &[2.5]), &f(&[], &[2.5]));
    check(
        Op::Max,
        Attrs::new(),
        &f(&[3], &[1.0, f64::NAN, 2.0]),
        &f(&[], &[f64::NAN]),
    );
}

/// Naive reduction: every element folded into the output element it belongs to.
fn naive(x: &Tensor, red: &[usize], keepdim: bool, op: Op) -> Tensor {
    let shape = x.shape();
    let out_shape: Vec<usize> = (0..shape.len())
        .filter_map(|a| match (red.contains(&a), keepdim) {
            (false, _) => Some(shape[a]),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    let n: usize = out_shape.iter().product();
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); n];
    for k in 0..x.numel() {
        let idx = unravel(k, shape);
        let mut o = 0;
        for a in 0..shape.len() {
            if !red.contains(&a) {
                o = o * shape[a] + idx[a];
            }
        }
        groups[o].push(x.data[k]);
    }
    let data = groups
        .iter()
        .map(|g| match op {
            Op::Sum => g.iter().sum(),
            Op::Mean => g.iter().sum::<f64>() / g.len() as f64,
            Op::Max => g.iter().cloned().fold(f64::MIN, f64::max),
            Op::Min => g.iter().cloned().fold(f64::MAX, f64::min),
            Op::Logsumexp => g.iter().map(|v| v.exp()).sum::<f64>().ln(),
            _ => unreachable!(),
        })
        .collect();
    Tensor::f32(out_shape, data)
}

#[test]
fn reductions_over_axis_sets() {
    let mut rng = Rng::new(3);
    let x = rng.tensor(&[7, 3, 13]);
    let sets: &[&[i64]] = &[
        &[0],
        &[1],
        &[2],
        &[-1],
        &[0, 2],
        &[-3, -2],
        &[0, 1, 2],
        &[1, -1],
    ];
    for &set in sets {
        let red: Vec<usize> = set.iter().map(|&a| a.rem_euclid(3) as usize).collect();
        for keepdim in [false, true] {
            for op in [Op::Sum, Op::Mean, Op::Max, Op::Min, Op::Logsumexp] {
                let want = naive(&x, &red, keepdim, op);
                check(op, axes(set, keepdim), &x, &want);
            }
        }
    }
}

#[test]
fn argmax_first_maximum() {
    let x = f(&[2, 3], &[1.0, 3.0, 3.0, 5.0, 2.0, 5.0]);
    let argmax = |a: i64, keepdim: bool| axis(a).with("keepdim", Attr::Bool(keepdim));
    check(Op::Argmax, argmax(1, false), &x, &i(&[2], &[1, 0]));
    check(Op::Argmax, argmax(-2, false), &x, &i(&[3], &[1, 0, 1]));
    check(Op::Argmax, argmax(-1, true), &x, &i(&[2, 1], &[1, 0]));
    let mut rng = Rng::new(4);
    let x = rng.tensor(&[5, 7, 3]);
    let want: Vec<i64> = (0..5 * 3)
        .map(|k| {
            let (a, c) = (k / 3, k % 3);
            let col: Vec<f64> = (0..7).map(|b| x.data[(a * 7 + b) * 3 + c]).collect();
            let m = col.iter().cloned().fold(f64::MIN, f64::max);
            col.iter().position(|&v| v == m).unwrap() as i64
        })
        .collect();
    check(Op::Argmax, axis(1), &x, &i(&[5, 3], &want));
}

#[test]
fn softmax_hand_values() {
    let (l2, l5) = (2f64.ln(), 5f64.ln());
    let x = f(&[3], &[0.0, l2, l5]);
    check(
        Op::Softmax,
        Attrs::new(),
        &x,
        &f(&[3], &[0.125, 0.25, 0.625]),
    );
    let logs = [0.125f64.ln(), 0.25f64.ln(), 0.625f64.ln()];
    check(Op::LogSoftmax, Attrs::new(), &x, &f(&[3], &logs));
    // Along axis 0 of [3, 2] (written -2), shifted far up: stable.
    let x = f(&[3, 2], &[1000.0, 0.0, 1000.0 + l2, 0.0, 1000.0 + l5, 0.0]);
    let third = 1.0 / 3.0;
    let want = f(&[3, 2], &[0.125, third, 0.25, third, 0.625, third]);
    // 1000 + ln 2 is itself rounded (to 1e-13), hence the looser tolerance.
    let got = run1(Op::Softmax, axis(-2), &[x]);
    assert_close(&got, &want, 1e-12, "shifted softmax");
    let nan = f64::NAN;
    let x = f(
        &[2, 2],
        &[f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0, f64::NEG_INFINITY],
    );
    check(
        Op::Softmax,
        Attrs::new(),
        &x,
        &f(&[2, 2], &[nan, nan, 1.0, 0.0]),
    );
    let want = f(&[2, 2], &[nan, nan, 0.0, f64::NEG_INFINITY]);
    check(Op::LogSoftmax, Attrs::new(), &x, &want);
}

#[test]
fn softmax_random_against_naive() {
    let mut rng = Rng::new(5);
    let x = rng.tensor(&[3, 7, 2]);
    let mut want = vec![0.0; x.numel()];
    let mut want_log = vec![0.0; x.numel()];
    for a in 0..3 {
        for c in 0..2 {
            let at = |b: usize| (a * 7 + b) * 2 + c;
            let z: f64 = (0..7).map(|b| x.data[at(b)].exp()).sum();
            for b in 0..7 {
                want[at(b)] = x.data[at(b)].exp() / z;
                want_log[at(b)] = x.data[at(b)] - z.ln();
            }
        }
    }
    check(Op::Softmax, axis(1), &x, &f(&[3, 7, 2], &want));
    check(Op::LogSoftmax, axis(-2), &x, &f(&[3, 7, 2], &want_log));
}
