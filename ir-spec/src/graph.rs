//! The graph: values and nodes in two arenas, referred to by typed handles.
//!
//! **Invariant:** nodes are stored in definition order and every operand of a node is defined
//! before it (by an earlier node or a declaration), so arena order is a topological order and
//! passes iterate `nodes` front to back without sorting. Every value and node in a `Graph` has
//! been checked by [`crate::infer`] when it was added: passes may rely on types and attributes
//! being complete and valid.

use std::collections::HashMap;

use crate::attr::{Attrs, Key, Kind};
use crate::infer::{Blame, TypeError, infer};
use crate::op::Op;
use crate::types::TensorType;

/// Handle of a value in [`Graph::values`].
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ValueId(pub u32);

/// Handle of a node in [`Graph::nodes`].
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct NodeId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

pub use sinter_artifact::Init;

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Fed by the caller on every run.
    Input,
    /// Trainable, persists across runs.
    Param(Init),
    /// Persists across runs, not trainable (optimizer moments, step counters, running stats).
    State(Init),
    /// Result `index` of a node.
    Node { node: NodeId, index: usize },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

impl Value {
    /// Inputs, params and states: the leaves that `grad` may differentiate with respect to.
    pub fn is_leaf(&self) -> bool {
        !matches!(self.def, ValueDef::Node { .. })
    }

    pub fn is_persistent(&self) -> bool {
        matches!(self.def, ValueDef::Param(_) | ValueDef::State(_))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub attrs: Attrs,
    pub outputs: Vec<ValueId>,
}

impl Node {
    /// The attribute `key` of this verified node. Debug builds check that the op table declares
    /// `key` for this op, so a pass cannot read an attribute the op does not have.
    pub fn attr<K: Kind>(&self, key: Key<K>) -> K::Out<'_> {
        debug_assert!(
            self.op
                .spec()
                .attr(key.name)
                .is_some_and(|a| a.kind == key.kind),
            "`{}` has no attribute `{}`",
            self.op.name(),
            key.name
        );
        self.attrs.of(key)
    }
}

/// `assign target = source`: after a run, the persistent `target` takes `source`'s value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assign {
    pub target: ValueId,
    pub source: ValueId,
}

/// A graph-level rule broken while building a graph.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("`{name}` is already defined")]
    Redefined { name: String, previous: ValueId },
    #[error("{0}")]
    Type(#[from] TypeError),
    #[error(
        "`grad` differentiates with respect to inputs, params and states; `{name}` is computed by a node"
    )]
    GradOfComputed { operand: usize, name: String },
    #[error(
        "the loss of this `grad` depends on `{name}`, a result of `{op}`, which depends on what \
         this `grad` differentiates: gradients do not flow through `grad` results or optimizer \
         steps (no second-order gradients)"
    )]
    SecondOrder {
        /// The `grad` or optimizer result the loss depends on.
        value: ValueId,
        name: String,
        op: &'static str,
    },
    #[error("`{name}` is not a param or state, so it cannot be assigned")]
    AssignToNonPersistent { name: String },
    #[error("`assign {target}` needs a value of type {expected}, got {actual}")]
    AssignType {
        target: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("`{name}` is assigned twice")]
    AssignedTwice { name: String },
    #[error("`{name}` names two results of one node")]
    DuplicateResultName { name: String },
    #[error("`{names}` gives {given} name(s) but `{op}` has {results} result(s)")]
    ResultCount {
        names: String,
        op: &'static str,
        given: usize,
        results: usize,
    },
}

