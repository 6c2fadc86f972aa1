//! Where each value's roles sit: forward from the token ids through every value computed from
//! them, backward into the index-only values (iota, constants, params) that meet them; which
//! operands of which products are keys; and what each key's cache holds.

use std::collections::HashMap;

use crate::attr::key;
use crate::decode::DecodeError;
use crate::decode::layout::{Layout, Place, Role, reshape_place};
use crate::graph::{Graph, Node, NodeId, ValueId};
use crate::op::Op;

/// What the analysis found.
pub(super) struct Analysis {
    /// Per value: computed from the token ids.
    pub token: Vec<bool>,
    /// Per value: its roles (for an index-only value, the roles its readers need).
    pub layout: Vec<Layout>,
    /// Operands that are keys, by (node, operand index), with the value their cache holds.
    pub key_uses: HashMap<(NodeId, usize), ValueId>,
    /// The values the caches hold, in graph order.
    pub caches: Vec<ValueId>,
    /// Products and reductions over key positions, checked by [`super::causal`].
    pub key_reductions: Vec<NodeId>,
    /// The forward program's batch and context length.
    pub batch: usize,
    pub context: usize,
}

impl Analysis {
    pub fn run(g: &Graph, ids: ValueId) -> Result<Analysis, DecodeError> {
        let shape = &g.ty(ids).shape;
        let mut a = Analysis {
            token: vec![false; g.values.len()],
            layout: vec![Layout::default(); g.values.len()],
            key_uses: HashMap::new(),
            caches: Vec::new(),
            key_reductions: Vec::new(),
            batch: shape[0],
            context: shape[1],
        };
        a.token[ids.index()] = true;
        let mut l = Layout::default();
        // A batch of one has no place of its own in merged axes (`[T, 1·H]` is `[T·1, H]`): it
        // is not followed, and such a program derives for one sequence only (see `derive`).
        if a.batch > 1 {
            l.set(Role::Batch, Place::new(0, 1));
        }
        l.set(Role::Query, Place::new(1, 1));
        a.layout[ids.index()] = l;
        let mut cx = Cx { g, a: &mut a };
        for id in g.node_ids() {
            cx.forward(id)?;
        }
        for id in (0..g.nodes.len() as u32).rev().map(NodeId) {
            cx.backward(id)?;
        }
        for v in g.value_ids() {
            cx.check_leaf(v)?;
        }
        cx.place_caches()?;
        Ok(a)
    }

    /// The layout of a token value (empty for an index-only one).
    pub fn token_layout(&self, v: ValueId) -> Layout {
        if self.token[v.index()] {
            self.layout[v.index()]
        } else {
            Layout::default()
        }
    }

    /// The extent of `role` in the forward program.
    pub fn extent(&self, role: Role) -> usize {
        match role {
            Role::Batch => self.batch,
            Role::Query | Role::Key => self.context,
        }
    }
}

struct Cx<'a> {
    g: &'a Graph,
    a: &'a mut Analysis,
}

/// `err` for the node: its first result's name, its op and the reason.
fn op_error(g: &Graph, node: &Node, reason: impl Into<String>) -> DecodeError {
    DecodeError::Op {
        value: g.name_of(node.outputs[0]).to_string(),
        op: node.op.name(),
        reason: reason.into(),
    }
}

