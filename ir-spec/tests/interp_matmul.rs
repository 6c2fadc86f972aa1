//! `matmul` with torch semantics against a naive triple loop.

mod interp_common;

use interp_common::*;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attrs, Op};

/// torch.matmul, written out: promote 1-D operands, broadcast batch axes, triple loop, drop the
/// promoted axes.
fn naive(a: &Tensor, b: &Tensor) -> Tensor {
    let sa: Vec<usize> = if a.rank() == 1 {
        vec![1, a.shape()[0]]
    } else {
        a.shape().to_vec()
    };
    let sb: Vec<usize> = if b.rank() == 1 {
        vec![b.shape()[0], 1]
    } else {
        b.shape().to_vec()
    };
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let rank = ba.len().max(bb.len());
    let ext = |s: &[usize], i: usize| {
        if i + s.len() >= rank {
            s[i + s.len() - rank]
        } else {
            1
        }
    };
    let batch: Vec<usize> = (0..rank).map(|i| ext(ba, i).max(ext(bb, i))).collect();
    let (m, k, n) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
    let a2 = Tensor::f32(sa.clone(), a.data.clone());
    let b2 = Tensor::f32(sb.clone(), b.data.clone());
    let mut data = Vec::new();
    let batches: usize = batch.iter().product();
    for p in 0..batches {
        let bi = unravel(p, &batch);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for l in 0..k {
                    let ia: Vec<usize> = bi.iter().copied().chain([i, l]).collect();
                    let ib: Vec<usize> = bi.iter().copied().chain([l, j]).collect();
                    acc += at_broadcast(&a2, &ia) * at_broadcast(&b2, &ib);
                }
                data.push(acc);
            }
        }
    }
    let mut shape = batch;
    if a.rank() >= 2 {
        shape.push(m);
    }
    if b.rank() >= 2 {
        shape.push(n);
    }
    Tensor::f32(shape, data)
}

fn check(sa: &[usize], sb: &[usize], expected_shape: &[usize], rng: &mut Rng) {
    let (a, b) = (rng.tensor(sa), rng.tensor(sb));
    let got = run1(Op::Matmul, Attrs::new(), &[a.clone(), b.clone()]);
    assert_eq!(got.shape(), expected_shape, "{sa:?} @ {sb:?}");
    assert_close(&got, &naive(&a, &b), 1e-14, &format!("{sa:?} @ {sb:?}"));
}

#[test]
fn hand_values() {
    let a = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    let got = run1(Op::Matmul, Attrs::new(), &[a, b]);
    assert_close(&got, &f(&[2, 2], &[19.0, 22.0, 43.0, 50.0]), 0.0, "2x2");
    let v = f(&[3], &[1.0, 2.0, 3.0]);
    let got = run1(Op::Matmul, Attrs::new(), &[v.clone(), v]);
    assert_close(&got, &f(&[], &[14.0]), 0.0, "dot");
}

#[test]
fn torch_shape_cases() {
    let mut rng = Rng::new(7);
    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[3], &[3], &[]),
        (&[2, 3], &[3], &[2]),
        (&[3], &[3, 4], &[4]),
        (&[1, 1], &[1, 1], &[1, 1]),
        (&[7, 13], &[13, 5], &[7, 5]),
        (&[4, 2, 3], &[3, 5], &[4, 2, 5]),
        (&[2, 3], &[4, 3, 5], &[4, 2, 5]),
        (&[5, 1, 2, 3], &[7, 3, 4], &[5, 7, 2, 4]),
        (&[3], &[2, 3, 4], &[2, 4]),
        (&[2, 1, 7, 13], &[13], &[2, 1, 7]),
        (&[1, 3, 1, 2], &[2, 1, 2, 7], &[2, 3, 1, 7]),
    ];
    for &(sa, sb, so) in cases {
        check(sa, sb, so, &mut rng);
    }
}
