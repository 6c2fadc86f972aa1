//! The backward primitives (`conv2d_grad_input`, `conv2d_grad_weight`, `max_pool2d_grad`,
//! `avg_pool2d_grad`, `embedding_grad`, `slice_grad`) against naive loops written here (in the
//! gather form, where the interpreter scatters), and as adjoints of their forward ops:
//! `<forward(x), dy> == <x, backward(dy)>`.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::{EvalError, Tensor};
use sinter_ir::{Attr, Attrs, Op};

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.ty, b.ty, "dot of different types");
    a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum()
}

fn assert_adjoint(lhs: f64, rhs: f64, what: &str) {
    assert!(
        (lhs - rhs).abs() <= 1e-10 * lhs.abs().max(1.0),
        "{what}: <forward, dy> = {lhs} but <x, backward> = {rhs}"
    );
}

fn ints(v: &[i64]) -> Attr {
    Attr::ints(v)
}

/// One conv2d configuration: input shape, weight shape, stride, padding, dilation, groups.
struct Conv {
    x: [usize; 4],
    w: [usize; 4],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
}

impl Conv {
    fn attrs(&self) -> Attrs {
        let pair = |p: [usize; 2]| ints(&[p[0] as i64, p[1] as i64]);
        Attrs::new()
            .with("stride", pair(self.stride))
            .with("padding", pair(self.padding))
            .with("dilation", pair(self.dilation))
            .with("groups", Attr::Int(self.groups as i64))
    }

    fn out_extent(&self, d: usize) -> usize {
        (self.x[2 + d] + 2 * self.padding[d] - self.dilation[d] * (self.w[2 + d] - 1) - 1)
            / self.stride[d]
            + 1
    }

    /// Output position along axis `d` whose tap `k` reads input `i`, if any.
    fn reader(&self, d: usize, i: usize, k: usize) -> Option<usize> {
        let t = (i + self.padding[d]).checked_sub(k * self.dilation[d])?;
        (t % self.stride[d] == 0 && t / self.stride[d] < self.out_extent(d))
            .then_some(t / self.stride[d])
    }
}

#[rustfmt::skip]
const CONVS: &[Conv] = &[
    Conv { x: [2, 3, 5, 6], w: [4, 3, 3, 2], stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 },
    Conv { x: [1, 2, 7, 6], w: [3, 2, 3, 3], stride: [2, 2], padding: [1, 1], dilation: [1, 1], groups: 1 },
    Conv { x: [2, 4, 8, 7], w: [6, 2, 2, 3], stride: [2, 1], padding: [1, 2], dilation: [2, 1], groups: 2 },
    Conv { x: [1, 6, 6, 6], w: [6, 1, 3, 3], stride: [3, 2], padding: [2, 1], dilation: [1, 2], groups: 6 },
    // stride larger than the kernel: some inputs are never read (their gradient is zero)
    Conv { x: [1, 2, 9, 8], w: [2, 2, 2, 2], stride: [3, 3], padding: [0, 0], dilation: [1, 1], groups: 1 },
];

/// dx[b, c, iy, ix] = Σ over the output positions and taps that read it of dy · w.
fn naive_grad_input(cv: &Conv, dy: &Tensor, w: &Tensor) -> Tensor {
    let [n, c, h, wd] = cv.x;
    let [o_count, c_per, kh, kw] = cv.w;
    let o_per = o_count / cv.groups;
    let mut data = Vec::new();
    for b in 0..n {
        for ch in 0..c {
            let g = ch / c_per;
            for iy in 0..h {
                for ix in 0..wd {
                    let mut acc = 0.0;
                    for o in g * o_per..(g + 1) * o_per {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let (Some(oy), Some(ox)) =
                                    (cv.reader(0, iy, ky), cv.reader(1, ix, kx))
                                else {
                                    continue;
                                };
                                acc += dy.at(&[b, o, oy, ox]) * w.at(&[o, ch % c_per, ky, kx]);
                            }
                        }
                    }
                    data.push(acc);
                }
            }
        }
    }
    f(&cv.x, &data)
}

