//! Extraction: one e-node per needed e-class, chosen to minimize the estimated time of the
//! whole step, counting a value that several kernels read once (a DAG cost, not a tree cost).
//!
//! **Cost model** ([`crate::cost`], on the compile's target; only ratios matter): each kernel
//! costs a launch, the bytes it moves at memory bandwidth, and its arithmetic; views, literals
//! and leaves cost nothing. A node whose result passes the target's binding limit costs
//! [`INFEASIBLE_NS`], so that extraction takes one that does not (a flash kernel instead of an
//! `[S, S]` score matrix) wherever there is one. A fused kernel that recomputes a cheap value pays for the arithmetic,
//! not for a store and a load, so extraction may prefer recomputing to storing.
//!
//! **Acyclicity by levels.** Every e-class has a level: the topological position of the
//! source value it came from, the lowest one when classes merge, one above its operands for
//! classes that rewrites create. A node may be chosen only if its operands' levels are lower
//! than its class's, so every choice is acyclic without a search for cycles.
//!
//! **Algorithm.** (1) Bottom-up, in level order, each class takes its most fused node (a
//! previous extraction's choice where one is given): few stored values to start from.
//! (2) From the root, the chosen nodes form a DAG; reference counts say how many chosen nodes
//! read each class. (3) Local improvement: for each chosen class, the alternative node with the
//! most negative exact change of the DAG cost (its own cost, the classes it newly needs, minus
//! the classes that nothing reads any more) replaces the chosen one (a class newly needed takes
//! its most fused node); repeated while passes improve. (4) Tuple moves: the results of one
//! multi-result kernel (a flash dK/dV kernel) pay off only together, so for each tuple the
//! classes that could take its results switch to it at once, kept if the whole cost drops;
//! and the other way, the classes reading one attention's flash kernels all switch to their
//! best nodes without flash kernels at once. (3) and (4) alternate while they improve, within a time budget. Each pass is linear in the
//! e-graph in practice, so extraction scales with the model.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::time::{Duration, Instant};

use egg::Id;
use sinter_ir::Op;

use super::analysis::Graph;
use super::lang::{ENode, Head};
use crate::cost::{CostModel, INFEASIBLE_NS};

/// What extraction must respect beyond the cost model, and the cost model.
#[derive(Clone, Copy, Debug)]
pub struct Settings<'m> {
    /// Prices every node.
    pub model: &'m CostModel,
    /// Flash kernels cost next to nothing, so extraction takes them wherever they exist.
    pub force_flash: bool,
    /// Flash kernels cost as much as an infeasible node, so extraction takes the unfused
    /// products wherever they can be stored.
    pub forbid_flash: bool,
}

/// The chosen node of every needed class.
pub struct Choice {
    pub node: HashMap<Id, ENode>,
    /// DAG cost of the choice (each chosen node once).
    pub cost: f64,
}

/// Bytes of the tensor in class `c`.
fn bytes(g: &Graph, c: Id) -> f64 {
    g[c].data.ty.size_bytes() as f64
}

/// The estimated time of `n` itself (operands not included) under `model`.
pub fn node_cost(model: &CostModel, g: &Graph, n: &ENode) -> f64 {
    let out = |g: &Graph| super::analysis::node_type(g, n);
    let ty = |k: Id| &g[k].data.ty;
    let operand_bytes = |kids: &[Id]| -> Vec<f64> { kids.iter().map(|&k| bytes(g, k)).collect() };
    match &n.head {
        Head::Leaf(_) | Head::Root | Head::Proj(_) => 0.0,
        Head::Flash(spec) => {
            let types: Vec<sinter_ir::TensorType> = n.kids.iter().map(|&k| ty(k).clone()).collect();
            model.flash(spec, &types)
        }
        Head::Kernel(p) => model.fused(p, &operand_bytes(&n.kids), out(g).size_bytes() as f64),
        Head::Epilogue(anchor, _, p) => {
            let split = n.anchor_operands();
            let extra: f64 = n.kids[split..].iter().map(|&k| bytes(g, k)).sum();
            let product = match anchor {
                Op::Matmul => model.matmul(ty(n.kids[0]), ty(n.kids[1]), &out(g)),
                _ => window_cost(model, g, &n.kids[..split], out(g).size_bytes() as f64),
            };
            product + model.bytes(extra) + model.flops(p.flops() as f64)
        }
        Head::Op(op, _) => {
            use Op::*;
            match op {
                Constant | Iota | Reshape | Permute | Transpose | BroadcastTo | Unsqueeze
                | Squeeze | Slice => 0.0,
                Matmul => model.matmul(ty(n.kids[0]), ty(n.kids[1]), &out(g)),
                Concat => {
                    n.kids.len() as f64 * model.launch()
                        + model.bytes(
                            n.kids.iter().map(|&k| bytes(g, k)).sum::<f64>()
                                + out(g).size_bytes() as f64,
                        )
                }
                _ => match super::fusion::program_of(g, n, true) {
                    Some(b) => model.fused(
                        &b.program,
                        &operand_bytes(&b.operands),
                        out(g).size_bytes() as f64,
                    ),
                    None => window_cost(model, g, &n.kids, out(g).size_bytes() as f64),
                },
            }
        }
    }
}

