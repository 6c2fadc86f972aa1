//! `conv2d` and the 2-D poolings, on NCHW tensors, as direct loops.

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::tensor::Tensor;
use crate::op::Op;

/// Stride, padding (and dilation) of one spatial axis of a convolution or pooling window.
#[derive(Clone, Copy)]
pub(crate) struct Axis {
    stride: usize,
    padding: usize,
    dilation: usize,
    /// Extent of the (unpadded) input along this axis.
    extent: usize,
}

impl Axis {
    /// The input coordinate read by output `o` at kernel tap `k`, or `None` in the padding.
    pub(crate) fn source(self, o: usize, k: usize) -> Option<usize> {
        (o * self.stride + k * self.dilation)
            .checked_sub(self.padding)
            .filter(|&i| i < self.extent)
    }
}

/// The two spatial axes of a window over an input of shape `input` (NCHW), from the node's
/// `stride` and `padding`.
pub(crate) fn axes(cx: &Cx, input: &[usize], dilation: [usize; 2]) -> [Axis; 2] {
    let (stride, padding) = (cx.attrs.of(key::STRIDE), cx.attrs.of(key::PADDING));
    [0, 1].map(|d| Axis {
        stride: stride[d],
        padding: padding[d],
        dilation: dilation[d],
        extent: input[2 + d],
    })
}

/// 2-D cross-correlation: `x [N, C, H, W]`, `w [O, C/groups, kH, kW]`, optional bias `[O]`;
/// output channel `o` reads the input channels of its group `o / (O/groups)`.
pub(crate) fn conv2d(cx: &Cx) -> Tensor {
    let d = cx.attrs.of(key::DILATION);
    let [ay, ax] = axes(cx, cx.x(0).shape(), [d[0], d[1]]);
    let (x, w, bias) = (cx.x(0), cx.x(1), cx.optional(2));
    let [n, c, h, wd] = [0, 1, 2, 3].map(|i| x.shape()[i]);
    let [o_count, c_per, kh, kw] = [0, 1, 2, 3].map(|i| w.shape()[i]);
    let [oh, ow] = [cx.out().shape[2], cx.out().shape[3]];
    let o_per = o_count / cx.attrs.of(key::GROUPS);
    let mut data = Vec::with_capacity(cx.out().numel());
    for b in 0..n {
        for o in 0..o_count {
            let first_c = o / o_per * c_per;
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = bias.map_or(0.0, |t| t.data[o]);
                    for ci in 0..c_per {
                        for ky in 0..kh {
                            let Some(iy) = ay.source(oy, ky) else {
                                continue;
                            };
                            for kx in 0..kw {
                                let Some(ix) = ax.source(ox, kx) else {
                                    continue;
                                };
                                let xv = x.data[((b * c + first_c + ci) * h + iy) * wd + ix];
                                acc += xv * w.data[((o * c_per + ci) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    data.push(acc);
                }
            }
        }
    }
    Tensor::new(cx.out().clone(), data)
}

/// `max_pool2d` (padding counts as `-inf`) or `avg_pool2d` (padding counts as 0 and toward the
/// divisor, which is always `kH·kW`: PyTorch's `count_include_pad=True`).
pub(crate) fn pool2d(cx: &Cx) -> Tensor {
    let [ay, ax] = axes(cx, cx.x(0).shape(), [1, 1]);
    let kernel = cx.attrs.of(key::KERNEL);
    let x = cx.x(0);
    let [n, c, h, w] = [0, 1, 2, 3].map(|i| x.shape()[i]);
    let [oh, ow] = [cx.out().shape[2], cx.out().shape[3]];
    let is_max = cx.op == Op::MaxPool2d;
    let mut data = Vec::with_capacity(cx.out().numel());
    for plane in 0..n * c {
        let xp = &x.data[plane * h * w..(plane + 1) * h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let taps = (0..kernel[0]).flat_map(|ky| (0..kernel[1]).map(move |kx| (ky, kx)));
                let values = taps
                    .filter_map(|(ky, kx)| Some(xp[ay.source(oy, ky)? * w + ax.source(ox, kx)?]));
                data.push(if is_max {
                    values.fold(f64::NEG_INFINITY, max_nan)
                } else {
                    values.sum::<f64>() / (kernel[0] * kernel[1]) as f64
                });
            }
        }
    }
    Tensor::new(cx.out().clone(), data)
}

/// max that propagates NaN, as PyTorch's pooling does.
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        a
    } else if b.is_nan() || b > a {
        b
    } else {
        a
    }
}
