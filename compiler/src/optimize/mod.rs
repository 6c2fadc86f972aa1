//! The `optimize` pass: equality saturation over the decomposed training step, then
//! extraction of the cheapest equivalent kernel graph.
//!
//! 1. **Build** an e-graph ([`lang`]) from the graph: one e-class per value, the IR's ops with
//!    their attributes as data, one root over the outputs and assign sources. The analysis
//!    ([`analysis`]) gives every class its type by the IR's own rules.
//! 2. **Rewrite**, rule set by rule set, each run bounded in iterations, e-nodes and time, and
//!    reported: algebra and layout identities ([`rules`]) to a fixed point, then fusion
//!    ([`fusion`]), which adds fused kernels beside the ops they replace.
//! 3. **Extract** ([`extract`]) one node per needed class with a DAG cost model of launches,
//!    bytes and arithmetic.
//! 4. **Merge siblings**: independent fused kernels over one iteration space that read a common
//!    value become one kernel with several outputs (a parameter's optimizer update writes the
//!    parameter and both moments in one pass); a kernel that reads another's outputs where they
//!    are written joins it the same way, the other's outputs still written (a layer norm's
//!    statistics, kept for its backward, and its normalized rows in one pass over each row).
//! 5. **Store recomputed values** ([`share`]): a value that a later kernel recomputes from
//!    several loads and an earlier kernel of the same space computes at every point is stored
//!    by the earlier kernel and loaded by the later one (a residual stream).
//!
//! The result is a [`KernelGraph`] for lowering. `--no-opt` skips this pass.

pub mod analysis;
pub mod attention;
pub mod extract;
pub mod fusion;
pub mod lang;
pub mod rules;
pub mod share;

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::time::{Duration, Instant};

use egg::{Id, Rewrite, Runner, StopReason};
use sinter_ir::{Graph, ValueDef, ValueId};

use crate::cost::CostModel;
use crate::fused::{Bound, merge_siblings};
use crate::kgraph::{KDef, KNode, KValue, KValueId, KernelGraph, KernelOp};
use crate::pipeline::{Pass, PassLog};
use analysis::Types;
use lang::{ENode, Head};

/// Bounds of one rule set's saturation.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub iterations: usize,
    pub nodes: usize,
    pub time: Duration,
}

/// What the optimizer did, for `--dump-after optimize` and `sinter inspect`.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub sets: Vec<SetReport>,
    /// Estimated cost (ns) of the graph as given and as extracted.
    pub cost_before: f64,
    pub cost_after: f64,
    /// Kernels merged as siblings.
    pub siblings_merged: usize,
    pub egraph_nodes: usize,
    pub egraph_classes: usize,
    pub total_time: Duration,
}

#[derive(Clone, Debug)]
pub struct SetReport {
    pub name: &'static str,
    pub iterations: usize,
    pub stop: String,
    pub nodes: usize,
    pub classes: usize,
    pub time: Duration,
    /// `(rule, times applied)`, in rule order.
    pub applied: Vec<(String, usize)>,
}

impl SetReport {
    /// One line: iterations, why it stopped, the e-graph's size.
    pub fn counts(&self) -> String {
        format!(
            "{} iteration(s), stopped: {}, {} e-nodes",
            self.iterations, self.stop, self.nodes
        )
    }
}

impl std::fmt::Display for SetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rule set {}: {} iteration(s), stopped: {}, {} e-nodes, {} e-classes, {:.1} ms",
            self.name,
            self.iterations,
            self.stop,
            self.nodes,
            self.classes,
            self.time.as_secs_f64() * 1e3
        )?;
        for (rule, n) in &self.applied {
            if *n > 0 {
                writeln!(f, "  {rule}: applied {n} time(s)")?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for s in &self.sets {
            write!(f, "{s}")?;
        }
        writeln!(
            f,
            "estimated cost {:.1} us -> {:.1} us; {} sibling kernel(s) merged",
            self.cost_before / 1e3,
            self.cost_after / 1e3,
            self.siblings_merged
        )?;
        write!(
            f,
            "optimize: {:.1} ms in all, e-graph of {} e-nodes in {} e-classes",
            self.total_time.as_secs_f64() * 1e3,
            self.egraph_nodes,
            self.egraph_classes
        )
    }
}

/// Default bounds: generous for graphs of a few thousand ops, and a node limit that scales with
/// the graph.
pub fn default_limits(graph_nodes: usize) -> (Limits, Limits) {
    let algebra = Limits {
        iterations: 8,
        nodes: 4 * graph_nodes + 10_000,
        time: Duration::from_secs(5),
    };
    let fusion = Limits {
        iterations: 12,
        nodes: 12 * graph_nodes + 20_000,
        time: Duration::from_secs(10),
    };
    (algebra, fusion)
}

/// Which attention kernels the optimizer may choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionPolicy {
    /// Flash kernels where the cost model finds them cheaper than the unfused products.
    #[default]
    Auto,
    /// Flash kernels wherever the rules find an attention.
    Flash,
    /// No flash kernels: the attention rules do not run.
    Unfused,
}

/// What the optimizer may do, and what prices its choices.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub attention: AttentionPolicy,
    /// The target and the compile's choices of kernel variants (including whether an
    /// attention's dQ and dK/dV kernels become one, [`attention::merge_backward`]).
    pub model: CostModel,
    /// Print each rule set's search, apply and rebuild times per iteration to stderr.
    pub trace: bool,
}

/// Optimizes a decomposed graph (see the module docs).
pub fn optimize(g: &Graph, config: &Config) -> (KernelGraph, Report) {
    optimize_logged(g, config, &mut PassLog::new(&[]))
}

