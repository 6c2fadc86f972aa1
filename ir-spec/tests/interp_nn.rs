//! Normalizations, convolution, pooling, embedding and losses against hand values and naive
//! loops written here.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::{EvalError, Tensor};
use sinter_ir::{Attr, Attrs, Op};

fn check(op: Op, attrs: Attrs, inputs: &[Tensor], expected: &Tensor) {
    let got = run1(op, attrs, inputs);
    assert_close(&got, expected, 1e-13, op.name());
}

fn eps(v: f64) -> Attrs {
    Attrs::new().with("eps", Attr::Float(v))
}

#[test]
fn layer_norm_hand_values() {
    // mean 2.5, biased var 1.25; eps 0.75 makes the denominator √2.
    let x = f(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let gamma = f(&[4], &[1.0, 2.0, 1.0, 0.5]);
    let beta = f(&[4], &[0.0, 1.0, -1.0, 0.0]);
    let r = std::f64::consts::FRAC_1_SQRT_2;
    let want = f(&[4], &[-1.5 * r, -r + 1.0, 0.5 * r - 1.0, 0.75 * r]);
    check(Op::LayerNorm, eps(0.75), &[x, gamma, beta], &want);
}

#[test]
fn layer_norm_and_rms_norm_rows() {
    let mut rng = Rng::new(8);
    let (x, gamma, beta) = (rng.tensor(&[2, 3, 7]), rng.tensor(&[7]), rng.tensor(&[7]));
    let mut ln = Vec::new();
    let mut rms = Vec::new();
    for row in x.data.chunks(7) {
        let mean = row.iter().sum::<f64>() / 7.0;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 7.0;
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 7.0;
        for (c, &v) in row.iter().enumerate() {
            ln.push((v - mean) / (var + 1e-5).sqrt() * gamma.data[c] + beta.data[c]);
            rms.push(v / (ms + 1e-6).sqrt() * gamma.data[c]);
        }
    }
    check(
        Op::LayerNorm,
        Attrs::new(),
        &[x.clone(), gamma.clone(), beta],
        &f(&[2, 3, 7], &ln),
    );
    check(Op::RmsNorm, Attrs::new(), &[x, gamma], &f(&[2, 3, 7], &rms));
    // mean(x²) = 12.5, + eps 3.5 = 16: divide by 4.
    let x = f(&[2], &[3.0, 4.0]);
    check(
        Op::RmsNorm,
        eps(3.5),
        &[x, f(&[2], &[1.0, -2.0])],
        &f(&[2], &[0.75, -2.0]),
    );
}

#[test]
fn group_norm() {
    let mut rng = Rng::new(9);
    for (shape, groups) in [
        (&[2usize, 6, 2, 3][..], 3usize),
        (&[3, 4, 5][..], 2),
        (&[1, 3][..], 1),
    ] {
        let x = rng.tensor(shape);
        let c = shape[1];
        let (gamma, beta) = (rng.tensor(&[c]), rng.tensor(&[c]));
        let spatial: usize = shape[2..].iter().product();
        let per = c / groups;
        let mut want = vec![0.0; x.numel()];
        for n in 0..shape[0] {
            for g in 0..groups {
                let idx: Vec<usize> = (g * per..(g + 1) * per)
                    .flat_map(|ch| (0..spatial).map(move |s| (n * c + ch) * spatial + s))
                    .collect();
                let cnt = idx.len() as f64;
                let mean = idx.iter().map(|&k| x.data[k]).sum::<f64>() / cnt;
                let var = idx.iter().map(|&k| (x.data[k] - mean).powi(2)).sum::<f64>() / cnt;
                for &k in &idx {
                    let ch = (k / spatial) % c;
                    want[k] =
                        (x.data[k] - mean) / (var + 1e-5).sqrt() * gamma.data[ch] + beta.data[ch];
                }
            }
        }
        let attrs = Attrs::new().with("groups", Attr::Int(groups as i64));
        check(Op::GroupNorm, attrs, &[x, gamma, beta], &f(shape, &want));
    }
}

/// Direct convolution written from the definition, reading padded input as 0.
#[allow(clippy::too_many_arguments)]
fn naive_conv(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    stride: [usize; 2],
    pad: [usize; 2],
    dil: [usize; 2],
    groups: usize,
) -> Tensor {
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (o, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    assert_eq!(c, cg * groups);
    let oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    let mut out = vec![0.0; n * o * oh * ow];
    for bn in 0..n {
        for oc in 0..o {
            let g = oc / (o / groups);
            for y in 0..oh {
                for xx in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b.data[oc]);
                    for ic in 0..cg {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (y * stride[0] + ky * dil[0]) as i64 - pad[0] as i64;
                                let ix = (xx * stride[1] + kx * dil[1]) as i64 - pad[1] as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                    continue;
                                }
                                let xi = x.at(&[bn, g * cg + ic, iy as usize, ix as usize]);
                                acc += xi * w.at(&[oc, ic, ky, kx]);
                            }
                        }
                    }
                    out[((bn * o + oc) * oh + y) * ow + xx] = acc;
                }
            }
        }
    }
    Tensor::f32(vec![n, o, oh, ow], out)
}

