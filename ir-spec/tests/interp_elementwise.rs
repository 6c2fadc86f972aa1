//! Unary, binary, comparison, `where` and `cast` semantics against closed forms and naive loops.

mod interp_common;

use std::f64::consts::{E, LN_2, PI};

use interp_common::*;
use sinter_ir::interp::Tensor;
use sinter_ir::interp::special::{erf, erfc};
use sinter_ir::{Attr, Attrs, Op};

fn check(op: Op, attrs: Attrs, inputs: &[Tensor], expected: &Tensor, tol: f64) {
    let got = run1(op, attrs, inputs);
    assert_close(&got, expected, tol, op.name());
}

fn unary(op: Op, cases: &[(f64, f64)]) {
    let x: Vec<f64> = cases.iter().map(|c| c.0).collect();
    let y: Vec<f64> = cases.iter().map(|c| c.1).collect();
    let n = x.len();
    check(op, Attrs::new(), &[f(&[n], &x)], &f(&[n], &y), 1e-15);
}

#[test]
fn unary_closed_forms() {
    let ln3 = 3f64.ln();
    unary(Op::Neg, &[(1.5, -1.5), (-2.0, 2.0), (0.0, 0.0)]);
    unary(Op::Abs, &[(-2.5, 2.5), (3.0, 3.0), (0.0, 0.0)]);
    unary(Op::Exp, &[(0.0, 1.0), (LN_2, 2.0), (1.0, E), (-LN_2, 0.5)]);
    unary(
        Op::Log,
        &[
            (1.0, 0.0),
            (E, 1.0),
            (8.0, 3.0 * LN_2),
            (0.0, f64::NEG_INFINITY),
        ],
    );
    unary(Op::Sqrt, &[(2.25, 1.5), (16.0, 4.0), (0.0, 0.0)]);
    unary(Op::Rsqrt, &[(4.0, 0.5), (0.25, 2.0), (0.0, f64::INFINITY)]);
    unary(Op::Reciprocal, &[(-4.0, -0.25), (0.5, 2.0)]);
    unary(Op::Square, &[(-3.0, 9.0), (0.5, 0.25)]);
    unary(
        Op::Relu,
        &[(-1.0, 0.0), (0.0, 0.0), (2.5, 2.5), (f64::NAN, f64::NAN)],
    );
    unary(
        Op::Sigmoid,
        &[(0.0, 0.5), (ln3, 0.75), (-ln3, 0.25), (-800.0, 0.0)],
    );
    unary(Op::Tanh, &[(0.0, 0.0), (LN_2, 0.6), (-LN_2, -0.6)]);
    unary(
        Op::Silu,
        &[(0.0, 0.0), (ln3, 0.75 * ln3), (-ln3, -0.25 * ln3)],
    );
    unary(
        Op::Sin,
        &[(PI / 6.0, 0.5), (PI / 2.0, 1.0), (-PI / 2.0, -1.0)],
    );
    unary(Op::Cos, &[(PI / 3.0, 0.5), (PI, -1.0), (0.0, 1.0)]);
}

#[test]
fn sigmoid_and_silu_match_tanh_identities() {
    let mut rng = Rng::new(1);
    let x = rng.tensor(&[7, 13]);
    let half_tanh = |v: f64| 0.5 * (1.0 + (v / 2.0).tanh());
    let sig = Tensor::f32(vec![7, 13], x.data.iter().map(|&v| half_tanh(v)).collect());
    check(
        Op::Sigmoid,
        Attrs::new(),
        std::slice::from_ref(&x),
        &sig,
        1e-15,
    );
    let silu = Tensor::f32(
        vec![7, 13],
        x.data.iter().map(|&v| v * half_tanh(v)).collect(),
    );
    check(Op::Silu, Attrs::new(), &[x], &silu, 1e-15);
}

/// 40-digit values (mpmath).
const ERF: &[(f64, f64)] = &[
    (0.0, 0.0),
    (1e-10, 1.1283791670955126e-10),
    (0.1, 0.1124629160182849),
    (0.25, 0.27632639016823696),
    (0.5, 0.5204998778130465),
    (0.75, 0.7111556336535151),
    (1.0, 0.8427007929497149),
    (1.5, 0.9661051464753108),
    (1.9999, 0.9953201979070294),
    (2.0, 0.9953222650189527),
    (2.5, 0.999593047982555),
    (3.0, 0.9999779095030014),
    (4.0, 0.9999999845827421),
    (5.5, 0.9999999999999927),
    (-0.3, -0.3286267594591274),
    (-1.2, -0.9103139782296353),
    (-3.7, -0.9999998328489421),
];

