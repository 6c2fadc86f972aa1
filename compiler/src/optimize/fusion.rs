//! Fusion rules: each adds, to a consumer's e-class, a fused kernel that computes the consumer
//! with one of its producers inlined ([`Bound::inline`]). The consumer's unfused form stays
//! in the class; extraction decides which to keep, so a value several kernels read may be
//! stored once or recomputed in each, whichever the cost model prefers.
//!
//! Every fusible e-node has a program view ([`program_of`]): an elementwise primitive is a
//! one-op map, a reduction a one-phase program, a view op (permute, transpose, unsqueeze,
//! squeeze, broadcast) a map whose access renames axes, a constant or `iota` a map without
//! operands, a kernel its own program. Fusion only ever grows the *largest* kernel of a class
//! with the *largest* kernel of a producer's class, so each class gains at most one kernel per
//! operand and iteration, and depth doubles per iteration: saturation stays linear in the graph.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use sinter_ir::{Attrs, DType, Op, TensorType, key};

use super::analysis::Graph;
use super::lang::{ENode, Head, Interned};
use crate::fused::{self, Access, Arg, Axis, Bound, Inst, Output, Program, Scalar};

/// The program view of `node` (see the module docs), or `None` for nodes that are not fusible
/// (matmul, convolution, concat, ...). `consumer` excludes the nodes that are fused only as
/// producers (views, literals): on their own they would be copies.
pub fn program_of(g: &Graph, node: &ENode, consumer: bool) -> Option<Bound<Id>> {
    let kid_ty = |i: usize| g[node.kids[i]].data.ty.clone();
    let out = |g: &Graph| super::analysis::node_type(g, node);
    let bound = |program: Program| {
        Some(Bound {
            program,
            operands: node.kids.iter().map(|&k| g.find(k)).collect(),
        })
    };
    match &node.head {
        Head::Kernel(p) => bound((**p).clone()),
        Head::Op(op, attrs) => {
            let op = *op;
            let inputs: Vec<sinter_ir::TensorType> = (0..node.kids.len()).map(kid_ty).collect();
            if let Some(p) = Program::of_primitive(op, attrs, &inputs, &out(g), !consumer) {
                return bound(p);
            }
            match op {
                _ if consumer => None,
                Op::Permute
                | Op::Transpose
                | Op::Unsqueeze
                | Op::Squeeze
                | Op::BroadcastTo
                | Op::Reshape => view_program(&kid_ty(0), &out(g), node).and_then(bound),
                // read through windows by the consumer they are fused into; on their own they
                // stay copies (whose parts lowering can write in place). A part that is a
                // reshape of a permuted tensor can need a copy, which a concat's lowering makes
                // straight into the part; read through a window, it would be copied first.
                Op::Concat | Op::SliceGrad if node.kids.iter().any(|&k| copied_reshape(g, k)) => {
                    None
                }
                Op::Concat => {
                    Program::concat(&out(g), &inputs, attrs.of(key::AXIS)).and_then(bound)
                }
                Op::SliceGrad if attrs.of(key::STEP) == 1 => Program::padded(
                    &out(g),
                    &inputs[0],
                    attrs.of(key::AXIS),
                    attrs.of(key::START),
                )
                .and_then(bound),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether class `c` holds a reshape of a permuted or transposed tensor (which lowering may
/// have to copy: `layout::View::reshape`).
fn copied_reshape(g: &Graph, c: Id) -> bool {
    let is = |c: Id, ops: &[Op]| {
        g[c].nodes
            .iter()
            .any(|n| matches!(&n.head, Head::Op(op, _) if ops.contains(op)))
    };
    g[c].nodes.iter().any(|n| {
        matches!(&n.head, Head::Op(Op::Reshape, _)) && is(n.kids[0], &[Op::Permute, Op::Transpose])
    })
}

/// [`program_of`] borrowing a kernel's own program rather than copying it.
fn program_ref<'n>(
    g: &Graph,
    node: &'n ENode,
    consumer: bool,
) -> Option<(Cow<'n, Program>, Vec<Id>)> {
    match &node.head {
        Head::Kernel(p) => Some((
            Cow::Borrowed(&**p),
            node.kids.iter().map(|&k| g.find(k)).collect(),
        )),
        _ => program_of(g, node, consumer).map(|b| (Cow::Owned(b.program), b.operands)),
    }
}

/// A view op as a copy program whose operand access maps the view's axes onto the input's.
/// `reshape` qualifies when it only inserts or removes extent-1 axes.
fn view_program(input: &TensorType, out: &TensorType, node: &ENode) -> Option<Program> {
    let (op, attrs) = node.ir()?;
    let rank = out.rank();
    // For each input axis: the output axis that indexes it (None: extent 1).
    let src: Vec<Option<usize>> = match op {
        Op::Permute => {
            let perm = attrs.of(key::PERM);
            (0..input.rank())
                .map(|a| perm.iter().position(|&p| p == a))
                .collect()
        }
        Op::Transpose => {
            let (d0, d1) = (attrs.of(key::DIM0), attrs.of(key::DIM1));
            (0..input.rank())
                .map(|a| {
                    Some(if a == d0 {
                        d1
                    } else if a == d1 {
                        d0
                    } else {
                        a
                    })
                })
                .collect()
        }
        Op::Unsqueeze => {
            let axis = attrs.of(key::AXIS);
            (0..input.rank())
                .map(|a| Some(if a < axis { a } else { a + 1 }))
                .collect()
        }
        Op::Squeeze => {
            let axis = attrs.of(key::AXIS);
            (0..input.rank())
                .map(|a| match a.cmp(&axis) {
                    std::cmp::Ordering::Less => Some(a),
                    std::cmp::Ordering::Equal => None,
                    std::cmp::Ordering::Greater => Some(a - 1),
                })
                .collect()
        }
        Op::BroadcastTo => {
            let lead = rank - input.rank();
            (0..input.rank()).map(|a| Some(lead + a)).collect()
        }
        Op::Reshape => {
            // only extent-1 axes inserted or removed: match the other axes in order
            let big_in: Vec<usize> = (0..input.rank()).filter(|&a| input.shape[a] != 1).collect();
            let big_out: Vec<usize> = (0..rank).filter(|&a| out.shape[a] != 1).collect();
            if big_in.len() != big_out.len()
                || big_in
                    .iter()
                    .zip(&big_out)
                    .any(|(&a, &b)| input.shape[a] != out.shape[b])
            {
                return None;
            }
            (0..input.rank())
                .map(|a| big_in.iter().position(|&x| x == a).map(|i| big_out[i]))
                .collect()
        }
        _ => return None,
    };
    let axes = src
        .iter()
        .enumerate()
        .map(|(a, s)| match s {
            Some(o) if input.shape[a] != 1 => Axis::Space(*o as u8),
            _ => Axis::One,
        })
        .collect();
    let mut p = Program::map(&out.shape, Scalar::Cast(input.dtype), &[], input.dtype);
    // replace the map's body with a load of the one operand through `axes`
    p.operands = vec![Access {
        dtype: input.dtype,
        axes,
    }];
    p.insts = vec![Inst::Load(0)];
    p.outputs = vec![Output {
        value: 0,
        access: crate::fused::broadcast_access(input.dtype, &out.shape, &out.shape),
    }];
    p.check().ok()?;
    Some(p)
}

/// What the fusion rules share: the attempts already made, the classes each fused kernel
/// computes inside itself, and the barrier of classes that must not be inlined (the values a
/// previous extraction stores, so that a second round builds each stored value's kernel up to
/// the other stored values).
#[derive(Default)]
pub struct State {
    /// `(consumer node, operand, producer node)` of every inline tried, kept or not.
    tried: Mutex<HashSet<Tried>>,
    /// `(consumer node, operand, anchor node)` of every epilogue tried, kept or not.
    tried_epilogues: Mutex<HashSet<(Arc<ENode>, usize, ENode)>>,
    /// By fused node (kernel or epilogue) with canonical operands.
    absorbed: Mutex<HashMap<ENode, Arc<Vec<Id>>>>,
    largest: Mutex<Largest>,
    touched: Mutex<Touched>,
    pub barrier: HashSet<Id>,
}

/// The classes where the fusion rules may find something new.
#[derive(Default)]
struct Touched {
    /// The classes that gained a node (or whose node gained what it absorbed) since the
    /// searches began (`None`: any class).
    since: Option<HashSet<Id>>,
    /// The classes the searches between two applications visit (`None`: every class): those
    /// touched before, and the classes reading them.
    dirty: Option<Arc<HashSet<Id>>>,
}

/// A consumer node, its operand and the producer node inlined there.
type Tried = (Arc<ENode>, usize, Arc<ENode>);

/// [`largest_node`] of each class and role, remembered between e-graph rebuilds. Between two
/// rebuilds a class's node list only grows (`add` makes one-node classes, `union` concatenates
/// lists), so an entry is current while its class has as many nodes as when it was scanned.
/// A rebuild sorts, deduplicates and re-canonicalizes the lists, so the first search after
/// an application starts afresh; so does a union of two classes that both existed (it changes
/// other nodes' canonical operands, by which [`State::inside`] looks them up).
#[derive(Default)]
struct Largest {
    /// An application happened since the entries were made (the runner rebuilds after it).
    stale: bool,
    /// A fusion rule has searched.
    searched: bool,
    /// By canonical class and role (consumer or producer): the class's node count when
    /// scanned, and its largest fusible node.
    by_class: HashMap<(Id, bool), (usize, Option<Ranked>)>,
}

impl State {
    /// A fresh state for a round with `barrier`, keeping what kernels absorbed (with their
    /// operands and absorbed classes re-canonicalized in `g`).
    pub fn next_round(&self, g: &Graph, barrier: HashSet<Id>) -> State {
        let old = self.absorbed.lock().expect("not poisoned");
        let absorbed = old
            .iter()
            .map(|(node, inner)| {
                let inner = inner.iter().map(|&k| g.find(k)).collect();
                (canonical(g, node), Arc::new(inner))
            })
            .collect();
        State {
            absorbed: Mutex::new(absorbed),
            barrier,
            ..State::default()
        }
    }

    /// Whether class `c` gets new kernels in this round: every class in the first, the stored
    /// classes (the barrier) in a round with a barrier.
    fn targets(&self, g: &Graph, c: Id) -> bool {
        self.barrier.is_empty() || self.barrier.contains(&g.find(c))
    }

    /// The classes a fused node (a kernel or an epilogue) computes inside itself, where the
    /// rule that built it recorded them.
    pub fn inside(&self, g: &Graph, node: &ENode) -> Option<Arc<Vec<Id>>> {
        if !matches!(node.head, Head::Kernel(_) | Head::Epilogue(..)) {
            return None;
        }
        let absorbed = self.absorbed.lock().expect("not poisoned");
        // the nodes of a rebuilt e-graph's classes are canonical already
        if node.kids.iter().all(|&k| g.find(k) == k) {
            absorbed.get(node).cloned()
        } else {
            absorbed.get(&canonical(g, node)).cloned()
        }
    }

    /// Whether a node computing the classes `inner` inside itself computes a barrier class.
    fn crosses_barrier(&self, g: &Graph, inner: Option<&Vec<Id>>) -> bool {
        !self.barrier.is_empty()
            && inner.is_some_and(|inner| inner.iter().any(|&c| self.barrier.contains(&g.find(c))))
    }

    fn lock_largest(&self) -> std::sync::MutexGuard<'_, Largest> {
        self.largest.lock().expect("not poisoned")
    }

    fn lock_touched(&self) -> std::sync::MutexGuard<'_, Touched> {
        self.touched.lock().expect("not poisoned")
    }

    fn touch(&self, c: Id) {
        if let Some(since) = self.lock_touched().since.as_mut() {
            since.insert(c);
        }
    }

    /// Called before a fusion rule searches; returns the classes to search (`None`: all).
    /// After an application it forgets the largest nodes and starts the next set of touched
    /// classes. A class outside the set has the same largest node, reading operand classes
    /// with the same largest nodes and anchors, as at the previous search, so each of its
    /// combinations was tried then (or was a match, tried when it applied). Applications
    /// fuse into a class's largest node as it is when they run, which the same iteration's
    /// applications may have grown, but only in classes that had matches, which are in the
    /// set.
    fn searching(&self, g: &Graph) -> Option<Arc<HashSet<Id>>> {
        let mut largest = self.lock_largest();
        let mut touched = self.lock_touched();
        if largest.stale || !largest.searched {
            largest.by_class.clear();
            largest.stale = false;
            touched.dirty = match touched.since.take() {
                Some(since) if largest.searched => {
                    let mut dirty = HashSet::default();
                    for c in since {
                        let c = g.find(c);
                        dirty.insert(c);
                        dirty.extend(g[c].parents().map(|p| g.find(p)));
                    }
                    Some(Arc::new(dirty))
                }
                _ => None,
            };
            touched.since = Some(HashSet::default());
            largest.searched = true;
        }
        touched.dirty.clone()
    }

    /// Adds `fused` to the e-graph in class `eclass` (the rules' last step); returns the
    /// changed class, if any.
    fn add(&self, g: &mut Graph, fused: ENode, eclass: Id) -> Vec<Id> {
        let classes = g.number_of_classes();
        let before = g.find(eclass);
        let old_len = g[before].nodes.len();
        let id = g.add(fused.clone());
        let existed = g.number_of_classes() == classes;
        let changed = g.union(id, eclass);
        let ranks = [true, false].map(|consumer| rank(g, &fused, consumer, self));
        let mut largest = self.lock_largest();
        largest.stale = true;
        if existed && changed {
            // two old classes merged: other nodes' operands are no longer canonical
            largest.by_class.clear();
            self.lock_touched().since = None;
        } else if changed {
            self.touch(g.find(eclass));
        }
        if !existed && changed && old_len > 1 {
            // the class's nodes are its old nodes and then `fused` (a union puts the longer
            // list first), so its largest node is the old one unless `fused` is larger
            let root = g.find(eclass);
            for (consumer, rank) in [true, false].into_iter().zip(ranks) {
                let Some((len, best)) = largest.by_class.remove(&(before, consumer)) else {
                    continue;
                };
                if len != old_len {
                    continue;
                }
                let best = match rank {
                    Some(r) if best.as_ref().is_none_or(|(b, _)| r > *b) => {
                        Some((r, Arc::new(fused.clone())))
                    }
                    _ => best,
                };
                largest.by_class.insert((root, consumer), (len + 1, best));
            }
        }
        if changed { vec![id] } else { Vec::new() }
    }

    fn record(&self, g: &Graph, node: &ENode, inner: Vec<Id>) {
        if !matches!(node.head, Head::Kernel(_) | Head::Epilogue(..)) {
            return;
        }
        let key = canonical(g, node);
        let mut absorbed = self.absorbed.lock().expect("not poisoned");
        if absorbed.contains_key(&key) {
            return;
        }
        // a node already in the e-graph (made by another rule) changes its size
        if let Some(c) = g.lookup(key.clone()) {
            let mut largest = self.lock_largest();
            largest.by_class.remove(&(c, true));
            largest.by_class.remove(&(c, false));
            self.touch(c);
        }
        absorbed.insert(key, Arc::new(inner));
    }
}

/// `node` with its operands' canonical classes.
fn canonical(g: &Graph, node: &ENode) -> ENode {
    ENode::new(
        node.head.clone(),
        node.kids.iter().map(|&k| g.find(k)).collect(),
    )
}

/// The size of `node` as a fusible node (its instruction count), without building its
/// program; `None` when it is not fusible in that role (see [`program_of`]).
fn fusible_size(node: &ENode, consumer: bool) -> Option<usize> {
    match &node.head {
        Head::Kernel(p) => Some(p.insts.len()),
        Head::Op(op, _) => {
            let op = *op;
            let as_consumer = Scalar::of(op).is_some()
                || matches!(op, Op::Cast | Op::Sum | Op::Max | Op::Min | Op::Argmax);
            let as_producer = matches!(
                op,
                Op::Constant
                    | Op::Iota
                    | Op::Permute
                    | Op::Transpose
                    | Op::Unsqueeze
                    | Op::Squeeze
                    | Op::BroadcastTo
                    | Op::Reshape
                    | Op::Concat
                    | Op::SliceGrad
            );
            (as_consumer || (!consumer && as_producer)).then_some(1 + node.kids.len())
        }
        _ => None,
    }
}

/// The largest fusible node of class `c` (most classes computed inside, then most
/// instructions) that does not compute a barrier class inside itself; remembered in
/// [`State::largest`] until the class changes.
fn largest_node(g: &Graph, c: Id, consumer: bool, state: &State) -> Option<Arc<ENode>> {
    let c = g.find(c);
    let len = g[c].nodes.len();
    if let Some((scanned, best)) = state.lock_largest().by_class.get(&(c, consumer))
        && *scanned == len
    {
        return best.as_ref().map(|(_, n)| n.clone());
    }
    let best = scan_largest(g, c, consumer, state);
    let node = best.as_ref().map(|(_, n)| n.clone());
    state
        .lock_largest()
        .by_class
        .insert((c, consumer), (len, best));
    node
}

/// [`largest_node`] without the memo: one pass over the class's nodes, the first of the
/// largest kept.
fn scan_largest(g: &Graph, c: Id, consumer: bool, state: &State) -> Option<Ranked> {
    let mut best: Option<(Rank, &ENode)> = None;
    for n in &g[c].nodes {
        if let Some(rank) = rank(g, n, consumer, state)
            && best.is_none_or(|(b, _)| rank > b)
        {
            best = Some((rank, n));
        }
    }
    best.map(|(rank, n)| (rank, Arc::new(n.clone())))
}

/// How large a fusible node is: the classes it computes inside itself, then its instructions.
type Rank = (usize, usize);

/// A node with its rank.
type Ranked = (Rank, Arc<ENode>);

/// The rank of `node` in its role, or `None` when it is not fusible in that role or computes
/// a barrier class inside itself.
fn rank(g: &Graph, node: &ENode, consumer: bool, state: &State) -> Option<Rank> {
    let size = fusible_size(node, consumer)?;
    let inner = state.inside(g, node);
    if state.crosses_barrier(g, inner.as_deref()) {
        return None;
    }
    Some((inner.map_or(0, |v| v.len()), size))
}

/// `consumer(.., producer(xs), ..) = fused(.., xs, ..)`: the consumer's largest kernel with
/// one producer's largest kernel inlined.
pub struct Fuse {
    state: Arc<State>,
}

/// The matches of `searcher` in every class or in the classes `only`, in the e-graph's order
/// of classes, at most `limit` in all (what egg's default `search_with_limit` does).
fn search_classes<'a, S: Searcher<ENode, super::analysis::Types>>(
    searcher: &'a S,
    g: &Graph,
    only: Option<&HashSet<Id>>,
    mut limit: usize,
) -> Vec<SearchMatches<'a, ENode>> {
    let mut matches = Vec::new();
    for class in g.classes() {
        if limit == 0 {
            break;
        }
        if only.is_some_and(|only| !only.contains(&class.id)) {
            continue;
        }
        if let Some(m) = searcher.search_eclass_with_limit(g, class.id, limit) {
            limit -= m.substs.len();
            matches.push(m);
        }
    }
    matches
}

