//! Normalizations: `layer_norm`, `rms_norm` (last axis), `group_norm` (`[N, C, *]`).
//! Means and variances are two-pass and biased (divided by the count), as in PyTorch.

use crate::attr::key;
use crate::interp::node::Cx;
use crate::interp::tensor::Tensor;

/// Mean and biased variance of a slice.
fn moments(c: &[f64]) -> (f64, f64) {
    let n = c.len() as f64;
    let mean = c.iter().sum::<f64>() / n;
    let var = c.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var)
}

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis.
pub(crate) fn layer_norm(cx: &Cx) -> Tensor {
    let (x, gamma, beta) = (cx.x(0), &cx.x(1).data, &cx.x(2).data);
    let eps = cx.attrs.of(key::EPS);
    let mut data = Vec::with_capacity(x.numel());
    for row in x.data.chunks(gamma.len()) {
        let (mean, var) = moments(row);
        let inv = 1.0 / (var + eps).sqrt();
        data.extend((0..row.len()).map(|i| (row[i] - mean) * inv * gamma[i] + beta[i]));
    }
    Tensor::new(cx.out().clone(), data)
}

/// `x / sqrt(mean(x²) + eps) * gamma` over the last axis.
pub(crate) fn rms_norm(cx: &Cx) -> Tensor {
    let (x, gamma) = (cx.x(0), &cx.x(1).data);
    let eps = cx.attrs.of(key::EPS);
    let mut data = Vec::with_capacity(x.numel());
    for row in x.data.chunks(gamma.len()) {
        let ms = row.iter().map(|&v| v * v).sum::<f64>() / row.len() as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        data.extend((0..row.len()).map(|i| row[i] * inv * gamma[i]));
    }
    Tensor::new(cx.out().clone(), data)
}

/// Each sample's channels split into `groups` groups of `C / groups`; each group is normalized
/// over its channels and all spatial positions, then scaled and shifted per channel.
pub(crate) fn group_norm(cx: &Cx) -> Tensor {
    let (x, gamma, beta) = (cx.x(0), &cx.x(1).data, &cx.x(2).data);
    let eps = cx.attrs.of(key::EPS);
    let groups = cx.attrs.of(key::GROUPS);
    let channels = x.shape()[1];
    let spatial: usize = x.shape()[2..].iter().product();
    let per_group = channels / groups * spatial;
    let mut data = Vec::with_capacity(x.numel());
    for (i, chunk) in x.data.chunks(per_group).enumerate() {
        let (mean, var) = moments(chunk);
        let inv = 1.0 / (var + eps).sqrt();
        let first_channel = (i % groups) * (channels / groups);
        data.extend(chunk.iter().enumerate().map(|(j, &v)| {
            let c = first_channel + j / spatial;
            (v - mean) * inv * gamma[c] + beta[c]
        }));
    }
    Tensor::new(cx.out().clone(), data)
}