/// dw[o, ci, ky, kx] = Σ over batch and output positions of x (read by that tap) · dy.
fn naive_grad_weight(cv: &Conv, x: &Tensor, dy: &Tensor) -> Tensor {
    let [o_count, c_per, kh, kw] = cv.w;
    let o_per = o_count / cv.groups;
    let (oh, ow) = (cv.out_extent(0), cv.out_extent(1));
    let mut data = Vec::new();
    for o in 0..o_count {
        for ci in 0..c_per {
            let ch = o / o_per * c_per + ci;
            for ky in 0..kh {
                for kx in 0..kw {
                    let mut acc = 0.0;
                    for b in 0..cv.x[0] {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let iy = (oy * cv.stride[0] + ky * cv.dilation[0]) as i64
                                    - cv.padding[0] as i64;
                                let ix = (ox * cv.stride[1] + kx * cv.dilation[1]) as i64
                                    - cv.padding[1] as i64;
                                if iy < 0 || ix < 0 || iy >= cv.x[2] as i64 || ix >= cv.x[3] as i64
                                {
                                    continue;
                                }
                                acc += x.at(&[b, ch, iy as usize, ix as usize])
                                    * dy.at(&[b, o, oy, ox]);
                            }
                        }
                    }
                    data.push(acc);
                }
            }
        }
    }
    f(&cv.w, &data)
}

#[test]
fn conv2d_grads_match_naive_loops_and_are_adjoints() {
    let mut rng = Rng::new(21);
    for (i, cv) in CONVS.iter().enumerate() {
        let (x, w) = (rng.tensor(&cv.x), rng.tensor(&cv.w));
        let y = run1(Op::Conv2d, cv.attrs(), &[x.clone(), w.clone()]);
        let dy = rng.tensor(y.shape());
        let as_ints = |s: [usize; 4]| ints(&s.map(|v| v as i64));

        let dx_attrs = cv.attrs().with("input_shape", as_ints(cv.x));
        let dx = run1(Op::Conv2dGradInput, dx_attrs, &[dy.clone(), w.clone()]);
        assert_close(
            &dx,
            &naive_grad_input(cv, &dy, &w),
            1e-12,
            &format!("conv {i} dx"),
        );

        let dw_attrs = cv.attrs().with("weight_shape", as_ints(cv.w));
        let dw = run1(Op::Conv2dGradWeight, dw_attrs, &[x.clone(), dy.clone()]);
        assert_close(
            &dw,
            &naive_grad_weight(cv, &x, &dy),
            1e-12,
            &format!("conv {i} dw"),
        );

        let forward = dot(&y, &dy);
        assert_adjoint(forward, dot(&x, &dx), &format!("conv {i} input"));
        assert_adjoint(forward, dot(&w, &dw), &format!("conv {i} weight"));
    }
}

#[test]
fn conv2d_grad_input_shape_disambiguates_strided_inputs() {
    // With stride 2, inputs of height 5 and 6 both give 2 output rows; the last row of the
    // height-6 input is never read, so its gradient is zero.
    let mut rng = Rng::new(3);
    let (dy, w) = (rng.tensor(&[1, 1, 2, 2]), rng.tensor(&[1, 1, 2, 2]));
    let attrs = Attrs::new().with("stride", Attr::Int(2));
    for h in [4, 5] {
        let a = attrs.clone().with("input_shape", ints(&[1, 1, h, 4]));
        let dx = run1(Op::Conv2dGradInput, a, &[dy.clone(), w.clone()]);
        assert_eq!(dx.shape(), &[1, 1, h as usize, 4]);
        if h == 5 {
            assert!(dx.data[16..].iter().all(|&v| v == 0.0));
        }
    }
}

/// One pooling configuration: input shape, kernel, stride, padding.
struct Pool {
    x: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
}

impl Pool {
    fn attrs(&self) -> Attrs {
        let pair = |p: [usize; 2]| ints(&[p[0] as i64, p[1] as i64]);
        Attrs::new()
            .with("kernel", pair(self.kernel))
            .with("stride", pair(self.stride))
            .with("padding", pair(self.padding))
    }

    /// In-bounds input positions of window (oy, ox), row-major.
    fn window(&self, oy: usize, ox: usize) -> Vec<(usize, usize)> {
        let mut taps = Vec::new();
        for ky in 0..self.kernel[0] {
            for kx in 0..self.kernel[1] {
                let iy = (oy * self.stride[0] + ky) as i64 - self.padding[0] as i64;
                let ix = (ox * self.stride[1] + kx) as i64 - self.padding[1] as i64;
                if iy >= 0 && ix >= 0 && iy < self.x[2] as i64 && ix < self.x[3] as i64 {
                    taps.push((iy as usize, ix as usize));
                }
            }
        }
        taps
    }
}

