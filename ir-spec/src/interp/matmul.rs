//! `matmul` with `torch.matmul` semantics.

use crate::interp::tensor::{Tensor, View};
use crate::types::{TensorType, broadcast_shapes};

/// `a @ b`: a 1-D `a` is a row `[1, K]` and a 1-D `b` a column `[K, 1]` (the added axis is removed
/// from the result); leading batch axes broadcast. Sums run over `k` in ascending order.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, out: &TensorType) -> Tensor {
    let a_shape = if a.rank() == 1 {
        vec![1, a.shape()[0]]
    } else {
        a.shape().to_vec()
    };
    let b_shape = if b.rank() == 1 {
        vec![b.shape()[0], 1]
    } else {
        b.shape().to_vec()
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let (m, k, n) = (a_shape[ra - 2], a_shape[ra - 1], b_shape[rb - 1]);
    let batch = broadcast_shapes(&a_shape[..ra - 2], &b_shape[..rb - 2])
        .expect("checked by the shape rule");
    let batched = |t: &Tensor, shape: Vec<usize>, rows: usize, cols: usize| {
        let t = Tensor::new(TensorType::f32(shape), t.data.clone());
        let mut full = batch.clone();
        full.extend([rows, cols]);
        View::broadcast(&t, &full).gather()
    };
    let a = batched(a, a_shape, m, k);
    let b = batched(b, b_shape, k, n);
    let batches: usize = batch.iter().product();
    let mut data = Vec::with_capacity(batches * m * n);
    for p in 0..batches {
        let (a, b) = (&a[p * m * k..], &b[p * k * n..]);
        for i in 0..m {
            for j in 0..n {
                data.push((0..k).map(|l| a[i * k + l] * b[l * n + j]).sum());
            }
        }
    }
    Tensor::new(out.clone(), data)
}
