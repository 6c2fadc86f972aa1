//! Storing values that later kernels recompute.
//!
//! Extraction decides per e-class whether a value is stored or recomputed inside its readers,
//! and a value that pays to store only when every reader switches at once stays recomputed:
//! the residual stream of a transformer is re-added from every earlier layer's output inside
//! each layer norm (at layer 11 of GPT-2-small, 22 tensors read per row where one would do).
//! This pass works on the extracted kernel graph instead. A fused kernel `b` that recomputes a
//! value which an earlier fused kernel `a` of the same iteration space also computes at every
//! point of that space (the same instructions over the same operands, read the same way) loads
//! it from `a`, which stores it as one more output, when that saves `b` at least two operand
//! reads (the store costs `a` one write).
//!
//! Kernels match by their space's axes in memory order, not by which of them are reduced: the
//! column sums of a layer norm's weight gradient (one row per feature) reuse the residual stream
//! that the forward's row kernels (one row per token) compute. A reduction that stores a value
//! of its whole space becomes a row kernel, with one more loop over the row that re-reads (from
//! cache, the row having just been read) what the value is computed from, so it offers the
//! value only to a reader that saves one read more than an elementwise or row kernel would.

use rustc_hash::FxHashMap as HashMap;
use sinter_ir::TensorType;

use crate::fused::{Access, Axis, Inst, Level, Output, Program, Scalar};
use crate::kernel::Pattern;
use crate::kgraph::{KNode, KValueId, KernelGraph, KernelOp};

/// Fewest operand reads a recomputing kernel must save for the value to be stored.
const MIN_SAVED_READS: usize = 2;

/// An instruction by what it computes, within a kernel's iteration space: keys of equal
/// instructions are equal in every kernel of that space.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    Load(KValueId, Access),
    Const(u32),
    Coord(u8),
    Map(Scalar, Vec<u32>),
}

/// A kernel's space: the extents of its axes above 1 in [`memory_order`].
type Space = Vec<usize>;

/// Stores the values that later fused kernels recompute (see the module docs); returns how many
/// it stored. Each stored value becomes an output of the earliest kernel that computes it.
pub fn store_recomputed(kg: &mut KernelGraph) -> usize {
    let mut keys = Keys::default();
    // a value some kernel computes at every point of its space: (node, instruction)
    let mut offered: HashMap<u32, (usize, u32)> = HashMap::default();
    // values stored so far, by the (node, instruction) that stores them
    let mut stores: HashMap<(usize, u32), KValueId> = HashMap::default();
    let mut stored = 0;
    for b in 0..kg.nodes.len() {
        while let KernelOp::Fused(p) = &kg.nodes[b].op {
            let keys_b = keys.of(p, &kg.nodes[b].inputs);
            let full = full_space(p);
            // the instruction whose load saves `b` the most reads, and its earlier computer
            let best = (0..p.insts.len())
                .filter(|&i| full[i])
                .filter_map(|i| {
                    let key = keys_b[i]?;
                    let &(a, j) = offered.get(&key)?;
                    let saved = saved_reads(p, i)?;
                    let least = match &kg.nodes[a].op {
                        KernelOp::Fused(pa)
                            if pa.pattern() == Pattern::Reduce && !stores.contains_key(&(a, j)) =>
                        {
                            MIN_SAVED_READS + 1
                        }
                        _ => MIN_SAVED_READS,
                    };
                    (a != b && saved >= least).then_some((saved, i, a, j, key))
                })
                .max_by_key(|&(saved, i, ..)| (saved, std::cmp::Reverse(i)));
            let Some((_, i, a, j, key)) = best else {
                // `b` is final: offer what it computes at every point of its space
                for (i, key) in keys_b.into_iter().enumerate() {
                    if let (Some(key), true) = (key, full[i]) {
                        offered.entry(key).or_insert((b, i as u32));
                    }
                }
                break;
            };
            let value = match stores.get(&(a, j)) {
                Some(&v) => v,
                None => {
                    let v = store(kg, a, j);
                    stores.insert((a, j), v);
                    keys.stands_for.insert(v, key);
                    stored += 1;
                    v
                }
            };
            load(kg, b, i as u32, value);
        }
    }
    stored
}

