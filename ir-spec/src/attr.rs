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

/// Shortest decimal text that reads back as the same `f64`, always with a `.` or exponent so it
/// lexes as a float.
pub fn format_float(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
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

    // Typed getters for verified nodes: the verifier guarantees presence and kind, so a miss is a
    // compiler bug and panics with the attribute's name.

    pub fn int(&self, name: &str) -> i64 {
        self.get(name)
            .and_then(Attr::as_int)
            .unwrap_or_else(|| missing(name))
    }

    pub fn float(&self, name: &str) -> f64 {
        self.get(name)
            .and_then(Attr::as_float)
            .unwrap_or_else(|| missing(name))
    }

    pub fn bool(&self, name: &str) -> bool {
        self.get(name)
            .and_then(Attr::as_bool)
            .unwrap_or_else(|| missing(name))
    }

    pub fn str(&self, name: &str) -> &str {
        self.get(name)
            .and_then(Attr::as_str)
            .unwrap_or_else(|| missing(name))
    }

    pub fn ints(&self, name: &str) -> Vec<i64> {
        self.get(name)
            .and_then(Attr::as_ints)
            .unwrap_or_else(|| missing(name))
    }

    /// An int list attribute of non-negative entries (axes, shapes, strides after verification).
    pub fn usizes(&self, name: &str) -> Vec<usize> {
        self.ints(name).into_iter().map(|v| v as usize).collect()
    }

    pub fn usize(&self, name: &str) -> usize {
        self.int(name) as usize
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
        assert_eq!(a.int("b"), 1);
    }
}