const ERFC_TAIL: &[(f64, f64)] = &[
    (2.0, 0.004677734981047266),
    (3.0, 2.209049699858544e-05),
    (5.0, 1.537459794428035e-12),
    (8.0, 1.1224297172982926e-29),
    (12.0, 1.3562611692059042e-64),
    (26.0, 5.663192408856143e-296),
];

#[test]
fn erf_matches_known_values() {
    for &(x, e) in ERF {
        assert!(
            (erf(x) - e).abs() <= 1e-15,
            "erf({x}) = {}, want {e}",
            erf(x)
        );
        assert!((erfc(x) - (1.0 - e)).abs() <= 1e-15, "erfc({x})");
    }
    for &(x, e) in ERFC_TAIL {
        assert!(
            ((erfc(x) - e) / e).abs() <= 1e-14,
            "erfc({x}) = {}, want {e}",
            erfc(x)
        );
        assert!(((erfc(-x) - (2.0 - e)) / 2.0).abs() <= 1e-15, "erfc(-{x})");
    }
    assert_eq!(erf(f64::INFINITY), 1.0);
    assert_eq!(erf(f64::NEG_INFINITY), -1.0);
    assert!(erf(f64::NAN).is_nan());
}

#[test]
fn gelu_both_forms() {
    // x·Φ(x), 40-digit values (mpmath).
    let exact: &[(f64, f64)] = &[
        (-12.0, -2.1317785344932147e-32),
        (-6.0, -5.9195258702261885e-09),
        (-3.0, -0.0040496940948902835),
        (-1.0, -0.15865525393145705),
        (-0.5, -0.15426876936299344),
        (0.0, 0.0),
        (0.3, 0.1853734266566858),
        (1.0, 0.8413447460685429),
        (2.0, 1.9544997361036416),
        (4.0, 3.9998733150326675),
    ];
    let x: Vec<f64> = exact.iter().map(|c| c.0).collect();
    let n = x.len();
    let y: Vec<f64> = exact.iter().map(|c| c.1).collect();
    let got = run1(Op::Gelu, Attrs::new(), &[f(&[n], &x)]);
    for i in 0..n {
        let tol = 1e-15 * y[i].abs().max(1e-300) + 1e-16;
        assert!(
            (got.data[i] - y[i]).abs() <= tol,
            "gelu({}) = {}",
            x[i],
            got.data[i]
        );
    }
    let tanh_form = |v: f64| {
        let inner = (2.0 / PI).sqrt() * (v + 0.044715 * v.powi(3));
        0.5 * v * (1.0 + inner.tanh())
    };
    let attrs = Attrs::new().with("approximate", Attr::Str("tanh".into()));
    let y: Vec<f64> = x.iter().map(|&v| tanh_form(v)).collect();
    check(Op::Gelu, attrs, &[f(&[n], &x)], &f(&[n], &y), 1e-15);
}

/// An independent scalar definition of each binary op.
fn scalar_binary(op: Op, a: f64, b: f64) -> f64 {
    let t = |c: bool| if c { 1.0 } else { 0.0 };
    match op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Div => a / b,
        Op::Pow => (b * a.ln()).exp(),
        Op::Maximum => {
            if a >= b {
                a
            } else {
                b
            }
        }
        Op::Minimum => {
            if a <= b {
                a
            } else {
                b
            }
        }
        Op::Eq => t(a == b),
        Op::Lt => t(a < b),
        Op::Le => t(a <= b),
        Op::Gt => t(a > b),
        Op::Ge => t(a >= b),
        _ => unreachable!(),
    }
}

#[rustfmt::skip]
const BINARY: [Op; 12] = [
    Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Pow, Op::Maximum, Op::Minimum,
    Op::Eq, Op::Lt, Op::Le, Op::Gt, Op::Ge,
];

