//! The kernel graph: what the optimizer hands to lowering. Values are the source graph's
//! (inputs, params, states, computed values); nodes are IR primitives or fused kernels found by
//! the optimizer. Without the optimizer (`--no-opt`) it is the decomposed graph, node for node.
//!
//! **Invariant:** as in [`sinter_ir::Graph`], nodes are in definition order (every operand is
//! defined before use), so arena order is a topological order.
//!
//! Values are [`KValueId`]s, not the IR's [`ValueId`]s: the optimizer numbers a kernel graph's
//! values anew (a value the source computes may be gone, a fused kernel's extra result new).
//! [`KValue::source`] names the IR value a kernel-graph value stands for, which is how the
//! compile's per-value facts (index contracts) reach the artifact's slots.

use sinter_ir::{Attrs, Graph, Init, Key, Op, TensorType, ValueDef, ValueId, attr::Kind};

use crate::fused::Program;

/// A value of a [`KernelGraph`] (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KValueId(pub u32);

impl KValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for KValueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// A vertex of [`KernelGraph::view`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vertex {
    /// An input, param or state.
    Leaf(KValueId),
    /// A node, by index.
    Node(usize),
}

/// What a kernel-graph node computes.
#[derive(Clone, Debug, PartialEq)]
pub enum KernelOp {
    /// An IR primitive with its attributes.
    Ir(Op, Attrs),
    /// A fused kernel program over the node's inputs (one result per program output).
    Fused(Box<Program>),
    /// An anchor op (`matmul` or `conv2d`, with its attributes) over its operands (the first
    /// inputs), stored through an elementwise epilogue program whose operand 0 is the anchor's
    /// result and whose operand `i > 0` is the `i`-th input after the anchor's operands.
    Epilogue(Op, Attrs, Box<Program>),
    /// A flash attention kernel (see [`crate::flash`]); inputs and results as its kind says.
    Flash(Box<crate::flash::FlashSpec>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct KNode {
    pub op: KernelOp,
    pub inputs: Vec<KValueId>,
    pub outputs: Vec<KValueId>,
    /// The source values this node computes or absorbed (as `value = op`), for the artifact's
    /// kernel listing.
    pub sources: Vec<String>,
    /// The rewrite rules that built this node (empty for a source op).
    pub rules: Vec<String>,
}

impl KNode {
    /// The IR op, if this node is one.
    pub fn ir(&self) -> Option<Op> {
        match &self.op {
            KernelOp::Ir(op, _) => Some(*op),
            _ => None,
        }
    }

    /// How many inputs of an [`KernelOp::Epilogue`] node are its anchor op's operands (all
    /// inputs of any other node).
    pub fn anchor_operands(&self) -> usize {
        match &self.op {
            KernelOp::Epilogue(_, _, p) => self.inputs.len() + 1 - p.operands.len(),
            _ => self.inputs.len(),
        }
    }

    /// Attribute `key` of an IR node, or of the anchor op of an epilogue node (see
    /// [`sinter_ir::Node::attr`]).
    pub fn attr<K: Kind>(&self, key: Key<K>) -> K::Out<'_> {
        match &self.op {
            KernelOp::Ir(op, attrs) | KernelOp::Epilogue(op, attrs, _) => {
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
    /// The IR value this value is, where it is one of the source graph's (every input, param
    /// and state; a computed value the optimizer kept).
    pub source: Option<ValueId>,
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
    pub assigns: Vec<(KValueId, KValueId)>,
    /// The outputs, in order, with the names the caller reads them by (one value may be
    /// output under several names once common subexpressions are shared).
    pub outputs: Vec<(String, KValueId)>,
}

impl KernelGraph {
    /// The graph `g` node for node (every node an IR primitive).
    pub fn from_graph(g: &Graph) -> KernelGraph {
        let values = g
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| KValue {
                source: Some(ValueId(i as u32)),
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
                inputs: n.inputs.iter().map(|v| KValueId(v.0)).collect(),
                outputs: n.outputs.iter().map(|v| KValueId(v.0)).collect(),
                sources: n
                    .outputs
                    .iter()
                    .map(|&o| format!("{} = {}", g.name_of(o), n.op.name()))
                    .collect(),
                rules: Vec::new(),
            })
            .collect();
        KernelGraph {
            name: g.name.clone(),
            values,
            nodes,
            assigns: g
                .assigns
                .iter()
                .map(|a| (KValueId(a.target.0), KValueId(a.source.0)))
                .collect(),
            outputs: g
                .outputs
                .iter()
                .map(|&v| (g.name_of(v).to_string(), KValueId(v.0)))
                .collect(),
        }
    }

    pub fn value(&self, v: KValueId) -> &KValue {
        &self.values[v.index()]
    }

    pub fn ty(&self, v: KValueId) -> &TensorType {
        &self.value(v).ty
    }

    pub fn name_of(&self, v: KValueId) -> &str {
        &self.value(v).name
    }

    /// The node computing `v`, if any.
    pub fn producer(&self, v: KValueId) -> Option<&KNode> {
        match self.value(v).def {
            KDef::Node { node, .. } => Some(&self.nodes[node]),
            _ => None,
        }
    }

    pub fn is_persistent(&self, v: KValueId) -> bool {
        matches!(self.value(v).def, KDef::Param(_) | KDef::State(_))
    }

    /// The graph as a petgraph graph: a vertex per input, param, state and node, an edge per
    /// operand carrying its value.
    pub fn view(&self) -> petgraph::graph::DiGraph<Vertex, KValueId> {
        use petgraph::graph::NodeIndex;
        let mut g = petgraph::graph::DiGraph::new();
        let mut leaf: std::collections::HashMap<KValueId, NodeIndex> = Default::default();
        for (i, v) in self.values.iter().enumerate() {
            if !matches!(v.def, KDef::Node { .. }) {
                let id = KValueId(i as u32);
                leaf.insert(id, g.add_node(Vertex::Leaf(id)));
            }
        }
        let nodes: Vec<NodeIndex> = (0..self.nodes.len())
            .map(|n| g.add_node(Vertex::Node(n)))
            .collect();
        for (n, node) in self.nodes.iter().enumerate() {
            for &input in &node.inputs {
                let from = match self.value(input).def {
                    KDef::Node { node: m, .. } => nodes[m],
                    _ => leaf[&input],
                };
                g.add_edge(from, nodes[n], input);
            }
        }
        g
    }

    /// The graph in Graphviz's DOT language (petgraph's writer over [`KernelGraph::view`]): one
    /// box per kernel (its op, or the pattern of a fused kernel and how many source ops it
    /// covers), one ellipse per input, param and state, an edge per operand labelled with its
    /// type; outputs and assign sources doubly outlined.
    pub fn to_dot(&self) -> String {
        use petgraph::dot::{Config, Dot};
        let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let results: std::collections::HashSet<KValueId> = self
            .outputs
            .iter()
            .map(|(_, v)| *v)
            .chain(self.assigns.iter().map(|(_, v)| *v))
            .collect();
        let view = self.view();
        let edge = |_, e: petgraph::graph::EdgeReference<'_, KValueId>| {
            format!("label=\"{}\", fontsize=8", self.ty(*e.weight()))
        };
        let vertex = |_, (_, v): (petgraph::graph::NodeIndex, &Vertex)| match *v {
            Vertex::Leaf(id) => {
                let kind = match self.value(id).def {
                    KDef::Input => "input",
                    KDef::Param(_) => "param",
                    _ => "state",
                };
                format!(
                    "shape=ellipse, label=\"{kind} {}\\n{}\"",
                    quote(self.name_of(id)),
                    self.ty(id)
                )
            }
            Vertex::Node(n) => {
                let node = &self.nodes[n];
                let what = match &node.op {
                    KernelOp::Ir(op, _) => op.name().to_string(),
                    KernelOp::Fused(p) => {
                        format!("fused {} ({} ops)", p.pattern(), node.sources.len())
                    }
                    KernelOp::Epilogue(anchor, ..) => {
                        format!("{} + epilogue ({} ops)", anchor.name(), node.sources.len())
                    }
                    KernelOp::Flash(spec) => spec.pattern().to_string(),
                };
                let names: Vec<&str> = node.outputs.iter().map(|&o| self.name_of(o)).collect();
                let peripheries = if node.outputs.iter().any(|o| results.contains(o)) {
                    2
                } else {
                    1
                };
                format!(
                    "shape=box, peripheries={peripheries}, label=\"{}\\n{}\"",
                    quote(&names.join(", ")),
                    quote(&what)
                )
            }
        };
        let config = [
            Config::GraphContentOnly,
            Config::NodeNoLabel,
            Config::EdgeNoLabel,
        ];
        let body = Dot::with_attr_getters(&view, &config, &edge, &vertex);
        format!(
            "digraph \"{}\" {{\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n{body:?}}}\n",
            quote(&self.name)
        )
    }

    /// Adds a value computed by node `node` (the node must be pushed with this value among its
    /// outputs).
    pub fn add_value(
        &mut self,
        name: String,
        ty: TensorType,
        node: usize,
        index: usize,
    ) -> KValueId {
        self.values.push(KValue {
            name,
            ty,
            def: KDef::Node { node, index },
            source: None,
        });
        KValueId((self.values.len() - 1) as u32)
    }
}

/// Runs a kernel graph in the reference interpreter: IR primitives by
/// [`sinter_ir::interp::eval_node`], fused kernels by [`crate::fused::eval::eval`]. Params and
/// states come from `persistent` by name, else from their initializers. Returns the outputs by
/// name, in order, then the assigned values by target name, in order. This is how tests check
/// that the optimizer's graphs compute what the source graph computes.
pub fn evaluate(
    kg: &KernelGraph,
    inputs: &std::collections::HashMap<String, sinter_ir::interp::Tensor>,
    persistent: &std::collections::HashMap<String, sinter_ir::interp::Tensor>,
) -> Result<EvalResult, sinter_ir::interp::EvalError> {
    use sinter_ir::interp::{Tensor, eval_node};
    let mut values: Vec<Option<Tensor>> = vec![None; kg.values.len()];
    for (i, v) in kg.values.iter().enumerate() {
        values[i] = match &v.def {
            KDef::Input => Some(inputs[&v.name].clone()),
            KDef::Param(init) | KDef::State(init) => Some(
                persistent
                    .get(&v.name)
                    .cloned()
                    .unwrap_or_else(|| sinter_ir::init::initial_value(&v.ty, init)),
            ),
            KDef::Node { .. } => None,
        };
    }
    for n in &kg.nodes {
        let args: Vec<&Tensor> = n
            .inputs
            .iter()
            .map(|i| values[i.index()].as_ref().expect("defined before use"))
            .collect();
        let out_types: Vec<TensorType> = n.outputs.iter().map(|&o| kg.ty(o).clone()).collect();
        let results = match &n.op {
            KernelOp::Ir(op, attrs) => eval_node(*op, attrs, &args, &out_types)?,
            KernelOp::Fused(p) => {
                let owned: Vec<Tensor> = args.iter().map(|&t| t.clone()).collect();
                crate::fused::eval::eval(p, &owned)
            }
            KernelOp::Flash(spec) => {
                let owned: Vec<Tensor> = args.iter().map(|&t| t.clone()).collect();
                crate::flash::eval(spec, &owned)
            }
            KernelOp::Epilogue(anchor, attrs, p) => {
                let product_ty = TensorType::f32(crate::fused::eval::shape_of(p, &p.operands[0]));
                let split = n.anchor_operands();
                let product = eval_node(*anchor, attrs, &args[..split], &[product_ty])?;
                let mut owned = product;
                owned.extend(args[split..].iter().map(|&t| t.clone()));
                crate::fused::eval::eval(p, &owned)
            }
        };
        for (&o, t) in n.outputs.iter().zip(results) {
            values[o.index()] = Some(t);
        }
    }
    let get = |v: KValueId| values[v.index()].clone().expect("computed");
    Ok(EvalResult {
        outputs: kg
            .outputs
            .iter()
            .map(|(name, v)| (name.clone(), get(*v)))
            .collect(),
        assigned: kg
            .assigns
            .iter()
            .map(|&(t, s)| (kg.name_of(t).to_string(), get(s)))
            .collect(),
    })
}

/// What [`evaluate`] returns.
#[derive(Clone, Debug)]
pub struct EvalResult {
    pub outputs: Vec<(String, sinter_ir::interp::Tensor)>,
    pub assigned: Vec<(String, sinter_ir::interp::Tensor)>,
}

/// `k=v, ..` of an IR op's attributes (empty for none).
fn attrs_text(attrs: &Attrs) -> String {
    let parts: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(", ")
}

impl std::fmt::Display for KernelOp {
    /// One line: the IR op with its attributes, the fused program's pattern, the anchor with
    /// its epilogue, or the flash kernel.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelOp::Ir(op, attrs) if attrs.iter().next().is_none() => f.write_str(op.name()),
            KernelOp::Ir(op, attrs) => write!(f, "{}[{}]", op.name(), attrs_text(attrs)),
            KernelOp::Fused(p) => write!(f, "fused {}", p.pattern()),
            KernelOp::Epilogue(op, attrs, _) if attrs.iter().next().is_none() => {
                write!(f, "{} + epilogue", op.name())
            }
            KernelOp::Epilogue(op, attrs, _) => {
                write!(f, "{}[{}] + epilogue", op.name(), attrs_text(attrs))
            }
            KernelOp::Flash(spec) => write!(f, "{}", spec.pattern()),
        }
    }
}

