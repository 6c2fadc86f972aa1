//! Lowering to primitives: every op that is defined in terms of other ops becomes those ops, so
//! that the optimizer sees one vocabulary and finds fused kernels (softmax, norms, losses,
//! optimizer updates) by rewriting instead of the backend hand-writing them.
//!
//! After [`decompose`] a graph holds only *primitives*: elementwise ops (unary, binary,
//! comparisons, `where`, `cast`), `constant`, `iota`, the reductions `sum`, `max`, `min` and
//! `argmax`, the view and layout ops, `matmul`, and the ops with their own kernels (`conv2d`,
//! pooling, `embedding` and the backward primitives). [`is_primitive`] says which.
//!
//! Each expansion computes exactly what the interpreter computes for the op, step for step, so
//! the interpreter gives the same values (to f64 rounding) for a graph and its decomposition; the
//! tests in `tests/decompose.rs` check every op. The identities, by op:
//!
//! | op | primitives |
//! |---|---|
//! | `mean(x)` | `sum(x) / n` |
//! | `logsumexp(x)` | `m = max(x)`; `m + log Σ exp(x − m)` where `m` is finite, else `m` |
//! | `softmax(x)` | `e = exp(x − max(x))`; `e / Σ e` |
//! | `log_softmax(x)` | `x − max(x) − log Σ exp(x − max(x))` |
//! | `layer_norm` | `c = x − Σx/n`; `c · rsqrt(Σc²/n + eps) · γ + β` |
//! | `rms_norm` | `x · rsqrt(Σx²/n + eps) · γ` |
//! | `group_norm` | `layer_norm` of `[N, G, C/G·S]` without affine, then `· γ + β` per channel |
//! | `cross_entropy` | `logsumexp(x) − Σ where(iota == label, x, 0)`, reduced |
//! | `mse_loss` | `(a − b)²`, reduced |
//! | `sgd`, `adam`, `adamw` | the update formulas of [`crate::interp`]'s optimizers |
//!
//! `mean` inside these (and `reduction="mean"`) divides by the count, as the interpreter does.
//! An op on `f16` values is expanded on its operands cast to `f32`, and its results are cast
//! back: it computes in `f32` and rounds once, as IR.md defines every op on `f16`.

use crate::attr::{Attrs, Reduction, key};
use crate::expand::{Rebuild, rebuild_mapped};
use crate::graph::{Graph, GraphError, Node, ValueId};
use crate::op::{Op, OpClass};
use crate::types::DType;

/// Whether `op` stays as it is through [`decompose`].
pub fn is_primitive(op: Op) -> bool {
    use Op::*;
    match op {
        Mean | Logsumexp | Softmax | LogSoftmax | LayerNorm | RmsNorm | GroupNorm
        | CrossEntropy | MseLoss | Sgd | Adam | AdamW | Attention | Grad => false,
        _ => !matches!(op.class(), OpClass::Composite | OpClass::Grad),
    }
}

/// `g` with every non-primitive op replaced by primitives; names, assigns and outputs are kept.
/// `g` must be free of `attention` and `grad` (run expansion and autodiff first).
pub fn decompose(g: &Graph) -> Graph {
    decompose_mapped(g).0
}

/// [`decompose`], also returning the new graph's value for each value of `g` (by index; a value
/// of a decomposed op is its result's replacement).
pub fn decompose_mapped(g: &Graph) -> (Graph, Vec<Option<ValueId>>) {
    let mut shared = Shared::default();
    rebuild_mapped(g, |rb, node, inputs| {
        if is_primitive(node.op) {
            return Ok(None);
        }
        let half = node
            .outputs
            .iter()
            .any(|&o| rb.old.ty(o).dtype == DType::F16);
        let mut b = Builder {
            rb,
            shared: &mut shared,
        };
        if !half {
            return b.expand(node, inputs).map(Some);
        }
        // an op on f16 values computes in f32 and rounds its results once (IR.md)
        let wide = inputs
            .iter()
            .map(|&v| b.cast_if(v, DType::F16, DType::F32))
            .collect::<Result<Vec<_>>>()?;
        let results = b.expand(node, &wide)?;
        results
            .into_iter()
            .map(|r| b.cast_if(r, DType::F32, DType::F16))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    })
    .expect("the decomposition of a verified graph type-checks")
}

