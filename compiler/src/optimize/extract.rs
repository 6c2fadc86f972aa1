//! Extraction: one e-node per needed e-class, chosen to minimize the estimated time of the
//! whole step, counting a value that several kernels read once (a DAG cost, not a tree cost).
//!
//! **Cost model** (nanoseconds on a GPU like the H200; only ratios matter): each kernel costs a
//! launch, the bytes it moves at memory bandwidth, and its arithmetic; views, literals and
//! leaves cost nothing. A fused kernel that recomputes a cheap value pays for the arithmetic,
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
use crate::fused::{Level, Program};

/// Fixed cost of one dispatch.
pub const LAUNCH_NS: f64 = 4000.0;
/// Sustained memory bandwidth, bytes per ns.
pub const BYTES_PER_NS: f64 = 3000.0;
/// Elementwise arithmetic, f32 operations per ns.
pub const FLOPS_PER_NS: f64 = 30000.0;
/// Matrix products, f32 operations per ns.
pub const MATMUL_FLOPS_PER_NS: f64 = 25000.0;

/// What extraction must respect beyond the cost model.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Flash kernels cost next to nothing, so extraction takes them wherever they exist.
    pub force_flash: bool,
    /// Flash kernels cost as much as an infeasible node, so extraction takes the unfused
    /// products wherever they can be stored.
    pub forbid_flash: bool,
    /// The largest tensor a kernel may store (a storage binding's limit): a node storing a
    /// larger one costs [`INFEASIBLE_NS`], so that extraction takes one that does not (a flash
    /// kernel instead of an `[S, S]` score matrix) wherever there is one.
    pub max_binding: u64,
    /// Lowering keeps an attention's dQ and dK/dV kernels apart (`--flash-backward split`), so
    /// the dQ kernel costs its own products, not the merged kernel's share.
    pub split_flash_backward: bool,
    /// [`crate::Options::tensor_cores`]: flash kernels with tensor-core forms run their
    /// products at those forms' rate, and their backward stays split.
    pub tensor_cores: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            force_flash: false,
            forbid_flash: false,
            max_binding: u64::MAX,
            split_flash_backward: false,
            tensor_cores: false,
        }
    }
}

/// The cost of a node whose result cannot be stored: finite, so that cost differences stay
/// numbers, and larger than any real step.
pub const INFEASIBLE_NS: f64 = 1e15;

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

/// The estimated time of `n` itself (operands not included).
pub fn node_cost(g: &Graph, n: &ENode) -> f64 {
    let out = |g: &Graph| super::analysis::node_type(g, n).size_bytes() as f64;
    match &n.head {
        Head::Leaf(_) | Head::Root | Head::Proj(_) => 0.0,
        Head::Flash(spec) => flash_cost(g, spec, &n.kids, true, false),
        Head::Kernel(p) => kernel_cost(g, p, &n.kids, out(g)),
        Head::Epilogue(anchor, _, p) => {
            let split = n.anchor_operands();
            let extra: f64 = n.kids[split..].iter().map(|&k| bytes(g, k)).sum();
            let product = match anchor {
                Op::Matmul => {
                    let (a, b) = (&g[n.kids[0]].data.ty, &g[n.kids[1]].data.ty);
                    matmul_cost(g, n, a, b)
                }
                _ => window_cost(g, &n.kids[..split], out(g)),
            };
            product + extra / BYTES_PER_NS + p.flops() as f64 / FLOPS_PER_NS
        }
        Head::Op(op, _) => {
            use Op::*;
            match op {
                Constant | Iota | Reshape | Permute | Transpose | BroadcastTo | Unsqueeze
                | Squeeze | Slice => 0.0,
                Matmul => {
                    let (a, b) = (&g[n.kids[0]].data.ty, &g[n.kids[1]].data.ty);
                    matmul_cost(g, n, a, b)
                }
                Concat => {
                    n.kids.len() as f64 * LAUNCH_NS
                        + (n.kids.iter().map(|&k| bytes(g, k)).sum::<f64>() + out(g)) / BYTES_PER_NS
                }
                _ => match super::fusion::program_of(g, n, true) {
                    Some(b) => kernel_cost(g, &b.program, &b.operands, out(g)),
                    None => window_cost(g, &n.kids, out(g)),
                },
            }
        }
    }
}

