//! Optimizer steps against the torch.optim formulas, written step by step here.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::{EvalError, Tensor};
use sinter_ir::{Attr, Attrs, Op};

fn check(op: Op, attrs: Attrs, inputs: &[Tensor], expected: &[Tensor]) {
    let got = run(op, attrs, inputs).unwrap();
    assert_eq!(got.len(), expected.len(), "{}", op.name());
    for (k, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_close(g, e, 1e-14, &format!("{} result {k}", op.name()));
    }
}

fn floats(pairs: &[(&str, f64)]) -> Attrs {
    pairs
        .iter()
        .fold(Attrs::new(), |a, &(k, v)| a.with(k, Attr::Float(v)))
}

fn map(t: &Tensor, f: impl Fn(usize) -> f64) -> Tensor {
    Tensor::f32(t.shape().to_vec(), (0..t.numel()).map(f).collect())
}

#[test]
fn sgd_variants_over_three_steps() {
    let mut rng = Rng::new(15);
    let shape = [3, 7];
    // (momentum, dampening, nesterov, weight_decay)
    for (mom, damp, nest, wd) in [
        (0.0, 0.0, false, 0.0),
        (0.0, 0.0, false, 0.1),
        (0.9, 0.0, false, 0.0),
        (0.9, 0.25, false, 0.01),
        (0.8, 0.0, true, 0.05),
    ] {
        let lr = 0.1;
        let attrs = floats(&[
            ("lr", lr),
            ("momentum", mom),
            ("dampening", damp),
            ("weight_decay", wd),
        ])
        .with("nesterov", Attr::Bool(nest));
        let mut p = rng.tensor(&shape);
        let mut buf = Tensor::f32(shape.to_vec(), vec![0.0; 21]);
        for _ in 0..3 {
            let grad = rng.tensor(&shape);
            let g = map(&p, |i| grad.data[i] + wd * p.data[i]);
            let new_buf = map(&p, |i| mom * buf.data[i] + (1.0 - damp) * g.data[i]);
            let step = if mom == 0.0 {
                g.clone()
            } else if nest {
                map(&p, |i| g.data[i] + mom * new_buf.data[i])
            } else {
                new_buf.clone()
            };
            let new_p = map(&p, |i| p.data[i] - lr * step.data[i]);
            if mom == 0.0 {
                check(
                    Op::Sgd,
                    attrs.clone(),
                    &[p.clone(), grad],
                    std::slice::from_ref(&new_p),
                );
            } else {
                let expected = [new_p.clone(), new_buf.clone()];
                check(
                    Op::Sgd,
                    attrs.clone(),
                    &[p.clone(), grad, buf.clone()],
                    &expected,
                );
            }
            p = new_p;
            buf = new_buf;
        }
    }
}

#[test]
fn adam_first_step_moves_by_lr() {
    // Step 1: m̂ = g and v̂ = g², so the update is lr · g / (|g| + eps).
    let p = f(&[2], &[1.0, -2.0]);
    let g = f(&[2], &[-0.5, 3.0]);
    let zeros = f(&[2], &[0.0, 0.0]);
    let lr = 1e-3;
    let want_p = f(
        &[2],
        &[
            1.0 + lr * 0.5 / (0.5 + 1e-8),
            -2.0 - lr * 3.0 / (3.0 + 1e-8),
        ],
    );
    let want_m = f(&[2], &[-0.05, 0.3]);
    let want_v = f(&[2], &[0.001 * 0.25, 0.001 * 9.0]);
    let inputs = [p, g, zeros.clone(), zeros, f(&[], &[1.0])];
    check(Op::Adam, Attrs::new(), &inputs, &[want_p, want_m, want_v]);
}

#[test]
fn adam_and_adamw_over_three_steps() {
    let mut rng = Rng::new(16);
    let shape = [13];
    for (op, wd) in [
        (Op::Adam, 0.0),
        (Op::Adam, 0.1),
        (Op::AdamW, 0.01),
        (Op::AdamW, 0.2),
    ] {
        let (lr, b1, b2, eps) = (0.01, 0.8, 0.95, 1e-6);
        let attrs = floats(&[
            ("lr", lr),
            ("beta1", b1),
            ("beta2", b2),
            ("eps", eps),
            ("weight_decay", wd),
        ]);
        let mut p = rng.tensor(&shape);
        let mut m = map(&p, |_| 0.0);
        let mut v = map(&p, |_| 0.0);
        for t in 1..=3 {
            let grad = rng.tensor(&shape);
            let tf = t as f64;
            let mut new = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..13 {
                let (pi, g) = match op {
                    Op::AdamW => (p.data[i] * (1.0 - lr * wd), grad.data[i]),
                    _ => (p.data[i], grad.data[i] + wd * p.data[i]),
                };
                let mi = b1 * m.data[i] + (1.0 - b1) * g;
                let vi = b2 * v.data[i] + (1.0 - b2) * g * g;
                let m_hat = mi / (1.0 - b1.powi(t));
                let v_hat = vi / (1.0 - b2.powi(t));
                new.0.push(pi - lr * m_hat / (v_hat.sqrt() + eps));
                new.1.push(mi);
                new.2.push(vi);
            }
            let expected = [f(&shape, &new.0), f(&shape, &new.1), f(&shape, &new.2)];
            let inputs = [p.clone(), grad, m.clone(), v.clone(), f(&[], &[tf])];
            check(op, attrs.clone(), &inputs, &expected);
            [p, m, v] = expected;
        }
    }
}

#[test]
fn adam_rejects_step_zero() {
    let z = f(&[1], &[0.0]);
    let inputs = [z.clone(), z.clone(), z.clone(), z, f(&[], &[0.0])];
    let err = run(Op::AdamW, Attrs::new(), &inputs).unwrap_err();
    assert_eq!(
        err,
        EvalError::InvalidStep {
            op: "adamw",
            value_name: "x4".into(),
            step: 0.0
        }
    );
}