/// [`optimize`], each phase reported to `log` as the pass it is ([`Pass::EGraph`] to
/// [`Pass::StoreRecomputed`]).
pub fn optimize_logged(g: &Graph, config: &Config, log: &mut PassLog) -> (KernelGraph, Report) {
    let start = Instant::now();
    let mut report = Report::default();
    let (algebra_limits, fusion_limits) = default_limits(g.nodes.len());
    log.start();
    let mut built = build(g);
    report.cost_before = original_choice(&built)
        .iter()
        .map(|(_, n)| extract::node_cost(&config.model, &built.egraph, n))
        .sum();
    let size = |eg: &analysis::Graph| {
        format!(
            "{} e-classes, {} e-nodes",
            eg.number_of_classes(),
            eg.total_number_of_nodes()
        )
    };
    let counts = size(&built.egraph);
    log.done(Pass::EGraph, counts.clone(), || {
        format!(
            "{counts}; the graph as given costs {:.1} us by the cost model\n",
            report.cost_before / 1e3
        )
    });
    let mut rules = rules::algebra();
    rules.extend(rules::layout());
    if config.attention != AttentionPolicy::Unfused {
        rules.extend(attention::rules());
    }
    let state = std::sync::Arc::new(fusion::State::default());
    for (pass, name, set, limits) in [
        (Pass::Algebra, "algebra+layout", rules, algebra_limits),
        (
            Pass::Fusion,
            "fusion",
            fusion::rules(state.clone()),
            fusion_limits,
        ),
    ] {
        let egraph = std::mem::take(&mut built.egraph);
        let (egraph, set) = run_set(name, egraph, &set, limits, config.trace);
        built.egraph = egraph;
        log.done(pass, set.counts(), || set.to_string());
        report.sets.push(set);
    }
    let settings = extract::Settings {
        model: &config.model,
        force_flash: config.attention == AttentionPolicy::Flash,
        forbid_flash: false,
    };
    // Extraction's local search does not leave the flash kernels once they are in (their
    // forward, backward and row statistics switch together, which no single move does): the
    // unfused products are extracted too, on a second thread, and the cheaper choice kept.
    let has_flash = built
        .egraph
        .classes()
        .any(|c| c.nodes.iter().any(|n| matches!(n.head, Head::Flash(_))));
    let level = levels(&built, g);
    let choice = if config.attention == AttentionPolicy::Auto && has_flash {
        let unfused = extract::Settings {
            forbid_flash: true,
            ..settings
        };
        let (flash, plain) = if cfg!(target_family = "wasm") {
            // no threads there
            (
                extract_round(&built, &level, None, settings),
                extract_round(&built, &level, None, unfused),
            )
        } else {
            std::thread::scope(|s| {
                let plain = s.spawn(|| extract_round(&built, &level, None, unfused));
                let flash = extract_round(&built, &level, None, settings);
                (
                    flash,
                    plain.join().expect("the unfused extraction does not panic"),
                )
            })
        };
        if plain.cost < flash.cost {
            plain
        } else {
            flash
        }
    } else {
        extract_round(&built, &level, None, settings)
    };
    let chosen = |choice: &extract::Choice| {
        format!(
            "{} classes chosen, estimated {:.1} us",
            choice.node.len(),
            choice.cost / 1e3
        )
    };
    log.done(Pass::Extract, chosen(&choice), || {
        to_kernel_graph(&built, g, &choice, None).to_string()
    });
    // Second round: each stored value's kernel rebuilt up to the other stored values, then
    // extraction again from the first round's choice.
    let barrier = stored(&config.model, &built.egraph, &choice);
    let state = std::sync::Arc::new(state.next_round(&built.egraph, barrier));
    let egraph = std::mem::take(&mut built.egraph);
    let (egraph, set) = run_set(
        "fusion up to stored values",
        egraph,
        &fusion::rules(state.clone()),
        fusion_limits,
        config.trace,
    );
    built.egraph = egraph;
    log.done(Pass::FusionToStored, set.counts(), || set.to_string());
    report.sets.push(set);
    let choice = extract_round(&built, &levels(&built, g), Some(&choice.node), settings);
    log.done(Pass::Reextract, chosen(&choice), || {
        to_kernel_graph(&built, g, &choice, None).to_string()
    });
    report.cost_after = choice.cost;
    report.egraph_nodes = built.egraph.total_number_of_nodes();
    report.egraph_classes = built.egraph.number_of_classes();
    // what each kernel computes inside itself, with its keys canonical in the final e-graph
    let fused = state.next_round(&built.egraph, HashSet::default());
    let mut kg = to_kernel_graph(&built, g, &choice, Some(&fused));
    let kernels = |kg: &KernelGraph| format!("{} kernels", kg.nodes.len());
    log.done(Pass::KernelGraph, kernels(&kg), || kg.to_string());
    report.siblings_merged = merge_all_siblings(&mut kg);
    log.done(
        Pass::MergeSiblings,
        format!("{} merged, {}", report.siblings_merged, kernels(&kg)),
        || kg.to_string(),
    );
    let merged = attention::merge_backward(&mut kg, &config.model);
    log.done(
        Pass::MergeFlashBackward,
        format!("{merged} merged, {}", kernels(&kg)),
        || kg.to_string(),
    );
    let stored = share::store_recomputed(&mut kg);
    report.total_time = start.elapsed();
    log.done(
        Pass::StoreRecomputed,
        format!("{stored} stored, {}", kernels(&kg)),
        || format!("{report}\n{kg}"),
    );
    (kg, report)
}

fn extract_round(
    b: &Built,
    levels: &HashMap<Id, u64>,
    previous: Option<&HashMap<Id, ENode>>,
    settings: extract::Settings,
) -> extract::Choice {
    let root = b.egraph.find(b.root);
    extract::extract(
        &b.egraph,
        root,
        levels,
        previous,
        Duration::from_secs(2),
        settings,
    )
}

/// The classes an extraction stores: those computed by a kernel (not views, literals or
/// leaves).
fn stored(model: &CostModel, g: &analysis::Graph, choice: &extract::Choice) -> HashSet<Id> {
    choice
        .node
        .iter()
        .filter(|(_, n)| extract::node_cost(model, g, n) > 0.0)
        .map(|(&c, _)| g.find(c))
        .collect()
}

/// The e-graph of a source graph.
struct Built {
    egraph: analysis::Graph,
    /// The class of every source value.
    class_of: Vec<Id>,
    /// The source graph's own node of every class it computes (children as added).
    original: HashMap<Id, ENode>,
    root: Id,
}