/// Convolution, pooling, gathers: a launch and their bytes (operands `kids`, result `out`).
fn window_cost(g: &Graph, kids: &[Id], out: f64) -> f64 {
    LAUNCH_NS + (kids.iter().map(|&k| bytes(g, k)).sum::<f64>() + out) / BYTES_PER_NS
}

/// Products inside flash kernels, f32 operations per ns (counting the backward's recomputed
/// products), with the SM balance of [`flash_cost`]: fitted on the H200 to the 128 × 64 tiling
/// (the default) at S = 512 to 4096, head dim 64, causal and not (BENCHMARKS.md, "Flash
/// tilings"), so that the model's flash-to-unfused ratio follows the measured one: flash loses
/// at S ≤ 1024 and wins from S = 2048 causal. Dropping naga's index clamping from the flash
/// kernels (`Kernel::indices_in_range`) made them 12% faster (S = 4096: 41.3 → 36.3 ms), but
/// the rate scaled by that picked flash at head dim 128, S = 2048 causal, where it measured
/// 12.08 ms against the unfused products' 10.79 (the model overestimates those at head dim 128
/// more than the flash kernels): at this rate every measured choice is right but one within 1%
/// (head dim 64, S = 1024 causal: flash 2.024 ms, unfused 2.045, auto picks unfused).
pub const FLASH_FLOPS_PER_NS: f64 = 16000.0;

/// How much faster the tensor-core forward ([`crate::codegen::flash::coop`]) runs its products
/// than the `f32` kernel the flash rate was fitted to: the H200 at S = 2048 causal, head
/// dimension 64 (B = 4, H = 12), ran the forward in 0.588 ms against 1.214 (2026-12-03, with
/// the output in cooperative accumulators; 0.640 before, fitted as 1.9).
pub const TENSOR_CORE_FORWARD_SPEEDUP: f64 = 2.07;

/// The same for the tensor-core dQ and dK/dV kernels, per product the model counts: in the
/// same session they took 0.636 + 0.835 ms for `d + 2·dv` and `2·d + 2·dv` products where the
/// `f32` whole backward took 2.728 + 0.112 (its dQ sum) for `3·d + 2·dv`: 3.28 against 8.88 µs
/// a product (2.7; fitted as 2.5 from 0.673 + 0.869 a session before). At head dimension 128
/// the split tensor-core backward ran 2.8× the `f32` whole one at S = 4096, where this constant
/// predicts about 1.9×: the choices there are the same either way.
pub const TENSOR_CORE_BACKWARD_SPEEDUP: f64 = 2.7;

/// A flash kernel: a launch, its operands and results once, and its products (those of the
/// blocks its mask leaves live) at the flash rate.
/// [`node_cost`] as lowering will build the node under `settings` (a dQ flash kernel that stays
/// apart from its dK/dV kernel costs its own products).
fn model_cost(g: &Graph, n: &ENode, settings: &Settings) -> f64 {
    match &n.head {
        Head::Flash(spec) => flash_cost(
            g,
            spec,
            &n.kids,
            !settings.split_flash_backward,
            settings.tensor_cores,
        ),
        _ => node_cost(g, n),
    }
}

