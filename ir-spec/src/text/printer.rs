//! The printer: a [`Graph`] to `.sir` text that parses back to an equal graph.
//!
//! Statements come in value-arena order (each declaration where its value is, each node where
//! its first result is), then the `assign`s and one `output` line. A node is printed *inline*,
//! nested in the one statement that uses it, only when reparsing recreates the same arena: see
//! [`inline_plan`].

use crate::attr::key;
use std::collections::HashSet;

use super::MAX_INLINE_DEPTH;
use crate::attr::{Attr, format_float};
use crate::graph::{Graph, Node, NodeId, ValueDef, ValueId};
use crate::op::Op;

/// Prints a graph as `.sir` text.
pub(crate) fn print(g: &Graph) -> String {
    let printer = Printer {
        g,
        inlined: inline_plan(g),
    };
    printer.graph()
}

struct Printer<'g> {
    g: &'g Graph,
    /// Per node: printed nested inside its only user rather than as a statement.
    inlined: Vec<bool>,
}

impl Printer<'_> {
    fn graph(&self) -> String {
        let g = self.g;
        let mut out = format!("graph {} {{\n", g.name);
        for id in g.value_ids() {
            let value = g.value(id);
            let ty = &value.ty;
            match &value.def {
                ValueDef::Input => out += &format!("  input  {}: {ty}\n", value.name),
                ValueDef::Param(init) => {
                    out += &format!("  param  {}: {ty} = {}\n", value.name, init);
                }
                ValueDef::State(init) => {
                    out += &format!("  state  {}: {ty} = {}\n", value.name, init);
                }
                ValueDef::Node { node, index: 0 } if !self.inlined[node.index()] => {
                    out += &format!("  {}\n", self.statement(*node));
                }
                ValueDef::Node { .. } => {}
            }
        }
        for a in &g.assigns {
            out += &format!(
                "  assign {} = {}\n",
                g.name_of(a.target),
                g.name_of(a.source)
            );
        }
        if !g.outputs.is_empty() {
            let names: Vec<&str> = g.outputs.iter().map(|&v| g.name_of(v)).collect();
            out += &format!("  output {}\n", names.join(", "));
        }
        out.push_str("}\n");
        out
    }

    /// `N1, N2 = op(...)`.
    fn statement(&self, id: NodeId) -> String {
        let node = self.g.node(id);
        let names: Vec<&str> = node.outputs.iter().map(|&v| self.g.name_of(v)).collect();
        let mut out = format!("{} = ", names.join(", "));
        self.call(&mut out, node);
        out
    }

    /// An operand: nested when its producer is inlined, else its name.
    fn operand(&self, out: &mut String, v: ValueId) {
        match self.g.producer(v) {
            Some(n) if self.inlined[n.index()] => {
                let node = self.g.node(n);
                match literal_value(node) {
                    Some(value) => out.push_str(&format_float(value)),
                    None => self.call(out, node),
                }
            }
            _ => out.push_str(self.g.name_of(v)),
        }
    }

    /// `op(operands..., attrs...)`, omitting attributes equal to their static default.
    fn call(&self, out: &mut String, node: &Node) {
        let spec = node.op.spec();
        out.push_str(spec.name);
        out.push('(');
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(", ");
            }
            first = false;
        };
        for &v in &node.inputs {
            sep(out);
            self.operand(out, v);
        }
        let in_spec = spec.attrs.iter().filter_map(|a| {
            let value = node.attrs.get(a.name)?;
            (a.default.value().as_ref() != Some(value)).then_some((a.name, value))
        });
        let extra = node.attrs.iter().filter(|(k, _)| spec.attr(k).is_none());
        for (name, value) in in_spec.chain(extra) {
            sep(out);
            out.push_str(name);
            out.push('=');
            attr_text(out, value);
        }
        out.push(')');
    }
}

