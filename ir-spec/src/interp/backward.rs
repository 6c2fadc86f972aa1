//! Backward primitives that autodiff emits: the adjoints of `conv2d` (with respect to its input
//! and its weight), of the two poolings, of `embedding` and of `slice`, as direct loops.
//!
//! Each is the exact transpose of its forward op's loop (accumulating where the forward op reads
//! an element several times), so `<forward(x), dy> == <x, backward(dy)>` holds to rounding.
//! `max_pool2d_grad` routes each window's `dy` to the window's *first* maximum of `x` in row-major
//! order (a NaN counts as a maximum, as in PyTorch); padding positions never win.

use crate::attr::key;
use crate::interp::EvalError;
use crate::interp::conv::axes;
use crate::interp::node::Cx;
use crate::interp::tensor::{Tensor, split_at_axis};

fn dilation(cx: &Cx) -> [usize; 2] {
    let d = cx.attrs.of(key::DILATION);
    [d[0], d[1]]
}

/// Calls `visit(x_index, w_index, dy_index)` for every multiply of `conv2d(x, w)` with `x` of
/// shape `x_shape`, `w` of shape `w_shape` and result `dy` of shape `dy_shape`, in the forward
/// loop's order.
fn for_each_conv_tap(
    cx: &Cx,
    x_shape: &[usize],
    w_shape: &[usize],
    dy_shape: &[usize],
    mut visit: impl FnMut(usize, usize, usize),
) {
    let [ay, ax] = axes(cx, x_shape, dilation(cx));
    let [n, c, h, wd] = [0, 1, 2, 3].map(|i| x_shape[i]);
    let [o_count, c_per, kh, kw] = [0, 1, 2, 3].map(|i| w_shape[i]);
    let [oh, ow] = [dy_shape[2], dy_shape[3]];
    let o_per = o_count / cx.attrs.of(key::GROUPS);
    for b in 0..n {
        for o in 0..o_count {
            let first_c = o / o_per * c_per;
            for oy in 0..oh {
                for ox in 0..ow {
                    let dy_index = ((b * o_count + o) * oh + oy) * ow + ox;
                    for ci in 0..c_per {
                        for ky in 0..kh {
                            let Some(iy) = ay.source(oy, ky) else {
                                continue;
                            };
                            for kx in 0..kw {
                                let Some(ix) = ax.source(ox, kx) else {
                                    continue;
                                };
                                let x_index = ((b * c + first_c + ci) * h + iy) * wd + ix;
                                let w_index = ((o * c_per + ci) * kh + ky) * kw + kx;
                                visit(x_index, w_index, dy_index);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `conv2d_grad_input(dy, w)`: `dx[x_index] += dy[dy_index] · w[w_index]` over every tap.
pub(crate) fn conv2d_grad_input(cx: &Cx) -> Tensor {
    let (dy, w) = (cx.x(0), cx.x(1));
    let mut data = vec![0.0; cx.out().numel()];
    for_each_conv_tap(cx, &cx.out().shape, w.shape(), dy.shape(), |xi, wi, yi| {
        data[xi] += dy.data[yi] * w.data[wi];
    });
    Tensor::new(cx.out().clone(), data)
}

/// `conv2d_grad_weight(x, dy)`: `dw[w_index] += x[x_index] · dy[dy_index]` over every tap.
pub(crate) fn conv2d_grad_weight(cx: &Cx) -> Tensor {
    let (x, dy) = (cx.x(0), cx.x(1));
    let mut data = vec![0.0; cx.out().numel()];
    for_each_conv_tap(cx, x.shape(), &cx.out().shape, dy.shape(), |xi, wi, yi| {
        data[wi] += x.data[xi] * dy.data[yi];
    });
    Tensor::new(cx.out().clone(), data)
}

/// Calls `visit(plane, dy_index, taps)` for every pooling window of an input of shape `input`,
/// where `taps` lists the in-bounds offsets (within the plane) of the window in row-major order.
fn for_each_window(cx: &Cx, input: &[usize], mut visit: impl FnMut(usize, usize, &[usize])) {
    let [ay, ax] = axes(cx, input, [1, 1]);
    let kernel = cx.attrs.of(key::KERNEL);
    let [n, c, _, w] = [0, 1, 2, 3].map(|i| input[i]);
    let dy = cx.inputs.last().expect("dy is the last operand");
    let [oh, ow] = [dy.shape()[2], dy.shape()[3]];
    let mut taps = Vec::with_capacity(kernel[0] * kernel[1]);
    for plane in 0..n * c {
        for oy in 0..oh {
            for ox in 0..ow {
                taps.clear();
                for ky in 0..kernel[0] {
                    let Some(iy) = ay.source(oy, ky) else {
                        continue;
                    };
                    taps.extend((0..kernel[1]).filter_map(|kx| Some(iy * w + ax.source(ox, kx)?)));
                }
                visit(plane, (plane * oh + oy) * ow + ox, &taps);
            }
        }
    }
}

/// `max_pool2d_grad(x, dy)`: each window's `dy` goes to its first maximum of `x`.
pub(crate) fn max_pool2d_grad(cx: &Cx) -> Tensor {
    let (x, dy) = (cx.x(0), cx.x(1));
    let plane_size = x.shape()[2] * x.shape()[3];
    let mut data = vec![0.0; x.numel()];
    for_each_window(cx, x.shape(), |plane, yi, taps| {
        let xp = &x.data[plane * plane_size..(plane + 1) * plane_size];
        let mut best: Option<usize> = None;
        for &t in taps {
            let better = match best {
                None => true,
                Some(b) => !xp[b].is_nan() && (xp[t] > xp[b] || xp[t].is_nan()),
            };
            if better {
                best = Some(t);
            }
        }
        if let Some(b) = best {
            data[plane * plane_size + b] += dy.data[yi];
        }
    });
    Tensor::new(cx.out().clone(), data)
}

/// `avg_pool2d_grad(dy)`: `dy / (kH·kW)` to every in-bounds position of each window.
pub(crate) fn avg_pool2d_grad(cx: &Cx) -> Tensor {
    let dy = cx.x(0);
    let out = &cx.out().shape;
    let kernel = cx.attrs.of(key::KERNEL);
    let area = (kernel[0] * kernel[1]) as f64;
    let plane_size = out[2] * out[3];
    let mut data = vec![0.0; cx.out().numel()];
    for_each_window(cx, out, |plane, yi, taps| {
        for &t in taps {
            data[plane * plane_size + t] += dy.data[yi] / area;
        }
    });
    Tensor::new(cx.out().clone(), data)
}

/// `embedding_grad(dy, ids)`: row `e` of `dy` added into row `ids[e]` of a zero `[V, D]` table.
/// An id outside `0..V` is an [`EvalError::IndexOutOfRange`] naming the ids.
pub(crate) fn embedding_grad(cx: &Cx) -> Result<Tensor, EvalError> {
    let (dy, ids) = (cx.x(0), cx.x(1));
    let [v, d] = [cx.out().shape[0], cx.out().shape[1]];
    let mut data = vec![0.0; v * d];
    for e in 0..ids.numel() {
        let row = cx.index(1, e, v)?;
        for (acc, &g) in data[row * d..(row + 1) * d]
            .iter_mut()
            .zip(&dy.data[e * d..])
        {
            *acc += g;
        }
    }
    Ok(Tensor::new(cx.out().clone(), data))
}

/// `slice_grad(dy)`: zeros of `shape`, with `dy` at the positions `slice` reads.
pub(crate) fn slice_grad(cx: &Cx) -> Tensor {
    let dy = cx.x(0);
    let axis = cx.attrs.of(key::AXIS);
    let (start, step) = (cx.attrs.of(key::START), cx.attrs.of(key::STEP));
    let shape = &cx.out().shape;
    let (outer, n, inner) = split_at_axis(shape, axis);
    let m = dy.shape()[axis];
    let mut data = vec![0.0; cx.out().numel()];
    for o in 0..outer {
        for i in 0..m {
            let to = (o * n + start + i * step) * inner;
            let from = (o * m + i) * inner;
            data[to..to + inner].copy_from_slice(&dy.data[from..from + inner]);
        }
    }
    Tensor::new(cx.out().clone(), data)
}