/// `merge`: lowering merges a dQ kernel into its dK/dV kernel where it can (the default);
/// `tensor_cores`: as [`Settings::tensor_cores`].
fn flash_cost(
    g: &Graph,
    spec: &crate::flash::FlashSpec,
    kids: &[Id],
    merge: bool,
    tensor_cores: bool,
) -> f64 {
    use crate::flash::FlashKind;
    let types: Vec<sinter_ir::TensorType> = kids.iter().map(|&k| g[k].data.ty.clone()).collect();
    let outs = spec.output_types(&types);
    let bytes: f64 = types
        .iter()
        .chain(&outs)
        .map(|t| t.size_bytes() as f64)
        .sum();
    let scores: f64 = spec.score.domain.iter().map(|&d| d as f64).product::<f64>()
        * crate::flash::live_fraction(&spec.score, 64, 32);
    let (q, v) = (&types[0], &types[2]);
    let (d, dv) = (q.shape[q.rank() - 1] as f64, v.shape[v.rank() - 1] as f64);
    let r = spec.score.domain.len();
    // Where lowering makes the dQ kernel part of the dK/dV kernel (`merge-flash-backward`, on
    // by default), the dQ kernel costs that kernel's dQ share: one product, over key blocks,
    // and the partial sums written and added.
    let merged = merge && spec.kind == FlashKind::BackwardDq && spec.merges(q, v, tensor_cores);
    // the kernel runs in its tensor-core form (`codegen::flash::coop`)
    let coop = crate::codegen::flash::coop::runs(tensor_cores, spec.kind, d as usize, dv as usize);
    let speedup = match (coop, spec.kind) {
        (false, _) => 1.0,
        (true, FlashKind::Forward) => TENSOR_CORE_FORWARD_SPEEDUP,
        (true, _) => TENSOR_CORE_BACKWARD_SPEEDUP,
    };
    let products = match spec.kind {
        FlashKind::Forward => d + dv,
        FlashKind::BackwardDq if merged => d,
        FlashKind::BackwardDq => d + 2.0 * dv,
        FlashKind::BackwardDkDv => 2.0 * d + 2.0 * dv,
        FlashKind::Backward => 3.0 * d + 2.0 * dv,
    };
    // Workgroups (one per block of rows of the tiling the kernel gets, the default or A where
    // the default would pass the kernel's register budget; rows are queries, or keys for
    // dK/dV) start in dispatch order on whichever SM frees first, one at a time per SM; each
    // works in proportion to its live share of columns. The busiest SM sets the time: a last partial
    // wave costs a whole one, and under a causal mask few waves balance badly (measured on the
    // H200 against S = 4096: at S = 512, 1024, 2048 the kernels ran at 0.65, 0.91, 0.95 of that
    // rate, causal ones at 0.45, 0.66, 0.85).
    let kind = if merged {
        FlashKind::BackwardDkDv
    } else {
        spec.kind
    };
    let by_keys = matches!(kind, FlashKind::BackwardDkDv | FlashKind::Backward);
    let rows = if coop {
        crate::codegen::flash::coop::ROWS
    } else {
        crate::codegen::flash::Tiling::DEFAULT
            .for_kernel(kind, d as usize, dv as usize)
            .rows
    };
    let per_block = crate::flash::live_per_row_block(&spec.score, rows, by_keys);
    let batch: usize = spec.score.domain[..r - 2].iter().product();
    let balance = sm_balance(batch, &per_block, crate::codegen::matmul::SMS);
    let (launch, bytes) = if merged {
        let dq = q.size_bytes() as u64;
        let groups = crate::codegen::flash::dq_groups(per_block.len(), dq, u64::MAX);
        (0.0, (2 * groups as u64 + 1) as f64 * dq as f64)
    } else {
        (LAUNCH_NS, bytes)
    };
    // the tensor-core backward's pass over dO for its gradient scale (`FlashScale`), shared by
    // the dQ and dK/dV kernels
    let scale_pass = if coop && spec.kind != FlashKind::Forward {
        (LAUNCH_NS + types[3].size_bytes() as f64 / BYTES_PER_NS) / 2.0
    } else {
        0.0
    };
    launch
        + scale_pass
        + bytes / BYTES_PER_NS
        + 2.0 * scores * products / FLASH_FLOPS_PER_NS / speedup / balance
}

/// The share of `sms` SMs' time that `batch` rounds of workgroups with works `per_block` keep
/// busy when each starts, in the kernel's launch order ([`crate::flash::LaunchOrder`]), on the
/// SM that frees first.
fn sm_balance(batch: usize, per_block: &[f64], sms: usize) -> f64 {
    use crate::flash::LaunchOrder;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // integer work units (1/1024 of a full block) keep the heap's order total
    let units: Vec<u64> = per_block
        .iter()
        .map(|&w| (w * 1024.0).round() as u64)
        .collect();
    let total: u64 = units.iter().sum::<u64>() * batch as u64;
    if total == 0 || sms == 0 {
        return 1.0;
    }
    let order = LaunchOrder::of(per_block, batch);
    let mut free: BinaryHeap<Reverse<u64>> = (0..sms).map(|_| Reverse(0)).collect();
    for b in order.launches(units.len(), batch) {
        let Reverse(t) = free.pop().unwrap_or(Reverse(0));
        free.push(Reverse(t + units[b]));
    }
    let makespan = free.into_iter().map(|Reverse(t)| t).max().unwrap_or(0);
    total as f64 / (makespan.max(1) * sms as u64) as f64
}

