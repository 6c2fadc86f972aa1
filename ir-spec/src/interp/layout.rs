//! Views and layout ops: `permute`, `transpose`, `broadcast_to`, `slice`, `concat`.
//! (`reshape`, `unsqueeze` and `squeeze` keep the elements as they are; see [`super::node`].)

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::tensor::{Tensor, View, split_at_axis};

/// Output axis `i` is input axis `perm[i]`.
pub(crate) fn permute(cx: &Cx, perm: &[usize]) -> Tensor {
    let data = View::of(cx.x(0)).permute(perm).gather();
    Tensor::new(cx.out().clone(), data)
}

/// Swaps `dim0` and `dim1`.
pub(crate) fn transpose(cx: &Cx) -> Tensor {
    let mut perm: Vec<usize> = (0..cx.x(0).rank()).collect();
    perm.swap(cx.attrs.of(key::DIM0), cx.attrs.of(key::DIM1));
    permute(cx, &perm)
}

/// numpy broadcast to the result's shape.
pub(crate) fn broadcast_to(cx: &Cx) -> Tensor {
    let data = View::broadcast(cx.x(0), &cx.out().shape).gather();
    Tensor::new(cx.out().clone(), data)
}

/// Elements `start, start + step, … < end` along `axis`.
pub(crate) fn slice(cx: &Cx) -> Tensor {
    let axis = cx.attrs.of(key::AXIS);
    let (start, step) = (cx.attrs.of(key::START), cx.attrs.of(key::STEP));
    let mut view = View::of(cx.x(0));
    view.offset = start * view.strides[axis];
    view.strides[axis] *= step;
    view.shape = cx.out().shape.clone();
    Tensor::new(cx.out().clone(), view.gather())
}

/// Joins the operands along `axis`, in order.
pub(crate) fn concat(cx: &Cx) -> Tensor {
    let axis = cx.attrs.of(key::AXIS);
    let (outer, _, _) = split_at_axis(&cx.out().shape, axis);
    let mut data = Vec::with_capacity(cx.out().numel());
    for o in 0..outer {
        for x in cx.inputs {
            let (_, n, inner) = split_at_axis(x.shape(), axis);
            data.extend_from_slice(&x.data[o * n * inner..(o + 1) * n * inner]);
        }
    }
    Tensor::new(cx.out().clone(), data)
}