/// The operand index of a match, carried in the substitution.
fn operand_var() -> Var {
    "?operand".parse().expect("a variable name")
}

impl Searcher<ENode, super::analysis::Types> for Fuse {
    fn search_eclass_with_limit(
        &self,
        g: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, ENode>> {
        let state = &self.state;
        if !state.targets(g, eclass) {
            return None;
        }
        let node = largest_node(g, eclass, true, state)?;
        let mut substs = Vec::new();
        let tried = state.tried.lock().expect("not poisoned");
        for (i, &kid) in node.kids.iter().enumerate() {
            let kid = g.find(kid);
            if kid == g.find(eclass) || substs.len() >= limit || state.barrier.contains(&kid) {
                continue;
            }
            let Some(producer) = largest_node(g, kid, false, state) else {
                continue;
            };
            if tried.contains(&(node.clone(), i, producer)) {
                continue;
            }
            let mut s = Subst::with_capacity(1);
            s.insert(operand_var(), Id::from(i));
            substs.push(s);
        }
        (!substs.is_empty()).then(|| SearchMatches {
            eclass,
            substs,
            ast: None,
        })
    }

    fn search_with_limit(&self, g: &Graph, limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let dirty = self.state.searching(g);
        search_classes(self, g, dirty.as_deref(), limit)
    }

    fn vars(&self) -> Vec<Var> {
        vec![operand_var()]
    }
}

impl Applier<ENode, super::analysis::Types> for Fuse {
    fn apply_one(
        &self,
        g: &mut Graph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<ENode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let i: usize = subst[operand_var()].into();
        let state = &self.state;
        let Some(node) = largest_node(g, eclass, true, state) else {
            return Vec::new();
        };
        let Some(consumer) = program_ref(g, &node, true) else {
            return Vec::new();
        };
        if i >= node.kids.len() || state.barrier.contains(&g.find(node.kids[i])) {
            return Vec::new();
        }
        let Some(pnode) = largest_node(g, node.kids[i], false, state) else {
            return Vec::new();
        };
        let Some(producer) = program_ref(g, &pnode, false) else {
            return Vec::new();
        };
        if !state
            .tried
            .lock()
            .expect("not poisoned")
            .insert((node.clone(), i, pnode.clone()))
        {
            return Vec::new();
        }
        let Some(merged) = fused::inline(&consumer.0, &consumer.1, i, &producer.0, &producer.1)
        else {
            return Vec::new();
        };
        let mut inner: Vec<Id> = vec![g.find(node.kids[i])];
        for n in [&node, &pnode] {
            if let Some(more) = state.inside(g, n) {
                inner.extend(more.iter().copied());
            }
        }
        let fused = ENode::new(Head::Kernel(Interned::new(merged.program)), merged.operands);
        state.record(g, &fused, inner);
        state.add(g, fused, eclass)
    }
}

/// An operand slot of a matmul epilogue: the product, or an e-class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Slot {
    Product,
    Class(Id),
}

