//! Front-end expansion of composite ops (`attention`) into primitives, and [`rebuild`], the
//! node-by-node graph copy that this and later passes use to replace nodes.
//!
//! `attention(q, k, v, [mask], scale, causal, window, mask_kind)` becomes
//! ```text
//! s = mul(matmul(q, transpose(k, dim0=2, dim1=3)), constant(scale))
//! s = add(s, mask)                          # additive mask
//! s = where(mask, s, constant(-inf))        # boolean mask
//! s = where(keep, s, constant(-inf))        # causal and/or window, keep: [Sq, Sk] of 0/1
//! out = matmul(softmax(s, axis=3), v)
//! ```
//! with `row = iota([Sq, Sk], axis=0)`, `col = iota([Sq, Sk], axis=1)`, causal
//! `keep = le(col, row)`, window `keep = lt(abs(sub(row, col)), constant(window))`, and both
//! `mul` of the two. The interpreter evaluates `attention` directly with exactly these steps,
//! in this order.
//!
//! Where `k` and `v` have fewer heads than `q` (grouped-query attention, `H = kv_heads ·
//! group`), the same steps run on five-dimensional views: `q` reshaped to `[B, kv_heads,
//! group, Sq, D]`, `k` and `v` unsqueezed to `[B, kv_heads, 1, Sk, D]` (the products broadcast
//! them over the group), the mask split alike, and the result reshaped back to
//! `[B, H, Sq, Dv]`.

use crate::attr::Attrs;
use crate::attr::key;
use crate::graph::{Graph, GraphError, Node, ValueDef, ValueId};
use crate::op::Op;
use crate::types::DType;

/// A graph under reconstruction from `old`, for [`rebuild`]'s lowering callback.
///
/// Values added through [`Rebuild::add`] get generated names that no value of `old` or of the
/// new graph has, so the nodes copied later keep their own names.
pub struct Rebuild<'a> {
    /// The graph being copied.
    pub old: &'a Graph,
    new: Graph,
    map: Vec<Option<ValueId>>,
}

impl Rebuild<'_> {
    /// The new graph so far (to read types of new values).
    pub fn graph(&self) -> &Graph {
        &self.new
    }

    /// The new value that stands for `old`'s value `v` (defined before the current node).
    pub fn mapped(&self, v: ValueId) -> ValueId {
        self.map[v.index()].expect("operands precede their users")
    }

    /// A generated name (`_` and a number) free in both graphs.
    pub fn fresh_name(&self) -> String {
        (self.new.values.len()..)
            .map(|k| format!("_{k}"))
            .find(|n| self.old.lookup(n).is_none() && self.new.lookup(n).is_none())
            .expect("some name is free")
    }

    /// Adds a node with fresh names for its results.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        attrs: Attrs,
    ) -> Result<Vec<ValueId>, GraphError> {
        let results = self.new.add_node(op, inputs, attrs, None)?;
        // The builder's generated names are free in the new graph; move any that an old value
        // (copied later) will need.
        for &r in &results {
            if self.old.lookup(self.new.name_of(r)).is_some() {
                let name = self.fresh_name();
                self.new.rename(r, name)?;
            }
        }
        Ok(results)
    }

    /// Adds a single-result node with a fresh name.
    pub fn add(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Result<ValueId, GraphError> {
        Ok(self.add_node(op, inputs, attrs)?[0])
    }

    /// Adds a scalar f32 literal with a fresh name.
    pub fn constant(&mut self, value: f64) -> Result<ValueId, GraphError> {
        self.add(Op::Constant, &[], Attrs::new().and(key::VALUE, value))
    }

    /// Declares a state that `old` does not have (a pass's own persistent value).
    pub fn add_state(
        &mut self,
        name: &str,
        ty: crate::types::TensorType,
        init: crate::graph::Init,
    ) -> Result<ValueId, GraphError> {
        self.new.add_state(name, ty, init)
    }
}