#[test]
fn conv2d_hand_value() {
    let x = f(
        &[1, 1, 3, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    );
    let w = f(&[1, 1, 2, 2], &[1.0; 4]);
    check(
        Op::Conv2d,
        Attrs::new(),
        &[x, w],
        &f(&[1, 1, 2, 2], &[12.0, 16.0, 24.0, 28.0]),
    );
}

#[test]
fn conv2d_against_naive_loop() {
    let mut rng = Rng::new(10);
    struct Case {
        x: [usize; 4],
        w: [usize; 4],
        bias: bool,
        stride: [usize; 2],
        pad: [usize; 2],
        dil: [usize; 2],
        groups: usize,
    }
    #[rustfmt::skip]
    let cases = [
        Case { x: [1, 3, 7, 5], w: [4, 3, 3, 3], bias: false, stride: [1, 1], pad: [0, 0], dil: [1, 1], groups: 1 },
        Case { x: [2, 3, 7, 7], w: [5, 3, 3, 3], bias: true, stride: [2, 2], pad: [1, 1], dil: [1, 1], groups: 1 },
        Case { x: [1, 2, 13, 11], w: [3, 2, 3, 2], bias: true, stride: [2, 3], pad: [2, 1], dil: [2, 3], groups: 1 },
        Case { x: [2, 4, 6, 5], w: [6, 2, 3, 1], bias: true, stride: [1, 2], pad: [1, 0], dil: [1, 1], groups: 2 },
        Case { x: [1, 6, 5, 5], w: [6, 1, 2, 2], bias: false, stride: [1, 1], pad: [1, 1], dil: [2, 2], groups: 6 },
    ];
    for c in cases {
        let (x, w) = (rng.tensor(&c.x), rng.tensor(&c.w));
        let b = c.bias.then(|| rng.tensor(&[c.w[0]]));
        let want = naive_conv(&x, &w, b.as_ref(), c.stride, c.pad, c.dil, c.groups);
        let pair = |v: [usize; 2]| Attr::ints(&[v[0] as i64, v[1] as i64]);
        let attrs = Attrs::new()
            .with("stride", pair(c.stride))
            .with("padding", pair(c.pad))
            .with("dilation", pair(c.dil))
            .with("groups", Attr::Int(c.groups as i64));
        let mut inputs = vec![x, w];
        inputs.extend(b);
        check(Op::Conv2d, attrs, &inputs, &want);
    }
}

fn pool(kernel: i64, stride: i64, padding: i64) -> Attrs {
    Attrs::new()
        .with("kernel", Attr::Int(kernel))
        .with("stride", Attr::Int(stride))
        .with("padding", Attr::Int(padding))
}

#[test]
fn pooling_hand_values() {
    let x = f(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // 2x2 windows, stride 1, padding 1: 3x3 windows over the zero/-inf padded input.
    let max = f(
        &[1, 1, 3, 3],
        &[1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 3.0, 4.0, 4.0],
    );
    check(Op::MaxPool2d, pool(2, 1, 1), std::slice::from_ref(&x), &max);
    let avg = [1.0, 3.0, 2.0, 4.0, 10.0, 6.0, 3.0, 7.0, 4.0].map(|v| v / 4.0);
    check(Op::AvgPool2d, pool(2, 1, 1), &[x], &f(&[1, 1, 3, 3], &avg));
    let neg = f(&[1, 1, 2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    let max = f(
        &[1, 1, 3, 3],
        &[-1.0, -1.0, -2.0, -1.0, -1.0, -2.0, -3.0, -3.0, -4.0],
    );
    check(Op::MaxPool2d, pool(2, 1, 1), &[neg], &max);
    // Default stride = kernel.
    let x = f(&[1, 1, 2, 4], &[1.0, 5.0, 2.0, 0.0, 3.0, 4.0, 8.0, 1.0]);
    let attrs = Attrs::new().with("kernel", Attr::Int(2));
    check(
        Op::MaxPool2d,
        attrs.clone(),
        std::slice::from_ref(&x),
        &f(&[1, 1, 1, 2], &[5.0, 8.0]),
    );
    check(Op::AvgPool2d, attrs, &[x], &f(&[1, 1, 1, 2], &[3.25, 2.75]));
}

#[test]
fn pooling_against_naive_loop() {
    let mut rng = Rng::new(11);
    let x = rng.tensor(&[2, 3, 7, 5]);
    for (k, s, p) in [(3, 2, 1), (2, 1, 1), (3, 1, 0), (1, 2, 0)] {
        let oh = (7 + 2 * p - k) / s + 1;
        let ow = (5 + 2 * p - k) / s + 1;
        let (mut mx, mut av) = (Vec::new(), Vec::new());
        for plane in 0..6 {
            for y in 0..oh {
                for xx in 0..ow {
                    let (mut m, mut sum) = (f64::NEG_INFINITY, 0.0);
                    for ky in 0..k {
                        for kx in 0..k {
                            let iy = (y * s + ky) as i64 - p as i64;
                            let ix = (xx * s + kx) as i64 - p as i64;
                            if (0..7).contains(&iy) && (0..5).contains(&ix) {
                                let v = x.data[plane * 35 + iy as usize * 5 + ix as usize];
                                m = m.max(v);
                                sum += v;
                            }
                        }
                    }
                    mx.push(m);
                    av.push(sum / (k * k) as f64);
                }
            }
        }
        let (k, s, p) = (k as i64, s as i64, p as i64);
        check(
            Op::MaxPool2d,
            pool(k, s, p),
            std::slice::from_ref(&x),
            &f(&[2, 3, oh, ow], &mx),
        );
        check(
            Op::AvgPool2d,
            pool(k, s, p),
            std::slice::from_ref(&x),
            &f(&[2, 3, oh, ow], &av),
        );
    }
}

#[test]
fn embedding_rows_and_bad_ids() {
    let table = f(&[5, 3], &(0..15).map(|v| v as f64).collect::<Vec<_>>());
    let ids = i(&[2, 2], &[4, 0, 2, 2]);
    let want = f(
        &[2, 2, 3],
        &[
            12.0, 13.0, 14.0, 0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 6.0, 7.0, 8.0,
        ],
    );
    check(Op::Embedding, Attrs::new(), &[table.clone(), ids], &want);
    check(
        Op::Embedding,
        Attrs::new(),
        &[table.clone(), i(&[], &[1])],
        &f(&[3], &[3.0, 4.0, 5.0]),
    );
    for bad in [5, -1] {
        let err = run(
            Op::Embedding,
            Attrs::new(),
            &[table.clone(), i(&[3], &[0, bad, 1])],
        )
        .unwrap_err();
        assert_eq!(
            err,
            EvalError::IndexOutOfRange {
                op: "embedding",
                value_name: "x1".into(),
                index: bad,
                bound: 5
            }
        );
        assert!(err.to_string().contains("`x1`"), "{err}");
    }
}

#[test]
fn cross_entropy_against_log_softmax() {
    let mut rng = Rng::new(12);
    let logits = rng.tensor(&[3, 7]);
    let labels = i(&[3], &[6, 0, 3]);
    let losses: Vec<f64> = (0..3)
        .map(|r| {
            let row = &logits.data[r * 7..(r + 1) * 7];
            let z: f64 = row.iter().map(|v| v.exp()).sum();
            let label = labels.data[r] as usize;
            -(row[label].exp() / z).ln()
        })
        .collect();
    let red = |r: &str| Attrs::new().with("reduction", Attr::Str(r.into()));
    let inputs = [logits.clone(), labels];
    check(Op::CrossEntropy, red("none"), &inputs, &f(&[3], &losses));
    check(
        Op::CrossEntropy,
        red("sum"),
        &inputs,
        &f(&[], &[losses.iter().sum()]),
    );
    check(
        Op::CrossEntropy,
        Attrs::new(),
        &inputs,
        &f(&[], &[losses.iter().sum::<f64>() / 3.0]),
    );
    // Uniform logits: loss ln C.
    let flat = f(&[2, 4], &[0.5; 8]);
    check(
        Op::CrossEntropy,
        Attrs::new(),
        &[flat, i(&[2], &[1, 3])],
        &f(&[], &[4f64.ln()]),
    );
    let err = run(
        Op::CrossEntropy,
        Attrs::new(),
        &[logits, i(&[3], &[0, 7, 1])],
    )
    .unwrap_err();
    assert_eq!(
        err,
        EvalError::IndexOutOfRange {
            op: "cross_entropy",
            value_name: "x1".into(),
            index: 7,
            bound: 7
        }
    );
}

#[test]
fn cross_entropy_ignore_index_as_pytorch() {
    // rows labelled ignore_index count 0 and leave the mean; all ignored: NaN (0/0)
    let mut rng = Rng::new(13);
    let logits = rng.tensor(&[3, 4]);
    let loss = |r: usize, label: usize| {
        let row = &logits.data[r * 4..(r + 1) * 4];
        row.iter().map(|v| v.exp()).sum::<f64>().ln() - row[label]
    };
    let (l0, l2) = (loss(0, 1), loss(2, 3));
    let attrs = |reduction: &str, ignore: i64| {
        Attrs::new()
            .with("reduction", Attr::Str(reduction.into()))
            .with("ignore_index", Attr::Int(ignore))
    };
    let inputs = [logits.clone(), i(&[3], &[1, -100, 3])];
    check(
        Op::CrossEntropy,
        attrs("none", -100),
        &inputs,
        &f(&[3], &[l0, 0.0, l2]),
    );
    check(
        Op::CrossEntropy,
        attrs("sum", -100),
        &inputs,
        &f(&[], &[l0 + l2]),
    );
    check(
        Op::CrossEntropy,
        attrs("mean", -100),
        &inputs,
        &f(&[], &[(l0 + l2) / 2.0]),
    );
    // an ignore index that is a class
    let inputs = [logits.clone(), i(&[3], &[1, 0, 3])];
    check(
        Op::CrossEntropy,
        attrs("mean", 0),
        &inputs,
        &f(&[], &[(l0 + l2) / 2.0]),
    );
    let all = run1(
        Op::CrossEntropy,
        attrs("mean", 2),
        &[logits.clone(), i(&[3], &[2, 2, 2])],
    );
    assert!(all.data[0].is_nan(), "{all}");
    // any other label outside the classes is still an error
    let err = run(
        Op::CrossEntropy,
        attrs("mean", -100),
        &[logits, i(&[3], &[1, -1, 3])],
    );
    assert!(err.is_err());
}

#[test]
fn mse_loss_reductions() {
    let a = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f(&[2, 2], &[0.0, 4.0, 3.0, 1.0]);
    let red = |r: &str| Attrs::new().with("reduction", Attr::Str(r.into()));
    let inputs = [a, b];
    check(
        Op::MseLoss,
        red("none"),
        &inputs,
        &f(&[2, 2], &[1.0, 4.0, 0.0, 9.0]),
    );
    check(Op::MseLoss, red("sum"), &inputs, &f(&[], &[14.0]));
    check(Op::MseLoss, Attrs::new(), &inputs, &f(&[], &[3.5]));
}
