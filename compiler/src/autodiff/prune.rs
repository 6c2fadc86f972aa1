//! Removal of the backward nodes that ended up unused (a seed or broadcast whose only consumer
//! folded it away), so that no kernel is scheduled for them. Nodes of the user's graph are
//! never removed.

use sinter_ir::{Graph, GraphError, ValueDef, ValueId};

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
    let mut new = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values.len()];
    for id in g.value_ids() {
        let v = g.value(id);
        let (name, ty) = (v.name.clone(), v.ty.clone());
        let node = match &v.def {
            ValueDef::Input => {
                map[id.index()] = Some(new.add_input(name, ty)?);
                continue;
            }
            ValueDef::Param(init) => {
                map[id.index()] = Some(new.add_param(name, ty, init.clone())?);
                continue;
            }
            ValueDef::State(init) => {
                map[id.index()] = Some(new.add_state(name, ty, init.clone())?);
                continue;
            }
            ValueDef::Node { node, index: 0 } if live[node.index()] => g.node(*node),
            ValueDef::Node { .. } => continue,
        };
        let inputs: Vec<ValueId> = node
            .inputs
            .iter()
            .map(|v| map[v.index()].expect("operands of live nodes are live"))
            .collect();
        let names: Vec<String> = node
            .outputs
            .iter()
            .map(|&o| g.name_of(o).to_string())
            .collect();
        let results = new.add_node(node.op, &inputs, node.attrs.clone(), Some(&names))?;
        for (o, r) in node.outputs.iter().zip(results) {
            map[o.index()] = Some(r);
        }
    }
    let mapped = |v: ValueId| map[v.index()].expect("used values are live");
    for a in &g.assigns {
        new.add_assign(mapped(a.target), mapped(a.source))?;
    }
    for &v in &g.outputs {
        new.add_output(mapped(v));
    }
    Ok(new)
}
