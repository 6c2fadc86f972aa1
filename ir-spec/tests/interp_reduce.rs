//! Reductions, `argmax`, `cumsum`, `softmax` and `log_softmax` against hand values and naive loops.

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

fn cumsum(a: i64, exclusive: bool, reverse: bool) -> Attrs {
    axis(a)
        .with("exclusive", Attr::Bool(exclusive))
        .with("reverse", Attr::Bool(reverse))
}

#[test]
fn cumsum_hand_values() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let c = |a, e, r, want: &[f64]| check(Op::Cumsum, cumsum(a, e, r), &x, &f(&[2, 3], want));
    c(1, false, false, &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    c(-1, true, false, &[0.0, 1.0, 3.0, 0.0, 4.0, 9.0]);
    c(1, false, true, &[6.0, 5.0, 3.0, 15.0, 11.0, 6.0]);
    c(1, true, true, &[5.0, 3.0, 0.0, 11.0, 6.0, 0.0]);
    c(0, false, false, &[1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    c(-2, true, true, &[4.0, 5.0, 6.0, 0.0, 0.0, 0.0]);
    // defaults: inclusive, forward
    check(
        Op::Cumsum,
        axis(1),
        &x,
        &f(&[2, 3], &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0]),
    );
    // NaN and infinities propagate as through `+`; the first sum keeps `-0`
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let s = f(&[5], &[-0.0, 1.0, inf, -inf, nan]);
    let got = run1(Op::Cumsum, axis(0), std::slice::from_ref(&s));
    assert!(got.data[0] == 0.0 && got.data[0].is_sign_negative());
    assert_eq!(got.data[1..3], [1.0, inf]);
    assert!(got.data[3].is_nan() && got.data[4].is_nan());
    let got = run1(Op::Cumsum, cumsum(0, true, true), std::slice::from_ref(&s));
    assert!(got.data[..4].iter().all(|v| v.is_nan()));
    assert_eq!(got.data[4], 0.0);
}

/// Every `cumsum` form against the sum of the elements it names, on random values.
#[test]
fn cumsum_naive_sums() {
    let mut rng = Rng::new(11);
    let x = rng.tensor(&[3, 5, 4]);
    for exclusive in [false, true] {
        for reverse in [false, true] {
            let want: Vec<f64> = (0..x.data.len())
                .map(|k| {
                    let (a, b, c) = (k / 20, (k / 4) % 5, k % 4);
                    (0..5)
                        .filter(|&j| match (exclusive, reverse) {
                            (false, false) => j <= b,
                            (true, false) => j < b,
                            (false, true) => j >= b,
                            (true, true) => j > b,
                        })
                        .map(|j| x.data[(a * 5 + j) * 4 + c])
                        .sum()
                })
                .collect();
            check(
                Op::Cumsum,
                cumsum(1, exclusive, reverse),
                &x,
                &f(&[3, 5, 4], &want),
            );
        }
    }
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
