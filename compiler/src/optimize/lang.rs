//! The e-graph's language: the IR's ops with their attributes as data, fused kernel programs,
//! and one root over everything the graph must produce.
//!
//! An e-node is a [`Head`] and the e-classes of its operands. Heads compare by content
//! (attributes and programs are shared behind [`Interned`], hashed once), so the e-graph's
//! hash-consing finds common subexpressions, equal fused kernels included.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use egg::{FromOp, Id, Language};
use sinter_ir::attr::format_float;
use sinter_ir::{Attr, Attrs, Op, ValueId, key};

use crate::fused::Program;

/// A value shared by many e-nodes, hashed once; compares by content.
#[derive(Clone)]
pub struct Interned<T>(Arc<(u64, T)>);

impl<T: Hash> Interned<T> {
    pub fn new(value: T) -> Interned<T> {
        let mut h = rustc_hash::FxHasher::default();
        value.hash(&mut h);
        Interned(Arc::new((h.finish(), value)))
    }
}

impl<T> std::ops::Deref for Interned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.1
    }
}

impl<T> Hash for Interned<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.0);
    }
}

impl<T: PartialEq> PartialEq for Interned<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.0.0 == other.0.0 && self.0.1 == other.0.1)
    }
}

impl<T: Eq> Eq for Interned<T> {}

impl<T: Ord> Ord for Interned<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0
            .0
            .cmp(&other.0.0)
            .then_with(|| self.0.1.cmp(&other.0.1))
    }
}

impl<T: Ord> PartialOrd for Interned<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: fmt::Debug> fmt::Debug for Interned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.1.fmt(f)
    }
}

/// What an e-node computes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Head {
    /// An input, param or state of the source graph.
    Leaf(ValueId),
    /// An IR primitive and its (complete, verified) attributes.
    Op(Op, Interned<Attrs>),
    /// A fused kernel; operand `i` is the e-node's child `i`.
    Kernel(Interned<Program>),
    /// An anchor op (`matmul`, or `conv2d`, with its attributes) over its operands (the first
    /// children) whose result passes through an elementwise epilogue program before it is
    /// stored: the program's operand 0 is the anchor's result, its operand `i > 0` is the
    /// `i`-th child after the anchor's operands (see [`ENode::anchor_operands`]).
    Epilogue(Op, Interned<Attrs>, Interned<Program>),
    /// A flash attention kernel (see [`crate::flash`]); its class is a tuple of its results,
    /// which [`Head::Proj`] nodes take apart.
    Flash(Interned<crate::flash::FlashSpec>),
    /// Result `i` of the multi-result node in the one child class.
    Proj(u8),
    /// The graph's outputs and assign sources, in order.
    Root,
}

/// The kind of a head, without its data: what egg indexes e-classes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Leaf,
    Op(Op),
    Kernel,
    Epilogue(Op),
    Flash,
    Proj,
    Root,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ENode {
    pub head: Head,
    pub kids: Vec<Id>,
}

impl ENode {
    pub fn new(head: Head, kids: Vec<Id>) -> ENode {
        ENode { head, kids }
    }

    pub fn op(op: Op, attrs: Attrs, kids: Vec<Id>) -> ENode {
        ENode::new(Head::Op(op, Interned::new(attrs)), kids)
    }

    /// A scalar f32 literal.
    pub fn constant(value: f64) -> ENode {
        ENode::op(
            Op::Constant,
            Attrs::new().and(key::VALUE, value),
            Vec::new(),
        )
    }

    /// The IR op of an `Op` head.
    pub fn ir(&self) -> Option<(Op, &Attrs)> {
        match &self.head {
            Head::Op(op, attrs) => Some((*op, attrs)),
            _ => None,
        }
    }

    /// How many children of an [`Head::Epilogue`] node are its anchor op's operands (the rest
    /// are the epilogue program's operands after the first).
    pub fn anchor_operands(&self) -> usize {
        match &self.head {
            Head::Epilogue(_, _, p) => self.kids.len() + 1 - p.operands.len(),
            _ => self.kids.len(),
        }
    }

    /// The value of a `constant`.
    pub fn constant_value(&self) -> Option<f64> {
        match self.ir()? {
            (Op::Constant, attrs) => Some(attrs.of(key::VALUE)),
            _ => None,
        }
    }
}

impl Language for ENode {
    type Discriminant = Kind;

    fn discriminant(&self) -> Kind {
        match &self.head {
            Head::Leaf(_) => Kind::Leaf,
            Head::Op(op, _) => Kind::Op(*op),
            Head::Kernel(_) => Kind::Kernel,
            Head::Epilogue(op, ..) => Kind::Epilogue(*op),
            Head::Flash(_) => Kind::Flash,
            Head::Proj(_) => Kind::Proj,
            Head::Root => Kind::Root,
        }
    }

    fn matches(&self, other: &Self) -> bool {
        self.head == other.head && self.kids.len() == other.kids.len()
    }

    fn children(&self) -> &[Id] {
        &self.kids
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.kids
    }
}

/// Patterns name attribute-free ops (`add`, `neg`, `where`, ...) and scalar literals (`1`,
/// `-0.5`, `inf`); ops with attributes are matched by Rust rules instead.
impl FromOp for ENode {
    type Error = String;

    fn from_op(op: &str, kids: Vec<Id>) -> Result<ENode, String> {
        if let Some(o) = Op::from_name(op) {
            if !o.spec().attrs.is_empty() {
                return Err(format!("`{op}` has attributes; write its rule in Rust"));
            }
            return Ok(ENode::op(o, Attrs::new(), kids));
        }
        let value = match op {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => op
                .parse::<f64>()
                .map_err(|_| format!("`{op}` is neither an op nor a number"))?,
        };
        if !kids.is_empty() {
            return Err(format!("the literal `{op}` takes no operands"));
        }
        Ok(ENode::constant(value))
    }
}

impl fmt::Display for ENode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.head {
            Head::Leaf(v) => write!(f, "leaf{}", v.0),
            Head::Op(Op::Constant, attrs) => {
                write!(f, "{}", format_float(attrs.of(key::VALUE)))
            }
            Head::Op(op, attrs) => {
                write!(f, "{}", op.name())?;
                for (k, v) in attrs.iter() {
                    write!(f, " {k}={}", Attr::clone(v))?;
                }
                Ok(())
            }
            Head::Kernel(p) => write!(f, "kernel[{}]", p.pattern()),
            Head::Epilogue(op, ..) => write!(f, "{}_epilogue", op.name()),
            Head::Flash(spec) => write!(f, "{}", spec.pattern()),
            Head::Proj(i) => write!(f, "result {i}"),
            Head::Root => write!(f, "root"),
        }
    }
}