/// A whole program: declarations, nodes, assignments and outputs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub assigns: Vec<Assign>,
    pub outputs: Vec<ValueId>,
    names: HashMap<String, ValueId>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.value(id).ty
    }

    pub fn name_of(&self, id: ValueId) -> &str {
        &self.value(id).name
    }

    pub fn lookup(&self, name: &str) -> Option<ValueId> {
        self.names.get(name).copied()
    }

    pub fn value_ids(&self) -> impl Iterator<Item = ValueId> + use<> {
        (0..self.values.len() as u32).map(ValueId)
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// The node that computes `id`, if any.
    pub fn producer(&self, id: ValueId) -> Option<NodeId> {
        match self.value(id).def {
            ValueDef::Node { node, .. } => Some(node),
            _ => None,
        }
    }

    pub fn inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.value_ids()
            .filter(|&v| self.value(v).def == ValueDef::Input)
    }

    pub fn params(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.value_ids()
            .filter(|&v| matches!(self.value(v).def, ValueDef::Param(_)))
    }

    pub fn states(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.value_ids()
            .filter(|&v| matches!(self.value(v).def, ValueDef::State(_)))
    }

    /// A fresh name for an unnamed value: `_` and the value's index (skipping taken names).
    fn fresh_name(&self) -> String {
        let base = format!("_{}", self.values.len());
        let mut name = base.clone();
        let mut k = 1;
        while self.names.contains_key(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        name
    }

    /// Whether `name` has the form of a generated name (`_` then a digit).
    pub fn is_generated_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars.next() == Some('_') && chars.next().is_some_and(|c| c.is_ascii_digit())
    }

    fn push_value(
        &mut self,
        name: Option<String>,
        ty: TensorType,
        def: ValueDef,
    ) -> Result<ValueId, GraphError> {
        let name = match name {
            Some(name) => {
                if let Some(&previous) = self.names.get(&name) {
                    return Err(GraphError::Redefined { name, previous });
                }
                name
            }
            None => self.fresh_name(),
        };
        let id = ValueId(self.values.len() as u32);
        self.names.insert(name.clone(), id);
        self.values.push(Value { name, ty, def });
        Ok(id)
    }

    pub fn add_input(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
    ) -> Result<ValueId, GraphError> {
        self.push_value(Some(name.into()), ty, ValueDef::Input)
    }

    pub fn add_param(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        init: Init,
    ) -> Result<ValueId, GraphError> {
        self.push_value(Some(name.into()), ty, ValueDef::Param(init))
    }

    pub fn add_state(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
        init: Init,
    ) -> Result<ValueId, GraphError> {
        self.push_value(Some(name.into()), ty, ValueDef::State(init))
    }

    /// Adds a node after checking it; `names` names its results (`None` for unnamed results,
    /// which get generated names). Returns the result values.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
        names: Option<&[String]>,
    ) -> Result<Vec<ValueId>, GraphError> {
        let mut attrs = attrs;
        let types: Vec<TensorType> = inputs.iter().map(|&v| self.ty(v).clone()).collect();
        let results = infer(op, &types, &mut attrs)?;
        if op == Op::Grad {
            for (i, &v) in inputs.iter().enumerate().skip(1) {
                if !self.value(v).is_leaf() {
                    return Err(GraphError::GradOfComputed {
                        operand: i,
                        name: self.name_of(v).to_string(),
                    });
                }
            }
            if let Some(value) = self.gradient_blocker(inputs[0], &inputs[1..]) {
                let node = self.node(self.producer(value).expect("a node result"));
                return Err(GraphError::SecondOrder {
                    value,
                    name: self.name_of(value).to_string(),
                    op: node.op.name(),
                });
            }
        }
        if let Some(names) = names {
            if names.len() != results.len() {
                return Err(GraphError::ResultCount {
                    names: names.join(", "),
                    op: op.name(),
                    given: names.len(),
                    results: results.len(),
                });
            }
            if let Some((_, name)) = names
                .iter()
                .enumerate()
                .find(|(i, n)| names[..*i].contains(n))
            {
                return Err(GraphError::DuplicateResultName { name: name.clone() });
            }
            if let Some(name) = names.iter().find(|n| self.names.contains_key(n.as_str())) {
                return Err(GraphError::Redefined {
                    name: name.clone(),
                    previous: self.names[name.as_str()],
                });
            }
        }
        let node = NodeId(self.nodes.len() as u32);
        let mut outputs = Vec::with_capacity(results.len());
        for (index, ty) in results.into_iter().enumerate() {
            let name = names.map(|n| n[index].clone());
            outputs.push(self.push_value(name, ty, ValueDef::Node { node, index })?);
        }
        self.nodes.push(Node {
            op,
            inputs: inputs.to_vec(),
            attrs,
            outputs: outputs.clone(),
        });
        Ok(outputs)
    }

    /// A result of a `grad` or optimizer node that `loss` depends on and that itself depends on
    /// one of `wrt`: differentiating `loss` with respect to `wrt` would need its derivative,
    /// which autodiff does not have (second-order gradients). One backward walk from `loss`.
    fn gradient_blocker(&self, loss: ValueId, wrt: &[ValueId]) -> Option<ValueId> {
        // Values that depend on a `wrt` operand, forward in arena order up to the loss.
        let end = self.producer(loss).map_or(0, |n| n.index() + 1);
        let mut depends = vec![false; self.values.len()];
        for &w in wrt {
            depends[w.index()] = true;
        }
        for node in &self.nodes[..end] {
            if node.inputs.iter().any(|v| depends[v.index()]) {
                for &o in &node.outputs {
                    depends[o.index()] = true;
                }
            }
        }
        let mut reached = vec![false; self.values.len()];
        reached[loss.index()] = true;
        for node in self.nodes[..end].iter().rev() {
            let Some(&out) = node.outputs.iter().find(|o| reached[o.index()]) else {
                continue;
            };
            let blocks = matches!(
                node.op.class(),
                crate::op::OpClass::Grad | crate::op::OpClass::Optimizer
            );
            if blocks && depends[out.index()] {
                return Some(out);
            }
            for &v in &node.inputs {
                reached[v.index()] = true;
            }
        }
        None
    }

    /// Adds a single-result node.
    pub fn add(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Result<ValueId, GraphError> {
        Ok(self.add_node(op, inputs, attrs, None)?[0])
    }

    /// Adds a scalar f32 literal.
    pub fn constant(&mut self, value: f64) -> Result<ValueId, GraphError> {
        self.add(
            Op::Constant,
            &[],
            Attrs::new().and(crate::attr::key::VALUE, value),
        )
    }

    pub fn add_assign(&mut self, target: ValueId, source: ValueId) -> Result<(), GraphError> {
        let t = self.value(target);
        if !t.is_persistent() {
            return Err(GraphError::AssignToNonPersistent {
                name: t.name.clone(),
            });
        }
        if self.assigns.iter().any(|a| a.target == target) {
            return Err(GraphError::AssignedTwice {
                name: t.name.clone(),
            });
        }
        let s = self.ty(source);
        if s != &t.ty {
            return Err(GraphError::AssignType {
                target: t.name.clone(),
                expected: t.ty.clone(),
                actual: s.clone(),
            });
        }
        self.assigns.push(Assign { target, source });
        Ok(())
    }

    pub fn add_output(&mut self, value: ValueId) {
        self.outputs.push(value);
    }

    /// Renames a value (used by the parser for `name = expr` where `expr` is a nested call).
    pub fn rename(&mut self, id: ValueId, name: String) -> Result<(), GraphError> {
        if let Some(&previous) = self.names.get(&name) {
            return Err(GraphError::Redefined { name, previous });
        }
        let old = std::mem::replace(&mut self.values[id.index()].name, name.clone());
        self.names.remove(&old);
        self.names.insert(name, id);
        Ok(())
    }

    /// A copy of the declarations that `keep_value` keeps and the nodes that `keep_node`
    /// keeps (whose operands it must keep), in order and with their names, without assigns and
    /// outputs; with the map from this graph's values to the copy's.
    pub fn restricted(
        &self,
        keep_value: impl Fn(ValueId) -> bool,
        keep_node: impl Fn(NodeId) -> bool,
    ) -> Result<(Graph, Vec<Option<ValueId>>), GraphError> {
        let mut new = Graph::new(self.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; self.values.len()];
        for id in self.value_ids() {
            let v = self.value(id);
            let (name, ty) = (v.name.clone(), v.ty.clone());
            let copied = match &v.def {
                ValueDef::Node { node, index: 0 } if keep_node(*node) => {
                    let node = self.node(*node);
                    let inputs: Vec<ValueId> = node
                        .inputs
                        .iter()
                        .map(|u| map[u.index()].expect("operands of kept nodes are kept"))
                        .collect();
                    let names: Vec<String> = node
                        .outputs
                        .iter()
                        .map(|&o| self.name_of(o).to_string())
                        .collect();
                    let results =
                        new.add_node(node.op, &inputs, node.attrs.clone(), Some(&names))?;
                    for (o, r) in node.outputs.iter().zip(results) {
                        map[o.index()] = Some(r);
                    }
                    continue;
                }
                ValueDef::Node { .. } => continue,
                _ if !keep_value(id) => continue,
                ValueDef::Input => new.add_input(name, ty)?,
                ValueDef::Param(init) => new.add_param(name, ty, init.clone())?,
                ValueDef::State(init) => new.add_state(name, ty, init.clone())?,
            };
            map[id.index()] = Some(copied);
        }
        Ok((new, map))
    }

    /// How many times each value is used (as an operand, an output or an assign source).
    pub fn use_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.values.len()];
        for node in &self.nodes {
            for &v in &node.inputs {
                counts[v.index()] += 1;
            }
        }
        for &v in &self.outputs {
            counts[v.index()] += 1;
        }
        for a in &self.assigns {
            counts[a.source.index()] += 1;
        }
        counts
    }
}

/// Blame of a type error, re-exported for the parser's span mapping.
pub type ErrorBlame = Blame;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn builds_and_names() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::f32(vec![2, 3])).unwrap();
        let y = g.add(Op::Relu, &[x], Attrs::new()).unwrap();
        assert_eq!(g.name_of(y), "_1");
        assert_eq!(g.ty(y), &TensorType::f32(vec![2, 3]));
        assert!(matches!(
            g.add_input("x", TensorType::scalar(DType::F32)),
            Err(GraphError::Redefined { .. })
        ));
    }

    #[test]
    fn grad_needs_leaves() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::f32(vec![3])).unwrap();
        let y = g.add(Op::Relu, &[x], Attrs::new()).unwrap();
        let l = g.add(Op::Sum, &[y], Attrs::new()).unwrap();
        assert!(g.add_node(Op::Grad, &[l, x], Attrs::new(), None).is_ok());
        assert!(matches!(
            g.add_node(Op::Grad, &[l, y], Attrs::new(), None),
            Err(GraphError::GradOfComputed { .. })
        ));
    }
}
