//! The causal check.
//!
//! In the step program a query at position `i` reads every key position `j` of the caches;
//! those past `i` hold whatever the cache has there (zeros, or an earlier sequence's keys),
//! where the forward program has the later tokens' keys. So every product and reduction over
//! key positions must come out the same whatever the keys past the query are. This module
//! proves it by following, for each value that ranges over key positions, what it holds at
//! the entries `j > i` (its *upper* entries):
//!
//! - `Exact(c)`: the constant `c` everywhere there (a causal mask's `-inf`, a softmax's 0);
//! - `NonZero`: nonzero everywhere there (a condition that keeps every such entry);
//! - `Clean`: a function of values that read no key past the query (identical in the forward
//!   and the step program);
//! - `Dirty`: it may read keys past the query.
//!
//! The products `q·kᵀ` are dirty; `where(keep, s, -inf)` with a `keep` that is 0 at every upper
//! entry is `Exact(-inf)`; a softmax over key positions of `Exact(-inf)` is `Exact(0)`, and a
//! product with values contracting `Exact(0)` weights reads nothing past the query. Index-only
//! values (masks built from `iota` and constants) are evaluated exactly at every upper entry.
//! Values computed from the tokens are taken to be finite (so `-inf + x` is `-inf`, `0·x` is 0,
//! and `0 / x` is 0, or NaN in a row that is NaN in both programs).

use std::collections::HashMap;

use crate::attr::key;
use crate::decode::DecodeError;
use crate::decode::analysis::Analysis;
use crate::decode::layout::{Layout, Role};
use crate::graph::{Graph, Node, NodeId, ValueId};
use crate::interp::{Tensor, scalar, to_i32};
use crate::op::Op;
use crate::types::DType;

/// What a value holds where a key comes after its query.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Upper {
    Exact(f64),
    NonZero,
    Clean,
    Dirty,
}

impl Upper {
    fn is_dirty(self) -> bool {
        self == Upper::Dirty
    }

    fn exact(self) -> Option<f64> {
        match self {
            Upper::Exact(c) => Some(c),
            _ => None,
        }
    }
}

/// Equal as values, NaN equal to NaN.
fn same(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// The weakest of several: dirty if one is, exact if all are the same constant, else clean.
fn join(items: &[Upper]) -> Upper {
    if items.iter().any(|u| u.is_dirty()) {
        return Upper::Dirty;
    }
    match items.first().and_then(|u| u.exact()) {
        Some(c) if items.iter().all(|u| u.exact().is_some_and(|d| same(c, d))) => Upper::Exact(c),
        _ => Upper::Clean,
    }
}

/// Refuses a program whose products or reductions over key positions may read keys past the
/// query (see the module docs).
pub(super) fn check(
    g: &Graph,
    a: &Analysis,
    states: &HashMap<String, Tensor>,
) -> Result<(), DecodeError> {
    let mut cx = Cx {
        g,
        a,
        upper: HashMap::new(),
        summaries: HashMap::new(),
        pure: pure_values(g, a, states),
        states,
    };
    for id in g.node_ids() {
        let node = g.node(id);
        let out = node.outputs[0];
        if a.key_reductions.contains(&id) {
            cx.check_reduction(id)?;
        }
        if a.token[out.index()] && a.layout[out.index()].get(Role::Key).is_some() {
            let u = cx.result(id);
            cx.upper.insert(out, u);
        }
    }
    Ok(())
}

/// Values computed from `iota`, constants and the states of `states` alone.
fn pure_values(g: &Graph, a: &Analysis, states: &HashMap<String, Tensor>) -> Vec<bool> {
    let mut pure = vec![false; g.values.len()];
    for v in g.states() {
        let known = states.get(g.name_of(v));
        pure[v.index()] = known.is_some_and(|t| t.ty == *g.ty(v));
    }
    for node in &g.nodes {
        let p = !a.token[node.outputs[0].index()]
            && node.outputs.len() == 1
            && node.inputs.iter().all(|v| pure[v.index()]);
        pure[node.outputs[0].index()] = p;
    }
    pure
}

struct Cx<'a> {
    g: &'a Graph,
    a: &'a Analysis,
    /// Token values ranging over key positions.
    upper: HashMap<ValueId, Upper>,
    /// Index-only values, by a key of their computation (the masks of every layer are alike).
    summaries: HashMap<String, Upper>,
    pure: Vec<bool>,
    states: &'a HashMap<String, Tensor>,
}

