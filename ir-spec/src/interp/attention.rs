//! `attention`, evaluated directly (not through its expansion into primitives).

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::reduce::softmax_row;
use crate::interp::tensor::{Tensor, View};

/// Which keys a query row may attend to, from `causal` and `window`.
#[derive(Clone, Copy)]
pub(crate) struct KeyFilter {
    pub(crate) causal: bool,
    /// 0: no window; `w > 0`: only keys with `|i - j| < w`.
    pub(crate) window: usize,
}

impl KeyFilter {
    /// Whether query `i` may attend to key `j` (both counted from the start: top-left alignment,
    /// as PyTorch's `is_causal`).
    pub(crate) fn allows(self, i: usize, j: usize) -> bool {
        (!self.causal || j <= i) && (self.window == 0 || i.abs_diff(j) < self.window)
    }
}

/// `softmax(scale · q kᵀ [+ mask | masked to -inf]) v` over `[B, H, S, D]` tensors; `k` and
/// `v` may have fewer heads (`H / group`), query head `h` reading key/value head `h / group`.
///
/// An additive mask is added to the scaled scores; a boolean mask sends scores where it is 0 to
/// `-inf`; `causal` and `window` do the same for keys they exclude. A query row with no allowed
/// key has an all `-inf` row of scores, and gives NaN, as in PyTorch.
pub(crate) fn attention(cx: &Cx) -> Tensor {
    let (q, k, v) = (cx.x(0), cx.x(1), cx.x(2));
    let [b, h, sq, d] = [0, 1, 2, 3].map(|i| q.shape()[i]);
    let (kv_heads, sk, dv) = (k.shape()[1], k.shape()[2], v.shape()[3]);
    // query head `hq` reads key/value head `hq / group` (grouped-query attention)
    let group = h / kv_heads;
    let scale = cx.attrs.of(key::SCALE);
    let additive = cx.attrs.of(key::MASK_KIND) == crate::attr::MaskKind::Additive;
    let filter = KeyFilter {
        causal: cx.attrs.of(key::CAUSAL),
        window: cx.attrs.of(key::WINDOW),
    };
    let mask = cx
        .optional(3)
        .map(|m| View::broadcast(m, &[b, h, sq, sk]).gather());
    let mut data = Vec::with_capacity(b * h * sq * dv);
    let mut scores = vec![0.0; sk];
    for bh in 0..b * h {
        let kv = (bh / h) * kv_heads + (bh % h) / group;
        let (qh, kh, vh) = (
            &q.data[bh * sq * d..],
            &k.data[kv * sk * d..],
            &v.data[kv * sk * dv..],
        );
        for i in 0..sq {
            for (j, s) in scores.iter_mut().enumerate() {
                let dot: f64 = (0..d).map(|l| qh[i * d + l] * kh[j * d + l]).sum();
                *s = dot * scale;
                if let Some(mask) = &mask {
                    let m = mask[(bh * sq + i) * sk + j];
                    if additive {
                        *s += m;
                    } else if m == 0.0 {
                        *s = f64::NEG_INFINITY;
                    }
                }
                if !filter.allows(i, j) {
                    *s = f64::NEG_INFINITY;
                }
            }
            let p = softmax_row(&scores);
            for c in 0..dv {
                data.push((0..sk).map(|j| p[j] * vh[j * dv + c]).sum());
            }
        }
    }
    Tensor::new(cx.out().clone(), data)
}
