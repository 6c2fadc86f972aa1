//! Reverse-mode automatic differentiation: [`differentiate`] replaces every `grad` node by a
//! backward subgraph of ordinary IR ops.
//!
//! For `d1, …, dk = grad(loss, w1, …, wk)` (each `wi` an input, param or state):
//! 1. **Tape** ([`Tape`]): the values that depend on some `wi` through operands that carry a
//!    gradient (the op table's `differentiable` flags, f32 only; `cast` f32→f32 too), and the
//!    nodes on a path from a `wi` to the loss. Nothing else is differentiated.
//! 2. **Sweep**: from the seed `d loss = 1`, the tape's nodes in reverse arena order; each node's
//!    result adjoint `dy` goes through its rule in [`rules`] (one exhaustive match on [`Op`]),
//!    which gives each wanted operand a gradient of exactly its shape (broadcasts are undone by
//!    [`emit::Emit::unbroadcast`], the one place that does). A value used several times sums
//!    its gradients.
//! 3. **Results**: `di` is the adjoint of `wi`, keeping the name `di`. When the loss does not
//!    depend on `wi`, `di` is zeros and a warning says so.
//! 4. **Prune**: backward nodes left unused by folding (see [`emit`]) are removed.
//!
//! The backward nodes are emitted at the place of the `grad` node, reading the forward values
//! they need (softmax outputs, `y` of `exp`, …) rather than recomputing them; each `grad`
//! statement gets its own backward subgraph. Differentiating through a `grad` result or an
//! optimizer step is an error ([`AutodiffError::NotDifferentiable`]).
//!
//! Conventions where the derivative is not unique follow PyTorch: `relu` and `abs` have
//! derivative 0 at 0; `maximum`/`minimum` ties send half of `dy` to each side; `max`/`min`
//! reductions share `dy` evenly among tied elements; `pow(a, b)` gives `d/da = 0` where
//! `b == 0` and `d/db = 0` where `a == 0` and `b >= 0`; `max_pool2d` routes `dy` to the first
//! maximum of each window.

mod emit;
mod prune;
mod rules;

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use sinter_ir::expand::{Rebuild, rebuild};
use sinter_ir::{Blame, Graph, GraphError, Node, NodeId, Op, OpClass, TypeError, ValueId};

use emit::Emit;
use rules::Site;

/// A graph without `grad` nodes, and what the pass has to say about it.
#[derive(Debug)]
pub struct Differentiated {
    pub graph: Graph,
    /// One line per gradient that is zero because the loss does not depend on its operand.
    pub warnings: Vec<String>,
}

/// Why a `grad` statement could not be differentiated.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    #[error(
        "`grad` of `{loss}`: the loss depends on `{value}`, a result of `{op}`, which cannot be \
         differentiated (gradients do not flow through `grad` results or optimizer steps)"
    )]
    NotDifferentiable {
        loss: String,
        op: &'static str,
        value: String,
    },
    #[error("`grad` of `{loss}`: cannot differentiate `{op}` (at `{value}`): {why}")]
    Unsupported {
        loss: String,
        op: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("internal autodiff error: {0}")]
    Internal(String),
}

impl From<GraphError> for AutodiffError {
    fn from(e: GraphError) -> AutodiffError {
        AutodiffError::Internal(format!("a gradient rule built an invalid node: {e}"))
    }
}

/// `g` with every `grad` node replaced by its backward subgraph; every other node, every name,
/// assign and output is kept, and each gradient keeps the name the `grad` statement gave it.
pub fn differentiate(g: &Graph) -> Result<Differentiated, AutodiffError> {
    let mut warnings = Vec::new();
    if !g.nodes.iter().any(|n| n.op == Op::Grad) {
        return Ok(Differentiated {
            graph: g.clone(),
            warnings,
        });
    }
    // `rebuild` speaks `GraphError`; an autodiff error is parked here and the copy is stopped
    // with a placeholder.
    let mut failure = None;
    let mut emitted: Vec<Range<usize>> = Vec::new();
    let mut results: HashSet<ValueId> = HashSet::new();
    let rebuilt = rebuild(g, |rb, node, _| {
        if node.op != Op::Grad {
            return Ok(None);
        }
        let first = rb.graph().values.len();
        match expand_grad(rb, node, &mut warnings) {
            Ok(grads) => {
                emitted.push(first..rb.graph().values.len());
                results.extend(grads.iter().copied());
                Ok(Some(grads))
            }
            Err(e) => {
                failure = Some(e);
                Err(TypeError::new(Blame::Op, "autodiff failed").into())
            }
        }
    });
    let graph = match (rebuilt, failure) {
        (_, Some(e)) => return Err(e),
        (Err(e), None) => return Err(e.into()),
        (Ok(graph), None) => graph,
    };
    // Backward nodes that folding left unused go; the gradients themselves stay.
    let removable =
        |v: ValueId| !results.contains(&v) && emitted.iter().any(|r| r.contains(&v.index()));
    let graph = prune::prune(&graph, removable)?;
    Ok(Differentiated { graph, warnings })
}

