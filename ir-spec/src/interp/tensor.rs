//! [`Tensor`]: a dense value of the interpreter, and strided views over its elements.

use std::fmt;

use crate::types::{DType, TensorType, contiguous_strides};

/// A dense tensor in C order. Every element is an `f64`, whatever the dtype: `f32` values are
/// computed (and kept) in double precision, `i32` values are stored exactly as integral `f64`s.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub ty: TensorType,
    pub data: Vec<f64>,
}

impl Tensor {
    /// A tensor of type `ty`; panics when `data` does not hold exactly `ty.numel()` elements.
    pub fn new(ty: TensorType, data: Vec<f64>) -> Tensor {
        assert_eq!(
            data.len(),
            ty.numel(),
            "a tensor of type {ty} holds {} elements, got {}",
            ty.numel(),
            data.len()
        );
        Tensor { ty, data }
    }

    /// An `f32` tensor of the given shape.
    pub fn f32(shape: impl Into<Vec<usize>>, data: Vec<f64>) -> Tensor {
        Tensor::new(TensorType::f32(shape.into()), data)
    }

    /// An `i32` tensor of the given shape.
    pub fn i32(shape: impl Into<Vec<usize>>, data: Vec<i64>) -> Tensor {
        Tensor::new(
            TensorType::i32(shape.into()),
            data.into_iter().map(|v| v as f64).collect(),
        )
    }

    /// An `f32` scalar (`f32[]`).
    pub fn scalar(v: f64) -> Tensor {
        Tensor::new(TensorType::scalar(DType::F32), vec![v])
    }

    /// Every element equal to `v`.
    pub fn full(ty: TensorType, v: f64) -> Tensor {
        let n = ty.numel();
        Tensor::new(ty, vec![v; n])
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The element at a multi-index; panics when the index is out of bounds.
    pub fn at(&self, index: &[usize]) -> f64 {
        assert_eq!(index.len(), self.rank(), "index {index:?} for {}", self.ty);
        let mut offset = 0;
        for ((&i, &d), s) in index
            .iter()
            .zip(self.shape())
            .zip(contiguous_strides(self.shape()))
        {
            assert!(i < d, "index {index:?} out of bounds for {}", self.ty);
            offset += i * s;
        }
        self.data[offset]
    }

    /// Largest absolute elementwise difference (`inf` when shapes differ; NaN in the same place
    /// on both sides counts as equal, NaN against a number as `inf`).
    pub fn max_abs_diff(&self, other: &Tensor) -> f64 {
        if self.shape() != other.shape() {
            return f64::INFINITY;
        }
        self.data
            .iter()
            .zip(&other.data)
            .map(|(&a, &b)| match (a.is_nan(), b.is_nan()) {
                (true, true) => 0.0,
                (false, false) if a == b => 0.0,
                (false, false) => (a - b).abs(),
                _ => f64::INFINITY,
            })
            .fold(0.0, f64::max)
    }

    /// The same elements under another type of equal element count.
    pub(crate) fn with_type(self, ty: TensorType) -> Tensor {
        Tensor::new(ty, self.data)
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.ty, self.data)
    }
}

/// A strided view of a tensor's elements: `shape` and `strides` (in elements) from `offset`.
/// Strides of 0 broadcast; views never copy until [`View::gather`].
#[derive(Clone, Debug)]
pub(crate) struct View<'a> {
    pub data: &'a [f64],
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl<'a> View<'a> {
    /// The whole tensor, contiguous.
    pub fn of(t: &'a Tensor) -> View<'a> {
        View {
            data: &t.data,
            offset: 0,
            shape: t.shape().to_vec(),
            strides: contiguous_strides(t.shape()),
        }
    }

    /// numpy broadcast to `shape` (the caller has checked that it broadcasts).
    pub fn broadcast(t: &'a Tensor, shape: &[usize]) -> View<'a> {
        let pad = shape.len() - t.rank();
        let own = contiguous_strides(t.shape());
        let strides = (0..shape.len())
            .map(|i| match i.checked_sub(pad) {
                Some(j) if t.shape()[j] != 1 => own[j],
                _ => 0,
            })
            .collect();
        View {
            data: &t.data,
            offset: 0,
            shape: shape.to_vec(),
            strides,
        }
    }

    /// Output axis `i` is this view's axis `perm[i]`.
    pub fn permute(mut self, perm: &[usize]) -> View<'a> {
        self.shape = perm.iter().map(|&p| self.shape[p]).collect();
        self.strides = perm.iter().map(|&p| self.strides[p]).collect();
        self
    }

    /// Every element, in C order of the view's shape.
    pub fn gather(&self) -> Vec<f64> {
        let numel: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(numel);
        if numel == 0 {
            return out;
        }
        let rank = self.shape.len();
        let mut index = vec![0usize; rank];
        let mut offset = self.offset;
        for _ in 0..numel {
            out.push(self.data[offset]);
            // Odometer increment, innermost axis first.
            for axis in (0..rank).rev() {
                index[axis] += 1;
                offset += self.strides[axis];
                if index[axis] < self.shape[axis] {
                    break;
                }
                offset -= self.strides[axis] * self.shape[axis];
                index[axis] = 0;
            }
        }
        out
    }
}

/// The extents before, at and after `axis`: `(outer, n, inner)`, so that element `(o, i, j)` is
/// at `(o * n + i) * inner + j`.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}
