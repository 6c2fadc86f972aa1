//! Reductions over axes, `argmax`, and `softmax`/`log_softmax` along an axis.

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::tensor::{Tensor, View, split_at_axis};
use crate::op::Op;

/// `sum`, `mean`, `max`, `min`, `logsumexp` over the (normalized) `axes`.
pub(crate) fn reduce(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let axes = cx.attrs.of(key::AXES);
    // Kept axes first, reduced axes last: each output element reduces one contiguous chunk.
    let perm: Vec<usize> = (0..x.rank())
        .filter(|a| !axes.contains(a))
        .chain(axes.iter().copied())
        .collect();
    let data = View::of(x).permute(&perm).gather();
    let chunk: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let f: fn(&[f64]) -> f64 = match cx.op {
        Op::Sum => |c| c.iter().sum(),
        Op::Mean => |c| c.iter().sum::<f64>() / c.len() as f64,
        Op::Max => |c| extreme(c, |a, b| a > b),
        Op::Min => |c| extreme(c, |a, b| a < b),
        Op::Logsumexp => logsumexp,
        other => unreachable!("`{}` is not a reduction", other.name()),
    };
    Tensor::new(cx.out().clone(), data.chunks(chunk).map(f).collect())
}

/// The max (or min) of a slice; NaN if any element is NaN, as in PyTorch.
fn extreme(c: &[f64], better: fn(f64, f64) -> bool) -> f64 {
    let mut best = c[0];
    for &v in c {
        if v.is_nan() {
            return v;
        }
        if better(v, best) {
            best = v;
        }
    }
    best
}

/// `log Σ exp(x)`, shifted by the max; `-inf` when every element is `-inf`, `inf` if one is.
pub(crate) fn logsumexp(c: &[f64]) -> f64 {
    let m = extreme(c, |a, b| a > b);
    if m.is_infinite() || m.is_nan() {
        return m;
    }
    m + c.iter().map(|&v| (v - m).exp()).sum::<f64>().ln()
}

/// `argmax`: the first index of the maximum along `axis` (a NaN counts as the maximum, as in
/// PyTorch), as i32.
pub(crate) fn argmax(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let (outer, n, inner) = split_at_axis(x.shape(), cx.attrs.of(key::AXIS));
    let last = cx.attrs.of(key::LAST);
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| x.data[(o * n + i) * inner + j];
            let mut best = 0;
            for i in 1..n {
                let (v, b) = (at(i), at(best));
                // a NaN is the maximum; ties (NaNs among them) go to the first, or the last
                let takes = if last {
                    v.is_nan() || (!b.is_nan() && v >= b)
                } else {
                    !b.is_nan() && (v > b || v.is_nan())
                };
                if takes {
                    best = i;
                }
            }
            data.push(best as f64);
        }
    }
    Tensor::new(cx.out().clone(), data)
}

/// `cumsum` along `axis`: each element the sum of the elements up to it (before it with
/// `exclusive`, where the first is 0), counted from the end with `reverse`. Plain f64 additions in scan order, so NaN
/// and infinities propagate as they do through `+`.
pub(crate) fn cumsum(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let (outer, n, inner) = split_at_axis(x.shape(), cx.attrs.of(key::AXIS));
    let (exclusive, reverse) = (cx.attrs.of(key::EXCLUSIVE), cx.attrs.of(key::REVERSE));
    let mut data = vec![0.0; x.data.len()];
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| (o * n + i) * inner + j;
            let mut acc = 0.0;
            for step in 0..n {
                let i = if reverse { n - 1 - step } else { step };
                let v = x.data[at(i)];
                if exclusive {
                    data[at(i)] = acc;
                }
                // the first sum is the element itself, so `-0` stays `-0` as in PyTorch
                acc = if step == 0 { v } else { acc + v };
                if !exclusive {
                    data[at(i)] = acc;
                }
            }
        }
    }
    Tensor::new(cx.out().clone(), data)
}

/// `softmax` or `log_softmax` along `axis`, shifted by the row max. A row of only `-inf` gives
/// NaN, as in PyTorch.
pub(crate) fn softmax(cx: &Cx) -> Tensor {
    let x = cx.x(0);
    let (outer, n, inner) = split_at_axis(x.shape(), cx.attrs.of(key::AXIS));
    let mut data = vec![0.0; x.numel()];
    let mut row = vec![0.0; n];
    for o in 0..outer {
        for j in 0..inner {
            let at = |i: usize| (o * n + i) * inner + j;
            for (i, r) in row.iter_mut().enumerate() {
                *r = x.data[at(i)];
            }
            let out = match cx.op {
                Op::Softmax => softmax_row(&row),
                _ => log_softmax_row(&row),
            };
            for (i, v) in out.into_iter().enumerate() {
                data[at(i)] = v;
            }
        }
    }
    Tensor::new(cx.out().clone(), data)
}

/// `exp(x - max) / Σ exp(x - max)`.
pub(crate) fn softmax_row(row: &[f64]) -> Vec<f64> {
    let m = extreme(row, |a, b| a > b);
    let e: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|v| v / s).collect()
}

/// `x - max - log Σ exp(x - max)`.
pub(crate) fn log_softmax_row(row: &[f64]) -> Vec<f64> {
    let m = extreme(row, |a, b| a > b);
    let s: f64 = row.iter().map(|&v| (v - m).exp()).sum();
    let l = s.ln();
    row.iter().map(|&v| v - m - l).collect()
}