impl Cx<'_> {
    fn shape(&self, v: ValueId) -> &[usize] {
        &self.g.ty(v).shape
    }

    fn rank(&self, v: ValueId) -> usize {
        self.g.ty(v).rank()
    }

    fn token_layout(&self, v: ValueId) -> Layout {
        self.a.token_layout(v)
    }

    /// Adds the roles `want` to the index-only value `v`.
    fn demand(&mut self, node: &Node, v: ValueId, want: Layout) -> Result<(), DecodeError> {
        let have = &mut self.a.layout[v.index()];
        for (role, p) in want.places() {
            match have.get(role) {
                None => have.set(role, p),
                Some(q) if q == p => {}
                Some(_) => {
                    return Err(op_error(
                        self.g,
                        node,
                        format!(
                            "reads `{}` with its {role} along another axis than another reader",
                            self.g.name_of(v)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The roles of a result whose leading `dims` axes are the right-aligned broadcast of the
    /// leading axes of `operands` (each `(value, its axes taking part)`): every token operand's
    /// roles; index-only operands get the roles of the axes they do not broadcast.
    fn align(
        &mut self,
        node: &Node,
        operands: &[(ValueId, usize)],
        out: &[usize],
    ) -> Result<Layout, DecodeError> {
        let r = out.len();
        let mut result = Layout::default();
        for &(v, n) in operands {
            let off = r - n;
            for (role, p) in self.token_layout(v).places() {
                if p.axis >= n {
                    continue;
                }
                let q = Place::new(p.axis + off, p.inner);
                if self.shape(v)[p.axis] != out[q.axis] {
                    return Err(op_error(
                        self.g,
                        node,
                        format!("broadcasts the {role} axis of `{}`", self.g.name_of(v)),
                    ));
                }
                match result.get(role) {
                    None => result.set(role, q),
                    Some(have) if have == q => {}
                    Some(_) => {
                        return Err(op_error(
                            self.g,
                            node,
                            format!(
                                "meets the {role} of its operands along two different axes{}",
                                if role == Role::Query {
                                    " (attention scores must be written as \
                                     matmul(q, transpose(k)), queries as rows)"
                                } else {
                                    ""
                                }
                            ),
                        ));
                    }
                }
            }
        }
        for &(v, n) in operands {
            let off = r - n;
            let token = self.a.token[v.index()];
            let mut want = Layout::default();
            for (role, p) in result.places() {
                let Some(axis) = p.axis.checked_sub(off) else {
                    continue;
                };
                let extent = self.shape(v)[axis];
                if token && self.a.layout[v.index()].get(role).is_none() && extent != 1 {
                    return Err(op_error(
                        self.g,
                        node,
                        format!(
                            "combines `{}`, which varies along the {role} axis of another operand \
                             without being computed per {}",
                            self.g.name_of(v),
                            if role == Role::Batch {
                                "sequence"
                            } else {
                                "position"
                            }
                        ),
                    ));
                }
                if !token && extent != 1 {
                    want.set(role, Place::new(axis, p.inner));
                }
            }
            if !token {
                self.demand(node, v, want)?;
            }
        }
        Ok(result)
    }

    /// The roles of a token node's result.
    fn forward(&mut self, id: NodeId) -> Result<(), DecodeError> {
        let g = self.g;
        let node = g.node(id);
        if !node.inputs.iter().any(|v| self.a.token[v.index()]) {
            return Ok(());
        }
        let fail = |reason: String| op_error(g, node, reason);
        let out = node.outputs[0];
        let out_shape = &g.ty(out).shape;
        let x = node.inputs.first().copied();
        let lx = x.map(|x| self.token_layout(x)).unwrap_or_default();
        use Op::*;
        let layout = match node.op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu | Cast => lx,
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq | Lt | Le | Gt | Ge | Where => {
                let operands: Vec<(ValueId, usize)> =
                    node.inputs.iter().map(|&v| (v, self.rank(v))).collect();
                self.align(node, &operands, out_shape)?
            }
            Sum | Mean | Max | Min | Logsumexp => {
                self.reduce(id, &node.attr(key::AXES), node.attr(key::KEEPDIM))?
            }
            Argmax => self.reduce(id, &[node.attr(key::AXIS)], node.attr(key::KEEPDIM))?,
            Cumsum => {
                let axis = node.attr(key::AXIS);
                if let Some((role, _)) = lx.at(axis).next() {
                    return Err(fail(format!(
                        "runs a prefix sum along its {role} axis, which generation cannot follow"
                    )));
                }
                lx
            }
            Reshape => {
                let from = self.shape(node.inputs[0]).to_vec();
                let mut l = Layout::default();
                for (role, p) in lx.places() {
                    let n = self.a.extent(role);
                    let q = reshape_place(&from, out_shape, p, n).ok_or_else(|| {
                        fail(format!(
                            "splits the {role} axis over several axes (from {from:?} to \
                             {out_shape:?})"
                        ))
                    })?;
                    l.set(role, q);
                }
                l
            }
            Permute => {
                let perm = node.attr(key::PERM);
                lx.map_axes(|a| perm.iter().position(|&p| p == a))
            }
            Transpose => {
                let (d0, d1) = (node.attr(key::DIM0), node.attr(key::DIM1));
                lx.map_axes(|a| Some(swap(a, d0, d1)))
            }
            BroadcastTo => {
                let v = node.inputs[0];
                self.align(node, &[(v, self.rank(v))], out_shape)?
            }
            Unsqueeze => {
                let axis = node.attr(key::AXIS);
                lx.map_axes(|a| Some(if a >= axis { a + 1 } else { a }))
            }
            Squeeze => {
                let axis = node.attr(key::AXIS);
                if let Some((role, _)) = lx.at(axis).next() {
                    return Err(fail(format!("removes the {role} axis")));
                }
                lx.map_axes(|a| Some(if a > axis { a - 1 } else { a }))
            }
            Slice => {
                let axis = node.attr(key::AXIS);
                if let Some((role, _)) = lx.at(axis).next()
                    && !whole_slice(node, self.shape(node.inputs[0])[axis])
                {
                    return Err(fail(format!(
                        "slices the {role} axis: generation computes every position alike, so a \
                         program may not shift or drop positions"
                    )));
                }
                lx
            }
            Concat => {
                let axis = node.attr(key::AXIS);
                for &v in &node.inputs {
                    if let Some((role, _)) = self.token_layout(v).at(axis).next() {
                        return Err(fail(format!("joins values along the {role} axis")));
                    }
                }
                let operands: Vec<(ValueId, usize)> =
                    node.inputs.iter().map(|&v| (v, self.rank(v))).collect();
                self.align_except(node, &operands, out_shape, axis)?
            }
            Matmul => self.matmul(id)?,
            Softmax | LogSoftmax => {
                let axis = node.attr(key::AXIS);
                self.normalize(id, &[axis])?;
                lx
            }
            LayerNorm | RmsNorm => {
                self.weights_not_tokens(node, 1)?;
                let last = self.rank(node.inputs[0]) - 1;
                self.normalize(id, &[last])?;
                lx
            }
            GroupNorm => {
                self.weights_not_tokens(node, 1)?;
                let axes: Vec<usize> = (1..self.rank(node.inputs[0])).collect();
                self.normalize(id, &axes)?;
                lx
            }
            Conv2d | MaxPool2d | AvgPool2d => {
                self.weights_not_tokens(node, 1)?;
                if let Some((role, _)) = lx.places().find(|(_, p)| p.axis != 0) {
                    return Err(fail(format!(
                        "slides a window over the {role} axis (only the batch may be the first \
                         axis of a convolution or pooling)"
                    )));
                }
                lx
            }
            Embedding => {
                if self.a.token[node.inputs[0].index()] {
                    return Err(fail(
                        "gathers rows of a table computed from the tokens".to_string(),
                    ));
                }
                self.token_layout(node.inputs[1])
            }
            CrossEntropy | MseLoss => {
                return Err(fail(
                    "is a loss: the logits must be the next-token scores, not a loss".to_string(),
                ));
            }
            Conv2dGradInput | Conv2dGradWeight | MaxPool2dGrad | AvgPool2dGrad | EmbeddingGrad
            | SliceGrad | Grad | Sgd | Adam | AdamW => {
                return Err(fail(
                    "is not a forward op (gradients and optimizer steps have no place in the \
                     logits' computation)"
                        .to_string(),
                ));
            }
            Attention | Constant | Iota => {
                unreachable!("attention is expanded first; constants and iota read no tokens")
            }
        };
        self.a.token[out.index()] = true;
        self.a.layout[out.index()] = layout;
        Ok(())
    }

    /// [`Cx::align`] over operands of equal rank, every axis but `skip` (`concat`'s).
    fn align_except(
        &mut self,
        node: &Node,
        operands: &[(ValueId, usize)],
        out: &[usize],
        skip: usize,
    ) -> Result<Layout, DecodeError> {
        // The joined axis carries no role (checked by the caller), so aligning against the
        // result's shape with that axis taken from each operand is plain alignment.
        let mut result = Layout::default();
        for &(v, n) in operands {
            let mut shape = out.to_vec();
            shape[skip] = self.shape(v)[skip];
            let l = self.align(node, &[(v, n)], &shape)?;
            for (role, p) in l.places() {
                match result.get(role) {
                    None => result.set(role, p),
                    Some(q) if q == p => {}
                    Some(_) => {
                        return Err(op_error(
                            self.g,
                            node,
                            format!("joins values whose {role} lie along different axes"),
                        ));
                    }
                }
            }
        }
        for &(v, _) in operands {
            if !self.a.token[v.index()] {
                self.demand(node, v, result)?;
            }
        }
        Ok(result)
    }

    /// Params of a norm or convolution (operands from `first` on) must not depend on tokens.
    fn weights_not_tokens(&self, node: &Node, first: usize) -> Result<(), DecodeError> {
        match node.inputs[first..]
            .iter()
            .find(|v| self.a.token[v.index()])
        {
            Some(&v) => Err(op_error(
                self.g,
                node,
                format!(
                    "takes `{}`, computed from the tokens, as a weight",
                    self.g.name_of(v)
                ),
            )),
            None => Ok(()),
        }
    }

    /// A normalization (softmax, norms) of the first operand over `axes`: over the batch or
    /// the positions it mixes sequences or positions; over key positions it is a reduction the
    /// causal check looks at.
    fn normalize(&mut self, id: NodeId, axes: &[usize]) -> Result<(), DecodeError> {
        let node = self.g.node(id);
        let l = self.token_layout(node.inputs[0]);
        for &axis in axes {
            for (role, _) in l.at(axis) {
                match role {
                    Role::Key => self.a.key_reductions.push(id),
                    Role::Batch | Role::Query => {
                        return Err(op_error(self.g, node, mixes(role, axis)));
                    }
                }
            }
        }
        Ok(())
    }

    /// A reduction of the first operand over `axes`.
    fn reduce(&mut self, id: NodeId, axes: &[usize], keepdim: bool) -> Result<Layout, DecodeError> {
        self.normalize(id, axes)?;
        let l = self.token_layout(self.g.node(id).inputs[0]);
        let l = l.map_axes(|a| {
            if axes.contains(&a) {
                None
            } else if keepdim {
                Some(a)
            } else {
                Some(a - axes.iter().filter(|&&r| r < a).count())
            }
        });
        Ok(l)
    }

    /// `matmul(a, b)` (both of rank 2 or more after expansion): rows of `a`, columns of `b`,
    /// broadcast batch axes, and the contraction. Two cases read keys: `a`'s rows and `b`'s
    /// columns are positions (`q·kᵀ`, the scores: `b` holds keys), and `a` contracts key
    /// positions with `b`'s positions (`p·v`: `b` holds values).
    fn matmul(&mut self, id: NodeId) -> Result<Layout, DecodeError> {
        let g = self.g;
        let node = g.node(id);
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let (ra, rb) = (self.rank(a), self.rank(b));
        let out_shape = g.ty(node.outputs[0]).shape.clone();
        let r = out_shape.len();
        let (la, lb) = (self.token_layout(a), self.token_layout(b));
        let fail = |reason: String| op_error(g, node, reason);
        let mut key_use = false;
        let b_rows = lb.at(rb - 2).next();
        for (role, _) in la.at(ra - 1) {
            match (role, b_rows) {
                (Role::Key, Some((Role::Query, _))) => {
                    key_use = true;
                    self.a.key_reductions.push(id);
                }
                (Role::Key, _) => {
                    return Err(fail(
                        "contracts key positions with a value that does not range over the \
                         positions"
                            .to_string(),
                    ));
                }
                (role, _) => return Err(fail(mixes(role, ra - 1))),
            }
        }
        for (role, _) in lb.at(rb - 2) {
            if !(role == Role::Query && key_use) {
                return Err(fail(mixes(role, rb - 2)));
            }
        }
        let mut result = Layout::default();
        for (role, p) in la.at(ra - 2) {
            result.set(role, Place::new(r - 2, p.inner));
        }
        let query_rows = la.get(Role::Query).is_some_and(|p| p.axis == ra - 2);
        for (role, p) in lb.at(rb - 1) {
            let role = if role == Role::Query && query_rows {
                key_use = true;
                Role::Key
            } else {
                role
            };
            if result.get(role).is_some() {
                return Err(fail(format!(
                    "meets the {role} of its operands along two axes"
                )));
            }
            result.set(role, Place::new(r - 1, p.inner));
        }
        let batch = self.align(node, &[(a, ra - 2), (b, rb - 2)], &out_shape[..r - 2])?;
        for (role, p) in batch.places() {
            if result.get(role).is_some() {
                return Err(fail(format!(
                    "meets the {role} of its operands along two axes"
                )));
            }
            result.set(role, p);
        }
        if key_use {
            self.a.key_uses.insert((id, 1), b);
        }
        Ok(result)
    }

    /// Carries the roles an index-only node's result must have back to its operands.
    fn backward(&mut self, id: NodeId) -> Result<(), DecodeError> {
        let g = self.g;
        let node = g.node(id);
        let out = node.outputs[0];
        if self.a.token[out.index()] || node.outputs.len() != 1 {
            return Ok(());
        }
        let want = self.a.layout[out.index()];
        if want.is_empty() {
            return Ok(());
        }
        let fail = |reason: String| op_error(g, node, reason);
        let out_shape = g.ty(out).shape.clone();
        use Op::*;
        match node.op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu | Cast => self.demand(node, node.inputs[0], want)?,
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq | Lt | Le | Gt | Ge | Where
            | BroadcastTo => {
                for &v in &node.inputs {
                    let off = out_shape.len() - self.rank(v);
                    let shape = self.shape(v).to_vec();
                    let l = want.map_axes(|a| a.checked_sub(off).filter(|&a| shape[a] != 1));
                    self.demand(node, v, l)?;
                }
            }
            Sum | Mean | Max | Min | Logsumexp | Argmax => {
                let axes = match node.op {
                    Argmax => vec![node.attr(key::AXIS)],
                    _ => node.attr(key::AXES),
                };
                let rank = self.rank(node.inputs[0]);
                let kept: Vec<usize> = (0..rank).filter(|a| !axes.contains(a)).collect();
                let l = if node.attr(key::KEEPDIM) {
                    want
                } else {
                    want.map_axes(|a| Some(kept[a]))
                };
                self.demand(node, node.inputs[0], l)?;
            }
            Reshape => {
                let x = node.inputs[0];
                let to = self.shape(x).to_vec();
                let mut l = Layout::default();
                for (role, p) in want.places() {
                    let n = self.a.extent(role);
                    let q = reshape_place(&out_shape, &to, p, n).ok_or_else(|| {
                        fail(format!(
                            "comes from a value that holds the {role} over several axes"
                        ))
                    })?;
                    l.set(role, q);
                }
                self.demand(node, x, l)?;
            }
            Permute => {
                let perm = node.attr(key::PERM);
                self.demand(node, node.inputs[0], want.map_axes(|a| Some(perm[a])))?;
            }
            Transpose => {
                let (d0, d1) = (node.attr(key::DIM0), node.attr(key::DIM1));
                self.demand(
                    node,
                    node.inputs[0],
                    want.map_axes(|a| Some(swap(a, d0, d1))),
                )?;
            }
            Unsqueeze => {
                let axis = node.attr(key::AXIS);
                let l = want.map_axes(|a| (a != axis).then(|| if a > axis { a - 1 } else { a }));
                self.demand(node, node.inputs[0], l)?;
            }
            Squeeze => {
                let axis = node.attr(key::AXIS);
                let l = want.map_axes(|a| Some(if a >= axis { a + 1 } else { a }));
                self.demand(node, node.inputs[0], l)?;
            }
            Slice => {
                let axis = node.attr(key::AXIS);
                if let Some((role, _)) = want.at(axis).next()
                    && !whole_slice(node, self.shape(node.inputs[0])[axis])
                {
                    return Err(fail(format!(
                        "slices the {role} axis of a value that the positions read"
                    )));
                }
                self.demand(node, node.inputs[0], want)?;
            }
            Concat => {
                let axis = node.attr(key::AXIS);
                if let Some((role, _)) = want.at(axis).next() {
                    return Err(fail(format!("joins values along the {role} axis")));
                }
                for &v in &node.inputs {
                    self.demand(node, v, want)?;
                }
            }
            Matmul => {
                let (a, b) = (node.inputs[0], node.inputs[1]);
                let (ra, rb, r) = (self.rank(a), self.rank(b), out_shape.len());
                let rows = want.map_axes(|ax| (ax == r - 2).then_some(ra - 2));
                let cols = want.map_axes(|ax| (ax == r - 1).then_some(rb - 1));
                let batch = |rank: usize, shape: &[usize]| {
                    want.map_axes(|ax| {
                        (ax < r - 2)
                            .then(|| (ax + rank).checked_sub(r))
                            .flatten()
                            .filter(|&a| shape[a] != 1)
                    })
                };
                let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
                let (ba, bb) = (batch(ra, &sa), batch(rb, &sb));
                self.demand(node, a, rows)?;
                self.demand(node, a, ba)?;
                self.demand(node, b, cols)?;
                self.demand(node, b, bb)?;
            }
            Softmax | LogSoftmax | LayerNorm | RmsNorm | Cumsum => {
                let axis = match node.op {
                    Softmax | LogSoftmax | Cumsum => node.attr(key::AXIS),
                    _ => out_shape.len() - 1,
                };
                if let Some((role, _)) = want.at(axis).next() {
                    let what = if node.op == Cumsum {
                        "sums a prefix of"
                    } else {
                        "normalizes"
                    };
                    return Err(fail(format!(
                        "{what} a value that does not depend on the tokens over its {role} \
                         axis, which generation shortens"
                    )));
                }
                self.demand(node, node.inputs[0], want)?;
            }
            Embedding => {
                let last = out_shape.len() - 1;
                if want.at(last).next().is_some() {
                    return Err(fail(
                        "gathers rows whose columns are positions; gather positions by rows \
                         instead"
                            .to_string(),
                    ));
                }
                self.demand(node, node.inputs[1], want)?;
            }
            GroupNorm | Conv2d | MaxPool2d | AvgPool2d | CrossEntropy | MseLoss
            | Conv2dGradInput | Conv2dGradWeight | MaxPool2dGrad | AvgPool2dGrad
            | EmbeddingGrad | SliceGrad | Grad | Sgd | Adam | AdamW | Attention => {
                let (role, _) = want.places().next().expect("not empty");
                return Err(fail(format!(
                    "computes a value that the {role} axis reads, from no token; only \
                     elementwise ops, views, products, reductions over other axes and gathers \
                     may build such values"
                )));
            }
            Constant | Iota => {}
        }
        Ok(())
    }

    /// Params and states that positions read must hold them along an axis of their own; iota
    /// must count along such an axis; and nothing index-only varies per sequence.
    fn check_leaf(&self, v: ValueId) -> Result<(), DecodeError> {
        let g = self.g;
        if self.a.token[v.index()] {
            return Ok(());
        }
        let l = self.a.layout[v.index()];
        if l.is_empty() {
            return Ok(());
        }
        let shape = self.shape(v);
        let own = |role: Role, p: Place| p.inner == 1 && shape[p.axis] == self.a.extent(role);
        let iota_axis = g
            .producer(v)
            .map(|n| g.node(n))
            .filter(|n| n.op == Op::Iota)
            .map(|n| n.attr(key::AXIS));
        let persistent = g.value(v).is_persistent();
        for (role, p) in l.places() {
            let problem = if role == Role::Batch && persistent {
                Some("varies along the batch axis, but it does not depend on the tokens")
            } else if (persistent || iota_axis == Some(p.axis)) && !own(role, p) {
                Some("holds it merged with another axis")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(DecodeError::Leaf {
                    value: g.name_of(v).to_string(),
                    role,
                    axis: p.axis,
                    problem,
                });
            }
        }
        Ok(())
    }

    /// For every key use, the value its cache holds: the operand itself, or the earliest value
    /// it is a view of (through transposes, permutes, reshapes, unsqueezes, squeezes and
    /// broadcasts) that still holds the positions along an axis of their own. A cache so holds
    /// the keys of grouped-query attention once per key head, not once per query head.
    fn place_caches(&mut self) -> Result<(), DecodeError> {
        let g = self.g;
        let own = |a: &Analysis, v: ValueId| {
            a.layout[v.index()]
                .get(Role::Query)
                .is_some_and(|p| p.inner == 1 && g.ty(v).shape[p.axis] == a.context)
        };
        let mut uses: Vec<((NodeId, usize), ValueId)> =
            self.a.key_uses.iter().map(|(&k, &v)| (k, v)).collect();
        uses.sort();
        for (at, b) in uses {
            let mut v = b;
            while let Some(n) = g.producer(v).map(|n| g.node(n))
                && matches!(
                    n.op,
                    Op::Transpose
                        | Op::Permute
                        | Op::Reshape
                        | Op::Unsqueeze
                        | Op::Squeeze
                        | Op::BroadcastTo
                )
                && self.a.token[n.inputs[0].index()]
                && own(self.a, n.inputs[0])
            {
                v = n.inputs[0];
            }
            if !own(self.a, v) {
                let node = g.node(at.0);
                return Err(op_error(
                    g,
                    node,
                    format!(
                        "reads keys `{}` whose positions share an axis with another one; keep \
                         the positions an axis of their own up to the attention",
                        g.name_of(b)
                    ),
                ));
            }
            self.a.key_uses.insert(at, v);
            if !self.a.caches.contains(&v) {
                self.a.caches.push(v);
            }
        }
        self.a.caches.sort();
        Ok(())
    }
}

/// Whether a verified `slice` node takes its whole axis of `extent`.
fn whole_slice(node: &Node, extent: usize) -> bool {
    node.attr(key::START) == 0 && node.attr(key::END) == extent && node.attr(key::STEP) == 1
}

fn swap(a: usize, d0: usize, d1: usize) -> usize {
    if a == d0 {
        d1
    } else if a == d1 {
        d0
    } else {
        a
    }
}

/// Why reducing over a batch or positions axis is refused.
fn mixes(role: Role, axis: usize) -> String {
    match role {
        Role::Batch => format!(
            "combines the sequences of the batch (axis {axis}), which generation computes \
             independently"
        ),
        Role::Query | Role::Key => format!(
            "combines the positions (axis {axis}): the result at one position would depend on \
             later tokens, so the program is not causal"
        ),
    }
}