/// Emits primitives into a graph under [`rebuild_mapped`].
struct Builder<'r, 'a> {
    rb: &'r mut Rebuild<'a>,
    shared: &'r mut Shared,
}

/// Values several optimizer nodes of one step need, made once: the two bias corrections of a
/// `bias_corrections` operand, and `1 − wd·lr` per (lr operand, weight decay).
#[derive(Default)]
struct Shared {
    corrections: std::collections::HashMap<ValueId, (ValueId, ValueId)>,
    decay: std::collections::HashMap<(ValueId, u64), ValueId>,
}

type Result<T> = std::result::Result<T, GraphError>;

impl Builder<'_, '_> {
    fn shape(&self, v: ValueId) -> Vec<usize> {
        self.rb.graph().ty(v).shape.clone()
    }

    fn op(&mut self, op: Op, inputs: &[ValueId]) -> Result<ValueId> {
        self.rb.add(op, inputs, Attrs::new())
    }

    /// `v` cast to `to` where its dtype is `from`, else `v`.
    fn cast_if(&mut self, v: ValueId, from: DType, to: DType) -> Result<ValueId> {
        if self.rb.graph().ty(v).dtype != from {
            return Ok(v);
        }
        self.rb
            .add(Op::Cast, &[v], Attrs::new().and(key::DTYPE, to))
    }

    fn c(&mut self, value: f64) -> Result<ValueId> {
        self.rb.constant(value)
    }

    /// `op(x, c)` with a literal `c`.
    fn with_const(&mut self, op: Op, x: ValueId, value: f64) -> Result<ValueId> {
        let c = self.c(value)?;
        self.op(op, &[x, c])
    }

    /// `op(c, x)` with a literal `c`.
    fn const_with(&mut self, op: Op, value: f64, x: ValueId) -> Result<ValueId> {
        let c = self.c(value)?;
        self.op(op, &[c, x])
    }

    fn reduce(&mut self, op: Op, x: ValueId, axes: &[usize], keepdim: bool) -> Result<ValueId> {
        let attrs = Attrs::new()
            .and(key::AXES, axes.to_vec())
            .and(key::KEEPDIM, keepdim);
        self.rb.add(op, &[x], attrs)
    }

    /// `sum(x, axes, keepdim) / count`.
    fn mean(&mut self, x: ValueId, axes: &[usize], keepdim: bool) -> Result<ValueId> {
        let shape = self.shape(x);
        let n: usize = axes.iter().map(|&a| shape[a]).product();
        let s = self.reduce(Op::Sum, x, axes, keepdim)?;
        self.with_const(Op::Div, s, n as f64)
    }

    fn reshape(&mut self, x: ValueId, shape: Vec<usize>) -> Result<ValueId> {
        self.rb
            .add(Op::Reshape, &[x], Attrs::new().and(key::SHAPE, shape))
    }

    /// `log Σ exp(x)` over `axes` (kept), shifted by the max; the max itself where it is not
    /// finite (`-inf` for a row of `-inf`, `inf` or NaN when one is).
    fn logsumexp_keep(&mut self, x: ValueId, axes: &[usize]) -> Result<ValueId> {
        let m = self.reduce(Op::Max, x, axes, true)?;
        let abs = self.op(Op::Abs, &[m])?;
        let finite = self.with_const(Op::Lt, abs, f64::INFINITY)?;
        let zero = self.c(0.0)?;
        let shift = self.op(Op::Where, &[finite, m, zero])?;
        let centered = self.op(Op::Sub, &[x, shift])?;
        let e = self.op(Op::Exp, &[centered])?;
        let s = self.reduce(Op::Sum, e, axes, true)?;
        let l = self.op(Op::Log, &[s])?;
        let r = self.op(Op::Add, &[shift, l])?;
        self.op(Op::Where, &[finite, r, m])
    }