impl std::fmt::Display for KernelGraph {
    /// The graph as text: its inputs, params and states, one line per kernel (`kN: results =
    /// op(operands)`, then the source ops it covers and the rules that built it, then a fused
    /// program's or an epilogue's body, indented), its outputs and assigns.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "kernel graph {}: {} kernels",
            self.name,
            self.nodes.len()
        )?;
        for v in &self.values {
            let kind = match v.def {
                KDef::Input => "input",
                KDef::Param(_) => "param",
                KDef::State(_) => "state",
                KDef::Node { .. } => continue,
            };
            writeln!(f, "  {kind} {}: {}", v.name, v.ty)?;
        }
        let names = |vs: &[KValueId]| -> String {
            let n: Vec<&str> = vs.iter().map(|&v| self.name_of(v)).collect();
            n.join(", ")
        };
        for (i, n) in self.nodes.iter().enumerate() {
            writeln!(
                f,
                "  k{i}: {} = {}({})",
                names(&n.outputs),
                n.op,
                names(&n.inputs)
            )?;
            writeln!(f, "      from: {}", n.sources.join("; "))?;
            if !n.rules.is_empty() {
                writeln!(f, "      rules: {}", n.rules.join(", "))?;
            }
            let body = match &n.op {
                KernelOp::Fused(p) | KernelOp::Epilogue(_, _, p) => p.to_string(),
                KernelOp::Flash(spec) => spec.to_string(),
                KernelOp::Ir(..) => String::new(),
            };
            for line in body.lines() {
                writeln!(f, "      {line}")?;
            }
        }
        for (name, v) in &self.outputs {
            writeln!(f, "  output {name} = {}", self.name_of(*v))?;
        }
        for &(target, source) in &self.assigns {
            writeln!(
                f,
                "  assign {} = {}",
                self.name_of(target),
                self.name_of(source)
            )?;
        }
        Ok(())
    }
}