#[test]
fn binary_broadcasting_corners() {
    let mut rng = Rng::new(2);
    let shapes: &[(&[usize], &[usize], &[usize])] = &[
        (&[], &[2, 3], &[2, 3]),
        (&[2, 3], &[], &[2, 3]),
        (&[3, 1], &[1, 4], &[3, 4]),
        (&[2, 3, 4], &[4], &[2, 3, 4]),
        (&[7, 1, 13], &[13], &[7, 1, 13]),
        (&[1], &[7, 1], &[7, 1]),
        (&[5, 1, 1], &[1, 3, 2], &[5, 3, 2]),
    ];
    for &(sa, sb, so) in shapes {
        for op in BINARY {
            let (a, mut b) = (rng.positive(sa), rng.positive(sb));
            if matches!(op, Op::Eq | Op::Le | Op::Ge) && !b.data.is_empty() {
                b.data[0] = a.data[0]; // exercise equality
            }
            let n: usize = so.iter().product();
            let data = (0..n)
                .map(|k| {
                    let idx = unravel(k, so);
                    scalar_binary(op, at_broadcast(&a, &idx), at_broadcast(&b, &idx))
                })
                .collect();
            let expected = Tensor::f32(so.to_vec(), data);
            check(op, Attrs::new(), &[a, b], &expected, 1e-14);
        }
    }
}

#[test]
fn nan_handling() {
    let a = f(&[3], &[f64::NAN, 1.0, 2.0]);
    let b = f(&[3], &[0.0, f64::NAN, 1.0]);
    check(
        Op::Maximum,
        Attrs::new(),
        &[a.clone(), b.clone()],
        &f(&[3], &[f64::NAN, f64::NAN, 2.0]),
        0.0,
    );
    check(
        Op::Minimum,
        Attrs::new(),
        &[a.clone(), b.clone()],
        &f(&[3], &[f64::NAN, f64::NAN, 1.0]),
        0.0,
    );
    check(
        Op::Eq,
        Attrs::new(),
        &[a.clone(), a.clone()],
        &f(&[3], &[0.0, 1.0, 1.0]),
        0.0,
    );
    check(
        Op::Lt,
        Attrs::new(),
        &[a, b],
        &f(&[3], &[0.0, 0.0, 0.0]),
        0.0,
    );
}

#[test]
fn comparisons_of_i32() {
    let a = i(&[2, 3], &[-2, 0, 5, 7, 7, 1]);
    let b = i(&[3], &[0, 0, 7]);
    let cases = [
        (Op::Eq, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
        (Op::Lt, [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
        (Op::Le, [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]),
        (Op::Gt, [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]),
        (Op::Ge, [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]),
    ];
    for (op, want) in cases {
        check(
            op,
            Attrs::new(),
            &[a.clone(), b.clone()],
            &f(&[2, 3], &want),
            0.0,
        );
    }
}

#[test]
fn where_selects_with_broadcasting() {
    // cond [3, 1], a [1, 4], b scalar.
    let cond = f(&[3, 1], &[0.0, -2.0, 1.0]);
    let a = f(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
    let b = f(&[], &[-9.0]);
    let want = f(
        &[3, 4],
        &[
            -9.0, -9.0, -9.0, -9.0, 1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0,
        ],
    );
    check(Op::Where, Attrs::new(), &[cond, a, b], &want, 0.0);
    // i32 condition and i32 branches.
    let cond = i(&[4], &[1, 0, 0, 3]);
    let a = i(&[4], &[10, 20, 30, 40]);
    let b = i(&[1], &[-1]);
    check(
        Op::Where,
        Attrs::new(),
        &[cond, a, b],
        &i(&[4], &[10, -1, -1, 40]),
        0.0,
    );
}

#[test]
fn casts() {
    let to_i32 = Attrs::new().with("dtype", Attr::Str("i32".into()));
    let x = f(&[6], &[-2.7, -0.5, 0.5, 2.7, 3.0, -7.0]);
    check(Op::Cast, to_i32, &[x], &i(&[6], &[-2, 0, 0, 2, 3, -7]), 0.0);
    let to_f32 = Attrs::new().with("dtype", Attr::Str("f32".into()));
    let big = i(&[3], &[16_777_217, -2_147_483_648, 2_147_483_647]);
    let want = f(&[3], &[16_777_217.0, -2_147_483_648.0, 2_147_483_647.0]);
    check(Op::Cast, to_f32, &[big], &want, 0.0);
}