    /// `(x − mean) · rsqrt(var + eps)` over the last axis.
    fn normalize_last(&mut self, x: ValueId, eps: f64) -> Result<ValueId> {
        let last = self.shape(x).len() - 1;
        let mu = self.mean(x, &[last], true)?;
        let c = self.op(Op::Sub, &[x, mu])?;
        let c2 = self.op(Op::Square, &[c])?;
        let var = self.mean(c2, &[last], true)?;
        let ve = self.with_const(Op::Add, var, eps)?;
        let inv = self.op(Op::Rsqrt, &[ve])?;
        self.op(Op::Mul, &[c, inv])
    }

    /// Applies a loss `reduction` to per-element losses.
    fn reduction(&mut self, losses: ValueId, reduction: Reduction) -> Result<ValueId> {
        let rank = self.shape(losses).len();
        let all: Vec<usize> = (0..rank).collect();
        match reduction {
            Reduction::None => Ok(losses),
            Reduction::Sum => self.reduce(Op::Sum, losses, &all, false),
            Reduction::Mean => self.mean(losses, &all, false),
        }
    }

    /// `cross_entropy`'s per-row losses with rows labelled `ignore` counting 0 and left out of
    /// the mean (`Σ losses / Σ kept`), and NaN for a row whose label is neither `ignore` nor a
    /// class (which the interpreter refuses; bounds admit the labels between).
    fn ignoring(
        &mut self,
        per_row: ValueId,
        labels: ValueId,
        ignore: i64,
        classes: usize,
        reduction: Reduction,
    ) -> Result<ValueId> {
        let ignored = self.with_const(Op::Eq, labels, ignore as f64)?;
        let at_least_0 = self.with_const(Op::Ge, labels, 0.0)?;
        let below_c = self.with_const(Op::Lt, labels, classes as f64)?;
        let class = self.op(Op::Mul, &[at_least_0, below_c])?;
        // NaN is no constant: the square root of -1
        let minus_one = self.c(-1.0)?;
        let nan = self.op(Op::Sqrt, &[minus_one])?;
        let checked = self.op(Op::Where, &[class, per_row, nan])?;
        let zero = self.c(0.0)?;
        let losses = self.op(Op::Where, &[ignored, zero, checked])?;
        match reduction {
            Reduction::Mean => {
                let total = self.reduce(Op::Sum, losses, &[0], false)?;
                let kept = self.const_with(Op::Sub, 1.0, ignored)?;
                let count = self.reduce(Op::Sum, kept, &[0], false)?;
                self.op(Op::Div, &[total, count])
            }
            Reduction::Sum | Reduction::None => self.reduction(losses, reduction),
        }
    }