/// Copies `g` into a new graph, declaration by declaration and node by node, in arena order.
///
/// For each node, `lower` gets the builder, the old node and its operands mapped into the new
/// graph. It returns `Ok(None)` to copy the node unchanged, or `Ok(Some(results))` with one new
/// value per result of the node, built with [`Rebuild::add`]; results created by this call are
/// renamed to the old results' names (a result that is an older value keeps its own name).
/// Declarations, assigns, outputs and the graph's name carry over.
pub fn rebuild<F>(g: &Graph, lower: F) -> Result<Graph, GraphError>
where
    F: FnMut(&mut Rebuild, &Node, &[ValueId]) -> Result<Option<Vec<ValueId>>, GraphError>,
{
    rebuild_mapped(g, lower).map(|(graph, _)| graph)
}

/// [`rebuild`], also returning where each value of `g` went: the new graph's value for each old
/// one (by old index), which passes use to carry facts about values across a rebuild.
pub fn rebuild_mapped<F>(g: &Graph, lower: F) -> Result<(Graph, Vec<Option<ValueId>>), GraphError>
where
    F: FnMut(&mut Rebuild, &Node, &[ValueId]) -> Result<Option<Vec<ValueId>>, GraphError>,
{
    rebuild_typed(g, true, lower)
}

/// [`rebuild`] for a pass that changes values' dtypes (the precision pass): a lowered node's
/// results may differ in dtype from the old ones (their shapes may not).
pub fn rebuild_retyping<F>(g: &Graph, lower: F) -> Result<Graph, GraphError>
where
    F: FnMut(&mut Rebuild, &Node, &[ValueId]) -> Result<Option<Vec<ValueId>>, GraphError>,
{
    rebuild_typed(g, false, lower).map(|(graph, _)| graph)
}

fn rebuild_typed<F>(
    g: &Graph,
    same_types: bool,
    mut lower: F,
) -> Result<(Graph, Vec<Option<ValueId>>), GraphError>
where
    F: FnMut(&mut Rebuild, &Node, &[ValueId]) -> Result<Option<Vec<ValueId>>, GraphError>,
{
    let mut rb = Rebuild {
        old: g,
        new: Graph::new(g.name.clone()),
        map: vec![None; g.values.len()],
    };
    for id in g.value_ids() {
        let value = g.value(id);
        let (name, ty) = (value.name.clone(), value.ty.clone());
        let node = match &value.def {
            ValueDef::Input => {
                rb.map[id.index()] = Some(rb.new.add_input(name, ty)?);
                continue;
            }
            ValueDef::Param(init) => {
                rb.map[id.index()] = Some(rb.new.add_param(name, ty, init.clone())?);
                continue;
            }
            ValueDef::State(init) => {
                rb.map[id.index()] = Some(rb.new.add_state(name, ty, init.clone())?);
                continue;
            }
            // A node is rebuilt once, at its first result.
            ValueDef::Node { index: 0, node } => g.node(*node),
            ValueDef::Node { .. } => continue,
        };
        let inputs: Vec<ValueId> = node.inputs.iter().map(|&v| rb.mapped(v)).collect();
        let first_new = rb.new.values.len();
        let results = match lower(&mut rb, node, &inputs)? {
            Some(results) => {
                assert_eq!(
                    results.len(),
                    node.outputs.len(),
                    "a lowering of `{}` must give one value per result",
                    node.op.name()
                );
                for (&old, &new) in node.outputs.iter().zip(&results) {
                    debug_assert!(
                        if same_types {
                            g.ty(old) == rb.new.ty(new)
                        } else {
                            g.ty(old).shape == rb.new.ty(new).shape
                        },
                        "lowering changed a type"
                    );
                    if new.index() >= first_new {
                        rb.new.rename(new, g.name_of(old).to_string())?;
                    }
                }
                results
            }
            None => {
                let names: Vec<String> = node
                    .outputs
                    .iter()
                    .map(|&v| g.name_of(v).to_string())
                    .collect();
                rb.new
                    .add_node(node.op, &inputs, node.attrs.clone(), Some(&names))?
            }
        };
        for (&old, new) in node.outputs.iter().zip(results) {
            rb.map[old.index()] = Some(new);
        }
    }
    for a in &g.assigns {
        let (target, source) = (rb.mapped(a.target), rb.mapped(a.source));
        rb.new.add_assign(target, source)?;
    }
    for &v in &g.outputs {
        let v = rb.mapped(v);
        rb.new.add_output(v);
    }
    Ok((rb.new, rb.map))
}

