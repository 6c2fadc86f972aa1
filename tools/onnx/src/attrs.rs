//! Reading a node's attributes, with a record of which were read: an attribute that no
//! translation looked at is reported rather than silently ignored.

use std::cell::RefCell;

use crate::error::Problem;
use crate::literal::Literal;
use crate::proto::{AttributeProto, NodeProto};

pub struct NodeAttrs<'a> {
    node: &'a NodeProto,
    read: RefCell<Vec<&'a str>>,
}

impl<'a> NodeAttrs<'a> {
    pub fn new(node: &'a NodeProto) -> NodeAttrs<'a> {
        NodeAttrs {
            node,
            read: RefCell::new(Vec::new()),
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

    /// Marks an attribute as looked at without reading it (one whose every value is accepted).
    pub fn ignore(&self, name: &str) {
        let _ = self.get(name);
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.get(name).and_then(|a| a.i).unwrap_or(default)
    }

    pub fn float(&self, name: &str, default: f64) -> f64 {
        self.get(name).and_then(|a| a.f).map_or(default, f64::from)
    }

    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }

    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.get(name).map(|a| a.floats.clone())
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).and_then(|a| a.s.as_ref()).map_or_else(
            || default.to_string(),
            |s| String::from_utf8_lossy(s).into_owned(),
        )
    }

    pub fn tensor(&self, name: &str) -> Result<Option<Literal>, Problem> {
        match self.get(name).and_then(|a| a.t.as_ref()) {
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
