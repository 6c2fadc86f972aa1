//! Losses: `cross_entropy` and `mse_loss`, with `reduction` mean, sum or none.

use crate::attr::key;
use crate::interp::EvalError;
use crate::interp::node::Cx;
use crate::interp::reduce::logsumexp;
use crate::interp::tensor::Tensor;

/// Applies `reduction` to per-element losses.
fn reduce(cx: &Cx, losses: Vec<f64>) -> Tensor {
    let data = match cx.attrs.of(key::REDUCTION) {
        "none" => losses,
        "sum" => vec![losses.iter().sum()],
        _ => vec![losses.iter().sum::<f64>() / losses.len() as f64],
    };
    Tensor::new(cx.out().clone(), data)
}

/// `logsumexp(logits[i]) - logits[i, labels[i]]` for logits `[N, C]` and i32 labels `[N]`.
/// A label outside `0..C` is an [`EvalError::IndexOutOfRange`] (there is no ignore index).
pub(crate) fn cross_entropy(cx: &Cx) -> Result<Tensor, EvalError> {
    let logits = cx.x(0);
    let classes = logits.shape()[1];
    let mut losses = Vec::with_capacity(logits.shape()[0]);
    for (i, row) in logits.data.chunks(classes).enumerate() {
        let label = cx.index(1, i, classes)?;
        losses.push(logsumexp(row) - row[label]);
    }
    Ok(reduce(cx, losses))
}

/// `(a - b)²`, reduced.
pub(crate) fn mse_loss(cx: &Cx) -> Tensor {
    let (a, b) = (&cx.x(0).data, &cx.x(1).data);
    reduce(
        cx,
        a.iter().zip(b).map(|(&a, &b)| (a - b) * (a - b)).collect(),
    )
}