    fn expand(&mut self, node: &Node, x: &[ValueId]) -> Result<Vec<ValueId>> {
        use Op::*;
        let one = |v: ValueId| Ok(vec![v]);
        match node.op {
            Mean => {
                let (axes, keep) = (node.attr(key::AXES), node.attr(key::KEEPDIM));
                one(self.mean(x[0], &axes, keep)?)
            }
            Logsumexp => {
                let axes = node.attr(key::AXES);
                let l = self.logsumexp_keep(x[0], &axes)?;
                if node.attr(key::KEEPDIM) {
                    return one(l);
                }
                let out = self.rb.old.ty(node.outputs[0]).shape.clone();
                one(self.reshape(l, out)?)
            }
            Softmax => {
                let axis = node.attr(key::AXIS);
                let m = self.reduce(Max, x[0], &[axis], true)?;
                let c = self.op(Sub, &[x[0], m])?;
                let e = self.op(Exp, &[c])?;
                let s = self.reduce(Sum, e, &[axis], true)?;
                one(self.op(Div, &[e, s])?)
            }
            LogSoftmax => {
                let axis = node.attr(key::AXIS);
                let m = self.reduce(Max, x[0], &[axis], true)?;
                let c = self.op(Sub, &[x[0], m])?;
                let e = self.op(Exp, &[c])?;
                let s = self.reduce(Sum, e, &[axis], true)?;
                let l = self.op(Log, &[s])?;
                one(self.op(Sub, &[c, l])?)
            }
            LayerNorm => {
                let n = self.normalize_last(x[0], node.attr(key::EPS))?;
                let scaled = self.op(Mul, &[n, x[1]])?;
                one(self.op(Add, &[scaled, x[2]])?)
            }
            RmsNorm => {
                let last = self.shape(x[0]).len() - 1;
                let sq = self.op(Square, &[x[0]])?;
                let ms = self.mean(sq, &[last], true)?;
                let me = self.with_const(Add, ms, node.attr(key::EPS))?;
                let inv = self.op(Rsqrt, &[me])?;
                let n = self.op(Mul, &[x[0], inv])?;
                one(self.op(Mul, &[n, x[1]])?)
            }
            GroupNorm => {
                let shape = self.shape(x[0]);
                let groups = node.attr(key::GROUPS);
                let c = shape[1];
                let rest: usize = shape[1..].iter().product::<usize>() / groups;
                let grouped = self.reshape(x[0], vec![shape[0], groups, rest])?;
                let n = self.normalize_last(grouped, node.attr(key::EPS))?;
                let n = self.reshape(n, shape.clone())?;
                // gamma, beta [C] → [C, 1, ...] so that they broadcast per channel
                let mut per_channel = vec![c];
                per_channel.extend(std::iter::repeat_n(1, shape.len() - 2));
                let gamma = self.reshape(x[1], per_channel.clone())?;
                let beta = self.reshape(x[2], per_channel)?;
                let scaled = self.op(Mul, &[n, gamma])?;
                one(self.op(Add, &[scaled, beta])?)
            }
            CrossEntropy => {
                let (logits, labels) = (x[0], x[1]);
                let shape = self.shape(logits);
                let lse = self.logsumexp_keep(logits, &[1])?;
                let classes = self.rb.add(
                    Iota,
                    &[],
                    Attrs::new()
                        .and(key::SHAPE, shape.clone())
                        .and(key::AXIS, 1),
                )?;
                let labels_f =
                    self.rb
                        .add(Cast, &[labels], Attrs::new().and(key::DTYPE, DType::F32))?;
                let labels_col = self.reshape(labels_f, vec![shape[0], 1])?;
                let hit = self.op(Eq, &[classes, labels_col])?;
                let zero = self.c(0.0)?;
                let picked = self.op(Where, &[hit, logits, zero])?;
                let picked = self.reduce(Sum, picked, &[1], true)?;
                let per_row = self.op(Sub, &[lse, picked])?;
                let per_row = self.reshape(per_row, vec![shape[0]])?;
                let reduction = node.attr(key::REDUCTION);
                match node.attrs.try_of(key::IGNORE_INDEX) {
                    None => one(self.reduction(per_row, reduction)?),
                    Some(ignore) => {
                        let labels_f = self.reshape(labels_f, vec![shape[0]])?;
                        one(self.ignoring(per_row, labels_f, ignore, shape[1], reduction)?)
                    }
                }
            }
            MseLoss => {
                let d = self.op(Sub, &[x[0], x[1]])?;
                let sq = self.op(Square, &[d])?;
                one(self.reduction(sq, node.attr(key::REDUCTION))?)
            }
            Sgd => self.sgd(node, x),
            Adam | AdamW => self.adam(node, x),
            other => unreachable!("`{}` is a primitive", other.name()),
        }
    }

    /// `g = grad + wd·param` (when `wd ≠ 0`); with momentum `buf' = momentum·buf +
    /// (1 − dampening)·g` and `g = nesterov ? g + momentum·buf' : buf'`; `param' = param − lr·g`.
    fn sgd(&mut self, node: &Node, x: &[ValueId]) -> Result<Vec<ValueId>> {
        let (param, grad) = (x[0], x[1]);
        let momentum = node.attr(key::MOMENTUM);
        let tensors = 2 + usize::from(momentum != 0.0);
        let wd = node.attr(key::WEIGHT_DECAY);
        let mut g = grad;
        if wd != 0.0 {
            let decay = self.const_with(Op::Mul, wd, param)?;
            g = self.op(Op::Add, &[grad, decay])?;
        }
        let mut results = Vec::new();
        if momentum != 0.0 {
            let buf = x[2];
            let kept = self.const_with(Op::Mul, momentum, buf)?;
            let fresh = self.const_with(Op::Mul, 1.0 - node.attr(key::DAMPENING), g)?;
            let new_buf = self.op(Op::Add, &[kept, fresh])?;
            g = if node.attr(key::NESTEROV) {
                let look = self.const_with(Op::Mul, momentum, new_buf)?;
                self.op(Op::Add, &[g, look])?
            } else {
                new_buf
            };
            results.push(new_buf);
        }
        let step = match x.get(tensors) {
            Some(&lr) => self.op(Op::Mul, &[lr, g])?,
            None => self.const_with(Op::Mul, node.attr(key::LR), g)?,
        };
        let new_param = self.op(Op::Sub, &[param, step])?;
        results.insert(0, new_param);
        Ok(results)
    }