/// `f(.., anchor(x, ..), ..) = anchor_epilogue[f](x, .., ..)`: an elementwise consumer of a
/// matrix product or a convolution (the anchor; or of an epilogue already fused into one)
/// applied as the anchor's result is stored.
pub struct Epilogue {
    state: Arc<State>,
    /// `matmul` or `conv2d`.
    anchor: Op,
}

/// What [`anchored`] finds in a class.
struct Anchored<'g> {
    attrs: Interned<Attrs>,
    /// The anchor op's operands.
    kids: Vec<Id>,
    /// The epilogue (a plain anchor has the identity) and its operands.
    epilogue: Cow<'g, Program>,
    operands: Vec<Slot>,
    /// The classes computed inside the anchor node.
    inner: Vec<Id>,
}

/// The anchor node of class `c` that [`anchored`] reads: its first `anchor` op or epilogue.
fn anchor_node(g: &Graph, c: Id, anchor: Op) -> Option<&ENode> {
    g[c].nodes.iter().find(|node| match &node.head {
        Head::Op(op, _) | Head::Epilogue(op, ..) => *op == anchor,
        _ => false,
    })
}

/// The anchor node of class `c` (see [`anchor_node`]) with its epilogue.
fn anchored<'g>(g: &'g Graph, c: Id, anchor: Op, state: &State) -> Option<Anchored<'g>> {
    let node = anchor_node(g, c, anchor)?;
    match &node.head {
        Head::Epilogue(_, attrs, p) => {
            let split = node.anchor_operands();
            let mut operands = vec![Slot::Product];
            operands.extend(node.kids[split..].iter().map(|&k| Slot::Class(k)));
            Some(Anchored {
                attrs: attrs.clone(),
                kids: node.kids[..split].to_vec(),
                epilogue: Cow::Borrowed(&**p),
                operands,
                inner: state
                    .inside(g, node)
                    .map_or_else(Vec::new, |inner| inner.to_vec()),
            })
        }
        Head::Op(_, attrs) => {
            let ty = &g[c].data.ty;
            let p = Program::map(
                &ty.shape,
                Scalar::Cast(DType::F32),
                &[Arg::Operand(ty.clone())],
                DType::F32,
            );
            Some(Anchored {
                attrs: attrs.clone(),
                kids: node.kids.clone(),
                epilogue: Cow::Owned(p),
                operands: vec![Slot::Product],
                inner: Vec::new(),
            })
        }
        _ => None,
    }
}