/// Interned instruction keys.
#[derive(Default)]
struct Keys {
    interned: HashMap<(Space, Key), u32>,
    /// A stored value, loaded over its whole space, stands for the key of what it stores, so
    /// that a value built on it keys like the same value recomputed.
    stands_for: HashMap<KValueId, u32>,
}

impl Keys {
    /// Each instruction's key; `None` for values that depend on a reduction's result (those
    /// differ between kernels whose phases differ). Keys name space axes by their place in
    /// [`memory_order`], so that kernels whose spaces differ only by axes of extent 1 (a
    /// reduction that keeps its reduced axis has one) or by which axes they reduce share keys.
    fn of(&mut self, p: &Program, inputs: &[KValueId]) -> Vec<Option<u32>> {
        let wide = memory_order(p);
        let place = |k: usize| wide.iter().position(|&w| w == k);
        let space: Space = wide.iter().map(|&k| p.extent(k)).collect();
        let compact = |access: &Access| Access {
            dtype: access.dtype,
            axes: access
                .axes
                .iter()
                .map(|a| match *a {
                    Axis::Space(k) => place(k as usize).map_or(Axis::One, |n| Axis::Space(n as u8)),
                    // a window keeps its place, start and length (a shifted load is another value)
                    Axis::Shifted { k, by, len } => Axis::Shifted {
                        k: place(k as usize).map_or(u8::MAX, |n| n as u8),
                        by,
                        len,
                    },
                    _ => Axis::One,
                })
                .collect(),
        };
        let whole = whole_space(p);
        let mut out: Vec<Option<u32>> = Vec::with_capacity(p.insts.len());
        for inst in &p.insts {
            let key = match inst {
                Inst::Load(o) => {
                    let (v, access) = (inputs[*o as usize], &p.operands[*o as usize]);
                    if let Some(&id) = self.stands_for.get(&v).filter(|_| access.axes == whole) {
                        out.push(Some(id));
                        continue;
                    }
                    Some(Key::Load(v, compact(access)))
                }
                Inst::Const(c) => Some(Key::Const(*c)),
                Inst::Coord(k) => Some(match place(*k as usize) {
                    Some(n) => Key::Coord(n as u8),
                    None => Key::Const(0f32.to_bits()),
                }),
                Inst::Map(s, args) => args
                    .iter()
                    .map(|&x| out[x as usize])
                    .collect::<Option<Vec<u32>>>()
                    .map(|ids| Key::Map(*s, ids)),
                Inst::Reduced(_) => None,
            };
            let id = key.map(|key| {
                let next = self.interned.len() as u32;
                *self.interned.entry((space.clone(), key)).or_insert(next)
            });
            out.push(id);
        }
        out
    }
}

/// Whether each instruction varies over every space axis of extent above 1 (through the axes
/// its loads and coordinates index): a value of the whole space, worth a tensor of its own.
fn full_space(p: &Program) -> Vec<bool> {
    let all: u64 = p.wide_axes().fold(0, |m, k| m | 1 << k);
    let levels = p.levels();
    let mut axes: Vec<u64> = Vec::with_capacity(p.insts.len());
    for inst in &p.insts {
        let m = match inst {
            Inst::Load(o) => p.operands[*o as usize]
                .axes
                .iter()
                .fold(0, |m, a| match a.space() {
                    Some(k) => m | 1 << k,
                    None => m,
                }),
            Inst::Coord(k) => 1 << k,
            Inst::Map(_, args) => args.iter().fold(0, |m, &x| m | axes[x as usize]),
            Inst::Const(_) | Inst::Reduced(_) => 0,
        };
        axes.push(m);
    }
    axes.iter()
        .zip(&levels)
        .map(|(&m, &level)| m == all && (p.reduce.is_empty() || level == Level::Element))
        .collect()
}