/// Convolution, pooling, gathers: a launch and their bytes (operands `kids`, result `out`).
fn window_cost(model: &CostModel, g: &Graph, kids: &[Id], out: f64) -> f64 {
    model.data(kids.iter().map(|&k| bytes(g, k)).sum::<f64>() + out)
}

/// How fused a node is: extraction starts from the most fused choice (fewest stored values)
/// and lets local moves store values where that is cheaper.
fn fusion_size(n: &ENode) -> usize {
    match &n.head {
        // a flash kernel's result: the most fused of all
        Head::Proj(_) => 200_000,
        Head::Epilogue(_, _, p) => 100_000 + p.insts.len(),
        Head::Op(Op::Matmul, _) => 100_000,
        Head::Kernel(p) => 1 + p.insts.len(),
        _ => 0,
    }
}

/// Extracts from `root` with the class levels `level` (see the module docs), starting from
/// `previous` where it names a valid node (else from the most fused node), improving for at
/// most `budget`.
pub fn extract(
    g: &Graph,
    root: Id,
    level: &HashMap<Id, u64>,
    previous: Option<&HashMap<Id, ENode>>,
    budget: Duration,
    settings: Settings,
) -> Choice {
    let start = Instant::now();
    let lvl = |c: Id| level.get(&g.find(c)).copied().unwrap_or(u64::MAX);
    // classes in level order
    let mut classes: Vec<Id> = g.classes().map(|c| c.id).collect();
    classes.sort_by_key(|&c| (lvl(c), c));
    let previous: HashMap<Id, ENode> = previous
        .map(|p| {
            p.iter()
                .map(|(&c, n)| {
                    let mut n = n.clone();
                    for k in n.kids.iter_mut() {
                        *k = g.find(*k);
                    }
                    (g.find(c), n)
                })
                .collect()
        })
        .unwrap_or_default();
    let mut own: HashMap<(Id, usize), f64> = HashMap::default();
    // (preferred-by-previous, fusion size, -cost) of the chosen node; larger is better
    let mut best: HashMap<Id, (f64, usize)> = HashMap::default();
    let mut rank: HashMap<Id, (bool, usize, f64)> = HashMap::default();
    for &c in &classes {
        let lc = lvl(c);
        let prev = previous.get(&c);
        for (i, n) in g[c].nodes.iter().enumerate() {
            if n.kids
                .iter()
                .any(|&k| lvl(k) >= lc || !best.contains_key(&g.find(k)))
            {
                continue;
            }
            let cost = match n.head {
                // a thousandth: cheaper than any alternative, still worth sharing
                Head::Flash(_) if settings.force_flash => 1e-3 * node_cost(settings.model, g, n),
                Head::Flash(_) if settings.forbid_flash => INFEASIBLE_NS,
                Head::Kernel(_) | Head::Epilogue(..) | Head::Op(..)
                    if settings.model.target.stored_bytes(&g[c].data.ty)
                        > settings.model.target.limits.max_binding
                        && node_cost(settings.model, g, n) > 0.0 =>
                {
                    INFEASIBLE_NS
                }
                _ => node_cost(settings.model, g, n),
            };
            own.insert((c, i), cost);
            let is_prev = prev.is_some_and(|p| {
                p.head == n.head && p.kids.iter().zip(&n.kids).all(|(&a, &b)| a == g.find(b))
            });
            let r = (is_prev, fusion_size(n), -cost);
            if rank.get(&c).is_none_or(|old| r > *old) {
                rank.insert(c, r);
                best.insert(c, (cost, i));
            }
        }
    }
    // the same without flash kernels: what the classes of an attention take when a move
    // drops its flash kernels
    let mut plain: HashMap<Id, (f64, usize)> = HashMap::default();
    let mut plain_rank: HashMap<Id, (usize, f64)> = HashMap::default();
    for &c in &classes {
        for (i, n) in g[c].nodes.iter().enumerate() {
            if matches!(n.head, Head::Proj(_) | Head::Flash(_))
                || n.kids.iter().any(|&k| !plain.contains_key(&g.find(k)))
            {
                continue;
            }
            let Some(&cost) = own.get(&(c, i)) else {
                continue;
            };
            let r = (fusion_size(n), -cost);
            if plain_rank.get(&c).is_none_or(|old| r > *old) {
                plain_rank.insert(c, r);
                plain.insert(c, (cost, i));
            }
        }
    }
    let mut chosen: HashMap<Id, usize> = HashMap::default();
    let mut refs: HashMap<Id, usize> = HashMap::default();
    let root = g.find(root);
    add_closure(g, &best, &mut chosen, &mut refs, root);
    *refs.entry(root).or_default() += 1;
    let cost_of =
        |c: Id, i: usize, own: &HashMap<(Id, usize), f64>| own.get(&(c, i)).copied().unwrap_or(0.0);

    // the projections of each tuple (a flash kernel's results), for moves that switch every
    // class reading some tuple to another tuple at once
    let mut projections: HashMap<Id, Vec<(Id, usize)>> = HashMap::default();
    for &c in &classes {
        for (i, n) in g[c].nodes.iter().enumerate() {
            if matches!(n.head, Head::Proj(_)) && own.contains_key(&(c, i)) {
                projections
                    .entry(g.find(n.kids[0]))
                    .or_default()
                    .push((c, i));
            }
        }
    }
    let total = |chosen: &HashMap<Id, usize>| -> f64 {
        chosen.iter().map(|(&c, &i)| cost_of(c, i, &own)).sum()
    };
    for _round in 0..4 {
        // local improvement: each pass gives every chosen class its best single swap
        for _pass in 0..6 {
            let mut improved = false;
            let mut order: Vec<Id> = chosen.keys().copied().collect();
            order.sort_by_key(|&c| std::cmp::Reverse((lvl(c), c)));
            for c in order {
                if start.elapsed() > budget {
                    break;
                }
                let Some(&cur) = chosen.get(&c) else { continue };
                let mut pick: Option<(f64, usize)> = None;
                for i in 0..g[c].nodes.len() {
                    if i == cur || !own.contains_key(&(c, i)) {
                        continue;
                    }
                    let delta = swap_delta(g, &best, &chosen, &refs, &own, c, cur, i);
                    if delta < -1e-3 && pick.is_none_or(|(d, _)| delta < d) {
                        pick = Some((delta, i));
                    }
                }
                if let Some((_, i)) = pick {
                    apply_swap(g, &best, &mut chosen, &mut refs, c, cur, i);
                    improved = true;
                }
            }
            if !improved || start.elapsed() > budget {
                break;
            }
        }
        // tuple moves: one kernel's results are worth taking only all together (dK and dV
        // from one dK/dV kernel), which no single swap sees
        let mut moved = false;
        let mut tuples: Vec<&Id> = projections.keys().collect();
        tuples.sort();
        for t in tuples {
            if start.elapsed() > budget {
                break;
            }
            let members: Vec<(Id, usize)> = projections[t]
                .iter()
                .copied()
                .filter(|&(c, i)| chosen.get(&c).is_some_and(|&cur| cur != i))
                .collect();
            if members.is_empty() {
                continue;
            }
            let before = total(&chosen);
            let (saved_chosen, saved_refs) = (chosen.clone(), refs.clone());
            for &(c, i) in &members {
                if let Some(&cur) = chosen.get(&c) {
                    apply_swap(g, &best, &mut chosen, &mut refs, c, cur, i);
                }
            }
            if total(&chosen) < before - 1e-3 {
                moved = true;
            } else {
                (chosen, refs) = (saved_chosen, saved_refs);
            }
        }
        // attention moves: an attention's flash kernels (those reading its q and k) pay off
        // only together, against the unfused products together; drop them all at once
        let mut groups: HashMap<(Id, Id), Vec<(Id, usize)>> = HashMap::default();
        for (&c, &i) in &chosen {
            let n = &g[c].nodes[i];
            if let Head::Proj(_) = n.head {
                let t = g.find(n.kids[0]);
                if let Some(&ti) = chosen.get(&t) {
                    let tn = &g[t].nodes[ti];
                    groups
                        .entry((g.find(tn.kids[0]), g.find(tn.kids[1])))
                        .or_default()
                        .push((c, i));
                }
            }
        }
        let mut keys: Vec<(Id, Id)> = groups.keys().copied().collect();
        keys.sort();
        for key in keys {
            if start.elapsed() > budget {
                break;
            }
            let members = &groups[&key];
            if members.iter().any(|(c, _)| !plain.contains_key(c)) {
                continue;
            }
            let before = total(&chosen);
            let (saved_chosen, saved_refs) = (chosen.clone(), refs.clone());
            for &(c, i) in members {
                if chosen.get(&c) == Some(&i) {
                    apply_swap(g, &plain, &mut chosen, &mut refs, c, i, plain[&c].1);
                }
            }
            if total(&chosen) < before - 1e-3 {
                moved = true;
            } else {
                (chosen, refs) = (saved_chosen, saved_refs);
            }
        }
        // anchor moves: a product or convolution that several chosen epilogues recompute
        // (a weight gradient feeding both AdamW moments) is worth storing once only when
        // every one of them reads it instead, which no single swap sees
        let mut recomputing: HashMap<ENode, Vec<Id>> = HashMap::default();
        for (&c, &i) in &chosen {
            if let Some(anchor) = anchor_of(g, &g[c].nodes[i]) {
                recomputing.entry(anchor).or_default().push(c);
            }
        }
        let mut anchors: Vec<(ENode, Vec<Id>)> = recomputing
            .into_iter()
            .filter(|(_, readers)| readers.len() > 1)
            .collect();
        anchors.sort();
        for (anchor, readers) in anchors {
            if start.elapsed() > budget {
                break;
            }
            let stored = g.lookup(anchor).map(|a| g.find(a));
            let before = total(&chosen);
            let (saved_chosen, saved_refs) = (chosen.clone(), refs.clone());
            for c in readers {
                // the node of the class that reads the product stored (or, where the class
                // has none, that recomputes no product: a form of it may be stored) and
                // changes the DAG cost least, given the readers switched before it
                let Some(&cur) = chosen.get(&c) else { continue };
                let candidates: Vec<usize> = (0..g[c].nodes.len())
                    .filter(|&j| own.contains_key(&(c, j)))
                    .filter(|&j| anchor_of(g, &g[c].nodes[j]).is_none())
                    .collect();
                let reading: Vec<usize> = candidates
                    .iter()
                    .copied()
                    .filter(|&j| {
                        let kids = &g[c].nodes[j].kids;
                        kids.iter().any(|&k| Some(g.find(k)) == stored)
                    })
                    .collect();
                let pick = if reading.is_empty() {
                    candidates
                } else {
                    reading
                }
                .into_iter()
                .map(|j| (swap_delta(g, &best, &chosen, &refs, &own, c, cur, j), j))
                .min_by(|x, y| x.0.total_cmp(&y.0));
                if let Some((_, j)) = pick {
                    apply_swap(g, &best, &mut chosen, &mut refs, c, cur, j);
                }
            }
            if total(&chosen) < before - 1e-3 {
                moved = true;
            } else {
                (chosen, refs) = (saved_chosen, saved_refs);
            }
        }
        if !moved || start.elapsed() > budget {
            break;
        }
    }
    let cost = chosen
        .iter()
        .map(|(&c, &i)| node_cost(settings.model, g, &g[c].nodes[i]))
        .sum();
    Choice {
        node: chosen
            .into_iter()
            .map(|(c, i)| (c, g[c].nodes[i].clone()))
            .collect(),
        cost,
    }
}