impl Searcher<ENode, super::analysis::Types> for Epilogue {
    fn search_eclass_with_limit(
        &self,
        g: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, ENode>> {
        if !self.state.targets(g, eclass) {
            return None;
        }
        let node = largest_node(g, eclass, true, &self.state)?;
        let mut substs = Vec::new();
        for (i, &kid) in node.kids.iter().enumerate() {
            if substs.len() >= limit {
                break;
            }
            // not filtered by `tried_epilogues`: the application fuses into the class's
            // largest node when it runs, which the fusion of producers may have grown since
            if reads_whole(g, &node, i) && anchor_node(g, kid, self.anchor).is_some() {
                let mut s = Subst::with_capacity(1);
                s.insert(operand_var(), Id::from(i));
                substs.push(s);
            }
        }
        (!substs.is_empty()).then(|| SearchMatches {
            eclass,
            substs,
            ast: None,
        })
    }

    fn search_with_limit(&self, g: &Graph, limit: usize) -> Vec<SearchMatches<'_, ENode>> {
        let dirty = self.state.searching(g);
        search_classes(self, g, dirty.as_deref(), limit)
    }

    fn vars(&self) -> Vec<Var> {
        vec![operand_var()]
    }
}

/// Whether `node` (an elementwise consumer, not a reduction) reads operand `i` element for
/// element: its program's access of that operand is the identity.
fn reads_whole(g: &Graph, node: &ENode, i: usize) -> bool {
    match &node.head {
        Head::Kernel(p) => p.reduce.is_empty() && identity_access(p, i),
        Head::Op(op, _) if Scalar::of(*op).is_some() || *op == Op::Cast => {
            g[node.kids[i]].data.ty.shape == super::analysis::node_type(g, node).shape
        }
        _ => false,
    }
}