/// The part of the graph that one `grad` differentiates.
struct Tape {
    /// By value index: whether the value depends on a `wrt` operand through operands that carry
    /// a gradient (or through a `grad`/optimizer node, so that using one is reported).
    active: Vec<bool>,
    /// The active nodes on a path to the loss, in arena order.
    nodes: Vec<NodeId>,
}

/// Whether a gradient flows from `node`'s result into its operand `i`: the op table's
/// `differentiable` flag (`cast` counts between floats), both sides floats (f32 or f16).
fn carries(g: &Graph, node: &Node, i: usize) -> bool {
    let declared = node.op.spec().operand_slot(i).differentiable;
    let float = |v: ValueId| g.ty(v).dtype.is_float();
    declared && float(node.inputs[i]) && node.outputs.iter().all(|&o| float(o))
}

/// `grad` results and optimizer steps have no gradient; a loss that depends on one is an error.
fn blocks_gradient(op: Op) -> bool {
    matches!(op.class(), OpClass::Grad | OpClass::Optimizer)
}

impl Tape {
    fn new(g: &Graph, loss: ValueId, wrt: &[ValueId]) -> Tape {
        let mut active = vec![false; g.values.len()];
        for &w in wrt {
            active[w.index()] = true;
        }
        let end = g.producer(loss).map_or(0, |n| n.index() + 1);
        let nodes = || (0..end as u32).map(NodeId);
        let flows = |node: &Node, i: usize| blocks_gradient(node.op) || carries(g, node, i);
        for id in nodes() {
            let node = g.node(id);
            let on =
                (0..node.inputs.len()).any(|i| active[node.inputs[i].index()] && flows(node, i));
            for &o in &node.outputs {
                active[o.index()] = on;
            }
        }
        let mut reached = vec![false; g.values.len()];
        reached[loss.index()] = true;
        for id in nodes().rev() {
            let node = g.node(id);
            if node.outputs.iter().any(|o| reached[o.index()]) {
                for (i, &v) in node.inputs.iter().enumerate() {
                    reached[v.index()] |= flows(node, i);
                }
            }
        }
        let on_path = |id: &NodeId| {
            let outs = &g.node(*id).outputs;
            outs.iter().any(|o| active[o.index()] && reached[o.index()])
        };
        let nodes = nodes().filter(on_path).collect();
        Tape { active, nodes }
    }
}

/// The backward subgraph of one `grad` node; one value per `wrt` operand.
fn expand_grad(
    rb: &mut Rebuild,
    grad: &Node,
    warnings: &mut Vec<String>,
) -> Result<Vec<ValueId>, AutodiffError> {
    let g = rb.old;
    let (loss, wrt) = (grad.inputs[0], &grad.inputs[1..]);
    let tape = Tape::new(g, loss, wrt);
    let first_new = rb.graph().values.len();
    let mut e = Emit::new(rb);
    // adjoints by value of the old graph, as values of the new one
    let mut adjoints: HashMap<ValueId, ValueId> = HashMap::new();
    adjoints.insert(loss, e.constant(1.0)?);
    for &id in tape.nodes.iter().rev() {
        let node = g.node(id);
        let Some(dy) = node.outputs.iter().find_map(|o| adjoints.get(o).copied()) else {
            continue;
        };
        let x: Vec<ValueId> = node.inputs.iter().map(|&v| e.rebuild().mapped(v)).collect();
        let wants: Vec<bool> = (0..node.inputs.len())
            .map(|i| tape.active[node.inputs[i].index()] && carries(g, node, i))
            .collect();
        let site = Site {
            loss: g.name_of(loss),
            node,
            x: &x,
            y: e.rebuild().mapped(node.outputs[0]),
            dy,
            wants: &wants,
        };
        let grads = rules::backward(&mut e, &site)?;
        debug_assert_eq!(grads.len(), node.inputs.len(), "{}", node.op.name());
        for (i, grad) in grads.into_iter().enumerate() {
            let Some(grad) = grad else { continue };
            let v = node.inputs[i];
            if e.ty(grad) != g.ty(v) || !wants[i] {
                return Err(AutodiffError::Internal(format!(
                    "the `{}` rule gave operand {i} (`{}`, {}) a gradient of type {}",
                    node.op.name(),
                    g.name_of(v),
                    g.ty(v),
                    e.ty(grad)
                )));
            }
            let total = match adjoints.get(&v) {
                Some(&previous) => e.add(previous, grad)?,
                None => grad,
            };
            adjoints.insert(v, total);
        }
    }
    let mut results: Vec<ValueId> = Vec::with_capacity(wrt.len());
    for &w in wrt {
        let value = match adjoints.get(&w) {
            Some(&a) => a,
            None => {
                warnings.push(format!(
                    "`{}` does not depend on `{}`; its gradient is zero",
                    g.name_of(loss),
                    g.name_of(w)
                ));
                e.zeros(&g.ty(w).shape)?
            }
        };
        // Each result must be a value of its own, made here, to take its name.
        let own = value.index() >= first_new && !results.contains(&value);
        results.push(if own { value } else { e.copy(value)? });
    }
    Ok(results)
}