impl Cx<'_> {
    /// What operand `v` holds at the upper entries of the values it meets.
    fn operand(&mut self, v: ValueId) -> Upper {
        if self.a.token[v.index()] {
            return self.upper.get(&v).copied().unwrap_or(Upper::Clean);
        }
        if !self.pure[v.index()] {
            return Upper::Clean;
        }
        let key = format!("{}|{:?}", self.structure(v), self.a.layout[v.index()]);
        if let Some(&u) = self.summaries.get(&key) {
            return u;
        }
        let u = self.summarize(v).unwrap_or(Upper::Clean);
        self.summaries.insert(key, u);
        u
    }

    /// A text that two index-only values share exactly when they are computed alike.
    fn structure(&self, v: ValueId) -> String {
        let Some(node) = self.g.producer(v) else {
            return format!("state {}", self.g.name_of(v));
        };
        let node = self.g.node(node);
        let operands: Vec<String> = node.inputs.iter().map(|&u| self.structure(u)).collect();
        format!(
            "{}{:?}{:?}({})",
            node.op.name(),
            node.attrs,
            self.g.ty(v).shape,
            operands.join(",")
        )
    }

    /// An index-only value's upper entries, evaluated one by one (`None` where an op has no
    /// per-element evaluation here).
    fn summarize(&self, v: ValueId) -> Option<Upper> {
        let shape = &self.g.ty(v).shape;
        if shape.len() > MAX_RANK {
            return None;
        }
        let l = self.a.layout[v.index()];
        let n = self.a.context;
        let (q, k) = (l.get(Role::Query), l.get(Role::Key));
        let mut coords = vec![0usize; shape.len()];
        let (mut first, mut all_same, mut nonzero) = (None, true, true);
        for _ in 0..shape.iter().product::<usize>() {
            let i = q.map(|p| p.coordinate(&coords, n));
            let j = k.map(|p| p.coordinate(&coords, n));
            let upper = match (i, j) {
                (Some(i), Some(j)) => j > i,
                (Some(i), None) => i + 1 < n,
                (None, Some(j)) => j > 0,
                (None, None) => true,
            };
            if upper {
                let x = self.eval_at(v, &coords)?;
                match first {
                    None => first = Some(x),
                    Some(f) => all_same &= same(f, x),
                }
                nonzero &= x != 0.0;
            }
            advance(&mut coords, shape);
        }
        Some(match first {
            Some(c) if all_same => Upper::Exact(c),
            _ if nonzero => Upper::NonZero,
            _ => Upper::Clean,
        })
    }

    /// The element of index-only `v` at `c` (the interpreter's scalar semantics).
    fn eval_at(&self, v: ValueId, c: &[usize]) -> Option<f64> {
        let g = self.g;
        let Some(node) = g.producer(v) else {
            let t = self.states.get(g.name_of(v))?;
            let flat = (c.iter().zip(t.shape())).fold(0, |flat, (&x, &n)| flat * n + x);
            return t.data.get(flat).copied();
        };
        let node = g.node(node);
        let out = &g.ty(v).shape;
        let mut buf = [0usize; MAX_RANK];
        // operand `u`'s coordinates under broadcasting to `out`
        let broadcast = |u: ValueId, buf: &mut [usize; MAX_RANK]| -> usize {
            let s = &g.ty(u).shape;
            let off = out.len() - s.len();
            for d in 0..s.len() {
                buf[d] = if s[d] == 1 { 0 } else { c[d + off] };
            }
            s.len()
        };
        use Op::*;
        Some(match node.op {
            Iota => c[node.attr(key::AXIS)] as f64,
            Constant => node.attr(key::VALUE),
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu => {
                let x = self.eval_at(node.inputs[0], c)?;
                scalar(node.op, tanh_form(node), &[x])
            }
            Cast => {
                let x = self.eval_at(node.inputs[0], c)?;
                match node.attr(key::DTYPE) {
                    DType::I32 => f64::from(to_i32(x)),
                    DType::F32 => x,
                    DType::F16 => DType::F16.round(x),
                }
            }
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq | Lt | Le | Gt | Ge | Where => {
                let mut args = [0.0; 3];
                for (i, &u) in node.inputs.iter().enumerate() {
                    let r = broadcast(u, &mut buf);
                    args[i] = self.eval_at(u, &buf[..r])?;
                }
                scalar(node.op, false, &args[..node.inputs.len()])
            }
            BroadcastTo => {
                let u = node.inputs[0];
                let r = broadcast(u, &mut buf);
                self.eval_at(u, &buf[..r])?
            }
            Unsqueeze => {
                let axis = node.attr(key::AXIS);
                let kept = c.iter().enumerate().filter(|&(d, _)| d != axis);
                for (r, (_, &x)) in kept.enumerate() {
                    buf[r] = x;
                }
                self.eval_at(node.inputs[0], &buf[..c.len() - 1])?
            }
            Squeeze => {
                let axis = node.attr(key::AXIS);
                let r = c.len() + 1;
                for d in 0..r {
                    buf[d] = match d.cmp(&axis) {
                        std::cmp::Ordering::Less => c[d],
                        std::cmp::Ordering::Equal => 0,
                        std::cmp::Ordering::Greater => c[d - 1],
                    };
                }
                self.eval_at(node.inputs[0], &buf[..r])?
            }
            Transpose => {
                let (d0, d1) = (node.attr(key::DIM0), node.attr(key::DIM1));
                buf[..c.len()].copy_from_slice(c);
                buf.swap(d0, d1);
                self.eval_at(node.inputs[0], &buf[..c.len()])?
            }
            Permute => {
                for (i, p) in node.attr(key::PERM).into_iter().enumerate() {
                    buf[p] = c[i];
                }
                self.eval_at(node.inputs[0], &buf[..c.len()])?
            }
            Reshape => {
                let u = node.inputs[0];
                let s = &g.ty(u).shape;
                let mut flat = 0;
                for (d, &x) in c.iter().enumerate() {
                    flat = flat * out[d] + x;
                }
                for d in (0..s.len()).rev() {
                    buf[d] = flat % s[d];
                    flat /= s[d];
                }
                self.eval_at(u, &buf[..s.len()])?
            }
            Slice => {
                let axis = node.attr(key::AXIS);
                buf[..c.len()].copy_from_slice(c);
                buf[axis] = c[axis] * node.attr(key::STEP) + node.attr(key::START);
                self.eval_at(node.inputs[0], &buf[..c.len()])?
            }
            _ => return None,
        })
    }

    /// What a token node's result, which ranges over key positions, holds at its upper entries.
    fn result(&mut self, id: NodeId) -> Upper {
        let node = self.g.node(id);
        let ops: Vec<Upper> = node.inputs.iter().map(|&v| self.operand(v)).collect();
        let key_axis = |l: Layout| l.get(Role::Key).map(|p| p.axis);
        let over_keys = |axes: &[usize]| {
            key_axis(self.a.token_layout(node.inputs[0])).is_some_and(|k| axes.contains(&k))
        };
        use Op::*;
        match node.op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu => match ops[0] {
                Upper::Exact(c) => Upper::Exact(scalar(node.op, tanh_form(node), &[c])),
                Upper::NonZero => Upper::Clean,
                u => u,
            },
            Cast => match ops[0] {
                Upper::Exact(c) if node.attr(key::DTYPE) == DType::I32 => {
                    Upper::Exact(f64::from(to_i32(c)))
                }
                Upper::NonZero => Upper::Clean,
                u => u,
            },
            Add | Sub | Mul | Div | Pow | Maximum | Minimum => arithmetic(node.op, ops[0], ops[1]),
            Eq | Lt | Le | Gt | Ge => match (ops[0], ops[1]) {
                (Upper::Exact(x), Upper::Exact(y)) => Upper::Exact(scalar(node.op, false, &[x, y])),
                (x, y) => join(&[x, y, Upper::Clean]),
            },
            Where => match ops[0] {
                Upper::Exact(0.0) => ops[2],
                Upper::Exact(_) | Upper::NonZero => ops[1],
                _ => join(&[ops[0], ops[1], ops[2], Upper::Clean]),
            },
            Softmax | LogSoftmax if over_keys(&[node.attr(key::AXIS)]) => match ops[0] {
                Upper::Exact(c) if c == f64::NEG_INFINITY => Upper::Exact(if node.op == Softmax {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }),
                _ => Upper::Clean,
            },
            Reshape | Permute | Transpose | BroadcastTo | Unsqueeze | Squeeze | Slice => ops[0],
            Concat => join(&ops),
            Matmul if self.a.key_uses.contains_key(&(id, 1)) => Upper::Dirty,
            _ => join(&[join(&ops), Upper::Clean]),
        }
    }

    /// A product or reduction over key positions must not read keys past the query.
    fn check_reduction(&mut self, id: NodeId) -> Result<(), DecodeError> {
        let node = self.g.node(id);
        let x = self.operand(node.inputs[0]);
        let fail = |reason: &str| DecodeError::NotCausal {
            value: self.g.name_of(node.outputs[0]).to_string(),
            op: node.op.name(),
            reason: reason.to_string(),
        };
        if node.op == Op::Matmul {
            // `b` holds values read from the caches: the weights must be exactly 0 past the
            // query
            return match x {
                Upper::Exact(0.0) => Ok(()),
                _ => Err(fail(
                    "it sums over key positions with weights that are not exactly 0 where a key \
                     comes after its query; mask the scores to -inf there before the softmax \
                     (`attention(q, k, v, causal=true)`, or `where(le(col, row), s, -inf)` with \
                     `iota`)",
                )),
            };
        }
        if x.is_dirty() {
            return Err(fail(
                "it reduces over key positions a value that depends on the keys of later tokens; \
                 mask the scores to -inf where a key comes after its query \
                 (`attention(q, k, v, causal=true)`, or `where(le(col, row), s, -inf)` with \
                 `iota`)",
            ));
        }
        Ok(())
    }
}