fn build(g: &Graph) -> Built {
    let leaves = g
        .values
        .iter()
        .map(|v| (!matches!(v.def, ValueDef::Node { .. })).then(|| v.ty.clone()))
        .collect();
    let mut egraph = analysis::Graph::new(Types {
        leaves,
        built_by: Vec::new(),
    });
    let mut class_of = vec![Id::from(0usize); g.values.len()];
    let mut original = HashMap::default();
    for v in g.value_ids() {
        if g.value(v).is_leaf() {
            let n = ENode::new(Head::Leaf(v), Vec::new());
            class_of[v.index()] = egraph.add(n.clone());
            original.insert(class_of[v.index()], n);
        }
    }
    for node in &g.nodes {
        debug_assert_eq!(node.outputs.len(), 1, "primitives have one result");
        let kids = node.inputs.iter().map(|&i| class_of[i.index()]).collect();
        let n = ENode::op(node.op, node.attrs.clone(), kids);
        let id = egraph.add(n.clone());
        class_of[node.outputs[0].index()] = id;
        original.entry(id).or_insert(n);
    }
    let mut roots: Vec<Id> = g.outputs.iter().map(|&v| class_of[v.index()]).collect();
    roots.extend(g.assigns.iter().map(|a| class_of[a.source.index()]));
    let root = egraph.add(ENode::new(Head::Root, roots));
    egraph.rebuild();
    Built {
        egraph,
        class_of,
        original,
        root,
    }
}

/// The source graph's own nodes, one per class (children canonical): the graph as given.
fn original_choice(b: &Built) -> Vec<(Id, ENode)> {
    let eg = &b.egraph;
    let mut seen = HashSet::default();
    let mut out = Vec::new();
    for (&c, n) in &b.original {
        let c = eg.find(c);
        if seen.insert(c) {
            let mut n = n.clone();
            for k in n.kids.iter_mut() {
                *k = eg.find(*k);
            }
            out.push((c, n));
        }
    }
    out
}

fn run_set(
    name: &'static str,
    egraph: analysis::Graph,
    rules: &[Rewrite<ENode, Types>],
    limits: Limits,
    trace: bool,
) -> (analysis::Graph, SetReport) {
    let t = Instant::now();
    let runner = Runner::default()
        .with_egraph(egraph)
        .with_iter_limit(limits.iterations)
        .with_node_limit(limits.nodes)
        .with_time_limit(limits.time)
        .with_scheduler(egg::SimpleScheduler)
        .run(rules);
    let stop = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("e-node limit ({n})"),
        Some(StopReason::TimeLimit(s)) => format!("time limit ({s:.1} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".to_string(),
    };
    if trace {
        for it in &runner.iterations {
            eprintln!(
                "{name}: {} nodes, search {:.1} ms, apply {:.1} ms, rebuild {:.1} ms",
                it.egraph_nodes,
                it.search_time * 1e3,
                it.apply_time * 1e3,
                it.rebuild_time * 1e3
            );
        }
    }
    let mut applied: Vec<(String, usize)> = rules.iter().map(|r| (r.name.to_string(), 0)).collect();
    for it in &runner.iterations {
        for (rule, n) in &it.applied {
            if let Some(e) = applied
                .iter_mut()
                .find(|(r, _)| r.as_str() == rule.as_str())
            {
                e.1 += n;
            }
        }
    }
    let report = SetReport {
        name,
        iterations: runner.iterations.len(),
        stop,
        nodes: runner.egraph.total_number_of_nodes(),
        classes: runner.egraph.number_of_classes(),
        time: t.elapsed(),
        applied,
    };
    let mut egraph = runner.egraph;
    egraph.rebuild();
    (egraph, report)
}