/// The anchor op an epilogue node computes inside itself, as the plain e-node (canonical).
fn anchor_of(g: &Graph, n: &ENode) -> Option<ENode> {
    let Head::Epilogue(op, attrs, _) = &n.head else {
        return None;
    };
    let kids = n.kids[..n.anchor_operands()]
        .iter()
        .map(|&k| g.find(k))
        .collect();
    Some(ENode::new(Head::Op(*op, attrs.clone()), kids))
}

/// Chooses `c` (and, recursively, what its best node needs) if it is not chosen yet.
fn add_closure(
    g: &Graph,
    best: &HashMap<Id, (f64, usize)>,
    chosen: &mut HashMap<Id, usize>,
    refs: &mut HashMap<Id, usize>,
    c: Id,
) {
    let mut stack = vec![c];
    while let Some(c) = stack.pop() {
        if chosen.contains_key(&c) {
            continue;
        }
        let i = best.get(&c).expect("an extractable class").1;
        chosen.insert(c, i);
        for &k in &g[c].nodes[i].kids {
            let k = g.find(k);
            *refs.entry(k).or_default() += 1;
            if !chosen.contains_key(&k) {
                stack.push(k);
            }
        }
    }
}

/// The change of DAG cost if class `c` switched from node `from` to node `to`.
#[allow(clippy::too_many_arguments)]
fn swap_delta(
    g: &Graph,
    best: &HashMap<Id, (f64, usize)>,
    chosen: &HashMap<Id, usize>,
    refs: &HashMap<Id, usize>,
    own: &HashMap<(Id, usize), f64>,
    c: Id,
    from: usize,
    to: usize,
) -> f64 {
    let cost = |c: Id, i: usize| own.get(&(c, i)).copied().unwrap_or(0.0);
    let mut delta = cost(c, to) - cost(c, from);
    // reference changes, without touching the real counts
    let mut diff: HashMap<Id, i64> = HashMap::default();
    for &k in &g[c].nodes[from].kids {
        *diff.entry(g.find(k)).or_default() -= 1;
    }
    for &k in &g[c].nodes[to].kids {
        *diff.entry(g.find(k)).or_default() += 1;
    }
    // classes newly needed: their best closure not already chosen; what that closure reads of
    // the chosen classes counts as references
    let mut added: HashSet<Id> = HashSet::default();
    let mut stack: Vec<Id> = diff
        .iter()
        .filter(|(k, d)| **d > 0 && !chosen.contains_key(k))
        .map(|(k, _)| *k)
        .collect();
    while let Some(k) = stack.pop() {
        if !added.insert(k) {
            continue;
        }
        let Some(&(_, i)) = best.get(&k) else {
            return f64::INFINITY;
        };
        delta += cost(k, i);
        for &kk in &g[k].nodes[i].kids {
            let kk = g.find(kk);
            if chosen.contains_key(&kk) {
                *diff.entry(kk).or_default() += 1;
            } else {
                stack.push(kk);
            }
        }
    }
    // classes no longer read: freed with what only they read
    let mut count: HashMap<Id, i64> = HashMap::default();
    let mut stack: Vec<Id> = Vec::new();
    for (&k, &d) in &diff {
        if d < 0 && chosen.contains_key(&k) {
            let left = refs.get(&k).copied().unwrap_or(0) as i64 + d;
            count.insert(k, left);
            if left == 0 {
                stack.push(k);
            }
        }
    }
    let mut freed: HashSet<Id> = HashSet::default();
    while let Some(k) = stack.pop() {
        if !freed.insert(k) || k == c {
            continue;
        }
        let i = chosen[&k];
        delta -= cost(k, i);
        for &kk in &g[k].nodes[i].kids {
            let kk = g.find(kk);
            let left = count.entry(kk).or_insert_with(|| {
                refs.get(&kk).copied().unwrap_or(0) as i64 + diff.get(&kk).copied().unwrap_or(0)
            });
            *left -= 1;
            if *left == 0 && chosen.contains_key(&kk) {
                stack.push(kk);
            }
        }
    }
    delta
}

/// Switches class `c` from node `from` to node `to`, updating what is chosen and the counts.
fn apply_swap(
    g: &Graph,
    best: &HashMap<Id, (f64, usize)>,
    chosen: &mut HashMap<Id, usize>,
    refs: &mut HashMap<Id, usize>,
    c: Id,
    from: usize,
    to: usize,
) {
    chosen.insert(c, to);
    for &k in &g[c].nodes[to].kids {
        let k = g.find(k);
        *refs.entry(k).or_default() += 1;
        if !chosen.contains_key(&k) {
            add_closure(g, best, chosen, refs, k);
        }
    }
    let mut stack: Vec<Id> = Vec::new();
    for &k in &g[c].nodes[from].kids {
        let k = g.find(k);
        let r = refs.entry(k).or_default();
        *r -= 1;
        if *r == 0 {
            stack.push(k);
        }
    }
    while let Some(k) = stack.pop() {
        let Some(i) = chosen.remove(&k) else { continue };
        refs.remove(&k);
        for &kk in &g[k].nodes[i].kids {
            let kk = g.find(kk);
            let r = refs.entry(kk).or_default();
            *r -= 1;
            if *r == 0 {
                stack.push(kk);
            }
        }
    }
}
