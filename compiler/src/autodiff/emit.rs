//! [`Emit`]: builds backward nodes into the graph under reconstruction, with the few local
//! simplifications that keep the emitted graph lean (no `mul(dy, 1)`, no reshape or broadcast to
//! the shape a value already has, one node per distinct node: the same op on the same operands
//! with the same attributes is emitted once), and [`Emit::unbroadcast`], the
//! one place where a broadcast gradient is summed back to its operand's shape.

use sinter_ir::key;
use std::collections::{HashMap, HashSet};

use sinter_ir::expand::Rebuild;
use sinter_ir::types::broadcast_shapes;
use sinter_ir::{Attrs, GraphError, Op, TensorType, ValueDef, ValueId};

type Result<T> = std::result::Result<T, GraphError>;

/// The builder of one `grad` statement's backward subgraph.
pub(super) struct Emit<'r, 'a> {
    rb: &'r mut Rebuild<'a>,
    /// Nodes emitted so far, by op, operands and attributes (every op is pure).
    emitted: HashMap<(Op, Vec<ValueId>, Attrs), ValueId>,
    /// Values known to hold only ones (the seed and its broadcasts and reshapes).
    ones: HashSet<ValueId>,
}

impl<'r, 'a> Emit<'r, 'a> {
    pub fn new(rb: &'r mut Rebuild<'a>) -> Emit<'r, 'a> {
        Emit {
            rb,
            emitted: HashMap::new(),
            ones: HashSet::new(),
        }
    }