/// Whether `p` reads operand `i` at exactly its own domain point (no broadcast or permutation).
fn identity_access(p: &Program, i: usize) -> bool {
    let axes = &p.operands[i].axes;
    axes.len() == p.domain.len()
        && axes
            .iter()
            .enumerate()
            .all(|(j, a)| *a == Axis::Space(j as u8) || (p.domain[j] == 1 && *a == Axis::One))
}

impl Applier<ENode, super::analysis::Types> for Epilogue {
    fn apply_one(
        &self,
        g: &mut Graph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<ENode>>,
        _: Symbol,
    ) -> Vec<Id> {
        let i: usize = subst[operand_var()].into();
        let Some(node) = largest_node(g, eclass, true, &self.state) else {
            return Vec::new();
        };
        let Some((consumer, consumer_kids)) = program_ref(g, &node, true) else {
            return Vec::new();
        };
        let Some(&kid) = node.kids.get(i) else {
            return Vec::new();
        };
        // the same epilogue made again would be the node the class already has
        let Some(anchor) = anchor_node(g, kid, self.anchor) else {
            return Vec::new();
        };
        let key = (node.clone(), i, anchor.clone());
        if !self
            .state
            .tried_epilogues
            .lock()
            .expect("not poisoned")
            .insert(key)
        {
            return Vec::new();
        }
        let Some(anchored) = anchored(g, kid, self.anchor, &self.state) else {
            return Vec::new();
        };
        let mut inner = anchored.inner;
        inner.push(g.find(node.kids[i]));
        if let Some(more) = self.state.inside(g, &node) {
            inner.extend(more.iter().copied());
        }
        let slots: Vec<Slot> = consumer_kids.iter().map(|&k| Slot::Class(k)).collect();
        let Some(merged) =
            fused::inline(&consumer, &slots, i, &anchored.epilogue, &anchored.operands)
        else {
            return Vec::new();
        };
        if !merged.program.reduce.is_empty() {
            return Vec::new();
        }
        let Some(at) = merged.operands.iter().position(|&s| s == Slot::Product) else {
            return Vec::new();
        };
        if !identity_access(&merged.program, at) {
            return Vec::new();
        }
        // the product becomes operand 0
        let (program, kids) = with_operand_first(merged.program, &merged.operands, at);
        let mut all = anchored.kids;
        all.extend(kids.into_iter().map(|s| match s {
            Slot::Class(k) => k,
            Slot::Product => unreachable!("moved first"),
        }));
        let head = Head::Epilogue(self.anchor, anchored.attrs, Interned::new(program));
        let fused = ENode::new(head, all);
        self.state.record(g, &fused, inner);
        self.state.add(g, fused, eclass)
    }
}