/// A new graph with every `attention` node replaced by primitives (see the module docs) and
/// every `matmul` with a 1-D operand written as a matrix product of promoted operands (see
/// [`promote_matmul`]); every other node, every name, assign and output is preserved, and each
/// replaced node's result keeps its name.
pub fn expand_composites(g: &Graph) -> Graph {
    rebuild(g, |rb, node, inputs| match node.op {
        Op::Attention if rb.old.ty(node.outputs[0]).dtype == DType::F16 => {
            // on f16 values: computed in f32, the result rounded once (IR.md)
            let wide = inputs
                .iter()
                .map(|&v| cast_to(rb, v, DType::F32))
                .collect::<Result<Vec<_>, _>>()?;
            let o = expand_attention(rb, node, &wide)?;
            cast_to(rb, o, DType::F16).map(|v| Some(vec![v]))
        }
        Op::Attention => expand_attention(rb, node, inputs).map(|v| Some(vec![v])),
        Op::Matmul => promote_matmul(rb, inputs),
        _ => Ok(None),
    })
    .expect("the expansion of a verified graph type-checks")
}

/// `torch.matmul`'s 1-D promotion, made explicit once so that no later pass handles it: a 1-D
/// `a` `[K]` becomes `[1, K]` and a 1-D `b` becomes `[K, 1]`, and the added axis is squeezed from
/// the product. `None` (keep the node) when both operands have rank 2 or more.
fn promote_matmul(
    rb: &mut Rebuild,
    inputs: &[ValueId],
) -> Result<Option<Vec<ValueId>>, GraphError> {
    let (a, b) = (inputs[0], inputs[1]);
    let (ra, rb_rank) = (rb.graph().ty(a).rank(), rb.graph().ty(b).rank());
    if ra > 1 && rb_rank > 1 {
        return Ok(None);
    }
    let unsqueeze = |rb: &mut Rebuild, x, axis: usize| {
        rb.add(Op::Unsqueeze, &[x], Attrs::new().and(key::AXIS, axis))
    };
    let a2 = if ra == 1 { unsqueeze(rb, a, 0)? } else { a };
    let b2 = if rb_rank == 1 {
        unsqueeze(rb, b, 1)?
    } else {
        b
    };
    let mut out = rb.add(Op::Matmul, &[a2, b2], Attrs::new())?;
    // The product is [.., M, N]; drop N first (the last axis), then M.
    if rb_rank == 1 {
        let last = rb.graph().ty(out).rank() - 1;
        out = rb.add(Op::Squeeze, &[out], Attrs::new().and(key::AXIS, last))?;
    }
    if ra == 1 {
        let m_axis = rb.graph().ty(out).rank() - if rb_rank == 1 { 1 } else { 2 };
        out = rb.add(Op::Squeeze, &[out], Attrs::new().and(key::AXIS, m_axis))?;
    }
    Ok(Some(vec![out]))
}

/// `attention` as primitives.
/// `v` cast to the float dtype `to`, or `v` where it is not a float of another dtype.
fn cast_to(rb: &mut Rebuild, v: ValueId, to: DType) -> Result<ValueId, GraphError> {
    let dtype = rb.graph().ty(v).dtype;
    if !dtype.is_float() || dtype == to {
        return Ok(v);
    }
    rb.add(Op::Cast, &[v], Attrs::new().and(key::DTYPE, to))
}