    /// The builder underneath (to read the old graph and the mapping of its values).
    pub fn rebuild(&self) -> &Rebuild<'a> {
        self.rb
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.rb.graph().ty(v)
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.ty(v).shape.clone()
    }

    /// Adds a single-result node, or finds the same node emitted before.
    pub fn op(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Result<ValueId> {
        let key = (op, inputs.to_vec(), attrs);
        if let Some(&v) = self.emitted.get(&key) {
            return Ok(v);
        }
        let v = self.rb.add(op, inputs, key.2.clone())?;
        self.emitted.insert(key, v);
        Ok(v)
    }

    /// A scalar f32 literal.
    pub fn constant(&mut self, value: f64) -> Result<ValueId> {
        let v = self.op(Op::Constant, &[], Attrs::new().and(key::VALUE, value))?;
        if value == 1.0 {
            self.ones.insert(v);
        }
        Ok(v)
    }

    /// The value of `v` when it is a `constant` node.
    pub fn constant_value(&self, v: ValueId) -> Option<f64> {
        let g = self.rb.graph();
        match g.value(v).def {
            ValueDef::Node { node, .. } if g.node(node).op == Op::Constant => {
                Some(g.node(node).attrs.of(key::VALUE))
            }
            _ => None,
        }
    }

    /// Whether every element of `v` is known to be 1.
    pub fn is_one(&self, v: ValueId) -> bool {
        self.ones.contains(&v) || self.constant_value(v) == Some(1.0)
    }

    fn binary(&mut self, op: Op, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op(op, &[a, b], Attrs::new())
    }

    pub fn unary(&mut self, op: Op, x: ValueId) -> Result<ValueId> {
        self.op(op, &[x], Attrs::new())
    }

    pub fn add(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(Op::Add, a, b)
    }

    pub fn sub(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(Op::Sub, a, b)
    }

    pub fn div(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(Op::Div, a, b)
    }

    pub fn neg(&mut self, a: ValueId) -> Result<ValueId> {
        self.unary(Op::Neg, a)
    }

    /// `a * b`, leaving out a factor known to be 1.
    pub fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        let out = broadcast_shapes(&self.ty(a).shape, &self.ty(b).shape)
            .expect("backward operands broadcast");
        for (one, other) in [(a, b), (b, a)] {
            if self.is_one(one) {
                return self.broadcast_to(other, &out);
            }
        }
        self.binary(Op::Mul, a, b)
    }

    /// `a * c` for a literal `c`; folds into a constant `a`.
    pub fn scale(&mut self, a: ValueId, c: f64) -> Result<ValueId> {
        if c == 1.0 {
            return Ok(a);
        }
        if let Some(v) = self.constant_value(a) {
            return self.constant(v * c);
        }
        let c = self.constant(c)?;
        self.mul(a, c)
    }

    /// `a + c` for a literal `c`.
    pub fn add_scalar(&mut self, a: ValueId, c: f64) -> Result<ValueId> {
        let c = self.constant(c)?;
        self.add(a, c)
    }

    /// `c - a` for a literal `c`.
    pub fn rsub_scalar(&mut self, c: f64, a: ValueId) -> Result<ValueId> {
        let c = self.constant(c)?;
        self.sub(c, a)
    }

    /// A comparison (`eq`, `gt`, …): 1.0 where it holds, else 0.0.
    pub fn compare(&mut self, op: Op, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(op, a, b)
    }

    pub fn select(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op(Op::Where, &[cond, a, b], Attrs::new())
    }

    pub fn reshape(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        let r = self.op(
            Op::Reshape,
            &[x],
            Attrs::new().and(key::SHAPE, shape.to_vec()),
        )?;
        if self.is_one(x) {
            self.ones.insert(r);
        }
        Ok(r)
    }

    /// A new value equal to `x` (a reshape to its own shape), for a result that must be a value
    /// of its own; never shared.
    pub fn copy(&mut self, x: ValueId) -> Result<ValueId> {
        let shape = self.shape(x);
        self.rb
            .add(Op::Reshape, &[x], Attrs::new().and(key::SHAPE, shape))
    }

    pub fn broadcast_to(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        if self.ty(x).shape == shape {
            return Ok(x);
        }
        let r = self.op(
            Op::BroadcastTo,
            &[x],
            Attrs::new().and(key::SHAPE, shape.to_vec()),
        )?;
        if self.is_one(x) {
            self.ones.insert(r);
        }
        Ok(r)
    }

    pub fn transpose_last(&mut self, x: ValueId) -> Result<ValueId> {
        let r = self.ty(x).rank();
        self.op(
            Op::Transpose,
            &[x],
            Attrs::new().and(key::DIM0, r - 2).and(key::DIM1, r - 1),
        )
    }

    fn reduce(&mut self, op: Op, x: ValueId, axes: &[usize], keepdim: bool) -> Result<ValueId> {
        self.op(
            op,
            &[x],
            Attrs::new()
                .and(key::AXES, axes.to_vec())
                .and(key::KEEPDIM, keepdim),
        )
    }

    /// `sum` over `axes` (nothing to do for no axes).
    pub fn sum(&mut self, x: ValueId, axes: &[usize], keepdim: bool) -> Result<ValueId> {
        if axes.is_empty() {
            return Ok(x);
        }
        self.reduce(Op::Sum, x, axes, keepdim)
    }

    pub fn mean(&mut self, x: ValueId, axes: &[usize], keepdim: bool) -> Result<ValueId> {
        if axes.is_empty() {
            return Ok(x);
        }
        self.reduce(Op::Mean, x, axes, keepdim)
    }

    /// Zeros of `shape`.
    pub fn zeros(&mut self, shape: &[usize]) -> Result<ValueId> {
        let zero = self.constant(0.0)?;
        self.broadcast_to(zero, shape)
    }

    /// `dy` (of a broadcast result's shape) summed back to `to`, the shape of the operand that
    /// was broadcast: summed over the axes `to` lacks or has as 1 (with keepdim when any of
    /// them is not a leading axis), then reshaped. Every broadcast gradient goes through here.
    pub fn unbroadcast(&mut self, dy: ValueId, to: &[usize]) -> Result<ValueId> {
        let from = self.shape(dy);
        if from == to {
            return Ok(dy);
        }
        let lead = from.len() - to.len();
        let axes: Vec<usize> = (0..from.len())
            .filter(|&i| i < lead || (to[i - lead] == 1 && from[i] != 1))
            .collect();
        let keepdim = axes.iter().any(|&i| i >= lead);
        let summed = self.sum(dy, &axes, keepdim)?;
        self.reshape(summed, to)
    }

    /// A reduction's result (or its adjoint) given back its reduced axes as size 1, so that it
    /// broadcasts against the reduction's operand of shape `x_shape`.
    pub fn keep_axes(
        &mut self,
        v: ValueId,
        x_shape: &[usize],
        axes: &[usize],
        keepdim: bool,
    ) -> Result<ValueId> {
        let leading = axes.iter().enumerate().all(|(i, &a)| i == a);
        if keepdim || leading {
            return Ok(v);
        }
        let kept: Vec<usize> = (0..x_shape.len())
            .map(|i| if axes.contains(&i) { 1 } else { x_shape[i] })
            .collect();
        self.reshape(v, &kept)
    }
}
