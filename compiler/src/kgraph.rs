//! The kernel graph: what the optimizer hands to lowering. Values are the source graph's
//! (inputs, params, states, computed values); nodes are IR primitives or fused kernels found by
//! the optimizer. Without the optimizer (`--no-opt`) it is the decomposed graph, node for node.
//!
//! **Invariant:** as in [`sinter_ir::Graph`], nodes are in definition order (every operand is
//! defined before use), so arena order is a topological order.

use sinter_ir::{Attrs, Graph, Init, Key, Op, TensorType, ValueDef, ValueId, attr::Kind};

use crate::fused::Program;

/// What a kernel-graph node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelOp {
    /// An IR primitive with its attributes.
    Ir(Op, Attrs),
    /// A fused kernel program over the node's inputs (one result per program output).
    Fused(Box<Program>),
    /// `a @ b` (inputs 0 and 1) stored through an elementwise epilogue program whose operand 0
    /// is the product and whose operand `i > 0` is input `i + 1`.
    MatmulEpilogue(Box<Program>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct KNode {
    pub op: KernelOp,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The source values this node computes or absorbed (as `value = op`), for the artifact's
    /// kernel listing.
    pub sources: Vec<String>,
}

impl KNode {
    /// The IR op, if this node is one.
    pub fn ir(&self) -> Option<Op> {
        match &self.op {
            KernelOp::Ir(op, _) => Some(*op),
            KernelOp::Fused(_) | KernelOp::MatmulEpilogue(_) => None,
        }
    }

    /// Attribute `key` of an IR node (see [`sinter_ir::Node::attr`]).
    pub fn attr<K: Kind>(&self, key: Key<K>) -> K::Out<'_> {
        match &self.op {
            KernelOp::Ir(op, attrs) => {
                debug_assert!(
                    op.spec().attr(key.name).is_some_and(|a| a.kind == key.kind),
                    "`{}` has no attribute `{}`",
                    op.name(),
                    key.name
                );
                attrs.of(key)
            }
            _ => panic!("a fused kernel has no attribute `{}`", key.name),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct KValue {
    pub name: String,
    pub ty: TensorType,
    pub def: KDef,
}

#[derive(Clone, Debug, PartialEq)]
pub enum KDef {
    Input,
    Param(Init),
    State(Init),
    Node { node: usize, index: usize },
}

/// See the module docs. Value ids index `values`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct KernelGraph {
    pub name: String,
    pub values: Vec<KValue>,
    pub nodes: Vec<KNode>,
    /// `(target, source)` of each `assign`.
    pub assigns: Vec<(ValueId, ValueId)>,
    /// The outputs, in order, with the names the caller reads them by (one value may be
    /// output under several names once common subexpressions are shared).
    pub outputs: Vec<(String, ValueId)>,
}

impl KernelGraph {
    /// The graph `g` node for node (every node an IR primitive).
    pub fn from_graph(g: &Graph) -> KernelGraph {
        let values = g
            .values
            .iter()
            .map(|v| KValue {
                name: v.name.clone(),
                ty: v.ty.clone(),
                def: match &v.def {
                    ValueDef::Input => KDef::Input,
                    ValueDef::Param(i) => KDef::Param(i.clone()),
                    ValueDef::State(i) => KDef::State(i.clone()),
                    ValueDef::Node { node, index } => KDef::Node {
                        node: node.index(),
                        index: *index,
                    },
                },
            })
            .collect();
        let nodes = g
            .nodes
            .iter()
            .map(|n| KNode {
                op: KernelOp::Ir(n.op, n.attrs.clone()),
                inputs: n.inputs.clone(),
                outputs: n.outputs.clone(),
                sources: n
                    .outputs
                    .iter()
                    .map(|&o| format!("{} = {}", g.name_of(o), n.op.name()))
                    .collect(),
            })
            .collect();
        KernelGraph {
            name: g.name.clone(),
            values,
            nodes,
            assigns: g.assigns.iter().map(|a| (a.target, a.source)).collect(),
            outputs: g
                .outputs
                .iter()
                .map(|&v| (g.name_of(v).to_string(), v))
                .collect(),
        }
    }

    pub fn value(&self, v: ValueId) -> &KValue {
        &self.values[v.index()]
    }

    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.value(v).ty
    }

    pub fn name_of(&self, v: ValueId) -> &str {
        &self.value(v).name
    }

    /// The node computing `v`, if any.
    pub fn producer(&self, v: ValueId) -> Option<&KNode> {
        match self.value(v).def {
            KDef::Node { node, .. } => Some(&self.nodes[node]),
            _ => None,
        }
    }

    pub fn is_persistent(&self, v: ValueId) -> bool {
        matches!(self.value(v).def, KDef::Param(_) | KDef::State(_))
    }

    /// Adds a value computed by node `node` (the node must be pushed with this value among its
    /// outputs).
    pub fn add_value(
        &mut self,
        name: String,
        ty: TensorType,
        node: usize,
        index: usize,
    ) -> ValueId {
        self.values.push(KValue {
            name,
            ty,
            def: KDef::Node { node, index },
        });
        ValueId((self.values.len() - 1) as u32)
    }
}
