//! Losses: `cross_entropy` and `mse_loss`, with `reduction` mean, sum or none.

use crate::attr::{Reduction, key};
use crate::interp::EvalError;
use crate::interp::node::Cx;
use crate::interp::reduce::logsumexp;
use crate::interp::tensor::Tensor;

/// Applies `reduction` to per-element losses.
fn reduce(cx: &Cx, losses: Vec<f64>) -> Tensor {
    let data = match cx.attrs.of(key::REDUCTION) {
        Reduction::None => losses,
        Reduction::Sum => vec![losses.iter().sum()],
        Reduction::Mean => vec![losses.iter().sum::<f64>() / losses.len() as f64],
    };
    Tensor::new(cx.out().clone(), data)
}

/// `logsumexp(logits[i]) - logits[i, labels[i]]` for logits `[N, C]` and i32 labels `[N]`.
/// A row whose label is `ignore_index` counts 0 and is left out of the mean (which is NaN, 0/0,
/// when every row is); any other label outside `0..C` is an [`EvalError::IndexOutOfRange`].
pub(crate) fn cross_entropy(cx: &Cx) -> Result<Tensor, EvalError> {
    let logits = cx.x(0);
    let classes = logits.shape()[1];
    let ignore = cx.attrs.try_of(key::IGNORE_INDEX);
    let mut losses = Vec::with_capacity(logits.shape()[0]);
    let mut kept = 0usize;
    for (i, row) in logits.data.chunks(classes).enumerate() {
        if ignore.is_some_and(|ii| cx.x(1).data[i] == ii as f64) {
            losses.push(0.0);
            continue;
        }
        let label = cx.index(1, i, classes)?;
        losses.push(logsumexp(row) - row[label]);
        kept += 1;
    }
    if ignore.is_some() && cx.attrs.of(key::REDUCTION) == Reduction::Mean {
        let sum: f64 = losses.iter().sum();
        return Ok(Tensor::new(cx.out().clone(), vec![sum / kept as f64]));
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