/// The value of a `constant` node, when it can be written as a literal operand.
fn literal_value(node: &Node) -> Option<f64> {
    match (node.op, node.attrs.get(key::VALUE.name)) {
        (Op::Constant, Some(Attr::Float(v))) if !v.is_nan() => Some(*v),
        _ => None,
    }
}

fn attr_text(out: &mut String, value: &Attr) {
    match value {
        Attr::Int(v) => out.push_str(&v.to_string()),
        Attr::Float(v) => out.push_str(&format_float(*v)),
        Attr::Bool(v) => out.push_str(if *v { "true" } else { "false" }),
        Attr::Str(s) => {
            out.push('"');
            for c in s.chars() {
                if matches!(c, '"' | '\\') {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        }
        Attr::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                attr_text(out, item);
            }
            out.push(']');
        }
    }
}

/// A run of nodes that prints as one nested expression: the values `start..end` of the arena,
/// created by reparsing in exactly this order (post-order, left to right).
struct Tree {
    root: ValueId,
    start: usize,
    end: usize,
    depth: usize,
}

/// Decides which nodes print nested inside their user.
///
/// The parser creates a statement's nested calls in post-order, innermost first and left to
/// right, and then the statement's own node. So a node can be nested in its user only if it has
/// one result, is used exactly once (by a node, not by an output or assign), has the name the
/// parser would generate for it, and its subtree occupies exactly the contiguous values just
/// before its user's (or just before the previous nested sibling's). Scanning nodes in order
/// with a stack of candidate subtrees checks that like a postfix evaluator.
fn inline_plan(g: &Graph) -> Vec<bool> {
    let candidate = inline_candidates(g);
    let mut inlined = vec![false; g.nodes.len()];
    let mut stack: Vec<Tree> = Vec::new();
    for (n, node) in g.nodes.iter().enumerate() {
        let Some(&first) = node.outputs.first() else {
            continue;
        };
        let mut start = first.index();
        let mut depth = 1;
        for &operand in node.inputs.iter().rev() {
            if let Some(top) = stack.last()
                && top.root == operand
                && top.end == start
            {
                if let Some(p) = g.producer(operand) {
                    inlined[p.index()] = true;
                }
                start = top.start;
                depth = depth.max(top.depth + 1);
                stack.pop();
            }
        }
        if candidate[n] && depth < MAX_INLINE_DEPTH {
            stack.push(Tree {
                root: first,
                start,
                end: first.index() + 1,
                depth,
            });
        }
    }
    inlined
}

/// Nodes that could print nested, judged on their own (position is checked by the caller).
fn inline_candidates(g: &Graph) -> Vec<bool> {
    let mut node_uses = vec![0usize; g.values.len()];
    for node in &g.nodes {
        for &v in &node.inputs {
            node_uses[v.index()] += 1;
        }
    }
    let mut pinned = vec![false; g.values.len()];
    for &v in &g.outputs {
        pinned[v.index()] = true;
    }
    for a in &g.assigns {
        pinned[a.source.index()] = true;
    }
    let generated = generated_names(g);
    g.nodes
        .iter()
        .map(|node| match node.outputs[..] {
            [v] => {
                let i = v.index();
                node_uses[i] == 1
                    && !pinned[i]
                    && generated[i]
                    && (node.op != Op::Constant || literal_value(node).is_some())
            }
            _ => false,
        })
        .collect()
}

/// Per value: whether its name is the one the builder generates for an unnamed value at its
/// position (`_` and its index, suffixed `_1`, `_2`... past names already taken by earlier
/// values). Mirrors `Graph::fresh_name`.
fn generated_names(g: &Graph) -> Vec<bool> {
    let mut taken: HashSet<&str> = HashSet::new();
    let mut result = Vec::with_capacity(g.values.len());
    for (i, value) in g.values.iter().enumerate() {
        let base = format!("_{i}");
        let mut fresh = base.clone();
        let mut k = 1;
        while taken.contains(fresh.as_str()) {
            fresh = format!("{base}_{k}");
            k += 1;
        }
        result.push(value.name == fresh);
        taken.insert(&value.name);
    }
    result
}
