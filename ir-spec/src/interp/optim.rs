//! Optimizer steps, elementwise, as `torch.optim` computes them (torch 2.x, `maximize=False`).

use crate::attr::key;
use crate::interp::EvalError;
use crate::interp::node::Cx;
use crate::interp::tensor::Tensor;
use crate::op::Op;

/// `sgd(param, grad, [buf])` → `param'` (and `buf'` with momentum):
/// `g = grad + wd·param`; with momentum `buf' = momentum·buf + (1 − dampening)·g` and
/// `g = nesterov ? g + momentum·buf' : buf'`; then `param' = param − lr·g`.
///
/// **Difference from torch:** torch's first step sets the buffer to `g` itself (no dampening)
/// because its buffer starts as `None`. Here the buffer is an explicit state, initialized to
/// zeros by the user, and the same update applies on every step. With `dampening = 0` (torch's
/// default) the two agree, since `momentum·0 + g = g`.
pub(crate) fn sgd(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let (param, grad) = (&cx.x(0).data, &cx.x(1).data);
    let momentum = cx.attrs.of(key::MOMENTUM);
    let tensors = 2 + usize::from(momentum != 0.0);
    let buf = (momentum != 0.0).then(|| &cx.x(2).data);
    let lr = match cx.optional(tensors) {
        Some(lr) => lr.data[0],
        None => cx.attrs.of(key::LR),
    };
    let dampening = cx.attrs.of(key::DAMPENING);
    let nesterov = cx.attrs.of(key::NESTEROV);
    let wd = cx.attrs.of(key::WEIGHT_DECAY);
    let mut new_param = Vec::with_capacity(param.len());
    let mut new_buf = Vec::with_capacity(param.len());
    for i in 0..param.len() {
        // as torch: the decay term only when it is not zero
        let mut g = if wd != 0.0 {
            grad[i] + wd * param[i]
        } else {
            grad[i]
        };
        if let Some(buf) = buf {
            let b = momentum * buf[i] + (1.0 - dampening) * g;
            g = if nesterov { g + momentum * b } else { b };
            new_buf.push(b);
        }
        new_param.push(param[i] - lr * g);
    }
    let ty = cx.out().clone();
    let mut out = vec![Tensor::new(ty.clone(), new_param)];
    if buf.is_some() {
        out.push(Tensor::new(ty, new_buf));
    }
    Ok(out)
}

/// `adam` / `adamw(param, grad, m, v, t, [lr], [bias_corrections])` → `param', m', v'`, for
/// the 1-based step `t` (`lr` the operand when given, and `1 − β1ᵗ`, `1 − β2ᵗ` the two
/// elements of `bias_corrections` when given):
/// `g = grad + wd·param` (adam) or `param ← param·(1 − lr·wd)`, `g = grad` (adamw);
/// `m' = β1·m + (1 − β1)·g`; `v' = β2·v + (1 − β2)·g²`; `m̂ = m' / (1 − β1ᵗ)`;
/// `v̂ = v' / (1 − β2ᵗ)`; `param' = param − lr·m̂ / (√v̂ + eps)`.
/// A step below 1 is an [`EvalError::InvalidStep`] (its bias correction divides by zero).
pub(crate) fn adam(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let (param, grad, m, v) = (&cx.x(0).data, &cx.x(1).data, &cx.x(2).data, &cx.x(3).data);
    let t = cx.x(4).data[0];
    if t.is_nan() || t < 1.0 {
        return Err(EvalError::InvalidStep {
            op: cx.op.name(),
            value_name: cx.name(4).to_string(),
            step: t,
        });
    }
    let [lr, beta1, beta2, eps, wd] =
        [key::LR, key::BETA1, key::BETA2, key::EPS, key::WEIGHT_DECAY].map(|a| cx.attrs.of(a));
    let lr = cx.optional(5).map_or(lr, |t| t.data[0]);
    let decoupled = cx.op == Op::AdamW;
    let (bc1, bc2) = match cx.optional(6) {
        Some(c) => (c.data[0], c.data[1]),
        None => (1.0 - beta1.powf(t), 1.0 - beta2.powf(t)),
    };
    let n = param.len();
    let (mut new_p, mut new_m, mut new_v) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for i in 0..n {
        let (p, g) = if decoupled {
            (param[i] * (1.0 - lr * wd), grad[i])
        } else if wd != 0.0 {
            (param[i], grad[i] + wd * param[i])
        } else {
            (param[i], grad[i])
        };
        let mi = beta1 * m[i] + (1.0 - beta1) * g;
        let vi = beta2 * v[i] + (1.0 - beta2) * g * g;
        let (m_hat, v_hat) = (mi / bc1, vi / bc2);
        new_p.push(p - lr * m_hat / (v_hat.sqrt() + eps));
        new_m.push(mi);
        new_v.push(vi);
    }
    let ty = cx.out().clone();
    Ok(vec![
        Tensor::new(ty.clone(), new_p),
        Tensor::new(ty.clone(), new_m),
        Tensor::new(ty, new_v),
    ])
}