fn expand_attention(
    rb: &mut Rebuild,
    node: &Node,
    inputs: &[ValueId],
) -> Result<ValueId, GraphError> {
    let a = &node.attrs;
    let (mut q, mut k, mut v, mut mask) = (inputs[0], inputs[1], inputs[2], inputs.get(3).copied());
    let q_shape = rb.graph().ty(q).shape.clone();
    let (heads, sq) = (q_shape[1], q_shape[2]);
    let (kv_heads, sk) = (rb.graph().ty(k).shape[1], rb.graph().ty(k).shape[2]);
    let grouped = kv_heads != heads;
    if grouped {
        // Grouped-query attention in five dimensions, `[B, kv_heads, group, S, D]`: q's heads
        // split into groups (a view), k and v gain a group axis of extent 1 (a view) along
        // which the products broadcast; no key or value is copied.
        let group = heads / kv_heads;
        let split = |shape: &[usize]| {
            let mut s = shape.to_vec();
            s.splice(1..2, [kv_heads, group]);
            s
        };
        q = reshape(rb, q, split(&q_shape))?;
        k = rb.add(Op::Unsqueeze, &[k], Attrs::new().and(key::AXIS, 2))?;
        v = rb.add(Op::Unsqueeze, &[v], Attrs::new().and(key::AXIS, 2))?;
        if let Some(m) = mask {
            mask = Some(group_mask(rb, m, kv_heads, group)?);
        }
    }
    let rank = rb.graph().ty(q).rank();
    let kt = rb.add(
        Op::Transpose,
        &[k],
        Attrs::new()
            .and(key::DIM0, rank - 2)
            .and(key::DIM1, rank - 1),
    )?;
    let qk = rb.add(Op::Matmul, &[q, kt], Attrs::new())?;
    let scale = rb.constant(a.of(key::SCALE))?;
    let mut s = rb.add(Op::Mul, &[qk, scale], Attrs::new())?;
    if let Some(mask) = mask {
        s = if a.of(key::MASK_KIND) == crate::attr::MaskKind::Additive {
            rb.add(Op::Add, &[s, mask], Attrs::new())?
        } else {
            let neg_inf = rb.constant(f64::NEG_INFINITY)?;
            rb.add(Op::Where, &[mask, s, neg_inf], Attrs::new())?
        };
    }
    if let Some(keep) = key_filter(rb, sq, sk, a.of(key::CAUSAL), a.of(key::WINDOW))? {
        let neg_inf = rb.constant(f64::NEG_INFINITY)?;
        s = rb.add(Op::Where, &[keep, s, neg_inf], Attrs::new())?;
    }
    let p = rb.add(Op::Softmax, &[s], Attrs::new().and(key::AXIS, rank - 1))?;
    let o = rb.add(Op::Matmul, &[p, v], Attrs::new())?;
    if !grouped {
        return Ok(o);
    }
    let mut out = q_shape;
    out[3] = rb.graph().ty(o).shape[rank - 1];
    reshape(rb, o, out)
}

fn reshape(rb: &mut Rebuild, x: ValueId, shape: Vec<usize>) -> Result<ValueId, GraphError> {
    rb.add(Op::Reshape, &[x], Attrs::new().and(key::SHAPE, shape))
}

/// A mask that broadcasts to the scores `[B, H, Sq, Sk]` as the same mask over the grouped
/// scores `[B, kv_heads, group, Sq, Sk]`: padded to rank 4, its head axis (1 or `H`) split in
/// two.
fn group_mask(
    rb: &mut Rebuild,
    mask: ValueId,
    kv_heads: usize,
    group: usize,
) -> Result<ValueId, GraphError> {
    let shape = &rb.graph().ty(mask).shape;
    let mut padded = vec![1; 4 - shape.len()];
    padded.extend(shape);
    let heads = if padded[1] == 1 {
        [1, 1]
    } else {
        [kv_heads, group]
    };
    let grouped = vec![padded[0], heads[0], heads[1], padded[2], padded[3]];
    reshape(rb, mask, grouped)
}

/// The `[Sq, Sk]` 0/1 condition of keys a query may see under `causal` and `window`; `None`
/// when every key is allowed.
fn key_filter(
    rb: &mut Rebuild,
    sq: usize,
    sk: usize,
    causal: bool,
    window: usize,
) -> Result<Option<ValueId>, GraphError> {
    if !causal && window == 0 {
        return Ok(None);
    }
    let iota = |rb: &mut Rebuild, axis| {
        rb.add(
            Op::Iota,
            &[],
            Attrs::new()
                .and(key::SHAPE, vec![sq, sk])
                .and(key::AXIS, axis),
        )
    };
    let row = iota(rb, 0)?;
    let col = iota(rb, 1)?;
    let mut keep = None;
    if causal {
        keep = Some(rb.add(Op::Le, &[col, row], Attrs::new())?);
    }
    if window > 0 {
        let diff = rb.add(Op::Sub, &[row, col], Attrs::new())?;
        let dist = rb.add(Op::Abs, &[diff], Attrs::new())?;
        let w = rb.constant(window as f64)?;
        let near = rb.add(Op::Lt, &[dist, w], Attrs::new())?;
        keep = Some(match keep {
            Some(c) => rb.add(Op::Mul, &[c, near], Attrs::new())?,
            None => near,
        });
    }
    Ok(keep)
}