fn matmul_cost(g: &Graph, n: &ENode, a: &sinter_ir::TensorType, b: &sinter_ir::TensorType) -> f64 {
    let out = super::analysis::node_type(g, n);
    let k = a.shape[a.rank() - 1] as f64;
    let flops = 2.0 * out.numel() as f64 * k;
    LAUNCH_NS
        + (a.size_bytes() + b.size_bytes() + out.size_bytes()) as f64 / BYTES_PER_NS
        + flops / MATMUL_FLOPS_PER_NS
}

/// A fused kernel: a launch, each operand read once per loop that reads it (re-reads of a row
/// mostly hit the cache: a quarter of the bytes each), the outputs written once, the arithmetic.
fn kernel_cost(g: &Graph, p: &Program, kids: &[Id], out_bytes: f64) -> f64 {
    let levels = p.levels();
    let mut reads = vec![0usize; p.operands.len()];
    let mut regions: Vec<Vec<u32>> = p.phases.iter().map(|ph| vec![ph.value]).collect();
    regions.push(p.outputs.iter().map(|o| o.value).collect());
    for roots in &regions {
        let mut need = vec![false; p.insts.len()];
        for &r in roots {
            need[r as usize] = true;
        }
        for i in (0..p.insts.len()).rev() {
            if need[i] {
                match &p.insts[i] {
                    crate::fused::Inst::Map(_, args) => {
                        for &a in args {
                            need[a as usize] = true;
                        }
                    }
                    crate::fused::Inst::Load(o)
                        if levels[i] == Level::Element || regions.len() == 1 =>
                    {
                        reads[*o as usize] += 1
                    }
                    crate::fused::Inst::Load(o) => reads[*o as usize] = reads[*o as usize].max(1),
                    _ => {}
                }
            }
        }
    }
    let read: f64 = kids
        .iter()
        .zip(&reads)
        .map(|(&k, &r)| {
            bytes(g, k)
                * if r == 0 {
                    0.0
                } else {
                    1.0 + 0.25 * (r - 1) as f64
                }
        })
        .sum();
    let extra_outputs: f64 = p.outputs[1..]
        .iter()
        .map(|o| {
            crate::fused::eval::shape_of(p, &o.access)
                .iter()
                .product::<usize>() as f64
                * 4.0
        })
        .sum();
    LAUNCH_NS + (read + out_bytes + extra_outputs) / BYTES_PER_NS + p.flops() as f64 / FLOPS_PER_NS
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
                Head::Flash(_) if settings.force_flash => 1e-3 * node_cost(g, n),
                Head::Flash(_) if settings.forbid_flash => INFEASIBLE_NS,
                Head::Kernel(_) | Head::Epilogue(..) | Head::Op(..)
                    if g[c].data.ty.size_bytes() as u64 > settings.max_binding
                        && node_cost(g, n) > 0.0 =>
                {
                    INFEASIBLE_NS
                }
                _ => model_cost(g, n, &settings),
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
        .map(|(&c, &i)| model_cost(g, &g[c].nodes[i], &settings))
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

#[cfg(test)]
mod tests {
    use super::sm_balance;

    /// Blocks of rising work (causal query blocks) balance better started heaviest first,
    /// which is the order [`sm_balance`] simulates for them; equal blocks balance whole waves.
    #[test]
    fn heaviest_first_evens_out_causal_blocks() {
        let rising: Vec<f64> = (1..=16).map(|b| b as f64 / 16.0).collect();
        let heavy_first = sm_balance(48, &rising, 132);
        // the same works in dispatch order, lightest first: the order simulated by hand
        let mut free = vec![0.0f64; 132];
        for _ in 0..48 {
            for &w in &rising {
                let i = (0..free.len())
                    .min_by(|&a, &b| free[a].total_cmp(&free[b]))
                    .unwrap_or(0);
                free[i] += w;
            }
        }
        let total: f64 = rising.iter().sum::<f64>() * 48.0;
        let in_order = total / (free.iter().copied().fold(0.0, f64::max) * 132.0);
        assert!(heavy_first > 0.95, "{heavy_first}");
        assert!(
            heavy_first > in_order + 0.05,
            "{heavy_first} against {in_order}"
        );
        assert_eq!(sm_balance(2, &[1.0; 66], 132), 1.0);
        assert!((sm_balance(1, &[1.0; 133], 132) - 133.0 / 264.0).abs() < 1e-9);
    }
}
