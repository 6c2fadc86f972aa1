//! Strided views: how a value sits in a buffer.
//!
//! View ops (permute, transpose, broadcast_to, unsqueeze, squeeze, slice, and reshape of data
//! whose strides allow it) produce new [`View`]s of the same buffer and cost no kernel.

use sinter_ir::types::contiguous_strides;

/// Handle of a planned buffer (see [`crate::schedule::Buffer`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct BufferId(pub u32);

/// A strided view into a buffer; offsets and strides in elements. Strides are never negative
/// (no op reverses an axis); broadcast axes have stride 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub buffer: BufferId,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

impl View {
    pub fn contiguous(buffer: BufferId, shape: &[usize]) -> View {
        View {
            buffer,
            offset: 0,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements are dense in C order (size-1 axes may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let expected = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(&self.strides)
            .zip(&expected)
            .all(|((&d, &s), &e)| d == 1 || s == e)
    }

    pub fn permute(&self, perm: &[usize]) -> View {
        View {
            buffer: self.buffer,
            offset: self.offset,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    /// numpy broadcast to `shape` (the caller has checked compatibility).
    pub fn broadcast_to(&self, shape: &[usize]) -> View {
        let lead = shape.len() - self.rank();
        let strides = (0..shape.len())
            .map(|i| {
                if i < lead || self.shape[i - lead] == 1 {
                    0
                } else {
                    self.strides[i - lead]
                }
            })
            .collect();
        View {
            buffer: self.buffer,
            offset: self.offset,
            shape: shape.to_vec(),
            strides,
        }
    }

    pub fn unsqueeze(&self, axis: usize) -> View {
        let mut v = self.clone();
        v.shape.insert(axis, 1);
        v.strides.insert(axis, 0);
        v
    }

    pub fn squeeze(&self, axis: usize) -> View {
        let mut v = self.clone();
        v.shape.remove(axis);
        v.strides.remove(axis);
        v
    }

    pub fn slice(&self, axis: usize, start: usize, len: usize, step: usize) -> View {
        let mut v = self.clone();
        v.offset += start * self.strides[axis];
        v.shape[axis] = len;
        v.strides[axis] *= step;
        v
    }

    /// Splits `axis` into `parts` (whose product is its extent), outermost first.
    pub fn split_axis(&self, axis: usize, parts: &[usize]) -> View {
        let mut v = self.clone();
        let inner = contiguous_strides(parts);
        v.shape.splice(axis..=axis, parts.iter().copied());
        v.strides
            .splice(axis..=axis, inner.iter().map(|s| s * self.strides[axis]));
        v
    }

    /// The same elements under a new shape, if the strides allow it without a copy.
    pub fn reshape(&self, shape: &[usize]) -> Option<View> {
        let strides = reshape_strides(&self.shape, &self.strides, shape)?;
        Some(View {
            buffer: self.buffer,
            offset: self.offset,
            shape: shape.to_vec(),
            strides,
        })
    }

    /// Picks the axes in `axes` (in that order).
    pub fn axes(&self, axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
        (
            axes.iter().map(|&a| self.shape[a]).collect(),
            axes.iter().map(|&a| self.strides[a]).collect(),
        )
    }
}

/// Strides for viewing `(shape, strides)` as `new_shape` without moving data (PyTorch's
/// `computeStride`): each run of old axes that is contiguous within itself may be re-split
/// freely; a new axis may not straddle two runs.
pub fn reshape_strides(
    shape: &[usize],
    strides: &[usize],
    new_shape: &[usize],
) -> Option<Vec<usize>> {
    let numel: usize = shape.iter().product();
    if new_shape.iter().product::<usize>() != numel {
        return None;
    }
    if numel == 1 || shape.is_empty() {
        return Some(contiguous_strides(new_shape));
    }
    let mut new_strides = vec![0; new_shape.len()];
    let mut view_d = new_shape.len() as isize - 1;
    let mut chunk_base = *strides.last().expect("rank > 0");
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..shape.len()).rev() {
        tensor_numel *= shape[d];
        let run_ends = d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base);
        if run_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base;
                view_numel *= new_shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                chunk_base = strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(new_strides)
}

impl std::fmt::Display for BufferId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b{}", self.0)
    }
}

impl std::fmt::Display for View {
    /// `bN[shape]`, then `+offset` and the strides where they are not the contiguous ones.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:?}", self.buffer, self.shape)?;
        if self.offset != 0 {
            write!(f, "+{}", self.offset)?;
        }
        if self.strides != contiguous_strides(&self.shape) {
            write!(f, " strides {:?}", self.strides)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: BufferId = BufferId(0);

    #[test]
    fn reshape_of_contiguous_is_free() {
        let v = View::contiguous(B, &[2, 3, 4]);
        assert_eq!(v.reshape(&[6, 4]).unwrap().strides, vec![4, 1]);
        assert_eq!(v.reshape(&[24]).unwrap().strides, vec![1]);
        assert_eq!(v.reshape(&[2, 1, 12]).unwrap().strides, vec![12, 12, 1]);
    }

    #[test]
    fn reshape_of_transposed_needs_a_copy_unless_runs_survive() {
        let t = View::contiguous(B, &[2, 3, 4]).permute(&[1, 0, 2]); // [3, 2, 4], strides [4, 12, 1]
        assert!(t.reshape(&[6, 4]).is_none());
        let r = t.reshape(&[3, 2, 2, 2]).unwrap();
        assert_eq!(r.strides, vec![4, 12, 2, 1]);
    }

    #[test]
    fn broadcast_and_slices() {
        let v = View::contiguous(B, &[3, 1]).broadcast_to(&[2, 3, 4]);
        assert_eq!(v.strides, vec![0, 1, 0]);
        let s = View::contiguous(B, &[10, 4]).slice(0, 1, 4, 3);
        assert_eq!(
            (s.offset, s.shape.clone(), s.strides.clone()),
            (4, vec![4, 4], vec![12, 1])
        );
        assert!(!s.is_contiguous());
        assert!(View::contiguous(B, &[5, 1]).unsqueeze(0).is_contiguous());
    }

    #[test]
    fn split_axis() {
        let v = View::contiguous(B, &[2, 6, 5]).split_axis(1, &[3, 2]);
        assert_eq!(v.shape, vec![2, 3, 2, 5]);
        assert_eq!(v.strides, vec![30, 10, 5, 1]);
    }
}
