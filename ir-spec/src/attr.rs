//! Attribute values: the data an op carries besides its operands.
//!
//! Attributes are plain data (ints, floats, strings, booleans and lists of them) so that a node
//! converts to an e-graph term without loss. After verification every node carries *every*
//! attribute its op declares, defaults filled in and negative axes normalized, so passes read
//! them without re-deriving defaults.

use std::fmt;

/// One attribute value.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum Attr {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    List(Vec<Attr>),
}

// Floats compare by bit pattern so that graphs are `Eq` and round-trip exactly.
impl PartialEq for Attr {
    fn eq(&self, other: &Attr) -> bool {
        match (self, other) {
            (Attr::Int(a), Attr::Int(b)) => a == b,
            (Attr::Float(a), Attr::Float(b)) => a.to_bits() == b.to_bits(),
            (Attr::Str(a), Attr::Str(b)) => a == b,
            (Attr::Bool(a), Attr::Bool(b)) => a == b,
            (Attr::List(a), Attr::List(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Attr {}

// A total order consistent with the bitwise equality above (egg's `Language` needs `Ord`):
// kinds first, then values, floats by bit pattern.
impl Ord for Attr {
    fn cmp(&self, other: &Attr) -> std::cmp::Ordering {
        fn rank(a: &Attr) -> u8 {
            match a {
                Attr::Int(_) => 0,
                Attr::Float(_) => 1,
                Attr::Str(_) => 2,
                Attr::Bool(_) => 3,
                Attr::List(_) => 4,
            }
        }
        match (self, other) {
            (Attr::Int(a), Attr::Int(b)) => a.cmp(b),
            (Attr::Float(a), Attr::Float(b)) => a.to_bits().cmp(&b.to_bits()),
            (Attr::Str(a), Attr::Str(b)) => a.cmp(b),
            (Attr::Bool(a), Attr::Bool(b)) => a.cmp(b),
            (Attr::List(a), Attr::List(b)) => a.cmp(b),
            _ => rank(self).cmp(&rank(other)),
        }
    }
}

impl PartialOrd for Attr {
    fn partial_cmp(&self, other: &Attr) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::hash::Hash for Attr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Attr::Int(v) => v.hash(state),
            Attr::Float(v) => v.to_bits().hash(state),
            Attr::Str(v) => v.hash(state),
            Attr::Bool(v) => v.hash(state),
            Attr::List(v) => v.hash(state),
        }
    }
}

impl Attr {
    pub fn ints(values: &[i64]) -> Attr {
        Attr::List(values.iter().map(|&v| Attr::Int(v)).collect())
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::Str(_) => "string",
            Attr::Bool(_) => "bool",
            Attr::List(_) => "list",
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// A float, accepting an int literal too (`eps=1` means 1.0).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Attr::Float(v) => Some(*v),
            Attr::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::Str(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Attr::List(items) => items.iter().map(Attr::as_int).collect(),
            _ => None,
        }
    }
}

// Shortest decimal text that reads back as the same `f64`, always with a `.` or exponent so it
// lexes as a float (shared with the artifact crate, which prints initializers).
pub use sinter_artifact::format_float;

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => f.write_str(&format_float(*v)),
            Attr::Str(v) => write!(f, "{v:?}"),
            Attr::Bool(v) => write!(f, "{v}"),
            Attr::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// The attributes of one node, sorted by name.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Attrs(Vec<(String, Attr)>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub fn set(&mut self, name: &str, value: Attr) {
        match self.0.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (name.to_string(), value)),
        }
    }

    pub fn with(mut self, name: &str, value: Attr) -> Attrs {
        self.set(name, value);
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Attr)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key` on a verified node: the verifier guarantees presence and kind, so a
    /// miss is a compiler bug and panics with the attribute's name.
    pub fn of<K: Kind>(&self, key: Key<K>) -> K::Out<'_> {
        self.get(key.name)
            .and_then(K::read)
            .unwrap_or_else(|| missing(key.name))
    }

    /// The value of `key`, if present and of its kind (for code that runs before verification
    /// has filled in defaults).
    pub fn try_of<K: Kind>(&self, key: Key<K>) -> Option<K::Out<'_>> {
        self.get(key.name).and_then(K::read)
    }

    /// Sets `key` to `value`.
    pub fn put<K: Kind>(&mut self, key: Key<K>, value: K::In) {
        self.set(key.name, K::write(value));
    }

    /// Removes the attribute `name`, if present.
    pub fn remove(&mut self, name: &str) {
        self.0.retain(|(k, _)| k != name);
    }

    /// `self` with `key` set to `value`.
    pub fn and<K: Kind>(mut self, key: Key<K>, value: K::In) -> Attrs {
        self.put(key, value);
        self
    }
}

fn missing(name: &str) -> ! {
    panic!("verified node lacks attribute `{name}` of the expected kind")
}

impl FromIterator<(String, Attr)> for Attrs {
    fn from_iter<I: IntoIterator<Item = (String, Attr)>>(iter: I) -> Attrs {
        let mut attrs = Attrs::new();
        for (k, v) in iter {
            attrs.set(&k, v);
        }
        attrs
    }
}

/// A typed attribute name. The op table declares each op's attributes through these keys, and
/// passes read attributes only through them ([`Attrs::of`], [`crate::Node::attr`]), so a name is
/// spelled once and its kind is checked by the type system: `node.attr(key::AXIS)` is a `usize`.
pub struct Key<K> {
    pub name: &'static str,
    pub kind: crate::op::AttrKind,
    kind_marker: std::marker::PhantomData<fn() -> K>,
}

impl<K> Clone for Key<K> {
    fn clone(&self) -> Key<K> {
        *self
    }
}

impl<K> Copy for Key<K> {}

impl<K> std::fmt::Debug for Key<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.name)
    }
}

impl<K> Key<K> {
    pub const fn new(name: &'static str, kind: crate::op::AttrKind) -> Key<K> {
        Key {
            name,
            kind,
            kind_marker: std::marker::PhantomData,
        }
    }
}

/// How an attribute kind reads and writes as Rust values.
pub trait Kind {
    type Out<'a>;
    type In;
    fn read(attr: &Attr) -> Option<Self::Out<'_>>;
    fn write(value: Self::In) -> Attr;
}

/// Kind markers for [`Key`].
pub mod kind {
    use super::{Attr, Kind};
    use crate::types::DType;

    /// A signed int (`i64`), e.g. before axes are normalized.
    pub enum Int {}
    /// A non-negative int read as `usize`: axes after normalization, counts, sizes.
    pub enum Index {}
    /// A float (an int literal reads as a float).
    pub enum Float {}
    pub enum Bool {}
    /// A string from a fixed set.
    pub enum Str {}
    /// A list of non-negative ints read as `usize`s.
    pub enum Indices {}
    /// A list of signed ints.
    pub enum Ints {}
    /// A dtype name.
    pub enum Dtype {}

    impl Kind for Int {
        type Out<'a> = i64;
        type In = i64;
        fn read(a: &Attr) -> Option<i64> {
            a.as_int()
        }
        fn write(v: i64) -> Attr {
            Attr::Int(v)
        }
    }
    impl Kind for Index {
        type Out<'a> = usize;
        type In = usize;
        fn read(a: &Attr) -> Option<usize> {
            a.as_int().and_then(|v| usize::try_from(v).ok())
        }
        fn write(v: usize) -> Attr {
            Attr::Int(v as i64)
        }
    }
    impl Kind for Float {
        type Out<'a> = f64;
        type In = f64;
        fn read(a: &Attr) -> Option<f64> {
            a.as_float()
        }
        fn write(v: f64) -> Attr {
            Attr::Float(v)
        }
    }
    impl Kind for Bool {
        type Out<'a> = bool;
        type In = bool;
        fn read(a: &Attr) -> Option<bool> {
            a.as_bool()
        }
        fn write(v: bool) -> Attr {
            Attr::Bool(v)
        }
    }
    impl Kind for Str {
        type Out<'a> = &'a str;
        type In = &'static str;
        fn read(a: &Attr) -> Option<&str> {
            a.as_str()
        }
        fn write(v: &'static str) -> Attr {
            Attr::Str(v.to_string())
        }
    }
    impl Kind for Indices {
        type Out<'a> = Vec<usize>;
        type In = Vec<usize>;
        fn read(a: &Attr) -> Option<Vec<usize>> {
            a.as_ints()?
                .into_iter()
                .map(|v| usize::try_from(v).ok())
                .collect()
        }
        fn write(v: Vec<usize>) -> Attr {
            Attr::List(v.into_iter().map(|x| Attr::Int(x as i64)).collect())
        }
    }
    impl Kind for Ints {
        type Out<'a> = Vec<i64>;
        type In = Vec<i64>;
        fn read(a: &Attr) -> Option<Vec<i64>> {
            a.as_ints()
        }
        fn write(v: Vec<i64>) -> Attr {
            Attr::ints(&v)
        }
    }
    impl Kind for Dtype {
        type Out<'a> = DType;
        type In = DType;
        fn read(a: &Attr) -> Option<DType> {
            a.as_str().and_then(DType::from_name)
        }
        fn write(v: DType) -> Attr {
            Attr::Str(v.name().to_string())
        }
    }
}

/// An attribute whose value is one of a few names, as a Rust enum: its text names (`NAMES`,
/// which the op table's `AttrKind::Str` lists) and its [`Kind`], so `attrs.of(key)` gives the
/// enum.
macro_rules! name_enum {
    ($(#[$meta:meta])* $ty:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $ty {
            $($(#[$vmeta])* $variant),+
        }

        impl $ty {
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// The names the text format takes, in [`Self::ALL`]'s order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $text),+
                }
            }

            pub fn from_name(name: &str) -> Option<$ty> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }

        impl Kind for $ty {
            type Out<'a> = $ty;
            type In = $ty;
            fn read(a: &Attr) -> Option<$ty> {
                a.as_str().and_then($ty::from_name)
            }
            fn write(v: $ty) -> Attr {
                Attr::Str(v.name().to_string())
            }
        }
    };
}

name_enum! {
    /// `reduction` of a loss, as PyTorch's.
    Reduction {
        Mean = "mean",
        Sum = "sum",
        /// One loss per element (or row).
        None = "none",
    }
}

name_enum! {
    /// `approximate` of `gelu`: the exact form with `erf` (`"none"`) or the tanh approximation.
    GeluForm {
        Erf = "none",
        Tanh = "tanh",
    }
}

name_enum! {
    /// `mask_kind` of `attention`: a mask of 0/1 (keep where nonzero) or added to the scores.
    MaskKind {
        Boolean = "boolean",
        Additive = "additive",
    }
}

/// Every attribute name of the IR, with its kind. The op table (`op.rs`) builds its attribute
/// lists from these; a test checks that every key is declared by some op.
pub mod key {
    use super::Key;
    use super::kind::*;
    use crate::op::AttrKind;

    const fn ints(n: usize) -> AttrKind {
        AttrKind::Ints(n)
    }

    pub const APPROXIMATE: Key<super::GeluForm> =
        Key::new("approximate", AttrKind::Str(super::GeluForm::NAMES));
    pub const AXES: Key<Indices> = Key::new("axes", ints(0));
    pub const KEEPDIM: Key<Bool> = Key::new("keepdim", AttrKind::Bool);
    pub const LAST: Key<Bool> = Key::new("last", AttrKind::Bool);
    pub const EXCLUSIVE: Key<Bool> = Key::new("exclusive", AttrKind::Bool);
    pub const REVERSE: Key<Bool> = Key::new("reverse", AttrKind::Bool);
    pub const AXIS: Key<Index> = Key::new("axis", AttrKind::Int);
    pub const SHAPE: Key<Indices> = Key::new("shape", ints(0));
    pub const PERM: Key<Indices> = Key::new("perm", ints(0));
    pub const DIM0: Key<Index> = Key::new("dim0", AttrKind::Int);
    pub const DIM1: Key<Index> = Key::new("dim1", AttrKind::Int);
    pub const START: Key<Index> = Key::new("start", AttrKind::Int);
    pub const END: Key<Index> = Key::new("end", AttrKind::Int);
    pub const STEP: Key<Index> = Key::new("step", AttrKind::Int);
    pub const DTYPE: Key<Dtype> = Key::new("dtype", AttrKind::DType);
    pub const EPS: Key<Float> = Key::new("eps", AttrKind::Float);
    pub const GROUPS: Key<Index> = Key::new("groups", AttrKind::Int);
    pub const STRIDE: Key<Indices> = Key::new("stride", ints(2));
    pub const PADDING: Key<Indices> = Key::new("padding", ints(2));
    pub const DILATION: Key<Indices> = Key::new("dilation", ints(2));
    pub const KERNEL: Key<Indices> = Key::new("kernel", ints(2));
    pub const REDUCTION: Key<super::Reduction> =
        Key::new("reduction", AttrKind::Str(super::Reduction::NAMES));
    pub const INPUT_SHAPE: Key<Indices> = Key::new("input_shape", ints(4));
    pub const WEIGHT_SHAPE: Key<Indices> = Key::new("weight_shape", ints(4));
    pub const NUM_EMBEDDINGS: Key<Index> = Key::new("num_embeddings", AttrKind::Int);
    pub const SCALE: Key<Float> = Key::new("scale", AttrKind::Float);
    pub const CAUSAL: Key<Bool> = Key::new("causal", AttrKind::Bool);
    pub const WINDOW: Key<Index> = Key::new("window", AttrKind::Int);
    pub const MASK_KIND: Key<super::MaskKind> =
        Key::new("mask_kind", AttrKind::Str(super::MaskKind::NAMES));
    pub const VALUE: Key<Float> = Key::new("value", AttrKind::Float);
    pub const LR: Key<Float> = Key::new("lr", AttrKind::Float);
    pub const MOMENTUM: Key<Float> = Key::new("momentum", AttrKind::Float);
    pub const DAMPENING: Key<Float> = Key::new("dampening", AttrKind::Float);
    pub const NESTEROV: Key<Bool> = Key::new("nesterov", AttrKind::Bool);
    pub const WEIGHT_DECAY: Key<Float> = Key::new("weight_decay", AttrKind::Float);
    pub const BETA1: Key<Float> = Key::new("beta1", AttrKind::Float);
    pub const BETA2: Key<Float> = Key::new("beta2", AttrKind::Float);
    pub const IGNORE_INDEX: Key<Int> = Key::new("ignore_index", AttrKind::Int);

    /// Every key, for the test that the op table declares each.
    pub const ALL: &[(&str, AttrKind)] = &[
        (APPROXIMATE.name, APPROXIMATE.kind),
        (AXES.name, AXES.kind),
        (KEEPDIM.name, KEEPDIM.kind),
        (LAST.name, LAST.kind),
        (EXCLUSIVE.name, EXCLUSIVE.kind),
        (REVERSE.name, REVERSE.kind),
        (AXIS.name, AXIS.kind),
        (SHAPE.name, SHAPE.kind),
        (PERM.name, PERM.kind),
        (DIM0.name, DIM0.kind),
        (DIM1.name, DIM1.kind),
        (START.name, START.kind),
        (END.name, END.kind),
        (STEP.name, STEP.kind),
        (DTYPE.name, DTYPE.kind),
        (EPS.name, EPS.kind),
        (GROUPS.name, GROUPS.kind),
        (STRIDE.name, STRIDE.kind),
        (PADDING.name, PADDING.kind),
        (DILATION.name, DILATION.kind),
        (KERNEL.name, KERNEL.kind),
        (REDUCTION.name, REDUCTION.kind),
        (INPUT_SHAPE.name, INPUT_SHAPE.kind),
        (WEIGHT_SHAPE.name, WEIGHT_SHAPE.kind),
        (NUM_EMBEDDINGS.name, NUM_EMBEDDINGS.kind),
        (SCALE.name, SCALE.kind),
        (CAUSAL.name, CAUSAL.kind),
        (WINDOW.name, WINDOW.kind),
        (MASK_KIND.name, MASK_KIND.kind),
        (VALUE.name, VALUE.kind),
        (LR.name, LR.kind),
        (MOMENTUM.name, MOMENTUM.kind),
        (DAMPENING.name, DAMPENING.kind),
        (NESTEROV.name, NESTEROV.kind),
        (WEIGHT_DECAY.name, WEIGHT_DECAY.kind),
        (BETA1.name, BETA1.kind),
        (BETA2.name, BETA2.kind),
        (IGNORE_INDEX.name, IGNORE_INDEX.kind),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_and_reparse_exactly() {
        for v in [0.1, 1.0, 1e-5, -3.25e10, 1.0 / 3.0, 5e-324] {
            let s = format_float(v);
            assert!(s.contains(['.', 'e']), "{s}");
            assert_eq!(s.parse::<f64>().map(f64::to_bits), Ok(v.to_bits()));
        }
    }

    #[test]
    fn attrs_stay_sorted() {
        let a = Attrs::new()
            .with("b", Attr::Int(1))
            .with("a", Attr::Bool(true));
        assert_eq!(a.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(a.get("b"), Some(&Attr::Int(1)));
    }
}