/// The level of every class (see [`extract`]): source values by topological position (the
/// lowest where classes merged), classes that rewrites made one above their operands.
fn levels(b: &Built, g: &Graph) -> HashMap<Id, u64> {
    const STRIDE: u64 = 1 << 16;
    let eg = &b.egraph;
    let mut level: HashMap<Id, u64> = HashMap::default();
    for v in g.value_ids() {
        let c = eg.find(b.class_of[v.index()]);
        let l = (v.index() as u64 + 1) * STRIDE;
        let e = level.entry(c).or_insert(l);
        *e = (*e).min(l);
    }
    level.insert(eg.find(b.root), u64::MAX - 1);
    // classes made by rewrites: in id order, which is creation order
    let mut ids: Vec<Id> = eg.classes().map(|c| c.id).collect();
    ids.sort();
    loop {
        let mut changed = false;
        for &c in &ids {
            if level.contains_key(&c) {
                continue;
            }
            let candidate = eg[c]
                .nodes
                .iter()
                .filter_map(|n| {
                    n.kids
                        .iter()
                        .map(|&k| level.get(&eg.find(k)).copied())
                        .try_fold(0u64, |m, l| l.map(|l| m.max(l)))
                })
                .min();
            if let Some(l) = candidate {
                level.insert(c, l + 1);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    relevel(eg, level)
}

/// Most violators that [`relevel`] tries to admit (each costs a search of the classes between
/// it and its highest operand in the order kept so far).
const RELEVEL_TRIES: usize = 512;

/// Reorders the levels so that nodes whose operands sit too high become choosable where that
/// keeps every choice acyclic. A flash kernel's tuple, for instance, reads the row sums
/// `rowsum(dO ∘ O)`, which the source computes after `dV = Pᵀ·dO`; the class of `dV` may still
/// take the tuple's projection, since nothing the tuple reads depends on `dV`.
///
/// Every node choosable under `level` stays choosable: its operands must precede its class.
/// Each violator in turn adds its own edges if no cycle results; a topological sort of the
/// classes under all these edges, ties broken by the old level, gives the new levels.
fn relevel(eg: &analysis::Graph, level: HashMap<Id, u64>) -> HashMap<Id, u64> {
    let lvl = |c: Id| level.get(&eg.find(c)).copied();
    // dependents[k]: the classes that must come after k
    let mut dependents: HashMap<Id, Vec<Id>> = HashMap::default();
    let mut violators: Vec<(Id, Vec<Id>)> = Vec::new();
    for class in eg.classes() {
        let Some(lc) = level.get(&class.id).copied() else {
            continue;
        };
        for n in &class.nodes {
            let kids: Option<Vec<(Id, u64)>> = n
                .kids
                .iter()
                .map(|&k| lvl(k).map(|l| (eg.find(k), l)))
                .collect();
            let Some(kids) = kids else { continue };
            if kids.iter().all(|&(_, l)| l < lc) {
                for (k, _) in kids {
                    dependents.entry(k).or_default().push(class.id);
                }
            } else if kids.iter().all(|&(k, _)| k != class.id) {
                violators.push((class.id, kids.into_iter().map(|(k, _)| k).collect()));
            }
        }
    }
    if violators.is_empty() {
        return level;
    }
    // flash projections first: they are what this is for
    violators.sort_by_key(|(c, _)| {
        let proj = eg[*c].nodes.iter().any(|n| matches!(n.head, Head::Proj(_)));
        (!proj, level[c], *c)
    });
    // A topological order of the classes under the edges so far, kept valid as edges are
    // added: a path only rises in it, so a cycle check searches no higher than the highest
    // operand instead of everything the candidate reaches.
    let mut order = Order::new(&level, &dependents);
    let mut admitted = 0;
    for (c, kids) in violators.into_iter().take(RELEVEL_TRIES) {
        if !order.closes_cycle(c, &kids, &dependents) {
            order.admit(c, &kids, &mut dependents);
            admitted += 1;
        }
    }
    if admitted == 0 {
        return level;
    }
    // Kahn's algorithm, lowest old level first
    let mut indegree: HashMap<Id, usize> = level.keys().map(|&c| (c, 0)).collect();
    for ds in dependents.values() {
        for d in ds {
            *indegree.get_mut(d).expect("a levelled class") += 1;
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<(u64, Id)>> = indegree
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(&c, _)| std::cmp::Reverse((level[&c], c)))
        .collect();
    let mut out: HashMap<Id, u64> = HashMap::default();
    while let Some(std::cmp::Reverse((_, c))) = ready.pop() {
        out.insert(c, out.len() as u64 + 1);
        for &d in dependents.get(&c).into_iter().flatten() {
            let n = indegree.get_mut(&d).expect("a levelled class");
            *n -= 1;
            if *n == 0 {
                ready.push(std::cmp::Reverse((level[&d], d)));
            }
        }
    }
    debug_assert_eq!(out.len(), level.len(), "the admitted edges are acyclic");
    out
}

/// A topological order of classes under a growing set of edges (Pearce and Kelly's dynamic
/// topological sort): adding an edge that runs against the order reorders only the classes
/// between its two ends.
struct Order {
    /// Each class's position.
    pos: HashMap<Id, usize>,
    /// Each class's predecessors (the reverse of the edges).
    preds: HashMap<Id, Vec<Id>>,
}

impl Order {
    /// The order of `level` (ties by id), which `dependents`' edges all follow.
    fn new(level: &HashMap<Id, u64>, dependents: &HashMap<Id, Vec<Id>>) -> Order {
        let mut at: Vec<Id> = level.keys().copied().collect();
        at.sort_by_key(|c| (level[c], *c));
        let pos = at.iter().enumerate().map(|(i, &c)| (c, i)).collect();
        let mut preds: HashMap<Id, Vec<Id>> = HashMap::default();
        for (&k, ds) in dependents {
            for &d in ds {
                preds.entry(d).or_default().push(k);
            }
        }
        Order { pos, preds }
    }

    /// Whether edges from each of `kids` to `c` would close a cycle: whether some operand is
    /// reachable from `c` already. Positions rise along every path, so only classes up to the
    /// highest operand's position need a look.
    fn closes_cycle(&self, c: Id, kids: &[Id], dependents: &HashMap<Id, Vec<Id>>) -> bool {
        let bound = kids.iter().map(|k| self.pos[k]).max().unwrap_or(0);
        let mut seen: HashSet<Id> = HashSet::default();
        let mut stack = vec![c];
        while let Some(x) = stack.pop() {
            if kids.contains(&x) {
                return true;
            }
            if seen.insert(x) {
                let next = dependents.get(&x).into_iter().flatten().copied();
                stack.extend(next.filter(|d| self.pos[d] <= bound));
            }
        }
        false
    }

    /// Adds the edges from each of `kids` to `c` (which close no cycle) to `dependents`,
    /// keeping the order.
    fn admit(&mut self, c: Id, kids: &[Id], dependents: &mut HashMap<Id, Vec<Id>>) {
        for &k in kids {
            dependents.entry(k).or_default().push(c);
            self.add_edge(k, c, dependents);
        }
    }

    /// Records the edge `from -> to` (already in `dependents`, and closing no cycle).
    fn add_edge(&mut self, from: Id, to: Id, dependents: &HashMap<Id, Vec<Id>>) {
        self.preds.entry(to).or_default().push(from);
        let (lb, ub) = (self.pos[&to], self.pos[&from]);
        if lb > ub {
            return;
        }
        // what `to` reaches up to `from`'s position, and what reaches `from` down to `to`'s
        let reach = |start: Id, edges: &HashMap<Id, Vec<Id>>, inside: &dyn Fn(usize) -> bool| {
            let mut seen: HashSet<Id> = HashSet::default();
            let mut stack = vec![start];
            let mut found = Vec::new();
            while let Some(x) = stack.pop() {
                if seen.insert(x) {
                    found.push(x);
                    let next = edges.get(&x).into_iter().flatten().copied();
                    stack.extend(next.filter(|y| inside(self.pos[y])));
                }
            }
            found.sort_by_key(|c| self.pos[c]);
            found
        };
        let after = reach(to, dependents, &|p| p <= ub);
        let before = reach(from, &self.preds, &|p| p >= lb);
        // the same positions, the classes reaching `from` first
        let mut slots: Vec<usize> = after.iter().chain(&before).map(|c| self.pos[c]).collect();
        slots.sort_unstable();
        for (&c, slot) in before.iter().chain(&after).zip(slots) {
            self.pos.insert(c, slot);
        }
    }
}

/// The kernel graph of an extraction: chosen nodes in dependency order.
/// The kernel graph of `choice`; `fused` (the fusion rules' state) tells which classes each
/// fused node computes inside itself, for its list of source ops and rules.
fn to_kernel_graph(
    b: &Built,
    g: &Graph,
    choice: &extract::Choice,
    fused: Option<&fusion::State>,
) -> KernelGraph {
    let eg = &b.egraph;
    let mut kg = KernelGraph {
        name: g.name.clone(),
        ..KernelGraph::default()
    };
    // leaves first, in source order, so that the artifact's manifest keeps its order
    let mut value_of: HashMap<Id, KValueId> = HashMap::default();
    for v in g.value_ids() {
        let value = g.value(v);
        let def = match &value.def {
            ValueDef::Input => KDef::Input,
            ValueDef::Param(i) => KDef::Param(i.clone()),
            ValueDef::State(i) => KDef::State(i.clone()),
            ValueDef::Node { .. } => continue,
        };
        let id = KValueId(kg.values.len() as u32);
        kg.values.push(KValue {
            name: value.name.clone(),
            ty: value.ty.clone(),
            def,
            source: Some(v),
        });
        value_of.entry(eg.find(b.class_of[v.index()])).or_insert(id);
    }
    // a name for each class: the first source value in it
    let mut first_value: HashMap<Id, ValueId> = HashMap::default();
    for v in g.value_ids() {
        first_value
            .entry(eg.find(b.class_of[v.index()]))
            .or_insert(v);
    }
    let name_of: HashMap<Id, &str> = first_value
        .iter()
        .map(|(&c, &v)| (c, g.name_of(v)))
        .collect();
    let mut used_names: HashSet<String> = kg.values.iter().map(|v| v.name.clone()).collect();
    // post-order from the root
    let root = eg.find(b.root);
    let mut order = Vec::new();
    let mut state: HashMap<Id, bool> = HashMap::default(); // false: entered, true: done
    let mut stack = vec![(root, false)];
    while let Some((c, exit)) = stack.pop() {
        if exit {
            state.insert(c, true);
            order.push(c);
            continue;
        }
        if state.contains_key(&c) {
            continue;
        }
        state.insert(c, false);
        stack.push((c, true));
        for &k in choice.node[&c].kids.iter().rev() {
            let k = eg.find(k);
            if !state.contains_key(&k) {
                stack.push((k, false));
            }
        }
    }
    let sources = SourceOps::new(b, g, choice, fused);
    let fresh_name = |c: Option<Id>, kg: &KernelGraph, used: &mut HashSet<String>| {
        let name = match c.and_then(|c| name_of.get(&c)) {
            Some(n) if !used.contains(*n) => n.to_string(),
            _ => (kg.values.len()..)
                .map(|i| format!("_k{i}"))
                .find(|n| !used.contains(n) && g.lookup(n).is_none())
                .expect("a free name"),
        };
        used.insert(name.clone());
        name
    };
    // the classes that take each result of a tuple (a flash node), for naming its results
    let mut takes: HashMap<(Id, u8), Id> = HashMap::default();
    for (&c, n) in &choice.node {
        if let Head::Proj(i) = n.head {
            takes.insert((eg.find(n.kids[0]), i), c);
        }
    }
    // a tuple's results, by index
    let mut results: HashMap<Id, Vec<KValueId>> = HashMap::default();
    for c in order {
        if c == root || value_of.contains_key(&c) {
            continue;
        }
        let node = &choice.node[&c];
        if let Head::Proj(i) = node.head {
            let tuple = eg.find(node.kids[0]);
            value_of.insert(c, results[&tuple][i as usize]);
            continue;
        }
        let inputs: Vec<KValueId> = node.kids.iter().map(|&k| value_of[&eg.find(k)]).collect();
        let index = kg.nodes.len();
        if let Head::Flash(spec) = &node.head {
            let types: Vec<sinter_ir::TensorType> =
                inputs.iter().map(|&v| kg.ty(v).clone()).collect();
            let mut outs = Vec::new();
            for (i, ty) in spec.output_types(&types).into_iter().enumerate() {
                let name = fresh_name(takes.get(&(c, i as u8)).copied(), &kg, &mut used_names);
                outs.push(kg.add_value(name, ty, index, i));
            }
            let sources: Vec<String> = takes
                .iter()
                .filter(|((t, _), _)| *t == c)
                .flat_map(|(_, &pc)| sources.absorbed(pc, node))
                .collect::<BTreeSet<String>>()
                .into_iter()
                .collect();
            kg.nodes.push(KNode {
                op: KernelOp::Flash(Box::new((**spec).clone())),
                inputs,
                outputs: outs.clone(),
                sources,
                rules: [match spec.kind {
                    crate::flash::FlashKind::Forward => attention::FLASH_FORWARD,
                    _ => attention::FLASH_BACKWARD,
                }]
                .into_iter()
                .chain((!spec.half.is_empty()).then_some(attention::FLASH_F16_RESULT))
                .map(str::to_string)
                .collect(),
            });
            results.insert(c, outs);
            continue;
        }
        let ty = eg[c].data.ty.clone();
        let name = fresh_name(Some(c), &kg, &mut used_names);
        let out = kg.add_value(name.clone(), ty, index, 0);
        kg.values[out.index()].source = first_value.get(&c).copied();
        let (op, absorbed) = match &node.head {
            Head::Op(op, attrs) => (
                KernelOp::Ir(*op, (**attrs).clone()),
                vec![format!("{name} = {}", op.name())],
            ),
            Head::Kernel(p) => (
                KernelOp::Fused(Box::new((**p).clone())),
                sources.absorbed(c, node),
            ),
            Head::Epilogue(anchor, attrs, p) => (
                KernelOp::Epilogue(*anchor, (**attrs).clone(), Box::new((**p).clone())),
                sources.absorbed(c, node),
            ),
            Head::Leaf(_) | Head::Root | Head::Flash(_) | Head::Proj(_) => {
                unreachable!("leaves, the root and tuples are not single-result kernels")
            }
        };
        // each inline absorbs one class; an epilogue's anchors are its own rule's. Where the
        // rule did not record its classes, each absorbed source op but the first (or the
        // product and the consumer) counts.
        let inlined = |start: usize| {
            let n = match sources.inside(node) {
                Some(inner) => inner.iter().filter(|&&k| !is_anchor(eg, k)).count(),
                None => absorbed.len().saturating_sub(start),
            };
            format!("fuse-producer x{n}")
        };
        let built_by = eg
            .analysis
            .built_by
            .iter()
            .find(|&&(class, _)| eg.find(class) == c)
            .map(|(_, rule)| rule.to_string());
        let mut rules = match &node.head {
            Head::Kernel(_) if built_by.is_some() => built_by.into_iter().collect(),
            Head::Kernel(_) => vec![inlined(1)],
            Head::Epilogue(anchor, ..) => {
                vec![format!("fuse-{}-epilogue", anchor.name()), inlined(2)]
            }
            _ => Vec::new(),
        };
        rules.retain(|r| !r.ends_with(" x0"));
        kg.nodes.push(KNode {
            op,
            inputs,
            outputs: vec![out],
            sources: if absorbed.is_empty() {
                vec![format!("{name} = {}", node)]
            } else {
                absorbed
            },
            rules,
        });
        value_of.insert(c, out);
    }
    kg.outputs = g
        .outputs
        .iter()
        .map(|&v| {
            (
                g.name_of(v).to_string(),
                value_of[&eg.find(b.class_of[v.index()])],
            )
        })
        .collect();
    // assign targets are leaves: their new ids
    let leaf_id = |v: ValueId| value_of[&eg.find(b.class_of[v.index()])];
    kg.assigns = g
        .assigns
        .iter()
        .map(|a| {
            (
                leaf_id(a.target),
                value_of[&eg.find(b.class_of[a.source.index()])],
            )
        })
        .collect();
    kg
}

/// Whether class `c` holds a matmul or convolution (with or without an epilogue).
fn is_anchor(eg: &analysis::Graph, c: Id) -> bool {
    eg[c].nodes.iter().any(|n| {
        matches!(
            n.head,
            Head::Op(sinter_ir::Op::Matmul | sinter_ir::Op::Conv2d, _) | Head::Epilogue(..)
        )
    })
}

/// Which source ops a fused kernel absorbed: the source values between its operands and the
/// class it computes, through the classes it computes inside itself (or, where those were not
/// recorded, up to any stored value).
struct SourceOps<'a> {
    b: &'a Built,
    g: &'a Graph,
    fused: Option<&'a fusion::State>,
    /// The last source value of each class.
    value_in: HashMap<Id, sinter_ir::ValueId>,
    /// Classes the extraction stores (their values are another kernel's outputs).
    stored: HashSet<Id>,
}

impl<'a> SourceOps<'a> {
    fn new(
        b: &'a Built,
        g: &'a Graph,
        choice: &extract::Choice,
        fused: Option<&'a fusion::State>,
    ) -> Self {
        let value_in = g
            .value_ids()
            .map(|v| (b.egraph.find(b.class_of[v.index()]), v))
            .collect();
        SourceOps {
            b,
            g,
            fused,
            value_in,
            stored: choice.node.keys().copied().collect(),
        }
    }

    /// The classes fused node `node` computes inside itself, where recorded.
    fn inside(&self, node: &ENode) -> Option<HashSet<Id>> {
        let eg = &self.b.egraph;
        let inner = self.fused?.inside(eg, node)?;
        Some(inner.iter().map(|&k| eg.find(k)).collect())
    }

    fn absorbed(&self, c: Id, node: &ENode) -> Vec<String> {
        let eg = &self.b.egraph;
        let stops: HashSet<Id> = node.kids.iter().map(|&k| eg.find(k)).collect();
        // a stored class that this node recomputes is walked through
        let inner = self.inside(node).unwrap_or_default();
        let Some(&start) = self.value_in.get(&c) else {
            return Vec::new();
        };
        let mut out = BTreeSet::new();
        let mut stack = vec![start];
        let mut seen = HashSet::default();
        while let Some(v) = stack.pop() {
            let class = eg.find(self.b.class_of[v.index()]);
            if !seen.insert(v)
                || stops.contains(&class)
                || (v != start && self.stored.contains(&class) && !inner.contains(&class))
            {
                continue;
            }
            let Some(n) = self.g.producer(v) else {
                continue;
            };
            let node = self.g.node(n);
            out.insert((v, format!("{} = {}", self.g.name_of(v), node.op.name())));
            stack.extend(node.inputs.iter().copied());
        }
        out.into_iter().map(|(_, s)| s).collect()
    }
}

/// How far back (in nodes) a fused kernel looks for a sibling to merge with.
const SIBLING_WINDOW: usize = 256;

/// Merges fused kernels of one iteration space that read a common value, or of which the later
/// reads the earlier's outputs (see [`merge_siblings`]); returns how many merges were made. Each
/// kernel, in order, absorbs an earlier one within [`SIBLING_WINDOW`] nodes whose outputs
/// nothing in between reads, so the merged kernel can take the later one's place.
fn merge_all_siblings(kg: &mut KernelGraph) -> usize {
    // elementwise primitives that extraction kept (a guard `where` reading a value stored for
    // other readers) are one-op fused programs, as lowering would make them, so they merge too
    for i in 0..kg.nodes.len() {
        if let KernelOp::Ir(op, attrs) = &kg.nodes[i].op
            && (crate::fused::Scalar::of(*op).is_some() || *op == sinter_ir::Op::Cast)
            && let [out] = kg.nodes[i].outputs[..]
        {
            let inputs: Vec<sinter_ir::TensorType> = (kg.nodes[i].inputs.iter())
                .map(|&v| kg.ty(v).clone())
                .collect();
            let program =
                crate::fused::Program::of_primitive(*op, attrs, &inputs, kg.ty(out), false);
            if let Some(program) = program {
                kg.nodes[i].op = KernelOp::Fused(Box::new(program));
            }
        }
    }
    let n = kg.nodes.len();
    let mut alive = vec![true; n];
    let mut merged = 0;
    for b in 0..n {
        if !is_fused(&kg.nodes[b]) {
            continue;
        }
        loop {
            let inputs: HashSet<KValueId> = kg.nodes[b].inputs.iter().copied().collect();
            let merge_with = |a: usize| {
                let related = kg.nodes[a]
                    .inputs
                    .iter()
                    .chain(&kg.nodes[a].outputs)
                    .any(|i| inputs.contains(i));
                (alive[a] && is_fused(&kg.nodes[a]) && related && !read_before(kg, &alive, a, b))
                    .then(|| {
                        merge_siblings(
                            &fused(&kg.nodes[a]),
                            &fused(&kg.nodes[b]),
                            &kg.nodes[a].outputs,
                        )
                    })
                    .flatten()
            };
            let candidate = (b.saturating_sub(SIBLING_WINDOW)..b)
                .rev()
                .find_map(|a| Some((a, merge_with(a)?)));
            let Some((a, m)) = candidate else { break };
            let first = std::mem::replace(
                &mut kg.nodes[a],
                KNode {
                    op: KernelOp::Fused(Box::new(m.program.clone())),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    sources: Vec::new(),
                    rules: Vec::new(),
                },
            );
            let second = &mut kg.nodes[b];
            // a reader of the first kernel's outputs joins it; independent kernels are siblings
            let rule = if second.inputs.iter().any(|v| first.outputs.contains(v)) {
                "merge-reader"
            } else {
                "merge-siblings"
            };
            let mut outputs = first.outputs;
            outputs.extend(second.outputs.iter().copied());
            let mut sources = first.sources;
            sources.extend(second.sources.iter().cloned());
            let rules = joined_rules(first.rules, &second.rules, rule);
            *second = KNode {
                op: KernelOp::Fused(Box::new(m.program)),
                inputs: m.operands,
                outputs,
                sources,
                rules,
            };
            alive[a] = false;
            merged += 1;
        }
    }
    keep_alive(kg, &alive);
    merged
}

/// The rules of two merged kernels and of the merge, each once, in order.
fn joined_rules(mut rules: Vec<String>, second: &[String], merge: &str) -> Vec<String> {
    for r in second.iter().map(String::as_str).chain([merge]) {
        if !rules.iter().any(|x| x == r) {
            rules.push(r.to_string());
        }
    }
    rules
}

/// Drops the nodes not `alive` and renumbers the values' defining nodes.
fn keep_alive(kg: &mut KernelGraph, alive: &[bool]) {
    let nodes = std::mem::take(&mut kg.nodes);
    kg.nodes = nodes
        .into_iter()
        .zip(alive)
        .filter_map(|(n, &keep)| keep.then_some(n))
        .collect();
    renumber(kg);
}

fn is_fused(n: &KNode) -> bool {
    matches!(n.op, KernelOp::Fused(_))
}

fn fused(n: &KNode) -> Bound<KValueId> {
    match &n.op {
        KernelOp::Fused(p) => Bound {
            program: (**p).clone(),
            operands: n.inputs.clone(),
        },
        _ => unreachable!("a fused node"),
    }
}

/// Whether some live node after `a` and before `b` reads `a`'s outputs (the merged kernel takes
/// `b`'s place, so nothing before it may read them; `b` itself may, through the merge).
fn read_before(kg: &KernelGraph, alive: &[bool], a: usize, b: usize) -> bool {
    let outputs = &kg.nodes[a].outputs;
    kg.nodes[a + 1..b]
        .iter()
        .zip(&alive[a + 1..b])
        .any(|(n, &live)| live && n.inputs.iter().any(|v| outputs.contains(v)))
}

/// Recomputes every value's defining node index after nodes moved.
fn renumber(kg: &mut KernelGraph) {
    for (i, n) in kg.nodes.iter().enumerate() {
        for (j, &o) in n.outputs.iter().enumerate() {
            kg.values[o.index()].def = KDef::Node { node: i, index: j };
        }
    }
}

/// The e-graph of a graph after some rule sets, for tests: every equivalence it holds can be
/// turned into a kernel graph and evaluated against the source.
pub struct Exploration<'g> {
    built: Built,
    source: &'g Graph,
    pub sets: Vec<SetReport>,
}

/// Runs the algebra and layout rules, and with `fusion` the fusion rules, over `g`.
pub fn explore(g: &Graph, fusion: bool) -> Exploration<'_> {
    let (algebra_limits, fusion_limits) = default_limits(g.nodes.len());
    let mut built = build(g);
    let mut sets = Vec::new();
    let mut rules = rules::algebra();
    rules.extend(rules::layout());
    rules.extend(attention::rules());
    let mut plan = vec![("algebra+layout", rules, algebra_limits)];
    if fusion {
        let state = std::sync::Arc::new(fusion::State::default());
        plan.push(("fusion", fusion::rules(state), fusion_limits));
    }
    for (name, set, limits) in plan {
        let egraph = std::mem::take(&mut built.egraph);
        let (egraph, report) = run_set(name, egraph, &set, limits, false);
        built.egraph = egraph;
        sets.push(report);
    }
    Exploration {
        built,
        source: g,
        sets,
    }
}

impl Exploration<'_> {
    /// How often each rule applied, over every set run.
    pub fn applied(&self, rule: &str) -> usize {
        self.sets
            .iter()
            .flat_map(|s| s.applied.iter())
            .filter(|(r, _)| r == rule)
            .map(|(_, n)| n)
            .sum()
    }

    /// The kernel graph of the source's own nodes (where a rule merged a class with one of its
    /// operands, that operand), then for each node of each class that is not the source's own,
    /// the kernel graph that computes that class with that node and every other class as the
    /// source does (or, for classes the rules made, with some node of theirs); at most `limit`
    /// of them, with what each is.
    pub fn variants(&self, limit: usize) -> Vec<(String, KernelGraph)> {
        let b = &self.built;
        let eg = &b.egraph;
        let levels = levels(b, self.source);
        let original: HashMap<Id, ENode> = original_choice(b).into_iter().collect();
        let model = CostModel::default();
        let settings = extract::Settings {
            model: &model,
            force_flash: false,
            forbid_flash: false,
        };
        let root = eg.find(b.root);
        // the source's own nodes where they are acyclic, some node elsewhere
        let default =
            extract::extract(eg, root, &levels, Some(&original), Duration::ZERO, settings);
        let mut out = vec![(
            "the source's nodes".to_string(),
            to_kernel_graph(b, self.source, &default, None),
        )];
        for class in eg.classes() {
            for n in &class.nodes {
                if out.len() >= limit {
                    return out;
                }
                if original.get(&class.id) == Some(n) || matches!(n.head, Head::Root) {
                    continue;
                }
                let mut prev = original.clone();
                prev.insert(class.id, n.clone());
                let choice =
                    extract::extract(eg, root, &levels, Some(&prev), Duration::ZERO, settings);
                if choice.node.get(&class.id) != Some(n) {
                    continue; // not reachable from the outputs, or not acyclic here
                }
                let what = format!("class {} as {n}", class.id);
                out.push((what, to_kernel_graph(b, self.source, &choice, None)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// Whether `to` is reachable from `from` along `edges` (a plain search, for checking).
    fn reaches(edges: &HashMap<Id, Vec<Id>>, from: Id, to: Id) -> bool {
        let mut seen: HashSet<Id> = HashSet::default();
        let mut stack = vec![from];
        while let Some(x) = stack.pop() {
            if x == to {
                return true;
            }
            if seen.insert(x) {
                stack.extend(edges.get(&x).into_iter().flatten().copied());
            }
        }
        false
    }

    /// The classes of a graph, their levels and the edges (`relevel`'s `dependents`).
    type Levelled = (Vec<Id>, HashMap<Id, u64>, HashMap<Id, Vec<Id>>);

    /// A random graph of 3 to 42 classes over random levels, with edges that follow the
    /// levels (as `relevel` starts with).
    fn random_graph(rng: &mut Rng) -> Levelled {
        let n = 3 + rng.below(40) as usize;
        let ids: Vec<Id> = (0..n).map(Id::from).collect();
        let level: HashMap<Id, u64> = ids.iter().map(|&c| (c, rng.below(8))).collect();
        let mut dependents: HashMap<Id, Vec<Id>> = HashMap::default();
        for _ in 0..n {
            let (a, b) = (
                ids[rng.below(n as u64) as usize],
                ids[rng.below(n as u64) as usize],
            );
            if level[&a] < level[&b] {
                dependents.entry(a).or_default().push(b);
            }
        }
        (ids, level, dependents)
    }

    /// `Order` keeps a topological order of every edge added, whatever order the edges come
    /// in: random graphs over random initial levels, each acyclic edge added one by one.
    #[test]
    fn order_stays_topological_as_edges_arrive() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut against = 0;
        for _ in 0..60 {
            let (ids, level, mut dependents) = random_graph(&mut rng);
            let n = ids.len();
            let mut order = Order::new(&level, &dependents);
            for _ in 0..3 * n {
                let (a, b) = (
                    ids[rng.below(n as u64) as usize],
                    ids[rng.below(n as u64) as usize],
                );
                if a == b || reaches(&dependents, b, a) {
                    continue;
                }
                against += usize::from(order.pos[&a] > order.pos[&b]);
                dependents.entry(a).or_default().push(b);
                order.add_edge(a, b, &dependents);
                let mut slots: Vec<usize> = order.pos.values().copied().collect();
                slots.sort_unstable();
                assert_eq!(
                    slots,
                    (0..n).collect::<Vec<_>>(),
                    "positions stay a permutation"
                );
                for (k, ds) in &dependents {
                    for d in ds {
                        assert!(
                            order.pos[k] < order.pos[d],
                            "edge {k} -> {d} runs backwards"
                        );
                    }
                }
            }
        }
        assert!(
            against > 100,
            "the edges exercise reordering ({against} ran against it)"
        );
    }

    /// `closes_cycle` agrees with a plain search on random candidates of one to four operands
    /// (as `relevel` proposes them), with edges admitted before it through `admit`.
    #[test]
    fn cycle_checks_agree_with_a_plain_search() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (mut cycles, mut admitted) = (0, 0);
        for _ in 0..60 {
            let (ids, level, mut dependents) = random_graph(&mut rng);
            let n = ids.len();
            let mut order = Order::new(&level, &dependents);
            for _ in 0..3 * n {
                let c = ids[rng.below(n as u64) as usize];
                let kids: Vec<Id> = (0..1 + rng.below(4))
                    .map(|_| ids[rng.below(n as u64) as usize])
                    .filter(|&k| k != c)
                    .collect();
                if kids.is_empty() {
                    continue;
                }
                let plain = kids.iter().any(|&k| reaches(&dependents, c, k));
                assert_eq!(order.closes_cycle(c, &kids, &dependents), plain);
                if plain {
                    cycles += 1;
                } else {
                    order.admit(c, &kids, &mut dependents);
                    admitted += 1;
                }
            }
        }
        assert!(
            cycles > 100 && admitted > 100,
            "{cycles} cycles, {admitted} admitted"
        );
    }

    /// The cases a bound on the search could get wrong: the only path leads to the highest
    /// operand; the path runs through an edge admitted for an earlier candidate, against the
    /// initial levels.
    #[test]
    fn cycle_checks_at_the_bound() {
        let id = Id::from;
        // levels in id order; edges 0 -> 1 -> 2
        let level: HashMap<Id, u64> = (0..6).map(|i| (id(i), i as u64)).collect();
        let mut dependents: HashMap<Id, Vec<Id>> = HashMap::default();
        dependents.entry(id(0)).or_default().push(id(1));
        dependents.entry(id(1)).or_default().push(id(2));
        let mut order = Order::new(&level, &dependents);
        // 0 and 2 into 1: 1 reaches 2, the highest operand, and only it
        assert!(order.closes_cycle(id(1), &[id(0), id(2)], &dependents));
        // 3 into 0: nothing from 0 reaches 3
        assert!(!order.closes_cycle(id(0), &[id(3)], &dependents));
        order.admit(id(0), &[id(3)], &mut dependents);
        // now 3 -> 0 -> 1 -> 2: 2 into 3 closes a cycle through the admitted edge, which the
        // initial levels order the other way
        assert!(order.closes_cycle(id(3), &[id(2)], &dependents));
        // 5 into 4: no path
        assert!(!order.closes_cycle(id(4), &[id(5)], &dependents));
    }
}
