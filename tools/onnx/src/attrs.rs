//! Reading a node's attributes, with a record of which were read and of any read as the wrong
//! kind: an attribute that no translation looked at, or that holds another kind of value than
//! the translation expects (`p` as a float where ONNX has an int), is reported rather than
//! silently ignored or replaced by its default.

use std::cell::RefCell;

use crate::error::Problem;
use crate::literal::Literal;
use crate::proto::{AttributeProto, NodeProto};

pub struct NodeAttrs<'a> {
    node: &'a NodeProto,
    read: RefCell<Vec<&'a str>>,
    /// `name (expected kind)` of attributes read as a kind they do not hold.
    mismatched: RefCell<Vec<String>>,
}

/// `AttributeProto.AttributeType` codes, and their names for messages.
mod kind {
    pub const FLOAT: i32 = 1;
    pub const INT: i32 = 2;
    pub const STRING: i32 = 3;
    pub const TENSOR: i32 = 4;
    pub const FLOATS: i32 = 6;
    pub const INTS: i32 = 7;
    pub const NAMES: &[&str] = &[
        "", "float", "int", "string", "tensor", "graph", "floats", "ints",
    ];
}

impl<'a> NodeAttrs<'a> {
    pub fn new(node: &'a NodeProto) -> NodeAttrs<'a> {
        NodeAttrs {
            node,
            read: RefCell::new(Vec::new()),
            mismatched: RefCell::new(Vec::new()),
        }
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        let found = self
            .node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))?;
        self.read
            .borrow_mut()
            .push(found.name.as_deref().unwrap_or(""));
        Some(found)
    }

    /// The attribute `name` when it is of kind `expected` (by its declared type or, where a
    /// model leaves that out, by `holds`); one of another kind is recorded as mismatched.
    fn typed(
        &self,
        name: &str,
        expected: i32,
        holds: impl Fn(&AttributeProto) -> bool,
    ) -> Option<&'a AttributeProto> {
        let a = self.get(name)?;
        let ok = match a.r#type {
            Some(t) if t != 0 => t == expected,
            _ => holds(a),
        };
        if ok {
            return Some(a);
        }
        let want = kind::NAMES
            .get(expected as usize)
            .copied()
            .unwrap_or("another kind");
        self.mismatched
            .borrow_mut()
            .push(format!("{name} (expected {want})"));
        None
    }

    /// Marks an attribute as looked at without reading it (one whose every value is accepted).
    pub fn ignore(&self, name: &str) {
        let _ = self.get(name);
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.typed(name, kind::INT, |a| a.i.is_some())
            .and_then(|a| a.i)
            .unwrap_or(default)
    }

    pub fn float(&self, name: &str, default: f64) -> f64 {
        self.typed(name, kind::FLOAT, |a| a.f.is_some())
            .and_then(|a| a.f)
            .map_or(default, f64::from)
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.typed(name, kind::INTS, |a| a.floats.is_empty())
            .map(|a| a.ints.clone())
    }

    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.typed(name, kind::FLOATS, |a| a.ints.is_empty())
            .map(|a| a.floats.clone())
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        self.typed(name, kind::STRING, |a| a.s.is_some())
            .and_then(|a| a.s.as_ref())
            .map_or_else(
                || default.to_string(),
                |s| String::from_utf8_lossy(s).into_owned(),
            )
    }

    pub fn tensor(&self, name: &str) -> Result<Option<Literal>, Problem> {
        match self
            .typed(name, kind::TENSOR, |a| a.t.is_some())
            .and_then(|a| a.t.as_ref())
        {
            None => Ok(None),
            Some(t) => Literal::from_proto(t)
                .map(Some)
                .map_err(|e| Problem::unsupported(format!("attribute `{name}`: {e}"))),
        }
    }

    /// An int attribute that must have one of `allowed` values.
    pub fn int_in(&self, name: &str, default: i64, allowed: &[i64]) -> Result<i64, Problem> {
        let v = self.int(name, default);
        if allowed.contains(&v) {
            Ok(v)
        } else {
            Err(Problem::unsupported(format!("attribute {name}={v}")))
        }
    }

    /// Attributes read as a kind they do not hold.
    pub fn mismatched(&self) -> Vec<String> {
        self.mismatched.borrow().clone()
    }

    /// The attributes that were never read, with their names.
    pub fn unread(&self) -> Vec<String> {
        let read = self.read.borrow();
        self.node
            .attribute
            .iter()
            .filter_map(|a| a.name.as_deref())
            .filter(|n| !read.contains(n))
            .map(str::to_string)
            .collect()
    }
}
