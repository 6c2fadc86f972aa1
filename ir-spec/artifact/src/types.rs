//! Element types and tensor types.
//!
//! Every value in a graph has a static [`TensorType`]: an element [`DType`] and a shape whose
//! dimensions are all known. A scalar is a tensor of rank 0 (`f32[]`).

use std::fmt;

/// Element type of a tensor.
///
/// [`DType::size_bytes`] is the one place that says how many bytes an element takes.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum DType {
    F32,
    I32,
    /// IEEE 754 binary16: 11 significant bits, largest finite value 65504.
    F16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::I32, DType::F16];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::F16 => "f16",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// `x` as a value of this dtype: rounded to nearest, ties to even (f32, f16: through f32,
    /// as a GPU computing in f32 stores it; past the largest finite value, infinite; NaN stays
    /// NaN), or truncated toward zero (i32, saturating; NaN to 0).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F32 => f64::from(x as f32),
            DType::F16 => f64::from(half::f16::from_f32(x as f32)),
            DType::I32 => f64::from(x as i32),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape: one extent per axis, outermost first (C order).
pub type Shape = Vec<usize>;

/// The type of a value: element type and static shape.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn f32(shape: impl Into<Shape>) -> TensorType {
        TensorType::new(DType::F32, shape)
    }

    pub fn i32(shape: impl Into<Shape>) -> TensorType {
        TensorType::new(DType::I32, shape)
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType::new(dtype, Vec::new())
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for a scalar). Saturates at `usize::MAX` rather than wrap, so a
    /// type too large to count is never mistaken for a small one; the verifier rejects such
    /// types ([`TensorType::checked_size_bytes`]).
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when it does not fit in a `usize`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Size in bytes; saturates like [`TensorType::numel`].
    pub fn size_bytes(&self) -> usize {
        self.checked_size_bytes().unwrap_or(usize::MAX)
    }

    /// Size in bytes, or `None` when it does not fit in a `usize`.
    pub fn checked_size_bytes(&self) -> Option<usize> {
        self.checked_numel()?.checked_mul(self.dtype.size_bytes())
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Row-major (C order) strides, in elements, of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// numpy broadcasting of two shapes; `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Shape> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Whether `from` broadcasts to exactly `to` (numpy rules, `from` on the right).
pub fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && broadcast_shapes(from, to).as_deref() == Some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(broadcast_shapes(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        assert!(broadcasts_to(&[1, 5], &[7, 5]));
        assert!(!broadcasts_to(&[7, 5], &[5]));
    }

    #[test]
    fn strides() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
    }

    #[test]
    fn sizes_never_wrap() {
        let huge = TensorType::f32(vec![1 << 31, 1 << 31]);
        assert_eq!(huge.checked_numel(), Some(1 << 62));
        assert_eq!(huge.checked_size_bytes(), None);
        assert_eq!(huge.size_bytes(), usize::MAX);
        let past = TensorType::i32(vec![1 << 40, 1 << 40]);
        assert_eq!(past.numel(), usize::MAX);
        assert_eq!(TensorType::f32(vec![3, 5]).size_bytes(), 60);
    }

    #[test]
    fn display() {
        assert_eq!(TensorType::f32(vec![2, 3]).to_string(), "f32[2, 3]");
        assert_eq!(TensorType::scalar(DType::I32).to_string(), "i32[]");
    }
}
