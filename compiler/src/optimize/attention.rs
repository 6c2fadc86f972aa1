//! Attention found by rewriting: rules that recognize, in the decomposed training step, the
//! forward of an attention and the backward autodiff made of it, and add the flash kernels of
//! [`crate::flash`] as equivalent nodes. Nothing here knows the `attention` composite: a user who
//! writes attention by hand from `matmul`, `transpose`, a scale, a mask and `softmax` gets the
//! same kernels, and any elementwise score function (scale, additive or boolean masks, causal or
//! window masks built from `iota`) is carried into the kernels as a program.
//!
//! The identities, in the order the rules use them:
//! - **softmax-lse**: `exp(s − m) / Σ exp(s − m) = exp(s − L)` with `m = max s`,
//!   `L = m + log Σ exp(s − m)`: the probabilities are recomputable from one value per row;
//! - **attention-delta**: `Σⱼ (dO·Vᵀ)ᵢⱼ Pᵢⱼ = Σₑ dOᵢₑ (P·V)ᵢₑ`, so the softmax backward's row
//!   sums `rowsum(dP ∘ P)` are `D = rowsum(dO ∘ O)`, computed from the output, not from P;
//! - **flash-attention-forward**: `softmax(score(q·kᵀ)) · v` is the flash forward's first result
//!   and `L` its second;
//! - **flash-attention-backward**: with `G = dscore(P ∘ (dP − D))` (the score function's backward
//!   applied to the softmax backward), `G · k`, `qᵀ · G` and `Pᵀ · dO` (autodiff's dQ, dKᵀ and
//!   dV) are the results of the dQ kernel and (transposed) of the dK/dV kernel, whose inputs
//!   are `q, k, v, dO, L, D` and the score function's operands;
//! - **flash-f16-result**: `cast(view(r), f16) = view(r')`, where `r'` is result `r` of the same
//!   kernel stored in `f16` (it rounds as the cast does), where only such casts read `r`.
//!
//! Once these hold in the e-graph, extraction chooses the kernels when the cost model says they
//! are cheaper than the `[Sq, Sk]` products they replace, which they are at any length.

use egg::{Id, Rewrite};
use rustc_hash::FxHashMap as HashMap;
use sinter_ir::{Attrs, DType, Op, key};

use super::analysis::{Graph, Types};
use super::lang::{ENode, Head, Interned};
use super::rules::{computed, is_view};
use crate::flash::variant::MAX_HEAD_DIM;
use crate::flash::{FlashKind, FlashSpec, HalfResults};
use crate::fused::{Access, Axis, Inst, Output, Program, Scalar, broadcast_access};

/// The attention rules.
/// The rules' names, as kernels and reports list them.
pub const ATTENTION_DELTA: &str = "attention-delta";
pub const FLASH_FORWARD: &str = "flash-attention-forward";
pub const FLASH_BACKWARD: &str = "flash-attention-backward";
pub const MERGE_FLASH_BACKWARD: &str = "merge-flash-backward";
pub const FLASH_F16_RESULT: &str = "flash-f16-result";

#[rustfmt::skip]
pub fn rules() -> Vec<Rewrite<ENode, Types>> {
    vec![
        // exp(s − m) / Σ exp(s − m) = exp(s − L), L = m + log Σ exp(s − m)
        computed("softmax-lse",   Op::Div,    softmax_lse),
        // Σⱼ (dO·Vᵀ)ᵢⱼ Pᵢⱼ = Σₑ dOᵢₑ (P·V)ᵢₑ
        computed(ATTENTION_DELTA, Op::Sum,    attention_delta),
        // softmax(score(q·kᵀ)) · v = flash_attention_fwd(q, k, v, ..).0
        computed(FLASH_FORWARD,   Op::Matmul, flash_forward),
        // G·k = dq(..), qᵀ·G = dkdv(..).0ᵀ, Pᵀ·dO = dkdv(..).1
        computed(FLASH_BACKWARD,  Op::Matmul, flash_backward),
        // cast(flash(..).i, f16) = flash(.., result i in f16).i
        computed(FLASH_F16_RESULT, Op::Cast,  f16_result),
    ]
}

fn nodes(g: &Graph, c: Id, op: Op) -> impl Iterator<Item = &ENode> {
    g[c].nodes
        .iter()
        .filter(move |n| n.ir().is_some_and(|(o, _)| o == op))
}