#[rustfmt::skip]
const POOLS: &[Pool] = &[
    Pool { x: [2, 2, 4, 6], kernel: [2, 2], stride: [2, 2], padding: [0, 0] },
    // overlapping windows
    Pool { x: [1, 3, 5, 5], kernel: [3, 3], stride: [1, 2], padding: [0, 0] },
    // padding, uneven kernel
    Pool { x: [2, 1, 6, 5], kernel: [3, 2], stride: [2, 1], padding: [1, 1] },
    // stride larger than the kernel
    Pool { x: [1, 2, 7, 7], kernel: [2, 2], stride: [3, 3], padding: [1, 0] },
];

#[test]
fn pool_grads_match_naive_loops_and_are_adjoints() {
    let mut rng = Rng::new(5);
    for (i, p) in POOLS.iter().enumerate() {
        let x = rng.tensor(&p.x);
        let y_max = run1(Op::MaxPool2d, p.attrs(), std::slice::from_ref(&x));
        let y_avg = run1(Op::AvgPool2d, p.attrs(), std::slice::from_ref(&x));
        let dy = rng.tensor(y_max.shape());
        let (oh, ow) = (dy.shape()[2], dy.shape()[3]);
        let area = (p.kernel[0] * p.kernel[1]) as f64;

        let mut want_max = vec![0.0; x.numel()];
        let mut want_avg = vec![0.0; x.numel()];
        for b in 0..p.x[0] {
            for c in 0..p.x[1] {
                let flat =
                    |(iy, ix): (usize, usize)| ((b * p.x[1] + c) * p.x[2] + iy) * p.x[3] + ix;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let g = dy.at(&[b, c, oy, ox]);
                        let taps = p.window(oy, ox);
                        let mut best = taps[0];
                        for &t in &taps {
                            if x.data[flat(t)] > x.data[flat(best)] {
                                best = t;
                            }
                            want_avg[flat(t)] += g / area;
                        }
                        want_max[flat(best)] += g;
                    }
                }
            }
        }
        let dmax = run1(Op::MaxPool2dGrad, p.attrs(), &[x.clone(), dy.clone()]);
        assert_close(&dmax, &f(&p.x, &want_max), 1e-12, &format!("pool {i} max"));
        let shape = ints(&p.x.map(|v| v as i64));
        let avg_attrs = p.attrs().with("input_shape", shape);
        let davg = run1(Op::AvgPool2dGrad, avg_attrs, std::slice::from_ref(&dy));
        assert_close(&davg, &f(&p.x, &want_avg), 1e-12, &format!("pool {i} avg"));

        assert_adjoint(dot(&y_max, &dy), dot(&x, &dmax), &format!("pool {i} max"));
        assert_adjoint(dot(&y_avg, &dy), dot(&x, &davg), &format!("pool {i} avg"));
    }
}