/// `p` with operand `at` moved to position 0; returns the program and the other operands.
fn with_operand_first<K: Copy>(mut p: Program, operands: &[K], at: usize) -> (Program, Vec<K>) {
    let order: Vec<usize> = std::iter::once(at)
        .chain((0..operands.len()).filter(|&o| o != at))
        .collect();
    let mut new_index = vec![0u32; operands.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new as u32;
    }
    p.operands = order.iter().map(|&o| p.operands[o].clone()).collect();
    for inst in &mut p.insts {
        if let Inst::Load(o) = inst {
            *o = new_index[*o as usize];
        }
    }
    let rest = order[1..].iter().map(|&o| operands[o]).collect();
    (p, rest)
}

/// The fusion rule set, sharing `state`.
pub fn rules(state: Arc<State>) -> Vec<Rewrite<ENode, super::analysis::Types>> {
    vec![
        Rewrite::new(
            "fuse-producer",
            Fuse {
                state: state.clone(),
            },
            Fuse {
                state: state.clone(),
            },
        )
        .expect("a valid rule"),
    ]
    .into_iter()
    .chain([Op::Matmul, Op::Conv2d].map(|anchor| {
        let rule = Epilogue {
            state: state.clone(),
            anchor,
        };
        let applier = Epilogue {
            state: state.clone(),
            anchor,
        };
        Rewrite::new(format!("fuse-{}-epilogue", anchor.name()), rule, applier)
            .expect("a valid rule")
    }))
    .collect()
}