fn rank(g: &Graph, c: Id) -> usize {
    g[c].data.ty.rank()
}

/// `axes == [last]` with `keepdim` for a reduction over a tensor of rank `r`.
fn over_last_axis(attrs: &Attrs, r: usize) -> bool {
    r > 0 && attrs.of(key::AXES) == [r - 1] && attrs.of(key::KEEPDIM)
}

/// The class `c` as the transpose of its last two axes: the class transposed.
fn untransposed(g: &Graph, c: Id) -> Option<Id> {
    let r = rank(g, c);
    if r < 2 {
        return None;
    }
    g[c].nodes.iter().find_map(|n| {
        let (op, attrs) = n.ir()?;
        let swaps_last = match op {
            Op::Transpose => {
                let (a, b) = (attrs.of(key::DIM0), attrs.of(key::DIM1));
                a.min(b) == r - 2 && a.max(b) == r - 1
            }
            Op::Permute => {
                let p = attrs.of(key::PERM);
                (0..r - 2).all(|i| p[i] == i) && p[r - 2] == r - 1 && p[r - 1] == r - 2
            }
            _ => false,
        };
        swaps_last.then(|| g.find(n.kids[0]))
    })
}

/// A softmax over the last axis: `p = e / z`, `e = exp(s − m)`, `m = max(s)`, `z = Σ e`.
#[derive(Clone, Copy, Debug)]
struct Softmax {
    s: Id,
    m: Id,
    z: Id,
}

fn softmax(g: &Graph, p: Id) -> Option<Softmax> {
    let r = rank(g, p);
    for div in nodes(g, p, Op::Div) {
        let (e, z) = (g.find(div.kids[0]), g.find(div.kids[1]));
        for exp in nodes(g, e, Op::Exp) {
            for sub in nodes(g, exp.kids[0], Op::Sub) {
                let (s, m) = (g.find(sub.kids[0]), g.find(sub.kids[1]));
                let max_ok = nodes(g, m, Op::Max)
                    .any(|n| g.find(n.kids[0]) == s && over_last_axis(n.ir().expect("an op").1, r));
                let sum_ok = nodes(g, z, Op::Sum)
                    .any(|n| g.find(n.kids[0]) == e && over_last_axis(n.ir().expect("an op").1, r));
                if max_ok && sum_ok {
                    return Some(Softmax { s, m, z });
                }
            }
        }
    }
    None
}

fn add(g: &mut Graph, op: Op, kids: Vec<Id>) -> Id {
    g.add(ENode::op(op, Attrs::new(), kids))
}

/// The class of `L = m + log z` of a softmax.
fn lse(g: &mut Graph, sm: Softmax) -> Id {
    let log = add(g, Op::Log, vec![sm.z]);
    add(g, Op::Add, vec![sm.m, log])
}

fn softmax_lse(g: &mut Graph, n: &ENode) -> Option<Id> {
    let p = g.lookup(n.clone())?;
    let sm = softmax(g, p)?;
    let l = lse(g, sm);
    let d = add(g, Op::Sub, vec![sm.s, l]);
    Some(add(g, Op::Exp, vec![d]))
}

/// `dP = dO · Vᵀ`: `(dO, V)`.
fn output_gradient_product(g: &Graph, dp: Id) -> Option<(Id, Id)> {
    nodes(g, dp, Op::Matmul).find_map(|n| {
        let v = untransposed(g, n.kids[1])?;
        Some((g.find(n.kids[0]), v))
    })
}

/// The class of `O = P · V`, if the e-graph holds it.
fn output(g: &Graph, p: Id, v: Id) -> Option<Id> {
    g.lookup(ENode::op(Op::Matmul, Attrs::new(), vec![p, v]))
}

