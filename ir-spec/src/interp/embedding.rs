//! `embedding`: rows of a table picked by i32 ids.

use crate::interp::EvalError;
use crate::interp::node::Cx;
use crate::interp::tensor::Tensor;

/// `table [V, D]`, `ids` of any shape: result `ids.shape + [D]`, row `ids[...]` of the table.
/// An id outside `0..V` is an [`EvalError::IndexOutOfRange`] naming the ids.
pub(crate) fn embedding(cx: &Cx) -> Result<Tensor, EvalError> {
    let (table, ids) = (cx.x(0), cx.x(1));
    let (v, d) = (table.shape()[0], table.shape()[1]);
    let mut data = Vec::with_capacity(cx.out().numel());
    for e in 0..ids.numel() {
        let row = cx.index(1, e, v)?;
        data.extend_from_slice(&table.data[row * d..(row + 1) * d]);
    }
    Ok(Tensor::new(cx.out().clone(), data))
}