/// The most axes an index-only value may have for its entries to be evaluated one by one.
const MAX_RANK: usize = 8;

/// Steps `coords` to the next element of `shape` in C order.
fn advance(coords: &mut [usize], shape: &[usize]) {
    for d in (0..shape.len()).rev() {
        coords[d] += 1;
        if coords[d] < shape[d] {
            return;
        }
        coords[d] = 0;
    }
}

fn tanh_form(node: &Node) -> bool {
    node.op == Op::Gelu && node.attr(key::APPROXIMATE) == crate::attr::GeluForm::Tanh
}

/// `op(a, b)` of an arithmetic op at upper entries: exact where both are, and where one side
/// absorbs the other (taken finite): `±inf + x`, `0·x`, `0 / x`.
fn arithmetic(op: Op, a: Upper, b: Upper) -> Upper {
    if let (Upper::Exact(x), Upper::Exact(y)) = (a, b) {
        return Upper::Exact(scalar(op, false, &[x, y]));
    }
    let inf = |u: Upper| u.exact().filter(|c| c.is_infinite());
    let zero = |u: Upper| u.exact().is_some_and(|c| c == 0.0);
    match op {
        Op::Add => {
            if let Some(c) = inf(a).or(inf(b)) {
                return Upper::Exact(c);
            }
        }
        Op::Sub => {
            if let Some(c) = inf(a) {
                return Upper::Exact(c);
            }
            if let Some(c) = inf(b) {
                return Upper::Exact(-c);
            }
        }
        Op::Mul if zero(a) || zero(b) => return Upper::Exact(0.0),
        Op::Div if zero(a) && !b.is_dirty() => return Upper::Exact(0.0),
        _ => {}
    }
    join(&[a, b, Upper::Clean])
}