fn attention_delta(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    let prod = g.find(n.kids[0]);
    if !over_last_axis(attrs, rank(g, prod)) {
        return None;
    }
    for mul in nodes(g, prod, Op::Mul).cloned().collect::<Vec<_>>() {
        for (dp, p) in [(mul.kids[0], mul.kids[1]), (mul.kids[1], mul.kids[0])] {
            let (dp, p) = (g.find(dp), g.find(p));
            if softmax(g, p).is_none() {
                continue;
            }
            let Some((d_o, v)) = output_gradient_product(g, dp) else {
                continue;
            };
            let Some(o) = output(g, p, v) else { continue };
            if g[o].data.ty != g[d_o].data.ty {
                continue;
            }
            let dm = add(g, Op::Mul, vec![d_o, o]);
            let sum = ENode::op(Op::Sum, attrs.clone(), vec![dm]);
            // and as one reduction kernel reading dO and O, which the flash kernels store
            // anyway: fusion grows only a class's largest kernel, not this alternative
            let fused = super::fusion::program_of(g, &sum, true).and_then(|consumer| {
                let producer = super::fusion::program_of(g, &g[dm].nodes[0].clone(), false)?;
                consumer.inline(0, &producer)
            });
            let id = g.add(sum);
            if let Some(k) = fused {
                let k = g.add(ENode::new(
                    Head::Kernel(Interned::new(k.program)),
                    k.operands,
                ));
                g.union(id, k);
            }
            g.analysis.built_by.push((id, ATTENTION_DELTA));
            return Some(id);
        }
    }
    None
}

/// An elementwise expression tree over the space `domain`, from a root class down to one
/// `stop` class (operand 0); other leaves become operands (broadcast into the space), literals
/// and `iota` become instructions.
struct Tree<'g> {
    g: &'g Graph,
    domain: Vec<usize>,
    stop: Id,
    program: Program,
    kids: Vec<Id>,
    memo: HashMap<Id, u32>,
    open: Vec<Id>,
    reached: bool,
}

/// Largest tree a rule builds (instructions).
const TREE_LIMIT: usize = 64;