    /// `adam` / `adamw` for the 1-based step `t` (see [`crate::interp`]'s `adam`).
    fn adam(&mut self, node: &Node, x: &[ValueId]) -> Result<Vec<ValueId>> {
        let (param, grad, m, v, t) = (x[0], x[1], x[2], x[3], x[4]);
        let [lr, beta1, beta2, eps, wd] =
            [key::LR, key::BETA1, key::BETA2, key::EPS, key::WEIGHT_DECAY].map(|k| node.attr(k));
        let (mut p, mut g) = (param, grad);
        let lr_value = x.get(5).copied();
        if node.op == Op::AdamW {
            p = match lr_value {
                // 1 − lr·wd from the step's lr
                Some(lr) => {
                    let keep = match self.shared.decay.get(&(lr, wd.to_bits())) {
                        Some(&keep) => keep,
                        None => {
                            let decay = self.const_with(Op::Mul, wd, lr)?;
                            let keep = self.const_with(Op::Sub, 1.0, decay)?;
                            self.shared.decay.insert((lr, wd.to_bits()), keep);
                            keep
                        }
                    };
                    self.op(Op::Mul, &[param, keep])?
                }
                None => self.with_const(Op::Mul, param, 1.0 - lr * wd)?,
            };
        } else if wd != 0.0 {
            let decay = self.const_with(Op::Mul, wd, param)?;
            g = self.op(Op::Add, &[grad, decay])?;
        }
        let m_kept = self.const_with(Op::Mul, beta1, m)?;
        let m_fresh = self.const_with(Op::Mul, 1.0 - beta1, g)?;
        let new_m = self.op(Op::Add, &[m_kept, m_fresh])?;
        let g2 = self.op(Op::Square, &[g])?;
        let v_kept = self.const_with(Op::Mul, beta2, v)?;
        let v_fresh = self.const_with(Op::Mul, 1.0 - beta2, g2)?;
        let new_v = self.op(Op::Add, &[v_kept, v_fresh])?;
        let (bc1, bc2) = match x.get(6) {
            Some(corrections) if self.shared.corrections.contains_key(corrections) => {
                self.shared.corrections[corrections]
            }
            Some(&corrections) => {
                let pick = |b: &mut Self, i: usize| -> Result<ValueId> {
                    let attrs = Attrs::new()
                        .and(key::AXIS, 0)
                        .and(key::START, i)
                        .and(key::END, i + 1);
                    let one = b.rb.add(Op::Slice, &[corrections], attrs)?;
                    b.reshape(one, vec![])
                };
                let both = (pick(self, 0)?, pick(self, 1)?);
                self.shared.corrections.insert(corrections, both);
                both
            }
            None => {
                let pow1 = self.const_with(Op::Pow, beta1, t)?;
                let bc1 = self.const_with(Op::Sub, 1.0, pow1)?;
                let pow2 = self.const_with(Op::Pow, beta2, t)?;
                (bc1, self.const_with(Op::Sub, 1.0, pow2)?)
            }
        };
        let m_hat = self.op(Op::Div, &[new_m, bc1])?;
        let v_hat = self.op(Op::Div, &[new_v, bc2])?;
        let root = self.op(Op::Sqrt, &[v_hat])?;
        let denom = self.with_const(Op::Add, root, eps)?;
        let num = match lr_value {
            Some(lr) => self.op(Op::Mul, &[lr, m_hat])?,
            None => self.const_with(Op::Mul, lr, m_hat)?,
        };
        let ratio = self.op(Op::Div, &[num, denom])?;
        let new_p = self.op(Op::Sub, &[p, ratio])?;
        Ok(vec![new_p, new_m, new_v])
    }
}
