//! Where the batch, query-position and key-position axes sit in a value.

use std::fmt;

/// What an axis of a value is to generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The sequences of a batch: the first axis of the token ids.
    Batch,
    /// The position of the token a value belongs to: the second axis of the token ids.
    Query,
    /// The position of an earlier token that a query reads: the keys and values of attention,
    /// which the derived step reads from its caches.
    Key,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Batch, Role::Query, Role::Key];

    fn index(self) -> usize {
        match self {
            Role::Batch => 0,
            Role::Query => 1,
            Role::Key => 2,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Batch => "batch",
            Role::Query => "positions",
            Role::Key => "key positions",
        })
    }
}

/// A role's place in a value: along `axis`, whose extent is `outer · n · inner` for the role's
/// extent `n`; the role's coordinate at index `x` of the axis is `(x / inner) % n`. A role has
/// an axis of its own when `inner` is 1 and the axis's extent is `n`; `[B·T, D]` holds the batch
/// (inner `T`) and the positions (inner 1) in its first axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub axis: usize,
    pub inner: usize,
}

impl Place {
    pub fn new(axis: usize, inner: usize) -> Place {
        Place { axis, inner }
    }

    /// The role's coordinate at the element with coordinates `coords` (`n`: its extent).
    pub fn coordinate(self, coords: &[usize], n: usize) -> usize {
        (coords[self.axis] / self.inner) % n
    }
}

/// The places of the roles a value carries (at most one place per role).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout([Option<Place>; 3]);

impl Layout {
    pub fn get(&self, role: Role) -> Option<Place> {
        self.0[role.index()]
    }

    pub fn set(&mut self, role: Role, place: Place) {
        self.0[role.index()] = Some(place);
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// Every role with its place.
    pub fn places(&self) -> impl Iterator<Item = (Role, Place)> + '_ {
        Role::ALL
            .into_iter()
            .filter_map(|r| self.get(r).map(|p| (r, p)))
    }

    /// The roles along `axis`.
    pub fn at(&self, axis: usize) -> impl Iterator<Item = (Role, Place)> + '_ {
        self.places().filter(move |(_, p)| p.axis == axis)
    }

    /// The same roles with every axis moved by `f` (`None` drops the role).
    pub fn map_axes(&self, f: impl Fn(usize) -> Option<usize>) -> Layout {
        let mut out = Layout::default();
        for (role, p) in self.places() {
            if let Some(axis) = f(p.axis) {
                out.set(role, Place::new(axis, p.inner));
            }
        }
        out
    }
}

/// The extent of each role in the forward program and in a derived one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extents {
    pub old: [usize; 3],
    pub new: [usize; 3],
}

impl Extents {
    /// The extent of `role` in the forward program.
    pub fn before(&self, role: Role) -> usize {
        self.old[role.index()]
    }

    /// The extent of `role` in the derived program.
    pub fn after(&self, role: Role) -> usize {
        self.new[role.index()]
    }

    /// `shape` (of a value laid out as `layout` in the forward program) with every role's
    /// extent changed to its new one.
    pub fn resize(&self, shape: &[usize], layout: &Layout) -> Vec<usize> {
        let mut out = shape.to_vec();
        for (role, p) in layout.places() {
            out[p.axis] = out[p.axis] / self.before(role) * self.after(role);
        }
        out
    }
}

/// The stride, in elements of a C-ordered tensor of `shape`, of the role at `place`.
pub fn flat_stride(shape: &[usize], place: Place) -> usize {
    shape[place.axis + 1..].iter().product::<usize>() * place.inner
}

/// The place in `to` of a role (extent `n`) at `place` in `from`, the same elements in C order
/// (a reshape): the axis of `to` that holds the role's whole stride range, if one does.
pub fn reshape_place(from: &[usize], to: &[usize], place: Place, n: usize) -> Option<Place> {
    let lo = flat_stride(from, place);
    let hi = lo * n;
    (0..to.len()).find_map(|axis| {
        let stride: usize = to[axis + 1..].iter().product();
        let top = stride * to[axis];
        let holds =
            stride <= lo && hi <= top && lo.is_multiple_of(stride) && top.is_multiple_of(hi);
        holds.then(|| Place::new(axis, lo / stride))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_keeps_an_axis_of_its_own() {
        let p = Place::new(1, 1);
        assert_eq!(
            reshape_place(&[4, 16, 32], &[4, 16, 2, 16], p, 16),
            Some(Place::new(1, 1))
        );
    }

    #[test]
    fn reshape_merges_and_splits() {
        // [B, T, D] -> [B*T, D]: the positions are the inner factor, the batch the outer one
        assert_eq!(
            reshape_place(&[4, 16, 32], &[64, 32], Place::new(1, 1), 16),
            Some(Place::new(0, 1))
        );
        assert_eq!(
            reshape_place(&[4, 16, 32], &[64, 32], Place::new(0, 1), 4),
            Some(Place::new(0, 16))
        );
        // back again
        assert_eq!(
            reshape_place(&[64, 32], &[4, 16, 32], Place::new(0, 16), 4),
            Some(Place::new(0, 1))
        );
        // an axis that splits the positions holds no place
        assert_eq!(
            reshape_place(&[4, 16, 32], &[4, 8, 64], Place::new(1, 1), 16),
            None
        );
    }

    #[test]
    fn resize_scales_every_role_of_an_axis() {
        let mut l = Layout::default();
        l.set(Role::Batch, Place::new(0, 16));
        l.set(Role::Query, Place::new(0, 1));
        let e = Extents {
            old: [4, 16, 16],
            new: [1, 1, 16],
        };
        assert_eq!(e.resize(&[64, 32], &l), vec![1, 32]);
    }
}