impl<'g> Tree<'g> {
    fn new(g: &'g Graph, domain: &[usize], stop: Id) -> Tree<'g> {
        let rank = domain.len();
        let program = Program {
            domain: domain.to_vec(),
            reduce: Vec::new(),
            operands: vec![Access {
                dtype: DType::F32,
                axes: (0..rank)
                    .map(|a| {
                        if domain[a] == 1 {
                            Axis::One
                        } else {
                            Axis::Space(a as u8)
                        }
                    })
                    .collect(),
            }],
            insts: Vec::new(),
            phases: Vec::new(),
            outputs: Vec::new(),
        };
        Tree {
            g,
            domain: domain.to_vec(),
            stop,
            program,
            kids: vec![stop],
            memo: HashMap::default(),
            open: Vec::new(),
            reached: false,
        }
    }

    fn push(&mut self, inst: Inst) -> u32 {
        self.program.insts.push(inst);
        (self.program.insts.len() - 1) as u32
    }

    /// The program of `root`, with its extra operands, if the tree reaches the stop class.
    fn build(mut self, root: Id) -> Option<(Program, Vec<Id>)> {
        let out = self.class(root)?;
        if !self.reached {
            return None;
        }
        let rank = self.domain.len();
        self.program.outputs.push(Output {
            value: out,
            access: broadcast_access(DType::F32, &self.domain, &self.domain),
        });
        let _ = rank;
        self.program.check().ok()?;
        Some((self.program, self.kids))
    }

    fn class(&mut self, c: Id) -> Option<u32> {
        let g = self.g;
        let c = g.find(c);
        if let Some(&i) = self.memo.get(&c) {
            return Some(i);
        }
        if self.open.contains(&c) || self.program.insts.len() > TREE_LIMIT {
            return None;
        }
        let ty = g[c].data.ty.clone();
        if ty.rank() > self.domain.len()
            || !sinter_ir::types::broadcasts_to(&ty.shape, &self.domain)
        {
            return None;
        }
        let id = if c == self.stop {
            self.reached = true;
            self.push(Inst::Load(0))
        } else if let Some(v) = g[c].data.constant {
            self.push(Inst::Const((v as f32).to_bits()))
        } else if let Some(i) = self.iota(c) {
            i
        } else {
            self.open.push(c);
            let mapped = self.elementwise(c);
            self.open.pop();
            match mapped {
                Some(i) => i,
                None => {
                    // a value read from memory
                    let slot = self.program.operands.len() as u32;
                    self.program
                        .operands
                        .push(broadcast_access(ty.dtype, &ty.shape, &self.domain));
                    self.kids.push(c);
                    self.push(Inst::Load(slot))
                }
            }
        };
        self.memo.insert(c, id);
        Some(id)
    }

    fn iota(&mut self, c: Id) -> Option<u32> {
        let g = self.g;
        let n = nodes(g, c, Op::Iota).next()?;
        let (_, attrs) = n.ir()?;
        let shape = attrs.of(key::SHAPE);
        let axis = self.domain.len() - shape.len() + attrs.of(key::AXIS);
        Some(if self.domain[axis] == 1 {
            self.push(Inst::Const(0f32.to_bits()))
        } else {
            self.push(Inst::Coord(axis as u8))
        })
    }

    /// The first elementwise node of `c` whose operands all build.
    fn elementwise(&mut self, c: Id) -> Option<u32> {
        let g = self.g;
        for n in &g[c].nodes {
            let Some((op, attrs)) = n.ir() else { continue };
            let scalar = match op {
                Op::Cast => Scalar::Cast(g[c].data.ty.dtype),
                Op::Gelu if attrs.of(key::APPROXIMATE) == sinter_ir::GeluForm::Tanh => {
                    Scalar::GeluTanh
                }
                _ => match Scalar::of(op) {
                    Some(s) => s,
                    None => continue,
                },
            };
            let mark = (
                self.program.insts.len(),
                self.program.operands.len(),
                self.kids.len(),
            );
            let memo = self.memo.clone();
            let reached = self.reached;
            let args: Option<Vec<u32>> = n.kids.iter().map(|&k| self.class(k)).collect();
            match args {
                Some(args) => return Some(self.push(Inst::Map(scalar, args))),
                None => {
                    // undo what the failed attempt added
                    self.program.insts.truncate(mark.0);
                    self.program.operands.truncate(mark.1);
                    self.kids.truncate(mark.2);
                    self.memo = memo;
                    self.reached = reached;
                }
            }
        }
        None
    }
}

/// `s` as a score function of a product `q · kᵀ`: `(program, q, k, extras)`.
struct Score {
    program: Program,
    q: Id,
    k: Id,
    extras: Vec<Id>,
}

/// The products `a · bᵀ` under `s` through elementwise nodes (breadth first, a few).
fn products(g: &Graph, s: Id) -> Vec<(Id, Id, Id)> {
    let mut found = Vec::new();
    let mut queue = vec![g.find(s)];
    let mut seen = vec![];
    while let Some(c) = queue.pop() {
        if seen.contains(&c) || seen.len() > 64 {
            continue;
        }
        seen.push(c);
        for n in &g[c].nodes {
            let Some((op, _)) = n.ir() else { continue };
            if op == Op::Matmul {
                if let Some(k) = untransposed(g, n.kids[1]) {
                    found.push((c, g.find(n.kids[0]), k));
                }
            } else if Scalar::of(op).is_some() || op == Op::Cast {
                queue.extend(n.kids.iter().map(|&k| g.find(k)));
            }
        }
    }
    found
}

fn score(g: &Graph, s: Id) -> Option<Score> {
    let domain = g[s].data.ty.shape.clone();
    if domain.len() < 2 {
        return None;
    }
    for (product, q, k) in products(g, s) {
        let (qt, kt) = (&g[q].data.ty, &g[k].data.ty);
        let r = domain.len();
        if qt.rank() < 2
            || kt.rank() < 2
            || qt.shape[qt.rank() - 2] != domain[r - 2]
            || kt.shape[kt.rank() - 2] != domain[r - 1]
        {
            continue;
        }
        let Some((program, kids)) = Tree::new(g, &domain, product).build(s) else {
            continue;
        };
        return Some(Score {
            program,
            q,
            k,
            extras: kids[1..].to_vec(),
        });
    }
    None
}

/// Class `c` read from `f16` storage where it is a cast of an `f16` value to `f32` (`c =
/// cast(x)`, or views of such a cast: the views are rebuilt over `x`), else `c`. A flash kernel
/// widens an `f16` operand as it loads it, exactly, so the cast needs no kernel of its own:
/// autocast feeds attention its products through such casts ([`crate::precision`]), and the
/// gradient of the cast after attention is one before `dO`'s views.
fn widened(g: &mut Graph, c: Id) -> Id {
    widened_within(g, c, 4)
}

/// [`widened`] through at most `views` view nodes.
fn widened_within(g: &mut Graph, c: Id, views: usize) -> Id {
    let c = g.find(c);
    if g[c].data.ty.dtype != DType::F32 {
        return c;
    }
    if let Some(x) = nodes(g, c, Op::Cast)
        .map(|n| g.find(n.kids[0]))
        .find(|&x| g[x].data.ty.dtype == DType::F16)
    {
        return x;
    }
    if views == 0 {
        return c;
    }
    for n in views_in(g, c) {
        let kid = g.find(n.kids[0]);
        let inner = widened_within(g, kid, views - 1);
        if inner != kid {
            let (op, attrs) = n.ir().expect("a view op");
            let half = g.add(ENode::op(op, attrs.clone(), vec![inner]));
            // views commute with the cast: `c = cast(view(x))`, which other kernels (the
            // attention-delta's row sums of `dO`) may read from `f16` storage too
            let cast = g.add(ENode::op(
                Op::Cast,
                Attrs::new().and(key::DTYPE, DType::F32),
                vec![half],
            ));
            g.union(c, cast);
            return half;
        }
    }
    c
}

/// Whether every reader of class `c` is a cast to `f16`, or a view (at most `views` deep)
/// whose readers are.
fn read_as_f16(g: &Graph, c: Id, views: usize) -> bool {
    g[c].parents().all(|p| {
        let n = g.id_to_node(p);
        match n.ir() {
            Some((Op::Cast, attrs)) => attrs.try_of(key::DTYPE) == Some(DType::F16),
            Some((op, _)) if is_view(op) && views > 0 => read_as_f16(g, g.find(p), views - 1),
            _ => false,
        }
    })
}

/// The view nodes of class `c`.
fn views_in(g: &Graph, c: Id) -> Vec<ENode> {
    (g[c].nodes.iter())
        .filter(|n| n.ir().is_some_and(|(op, _)| is_view(op)))
        .cloned()
        .collect()
}

/// Whether a flash kernel takes these shapes: head dimensions within its limit.
fn fits(g: &Graph, q: Id, v: Id) -> bool {
    let (qt, vt) = (&g[q].data.ty, &g[v].data.ty);
    qt.shape[qt.rank() - 1] <= MAX_HEAD_DIM && vt.shape[vt.rank() - 1] <= MAX_HEAD_DIM
}

/// Adds the flash forward of the attention `P · V` (with `P = softmax(s)`) and returns its
/// tuple class, the softmax and the score.
fn forward(g: &mut Graph, p: Id, v: Id) -> Option<(Id, Softmax, Score)> {
    let sm = softmax(g, p)?;
    let sc = score(g, sm.s)?;
    if !fits(g, sc.q, v) {
        return None;
    }
    let spec = FlashSpec {
        kind: FlashKind::Forward,
        score: sc.program.clone(),
        dscore: None,
        half: HalfResults::NONE,
    };
    let mut kids = vec![widened(g, sc.q), widened(g, sc.k), widened(g, v)];
    kids.extend(&sc.extras);
    let tuple = g.add(ENode::new(Head::Flash(Interned::new(spec)), kids));
    Some((tuple, sm, sc))
}

fn flash_forward(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (p, v) = (g.find(n.kids[0]), g.find(n.kids[1]));
    let (tuple, sm, _) = forward(g, p, v)?;
    let l = lse(g, sm);
    let l_result = g.add(ENode::new(Head::Proj(1), vec![tuple]));
    g.union(l, l_result);
    Some(g.add(ENode::new(Head::Proj(0), vec![tuple])))
}

/// The gradient `G` of a product `q·kᵀ` that autodiff made from a softmax attention:
/// `G = dscore(P ∘ (dP − D))` for the `P` of `v`'s attention.
struct Backward {
    p: Id,
    v: Id,
    d_o: Id,
    dscore: Program,
    dscore_extras: Vec<Id>,
}

/// `ds = P ∘ (dP − rowsum(dP ∘ P))` in class `c`: `(P, dO, V)`.
fn softmax_gradient(g: &Graph, c: Id) -> Option<(Id, Id, Id)> {
    for mul in nodes(g, c, Op::Mul) {
        for (p, diff) in [(mul.kids[0], mul.kids[1]), (mul.kids[1], mul.kids[0])] {
            let p = g.find(p);
            if softmax(g, p).is_none() {
                continue;
            }
            for sub in nodes(g, diff, Op::Sub) {
                let dp = g.find(sub.kids[0]);
                let Some((d_o, v)) = output_gradient_product(g, dp) else {
                    continue;
                };
                // the row sum of dP ∘ P over the last axis
                let r = rank(g, dp);
                let rowsum = nodes(g, sub.kids[1], Op::Sum).any(|s| {
                    over_last_axis(s.ir().expect("an op").1, r)
                        && nodes(g, s.kids[0], Op::Mul).any(|m| {
                            let (a, b) = (g.find(m.kids[0]), g.find(m.kids[1]));
                            (a, b) == (dp, p) || (a, b) == (p, dp)
                        })
                });
                if rowsum {
                    return Some((p, d_o, v));
                }
            }
        }
    }
    None
}

/// The classes under `x` (through elementwise nodes) where a softmax gradient sits.
fn gradient_sites(g: &Graph, x: Id) -> Vec<Id> {
    let mut found = Vec::new();
    let mut queue = vec![g.find(x)];
    let mut seen = vec![];
    while let Some(c) = queue.pop() {
        if seen.contains(&c) || seen.len() > 64 {
            continue;
        }
        seen.push(c);
        if softmax_gradient(g, c).is_some() {
            found.push(c);
            continue;
        }
        for n in &g[c].nodes {
            if let Some((op, _)) = n.ir()
                && (Scalar::of(op).is_some() || op == Op::Cast)
            {
                queue.extend(n.kids.iter().map(|&k| g.find(k)));
            }
        }
    }
    found
}

fn backward_of(g: &Graph, x: Id) -> Option<Backward> {
    let domain = g[x].data.ty.shape.clone();
    for ds in gradient_sites(g, x) {
        let (p, d_o, v) = softmax_gradient(g, ds)?;
        let Some((dscore, kids)) = Tree::new(g, &domain, ds).build(x) else {
            continue;
        };
        return Some(Backward {
            p,
            v,
            d_o,
            dscore,
            dscore_extras: kids[1..].to_vec(),
        });
    }
    None
}

/// Adds the backward kernel of `kind` for the gradient `G` in class `x`; returns its tuple
/// class and the attention's `q` and `k`.
fn backward(g: &mut Graph, x: Id, kind: FlashKind) -> Option<(Id, Id, Id)> {
    let bw = backward_of(g, x)?;
    let sm = softmax(g, bw.p)?;
    let sc = score(g, sm.s)?;
    if !fits(g, sc.q, bw.v) || g[bw.d_o].data.ty.shape.last() != g[bw.v].data.ty.shape.last() {
        return None;
    }
    let o = output(g, bw.p, bw.v)?;
    let l = lse(g, sm);
    let r = rank(g, o);
    let dm = add(g, Op::Mul, vec![bw.d_o, o]);
    let delta = g.add(ENode::op(
        Op::Sum,
        Attrs::new()
            .and(key::AXES, vec![r - 1])
            .and(key::KEEPDIM, true),
        vec![dm],
    ));
    // the backward kernels read D = rowsum(dO ∘ O), attention-delta's identity
    g.analysis.built_by.push((delta, ATTENTION_DELTA));
    let spec = FlashSpec {
        kind,
        score: sc.program,
        dscore: Some(bw.dscore),
        half: HalfResults::NONE,
    };
    let mut kids = vec![
        widened(g, sc.q),
        widened(g, sc.k),
        widened(g, bw.v),
        widened(g, bw.d_o),
        l,
        delta,
    ];
    kids.extend(&sc.extras);
    kids.extend(&bw.dscore_extras);
    let tuple = g.add(ENode::new(Head::Flash(Interned::new(spec)), kids));
    Some((tuple, sc.q, sc.k))
}

fn flash_backward(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (a, b) = (g.find(n.kids[0]), g.find(n.kids[1]));
    // dQ = G · k
    if let Some((tuple, _, k)) = backward(g, a, FlashKind::BackwardDq)
        && k == b
    {
        return Some(g.add(ENode::new(Head::Proj(0), vec![tuple])));
    }
    // dKᵀ = qᵀ · G
    if let Some(q) = untransposed(g, a)
        && let Some((tuple, q2, _)) = backward(g, b, FlashKind::BackwardDkDv)
        && q == q2
    {
        let dk = g.add(ENode::new(Head::Proj(0), vec![tuple]));
        let r = rank(g, dk);
        return Some(g.add(ENode::op(
            Op::Transpose,
            Attrs::new().and(key::DIM0, r - 2).and(key::DIM1, r - 1),
            vec![dk],
        )));
    }
    // dV = Pᵀ · dO: the dK/dV kernel of each gradient that reads this P. Rewrites that move a
    // scale give several (`G` and `c·G`, each a valid dK kernel): all give this dV, so that
    // extraction can share one kernel between dK and dV whichever dK it picks.
    let p = untransposed(g, a)?;
    softmax(g, p)?;
    let mut dv: Option<Id> = None;
    for x in dk_sites(g, p, b) {
        let Some((tuple, _, _)) = backward(g, x, FlashKind::BackwardDkDv) else {
            continue;
        };
        let proj = g.add(ENode::new(Head::Proj(1), vec![tuple]));
        match dv {
            Some(first) => {
                g.union(first, proj);
            }
            None => dv = Some(proj),
        }
    }
    dv
}

/// `cast(flash(..).i, f16)`: result `i` of the same kernel stored in `f16`, which rounds the
/// `f32` it computes as the cast does (exact); also through views (`cast(view(r)) =
/// view(cast(r))`), as autodiff casts a gradient after the views that undo attention's. The
/// kernel's other results are the old kernel's, so extraction may take every result of the
/// new kernel at once (dK and dV cast for the products after them) and drop the old one and
/// the cast kernels; where the `f32` result has readers of its own (the forward's `O`, which
/// the backward's delta reads) it keeps the old kernel and the cast.
fn f16_result(g: &mut Graph, n: &ENode) -> Option<Id> {
    let (_, attrs) = n.ir()?;
    if attrs.try_of(key::DTYPE) != Some(DType::F16) {
        return None;
    }
    f16_result_within(g, n.kids[0], 4)
}

/// [`f16_result`] of class `c`, through at most `views` view nodes.
fn f16_result_within(g: &mut Graph, c: Id, views: usize) -> Option<Id> {
    let c = g.find(c);
    if g[c].data.ty.dtype != DType::F32 {
        return None;
    }
    // every kernel whose result `i` the class is (several once some results are `f16`),
    // where nothing reads the `f32` result but through casts to `f16`: else extraction could
    // take a second kernel for the `f16` result (the training step's delta reads `O`)
    let mut found = Vec::new();
    if !read_as_f16(g, c, 4) {
        return None;
    }
    for p in &g[c].nodes {
        let Head::Proj(i) = p.head else { continue };
        let tuple = g.find(p.kids[0]);
        for t in &g[tuple].nodes {
            if let Head::Flash(spec) = &t.head
                && spec.may_be_half(i as usize)
                && !spec.half.contains(i as usize)
            {
                found.push((i, tuple, (**spec).clone(), t.kids.clone()));
            }
        }
    }
    let mut result: Option<Id> = None;
    for (i, tuple, spec, kids) in found {
        let types: Vec<_> = kids.iter().map(|&k| g[k].data.ty.clone()).collect();
        let results = spec.output_types(&types).len() as u8;
        let half = FlashSpec {
            half: spec.half.with(i as usize),
            ..spec
        };
        let new = g.add(ENode::new(Head::Flash(Interned::new(half)), kids));
        for j in (0..results).filter(|&j| j != i) {
            let old = g.lookup(ENode::new(Head::Proj(j), vec![tuple]));
            let other = g.add(ENode::new(Head::Proj(j), vec![new]));
            if let Some(old) = old {
                g.union(old, other);
            }
        }
        let this = g.add(ENode::new(Head::Proj(i), vec![new]));
        if let Some(r) = result {
            g.union(r, this);
        }
        result = Some(this);
    }
    if result.is_some() || views == 0 {
        return result;
    }
    for n in views_in(g, c) {
        if let Some(inner) = f16_result_within(g, n.kids[0], views - 1) {
            let (op, attrs) = n.ir().expect("a view op");
            return Some(g.add(ENode::op(op, attrs.clone(), vec![inner])));
        }
    }
    None
}

/// The classes of `G` (a product's gradient) built from softmax `p` and output gradient `d_o`
/// that a matmul with a transposed first operand reads (autodiff's dKᵀ = qᵀ · G): found by
/// walking up from `p` through the softmax gradient and the elementwise nodes above it.
fn dk_sites(g: &Graph, p: Id, d_o: Id) -> Vec<Id> {
    let parents = |c: Id| -> Vec<(Id, ENode)> {
        g[c].parents()
            .map(|n| (g.find(n), g.id_to_node(n).clone()))
            .collect()
    };
    let mut queue: Vec<Id> = parents(p)
        .into_iter()
        .filter(|(_, n)| n.ir().is_some_and(|(op, _)| op == Op::Mul))
        .map(|(c, _)| c)
        .collect();
    let mut seen: Vec<Id> = Vec::new();
    let mut found: Vec<Id> = Vec::new();
    while let Some(c) = queue.pop() {
        if seen.contains(&c) || seen.len() > 64 {
            continue;
        }
        seen.push(c);
        for (parent, n) in parents(c) {
            let Some((op, _)) = n.ir() else { continue };
            if op == Op::Matmul && g.find(n.kids[1]) == c && untransposed(g, n.kids[0]).is_some() {
                if !found.contains(&c)
                    && let Some(bw) = backward_of(g, c)
                    && bw.p == p
                    && bw.d_o == d_o
                {
                    found.push(c);
                }
            } else if Scalar::of(op).is_some() || op == Op::Cast {
                queue.push(parent);
            }
        }
    }
    found
}

/// Makes each dQ kernel and dK/dV kernel of one attention (the same inputs and score
/// functions) one kernel of the whole backward ([`FlashKind::Backward`]) where
/// [`crate::flash::variant::merges`] says so under `model`'s target and choices; returns how
/// many were merged.
/// The merged kernel takes the earlier one's place: the two read the same values, so
/// everything either's readers read is defined by then.
pub fn merge_backward(
    kg: &mut crate::kgraph::KernelGraph,
    model: &crate::cost::CostModel,
) -> usize {
    use crate::kgraph::{KNode, KernelOp};
    fn spec_of(n: &KNode) -> Option<&FlashSpec> {
        match &n.op {
            KernelOp::Flash(s) => Some(s),
            _ => None,
        }
    }
    let mut alive = vec![true; kg.nodes.len()];
    let mut merged = 0;
    for a in 0..kg.nodes.len() {
        let Some(first) = spec_of(&kg.nodes[a]).cloned() else {
            continue;
        };
        let want = match first.kind {
            FlashKind::BackwardDq => FlashKind::BackwardDkDv,
            FlashKind::BackwardDkDv => FlashKind::BackwardDq,
            _ => continue,
        };
        let (q, v) = (kg.ty(kg.nodes[a].inputs[0]), kg.ty(kg.nodes[a].inputs[2]));
        if !crate::flash::variant::merges(&model.target, &model.flash, &first, q, v) {
            continue;
        }
        let partner = (a + 1..kg.nodes.len()).find(|&b| {
            alive[b]
                && kg.nodes[b].inputs == kg.nodes[a].inputs
                && spec_of(&kg.nodes[b]).is_some_and(|s| {
                    s.kind == want && s.score == first.score && s.dscore == first.dscore
                })
        });
        let Some(b) = partner else { continue };
        // each result keeps its storage: dK and dV at 0 and 1, dQ at 2
        let second_half = spec_of(&kg.nodes[b]).expect("a flash partner").half;
        let (dkdv_half, dq_half) = if first.kind == FlashKind::BackwardDkDv {
            (first.half, second_half)
        } else {
            (second_half, first.half)
        };
        let half = if dq_half.contains(0) {
            dkdv_half.with(2)
        } else {
            dkdv_half
        };
        let second = std::mem::replace(
            &mut kg.nodes[b],
            KNode {
                op: KernelOp::Ir(Op::Constant, Attrs::new()),
                inputs: Vec::new(),
                outputs: Vec::new(),
                sources: Vec::new(),
                rules: Vec::new(),
            },
        );
        alive[b] = false;
        let first_node = &mut kg.nodes[a];
        let (dkdv, dq) = if first.kind == FlashKind::BackwardDkDv {
            (first_node.outputs.clone(), second.outputs[0])
        } else {
            (second.outputs.clone(), first_node.outputs[0])
        };
        let mut outputs = dkdv;
        outputs.push(dq);
        let mut sources = std::mem::take(&mut first_node.sources);
        sources.extend(second.sources);
        sources.sort();
        sources.dedup();
        let rules = super::joined_rules(
            std::mem::take(&mut first_node.rules),
            &second.rules,
            MERGE_FLASH_BACKWARD,
        );
        *first_node = KNode {
            op: KernelOp::Flash(Box::new(FlashSpec {
                kind: FlashKind::Backward,
                half,
                ..first
            })),
            inputs: first_node.inputs.clone(),
            outputs,
            sources,
            rules,
        };
        merged += 1;
    }
    super::keep_alive(kg, &alive);
    merged
}
