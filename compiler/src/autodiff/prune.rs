//! Removal of the backward nodes that ended up unused (a seed or broadcast whose only consumer
//! folded it away), so that no kernel is scheduled for them. Nodes of the user's graph are
//! never removed.

use sinter_ir::{Graph, GraphError, ValueId};

/// A copy of `g` without the nodes whose results are all unused and that `removable` allows
/// (by the node's first result); names, declarations, assigns and outputs are kept.
pub(super) fn prune(g: &Graph, removable: impl Fn(ValueId) -> bool) -> Result<Graph, GraphError> {
    let mut uses = g.use_counts();
    let mut live = vec![true; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate().rev() {
        let unused = node.outputs.iter().all(|o| uses[o.index()] == 0);
        if unused && removable(node.outputs[0]) {
            live[i] = false;
            for v in &node.inputs {
                uses[v.index()] -= 1;
            }
        }
    }
    if live.iter().all(|&l| l) {
        return Ok(g.clone());
    }
    let (mut new, map) = g.restricted(|_| true, |n| live[n.index()])?;
    let mapped = |v: ValueId| map[v.index()].expect("used values are live");
    for a in &g.assigns {
        new.add_assign(mapped(a.target), mapped(a.source))?;
    }
    for &v in &g.outputs {
        new.add_output(mapped(v));
    }
    Ok(new)
}