/// How many fewer operands `p` reads when instruction `i` is loaded instead of computed (the
/// load itself counted); `None` when it reads no fewer.
fn saved_reads(p: &Program, i: usize) -> Option<usize> {
    let (with_load, _) = replaced(p, i as u32).simplified();
    p.operands
        .len()
        .checked_sub(with_load.operands.len())
        .filter(|&n| n > 0)
}

/// `p` with instruction `i` loaded from a new last operand indexed by every space axis of
/// extent above 1 (in order).
fn replaced(p: &Program, i: u32) -> Program {
    let mut q = p.clone();
    q.operands.push(Access {
        dtype: p.dtypes()[i as usize],
        axes: whole_space(p),
    });
    q.insts[i as usize] = Inst::Load((q.operands.len() - 1) as u32);
    q
}

/// The access of a tensor holding one value per point of `p`'s space, laid out in
/// [`memory_order`].
fn whole_space(p: &Program) -> Vec<Axis> {
    memory_order(p)
        .into_iter()
        .map(|k| Axis::Space(k as u8))
        .collect()
}

/// `p`'s space axes of extent above 1, ordered as the first operand that indexes each of them
/// once lays them out in memory (outermost first), else in space order. Two kernels over the
/// same tensors then order their axes alike whichever of them they reduce, and a stored value
/// keeps the layout of the tensors it is computed from.
fn memory_order(p: &Program) -> Vec<usize> {
    let wide: Vec<usize> = p.wide_axes().collect();
    p.operands
        .iter()
        .find_map(|access| {
            let order: Vec<usize> = access
                .axes
                .iter()
                .filter_map(|a| match *a {
                    Axis::Space(k) if p.extent(k as usize) > 1 => Some(k as usize),
                    _ => None,
                })
                .collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            (sorted == wide).then_some(order)
        })
        .unwrap_or(wide)
}

/// Makes node `a` also store its instruction `j`; returns the new value.
fn store(kg: &mut KernelGraph, a: usize, j: u32) -> KValueId {
    let KernelOp::Fused(p) = &mut kg.nodes[a].op else {
        unreachable!("a fused node")
    };
    let order = memory_order(p);
    let axes: Vec<Axis> = order.iter().map(|&k| Axis::Space(k as u8)).collect();
    let shape: Vec<usize> = order.iter().map(|&k| p.extent(k)).collect();
    let dtype = p.dtypes()[j as usize];
    p.outputs.push(Output {
        value: j,
        access: Access { dtype, axes },
    });
    let index = kg.nodes[a].outputs.len();
    let name = format!("{}.stored{index}", kg.name_of(kg.nodes[a].outputs[0]));
    let value = kg.add_value(name, TensorType::new(dtype, shape), a, index);
    let node = &mut kg.nodes[a];
    node.outputs.push(value);
    note_rule(node);
    value
}

/// Makes node `b` load `value` where its instruction `i` computed it.
fn load(kg: &mut KernelGraph, b: usize, i: u32, value: KValueId) {
    let node = &mut kg.nodes[b];
    let KernelOp::Fused(p) = &node.op else {
        unreachable!("a fused node")
    };
    let (q, keep) = replaced(p, i).simplified();
    let mut inputs = node.inputs.clone();
    inputs.push(value);
    node.inputs = inputs
        .into_iter()
        .zip(keep)
        .filter_map(|(v, k)| k.then_some(v))
        .collect();
    node.op = KernelOp::Fused(Box::new(q));
    note_rule(node);
}

/// Lists this pass among the rules that built `node`, once.
fn note_rule(node: &mut KNode) {
    if !node.rules.iter().any(|r| r == "store-recomputed") {
        node.rules.push("store-recomputed".to_string());
    }
}