#[test]
fn max_pool2d_grad_picks_the_first_maximum_and_accumulates_overlaps() {
    // One 3x3 plane, kernel 2, stride 1: four overlapping windows.
    // x = [[5, 5, 1],      window (0,0): 5 5 / 2 5 -> first 5 at (0,0)
    //      [2, 5, 5],      window (0,1): 5 1 / 5 5 -> first 5 at (0,1)
    //      [0, 5, 3]]      window (1,0): 2 5 / 0 5 -> first 5 at (1,1)
    //                      window (1,1): 5 5 / 5 3 -> first 5 at (1,1)
    let x = f(
        &[1, 1, 3, 3],
        &[5.0, 5.0, 1.0, 2.0, 5.0, 5.0, 0.0, 5.0, 3.0],
    );
    let dy = f(&[1, 1, 2, 2], &[1.0, 10.0, 100.0, 1000.0]);
    let attrs = Attrs::new()
        .with("kernel", Attr::Int(2))
        .with("stride", Attr::Int(1));
    let dx = run1(Op::MaxPool2dGrad, attrs, &[x, dy]);
    let want = f(
        &[1, 1, 3, 3],
        &[1.0, 10.0, 0.0, 0.0, 1100.0, 0.0, 0.0, 0.0, 0.0],
    );
    assert_close(&dx, &want, 0.0, "ties");

    // Padding never wins, even over negative values: kernel 2, stride 1, padding 1 on a 2x2
    // plane gives nine windows of one, two or four elements.
    let x = f(&[1, 1, 2, 2], &[-3.0, -2.0, -4.0, -1.0]);
    let dy = f(
        &[1, 1, 3, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    );
    let attrs = Attrs::new()
        .with("kernel", Attr::Int(2))
        .with("stride", Attr::Int(1))
        .with("padding", Attr::Int(1));
    let dx = run1(Op::MaxPool2dGrad, attrs, &[x, dy]);
    // -3 wins windows 0 and 3, -2 windows 1 and 2, -4 window 6, -1 windows 4, 5, 7 and 8.
    let want = f(&[1, 1, 2, 2], &[5.0, 5.0, 7.0, 28.0]);
    assert_close(&dx, &want, 0.0, "padding");
}

#[test]
fn avg_pool2d_grad_counts_padding_in_the_divisor() {
    // 1x1 input, kernel 2, padding 1, stride 1: four windows each see the single element and
    // divide by 4 (count_include_pad).
    let dy = f(&[1, 1, 2, 2], &[4.0, 8.0, 12.0, 16.0]);
    let attrs = Attrs::new()
        .with("kernel", Attr::Int(2))
        .with("stride", Attr::Int(1))
        .with("padding", Attr::Int(1))
        .with("input_shape", ints(&[1, 1, 1, 1]));
    let dx = run1(Op::AvgPool2dGrad, attrs, &[dy]);
    assert_close(&dx, &f(&[1, 1, 1, 1], &[10.0]), 0.0, "avg");
}

#[test]
fn embedding_grad_sums_repeated_ids() {
    let mut rng = Rng::new(9);
    let (v, d) = (5, 3);
    let ids = i(&[2, 4], &[1, 4, 1, 0, 4, 4, 2, 1]);
    let table = rng.tensor(&[v, d]);
    let y = run1(Op::Embedding, Attrs::new(), &[table.clone(), ids.clone()]);
    let dy = rng.tensor(y.shape());
    let attrs = Attrs::new().with("num_embeddings", Attr::Int(v as i64));
    let dw = run1(Op::EmbeddingGrad, attrs.clone(), &[dy.clone(), ids.clone()]);
    let mut want = vec![0.0; v * d];
    for (e, &id) in ids.data.iter().enumerate() {
        for j in 0..d {
            want[id as usize * d + j] += dy.data[e * d + j];
        }
    }
    assert_close(&dw, &f(&[v, d], &want), 1e-12, "embedding_grad");
    assert!(
        dw.data[3 * d..4 * d].iter().all(|&g| g == 0.0),
        "unused row 3"
    );
    assert_adjoint(dot(&y, &dy), dot(&table, &dw), "embedding");

    // ids of rank 0 and 1
    let dw = run1(
        Op::EmbeddingGrad,
        attrs.clone(),
        &[f(&[3], &[1.0, 2.0, 3.0]), i(&[], &[2])],
    );
    assert_close(
        &dw,
        &f(
            &[5, 3],
            &[0., 0., 0., 0., 0., 0., 1., 2., 3., 0., 0., 0., 0., 0., 0.],
        ),
        0.0,
        "rank 0",
    );
}

#[test]
fn embedding_grad_rejects_out_of_range_ids() {
    let attrs = Attrs::new().with("num_embeddings", Attr::Int(4));
    for bad in [4, -1] {
        let err = run(
            Op::EmbeddingGrad,
            attrs.clone(),
            &[f(&[2, 2], &[1.0; 4]), i(&[2], &[0, bad])],
        )
        .unwrap_err();
        assert!(
            matches!(&err, EvalError::IndexOutOfRange { op: "embedding_grad", value_name, index, bound: 4 }
                if value_name == "x1" && *index == bad),
            "{err}"
        );
    }
}

#[test]
fn slice_grad_places_dy_where_slice_reads() {
    let mut rng = Rng::new(13);
    // (shape, axis, start, end, step), negative values as a user would write them
    let cases: &[(&[usize], i64, i64, i64, i64)] = &[
        (&[6], 0, 1, 5, 1),
        (&[3, 7, 2], 1, 1, 7, 3),
        (&[4, 5], -1, -4, -1, 2),
        (&[5, 2, 3], 0, 0, 5, 2),
        (&[2, 3, 4], -3, 1, 2, 1),
    ];
    for &(shape, axis, start, end, step) in cases {
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis))
            .with("start", Attr::Int(start))
            .with("end", Attr::Int(end))
            .with("step", Attr::Int(step));
        let x = rng.tensor(shape);
        let y = run1(Op::Slice, attrs.clone(), std::slice::from_ref(&x));
        let dy = rng.tensor(y.shape());
        let shape_attr = ints(&shape.iter().map(|&v| v as i64).collect::<Vec<_>>());
        let dx = run1(
            Op::SliceGrad,
            attrs.with("shape", shape_attr),
            std::slice::from_ref(&dy),
        );

        let a = if axis < 0 {
            axis + shape.len() as i64
        } else {
            axis
        } as usize;
        let n = shape[a] as i64;
        let s = if start < 0 { start + n } else { start };
        let mut want = vec![0.0; x.numel()];
        for (k, &g) in dy.data.iter().enumerate() {
            let mut idx = unravel(k, dy.shape());
            idx[a] = (s + idx[a] as i64 * step) as usize;
            let flat: usize = idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum();
            want[flat] = g;
        }
        let what = format!("slice_grad {shape:?} axis {axis}");
        assert_close(&dx, &f(shape, &want), 0.0, &what);
        assert_adjoint(dot(&y, &dy), dot(&x, &dx), &what);
    }
}

#[test]
fn shape_rules_reject_mismatched_operands() {
    use sinter_ir::infer::infer;
    use sinter_ir::{DType, TensorType};
    let f32 = |s: &[usize]| TensorType::f32(s.to_vec());
    let pool = Attrs::new()
        .with("kernel", Attr::Int(2))
        .with("stride", Attr::Int(2));
    let bad: Vec<(Op, Vec<TensorType>, Attrs)> = vec![
        // dy must be f32 and of the pooled shape
        (
            Op::MaxPool2dGrad,
            vec![f32(&[1, 1, 4, 4]), TensorType::i32(vec![1, 1, 2, 2])],
            pool.clone(),
        ),
        (
            Op::MaxPool2dGrad,
            vec![f32(&[1, 1, 4, 4]), f32(&[1, 1, 3, 3])],
            pool.clone(),
        ),
        (
            Op::AvgPool2dGrad,
            vec![f32(&[1, 1, 3, 2])],
            pool.clone().with("input_shape", ints(&[1, 1, 4, 4])),
        ),
        // dy must be the conv2d output for input_shape and w
        (
            Op::Conv2dGradInput,
            vec![f32(&[1, 2, 3, 3]), f32(&[2, 1, 2, 2])],
            Attrs::new().with("input_shape", ints(&[1, 1, 5, 5])),
        ),
        // channels must fit groups
        (
            Op::Conv2dGradWeight,
            vec![f32(&[1, 3, 5, 5]), f32(&[1, 2, 4, 4])],
            Attrs::new().with("weight_shape", ints(&[2, 2, 2, 2])),
        ),
        // dy must be ids.shape + [D]
        (
            Op::EmbeddingGrad,
            vec![f32(&[3, 2]), TensorType::i32(vec![4])],
            Attrs::new().with("num_embeddings", Attr::Int(5)),
        ),
        // dy must be the slice of `shape`
        (
            Op::SliceGrad,
            vec![f32(&[2, 3])],
            Attrs::new()
                .with("shape", ints(&[2, 7]))
                .with("axis", Attr::Int(1))
                .with("start", Attr::Int(0))
                .with("end", Attr::Int(7))
                .with("step", Attr::Int(2)),
        ),
    ];
    for (op, inputs, attrs) in bad {
        let mut attrs = attrs;
        assert!(
            infer(op, &inputs, &mut attrs).is_err(),
            "{} accepted {inputs:?}",
            op.name()
        );
    }
    // and the matching ones pass
    let mut attrs = Attrs::new().with("input_shape", ints(&[1, 1, 5, 5]));
    let out = infer(
        Op::Conv2dGradInput,
        &[f32(&[1, 2, 4, 4]), f32(&[2, 1, 2, 2])],
        &mut attrs,
    );
    assert_eq!(out, Ok(vec![TensorType::new(DType::F32, vec![1, 1, 5, 5])]));
}
