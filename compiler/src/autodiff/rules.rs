//! The gradient table: one arm per op, no fallback, so an op added to the IR without its
//! gradient does not compile.
//!
//! Each arm gets a [`Site`] (the forward node, its operands and result in the new graph, the
//! result's adjoint `dy`, and which operands need a gradient) and returns one entry per operand:
//! `Some(gradient)` of exactly the operand's shape for each wanted operand, `None` otherwise.
//! Semantics follow PyTorch's autograd; where the derivative is not unique (kinks, ties) the
//! arm says which convention it takes.

use sinter_ir::key;
use std::f64::consts::PI;

use sinter_ir::{Attrs, GeluForm, GraphError, Node, Op, Reduction, ValueId};

use super::AutodiffError;
use super::emit::Emit;

type Result<T> = std::result::Result<T, AutodiffError>;

/// One forward node being differentiated.
pub(super) struct Site<'n> {
    /// The name of the loss being differentiated (for error messages).
    pub loss: &'n str,
    /// The forward node (of the graph being rebuilt).
    pub node: &'n Node,
    /// Its operands, in the new graph.
    pub x: &'n [ValueId],
    /// Its (first) result, in the new graph.
    pub y: ValueId,
    /// The adjoint of that result.
    pub dy: ValueId,
    /// Which operands need a gradient.
    pub wants: &'n [bool],
}

impl Site<'_> {
    fn attrs(&self) -> &Attrs {
        &self.node.attrs
    }

    fn want(&self, i: usize) -> bool {
        self.wants.get(i).copied().unwrap_or(false)
    }
}

/// The gradient of every operand of `s.node` that `s.wants`.
pub(super) fn backward(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    use Op::*;
    let (x, y, dy) = (s.x, s.y, s.dy);
    let one = |g: ValueId| -> Result<Vec<Option<ValueId>>> { Ok(vec![Some(g)]) };
    let none = || -> Result<Vec<Option<ValueId>>> { Ok(vec![None; s.x.len()]) };
    match s.node.op {
        // ---- unary: dx = dy · f'(x), reusing y = f(x) where it is cheaper ----
        // d(-x) = -dy
        Neg => one(e.neg(dy)?),
        // d|x| = dy · sign(x), with sign(0) = 0
        Abs => {
            let z = zero(e)?;
            let pos = e.compare(Gt, x[0], z)?;
            let neg = e.compare(Lt, x[0], z)?;
            let sign = e.sub(pos, neg)?;
            one(e.mul(dy, sign)?)
        }
        // d e^x = dy · y
        Exp => one(e.mul(dy, y)?),
        // d log x = dy / x
        Log => one(e.div(dy, x[0])?),
        // d √x = dy / (2y)
        Sqrt => {
            let two_y = e.scale(y, 2.0)?;
            one(e.div(dy, two_y)?)
        }
        // d x^(-1/2) = dy · (-1/2) · y³
        Rsqrt => {
            let y2 = e.unary(Square, y)?;
            let y3 = e.mul(y2, y)?;
            let d = e.scale(y3, -0.5)?;
            one(e.mul(dy, d)?)
        }
        // d (1/x) = -dy · y²
        Reciprocal => {
            let y2 = e.unary(Square, y)?;
            let g = e.mul(dy, y2)?;
            one(e.neg(g)?)
        }
        // d x² = dy · 2x
        Square => {
            let two_x = e.scale(x[0], 2.0)?;
            one(e.mul(dy, two_x)?)
        }
        // d relu = dy where x > 0 (0 at the kink, as PyTorch)
        Relu => {
            let z = zero(e)?;
            let pos = e.compare(Gt, x[0], z)?;
            one(e.select(pos, dy, z)?)
        }
        // d σ = dy · y · (1 - y)
        Sigmoid => {
            let d = e.rsub_scalar(1.0, y)?;
            let d = e.mul(y, d)?;
            one(e.mul(dy, d)?)
        }
        // d tanh = dy · (1 - y²)
        Tanh => {
            let y2 = e.unary(Square, y)?;
            let d = e.rsub_scalar(1.0, y2)?;
            one(e.mul(dy, d)?)
        }
        // d (x·σ(x)) = dy · σ · (1 + x - y)
        Silu => {
            let sig = e.unary(Sigmoid, x[0])?;
            let d = e.sub(x[0], y)?;
            let d = e.add_scalar(d, 1.0)?;
            let d = e.mul(sig, d)?;
            one(e.mul(dy, d)?)
        }
        // d sin = dy · cos x
        Sin => {
            let c = e.unary(Cos, x[0])?;
            one(e.mul(dy, c)?)
        }
        // d cos = -dy · sin x
        Cos => {
            let sn = e.unary(Sin, x[0])?;
            let g = e.mul(dy, sn)?;
            one(e.neg(g)?)
        }
        Gelu => one(gelu(e, s)?),

        // ---- binary, broadcasting: the full-shape gradient, then unbroadcast ----
        // d(a + b) = (dy, dy)
        Add => binary(e, s, |_, dy| Ok(dy), |_, dy| Ok(dy)),
        // d(a - b) = (dy, -dy); negate after summing (smaller)
        Sub => {
            let da = want_then(s, 0, || e.unbroadcast(dy, &e.shape(x[0])))?;
            let db = want_then(s, 1, || {
                let g = e.unbroadcast(dy, &e.shape(x[1]))?;
                e.neg(g)
            })?;
            Ok(vec![da, db])
        }
        // d(a · b) = (dy · b, dy · a)
        Mul => binary(e, s, |e, dy| e.mul(dy, x[1]), |e, dy| e.mul(dy, x[0])),
        // d(a / b) = (dy / b, -dy · y / b)
        Div => binary(
            e,
            s,
            |e, dy| e.div(dy, x[1]),
            |e, dy| {
                let q = e.div(y, x[1])?;
                let g = e.mul(dy, q)?;
                e.neg(g)
            },
        ),
        Pow => pow(e, s),
        Maximum => extremum(e, s, Gt, Lt),
        Minimum => extremum(e, s, Lt, Gt),
        // comparisons are piecewise constant: no gradient
        Eq | Lt | Le | Gt | Ge => none(),
        // where(cond, a, b): dy to a where cond holds, to b elsewhere; cond gets none
        Where => {
            let da = want_then(s, 1, || {
                let z = zero(e)?;
                let g = e.select(x[0], dy, z)?;
                e.unbroadcast(g, &e.shape(x[1]))
            })?;
            let db = want_then(s, 2, || {
                let z = zero(e)?;
                let g = e.select(x[0], z, dy)?;
                e.unbroadcast(g, &e.shape(x[2]))
            })?;
            Ok(vec![None, da, db])
        }

        // ---- reductions ----
        // d sum = dy broadcast back over the reduced axes
        Sum => {
            let (axes, keepdim) = reduce_attrs(s);
            let shape = e.shape(x[0]);
            let g = e.keep_axes(dy, &shape, &axes, keepdim)?;
            one(e.broadcast_to(g, &shape)?)
        }
        // d mean = dy / count broadcast back
        Mean => {
            let (axes, keepdim) = reduce_attrs(s);
            let shape = e.shape(x[0]);
            let count: usize = axes.iter().map(|&a| shape[a]).product();
            let g = e.scale(dy, 1.0 / count as f64)?;
            let g = e.keep_axes(g, &shape, &axes, keepdim)?;
            one(e.broadcast_to(g, &shape)?)
        }
        // d max = dy shared evenly among the elements equal to the max (PyTorch's amax)
        Max | Min => {
            let (axes, keepdim) = reduce_attrs(s);
            let shape = e.shape(x[0]);
            let yk = e.keep_axes(y, &shape, &axes, keepdim)?;
            let mask = e.compare(Eq, x[0], yk)?;
            let count = e.sum(mask, &axes, true)?;
            let dyk = e.keep_axes(dy, &shape, &axes, keepdim)?;
            let share = e.div(dyk, count)?;
            one(e.mul(mask, share)?)
        }
        // d logsumexp = dy · exp(x - y)
        Logsumexp => {
            let (axes, keepdim) = reduce_attrs(s);
            let shape = e.shape(x[0]);
            let yk = e.keep_axes(y, &shape, &axes, keepdim)?;
            let d = e.sub(x[0], yk)?;
            let p = e.unary(Exp, d)?;
            let dyk = e.keep_axes(dy, &shape, &axes, keepdim)?;
            one(e.mul(p, dyk)?)
        }
        Argmax => none(),
        // each x[j] is in the sums of the elements it precedes (or follows, reversed), so
        // dx = the same scan of dy run the other way: cumsum(dy, axis, exclusive, !reverse)
        Cumsum => {
            let reverse = s.attrs().of(key::REVERSE);
            let attrs = s.attrs().clone().and(key::REVERSE, !reverse);
            one(e.op(Cumsum, &[dy], attrs)?)
        }

        // ---- shape and layout: the inverse movement of dy ----
        Reshape | Unsqueeze | Squeeze => one(e.reshape(dy, &e.shape(x[0]))?),
        // permute by the inverse permutation
        Permute => {
            let perm = s.attrs().of(key::PERM);
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            one(e.op(Permute, &[dy], Attrs::new().and(key::PERM, inverse))?)
        }
        // a transpose is its own inverse
        Transpose => one(e.op(Transpose, &[dy], s.attrs().clone())?),
        BroadcastTo => one(e.unbroadcast(dy, &e.shape(x[0]))?),
        // dy placed where the slice reads
        Slice => {
            let attrs = s.attrs().clone().and(key::SHAPE, e.shape(x[0]));
            one(e.op(SliceGrad, &[dy], attrs)?)
        }
        // each operand gets its slice of dy
        Concat => {
            let axis = s.attrs().of(key::AXIS);
            let total = e.ty(dy).shape[axis];
            let mut start = 0;
            let mut grads = Vec::with_capacity(x.len());
            for (i, &xi) in x.iter().enumerate() {
                let len = e.ty(xi).shape[axis];
                grads.push(want_then(s, i, || {
                    if len == total {
                        return Ok(dy);
                    }
                    let attrs = Attrs::new()
                        .and(key::AXIS, axis)
                        .and(key::START, start)
                        .and(key::END, start + len);
                    e.op(Slice, &[dy], attrs)
                })?);
                start += len;
            }
            Ok(grads)
        }
        // between floats the gradient is cast back (the identity from f32 to f32); casts to or
        // from i32 carry no gradient
        Cast => {
            let from = e.ty(s.x[0]).dtype;
            Ok(vec![want_then(s, 0, || {
                if e.ty(dy).dtype == from {
                    Ok(dy)
                } else {
                    e.op(Cast, &[dy], Attrs::new().and(key::DTYPE, from))
                }
            })?])
        }

        Matmul => matmul(e, s),

        // ---- neural-network ops ----
        // d softmax = y · (dy - Σ dy·y)
        Softmax => {
            let axis = s.attrs().of(key::AXIS);
            let dyy = e.mul(dy, y)?;
            let dot = e.sum(dyy, &[axis], true)?;
            let d = e.sub(dy, dot)?;
            one(e.mul(y, d)?)
        }
        // d log_softmax = dy - exp(y) · Σ dy
        LogSoftmax => {
            let axis = s.attrs().of(key::AXIS);
            let total = e.sum(dy, &[axis], true)?;
            let p = e.unary(Exp, y)?;
            let g = e.mul(p, total)?;
            one(e.sub(dy, g)?)
        }
        LayerNorm | RmsNorm => last_axis_norm(e, s),
        GroupNorm => group_norm(e, s),
        Conv2d => conv2d(e, s),
        MaxPool2d => {
            let g = e.op(MaxPool2dGrad, &[x[0], dy], s.attrs().clone())?;
            one(g)
        }
        AvgPool2d => {
            let attrs = s.attrs().clone().and(key::INPUT_SHAPE, e.shape(x[0]));
            one(e.op(AvgPool2dGrad, &[dy], attrs)?)
        }
        // rows of dy summed into the table at ids
        Embedding => {
            let rows = e.ty(x[0]).shape[0];
            let attrs = Attrs::new().and(key::NUM_EMBEDDINGS, rows);
            Ok(vec![Some(e.op(EmbeddingGrad, &[dy, x[1]], attrs)?), None])
        }
        CrossEntropy => cross_entropy(e, s),
        // d mse = ±2 (a - b) · dy (/ count for mean)
        MseLoss => {
            let diff = e.sub(x[0], x[1])?;
            let k = match s.attrs().of(key::REDUCTION) {
                Reduction::Mean => 2.0 / e.ty(x[0]).numel() as f64,
                Reduction::Sum | Reduction::None => 2.0,
            };
            let scaled = e.scale(dy, k)?;
            let da = e.mul(diff, scaled)?;
            let db = want_then(s, 1, || e.neg(da))?;
            Ok(vec![s.want(0).then_some(da), db])
        }

        // ---- backward primitives (second order): each is linear in its differentiable
        // operands, so its adjoint is the forward op (or the other backward primitive) ----
        Conv2dGradInput => {
            let attrs = conv_attrs(s.attrs());
            let ddy = want_then(s, 0, || e.op(Conv2d, &[dy, x[1]], attrs.clone()))?;
            let dw = want_then(s, 1, || {
                let a = attrs.clone().and(key::WEIGHT_SHAPE, e.shape(x[1]));
                e.op(Conv2dGradWeight, &[dy, x[0]], a)
            })?;
            Ok(vec![ddy, dw])
        }
        Conv2dGradWeight => {
            let attrs = conv_attrs(s.attrs());
            let dx = want_then(s, 0, || {
                let a = attrs.clone().and(key::INPUT_SHAPE, e.shape(x[0]));
                e.op(Conv2dGradInput, &[x[1], dy], a)
            })?;
            let ddy = want_then(s, 1, || e.op(Conv2d, &[x[0], dy], attrs.clone()))?;
            Ok(vec![dx, ddy])
        }
        MaxPool2dGrad => Err(unsupported(
            e,
            s,
            "second-order gradients through max pooling are not supported",
        )),
        AvgPool2dGrad => {
            let mut attrs = Attrs::new();
            for name in ["kernel", "stride", "padding"] {
                attrs.set(name, s.attrs().get(name).expect("verified").clone());
            }
            one(e.op(AvgPool2d, &[dy], attrs)?)
        }
        EmbeddingGrad => Ok(vec![
            Some(e.op(Embedding, &[dy, x[1]], Attrs::new())?),
            None,
        ]),
        SliceGrad => {
            let mut attrs = Attrs::new();
            for name in ["axis", "start", "end", "step"] {
                attrs.set(name, s.attrs().get(name).expect("verified").clone());
            }
            one(e.op(Slice, &[dy], attrs)?)
        }

        // expanded before autodiff runs
        Attention => Err(unsupported(e, s, "run `expand_composites` before autodiff")),
        // no operands
        Constant | Iota => Ok(Vec::new()),
        // results of a `grad` or an optimizer step are not differentiable
        Grad | Sgd | Adam | AdamW => Err(AutodiffError::NotDifferentiable {
            loss: s.loss.to_string(),
            op: s.node.op.name(),
            value: result_name(e, s),
        }),
    }
}

fn zero(e: &mut Emit) -> std::result::Result<ValueId, GraphError> {
    e.constant(0.0)
}

fn result_name(e: &Emit, s: &Site) -> String {
    e.rebuild().old.name_of(s.node.outputs[0]).to_string()
}

fn unsupported(e: &Emit, s: &Site, why: &'static str) -> AutodiffError {
    AutodiffError::Unsupported {
        loss: s.loss.to_string(),
        op: s.node.op.name(),
        value: result_name(e, s),
        why,
    }
}

/// `Some(f())` when operand `i` wants a gradient.
fn want_then(
    s: &Site,
    i: usize,
    f: impl FnOnce() -> std::result::Result<ValueId, GraphError>,
) -> Result<Option<ValueId>> {
    if s.want(i) { Ok(Some(f()?)) } else { Ok(None) }
}

/// A broadcasting binary op: each wanted operand's full-shape gradient from `da`/`db`, summed
/// back to the operand's shape.
fn binary(
    e: &mut Emit,
    s: &Site,
    da: impl FnOnce(&mut Emit, ValueId) -> std::result::Result<ValueId, GraphError>,
    db: impl FnOnce(&mut Emit, ValueId) -> std::result::Result<ValueId, GraphError>,
) -> Result<Vec<Option<ValueId>>> {
    let ga = if s.want(0) {
        let g = da(e, s.dy)?;
        Some(e.unbroadcast(g, &e.shape(s.x[0]))?)
    } else {
        None
    };
    let gb = if s.want(1) {
        let g = db(e, s.dy)?;
        Some(e.unbroadcast(g, &e.shape(s.x[1]))?)
    } else {
        None
    };
    Ok(vec![ga, gb])
}

fn reduce_attrs(s: &Site) -> (Vec<usize>, bool) {
    (s.attrs().of(key::AXES), s.attrs().of(key::KEEPDIM))
}

/// GELU: erf form `dy · (Φ(x) + x·φ(x))` with `Φ(x) = y / x` (½ at 0, where y = x·Φ(x));
/// tanh form: the exact derivative of `½·x·(1 + tanh(u))`, `u = √(2/π)·(x + 0.044715·x³)`.
fn gelu(e: &mut Emit, s: &Site) -> Result<ValueId> {
    let (x, y, dy) = (s.x[0], s.y, s.dy);
    let x2 = e.unary(Op::Square, x)?;
    let d = if s.attrs().of(key::APPROXIMATE) == GeluForm::Tanh {
        let (k, c) = ((2.0 / PI).sqrt(), 0.044715);
        // u = x·(k + k·c·x²), du/dx = k + 3·k·c·x²
        let inner = e.scale(x2, k * c)?;
        let inner = e.add_scalar(inner, k)?;
        let u = e.mul(x, inner)?;
        let t = e.unary(Op::Tanh, u)?;
        let du = e.scale(x2, 3.0 * k * c)?;
        let du = e.add_scalar(du, k)?;
        // ½(1 + t) + ½·x·(1 - t²)·du
        let left = e.add_scalar(t, 1.0)?;
        let left = e.scale(left, 0.5)?;
        let t2 = e.unary(Op::Square, t)?;
        let sech2 = e.rsub_scalar(1.0, t2)?;
        let right = e.mul(x, sech2)?;
        let du_half = e.scale(du, 0.5)?;
        let right = e.mul(right, du_half)?;
        e.add(left, right)?
    } else {
        let z = zero(e)?;
        let at_zero = e.compare(Op::Eq, x, z)?;
        let half = e.constant(0.5)?;
        let ratio = e.div(y, x)?;
        let cdf = e.select(at_zero, half, ratio)?;
        // φ(x) = exp(-x²/2) / √(2π)
        let h = e.scale(x2, -0.5)?;
        let pdf = e.unary(Op::Exp, h)?;
        let pdf = e.scale(pdf, 1.0 / (2.0 * PI).sqrt())?;
        let xpdf = e.mul(x, pdf)?;
        e.add(cdf, xpdf)?
    };
    Ok(e.mul(dy, d)?)
}

/// `pow(a, b)` as PyTorch: `d/da = dy·b·a^(b-1)` (0 where b == 0), `d/db = dy·y·log(a)` (0 where
/// a == 0 and b >= 0, so `0^b` has no NaN gradient). A literal exponent folds `b - 1`.
fn pow(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (a, b, y, dy) = (s.x[0], s.x[1], s.y, s.dy);
    let da = want_then(s, 0, || {
        let g = match e.constant_value(b) {
            // a literal exponent: no mask, and b - 1 folded
            Some(0.0) => return e.zeros(&e.shape(a)),
            Some(1.0) => dy,
            Some(c) => {
                let p = e.constant(c - 1.0)?;
                let p = e.op(Op::Pow, &[a, p], Attrs::new())?;
                let d = e.scale(p, c)?;
                e.mul(dy, d)?
            }
            None => {
                let bm1 = e.add_scalar(b, -1.0)?;
                let p = e.op(Op::Pow, &[a, bm1], Attrs::new())?;
                let d = e.mul(b, p)?;
                let d = e.mul(dy, d)?;
                let z = e.constant(0.0)?;
                let b0 = e.compare(Op::Eq, b, z)?;
                e.select(b0, z, d)?
            }
        };
        e.unbroadcast(g, &e.shape(a))
    })?;
    let db = want_then(s, 1, || {
        let z = e.constant(0.0)?;
        let log_a = e.unary(Op::Log, a)?;
        let d = e.mul(y, log_a)?;
        let a0 = e.compare(Op::Eq, a, z)?;
        let b_pos = e.compare(Op::Ge, b, z)?;
        let cond = e.mul(a0, b_pos)?;
        let d = e.select(cond, z, d)?;
        let g = e.mul(dy, d)?;
        e.unbroadcast(g, &e.shape(b))
    })?;
    Ok(vec![da, db])
}

/// `maximum` (`wins = gt`) or `minimum` (`wins = lt`): dy to the winning side, half to each
/// side where a == b (PyTorch).
fn extremum(e: &mut Emit, s: &Site, wins: Op, loses: Op) -> Result<Vec<Option<ValueId>>> {
    let (a, b, dy) = (s.x[0], s.x[1], s.dy);
    // share of operand `side`: 1 where it wins, ½ where tied
    let share = |e: &mut Emit, side: Op| -> std::result::Result<ValueId, GraphError> {
        let w = e.compare(side, a, b)?;
        let tie = e.compare(Op::Eq, a, b)?;
        let half = e.scale(tie, 0.5)?;
        let m = e.add(w, half)?;
        e.mul(dy, m)
    };
    let ga = if s.want(0) {
        Some(share(e, wins)?)
    } else {
        None
    };
    let gb = match (s.want(1), ga) {
        (false, _) => None,
        (true, Some(ga)) => Some(e.sub(dy, ga)?),
        (true, None) => Some(share(e, loses)?),
    };
    let da = match ga {
        Some(g) => Some(e.unbroadcast(g, &e.shape(a))?),
        None => None,
    };
    let db = match gb {
        Some(g) => Some(e.unbroadcast(g, &e.shape(b))?),
        None => None,
    };
    Ok(vec![da, db])
}

/// `torch.matmul`: with 1-D operands promoted (`[K]` as `[1, K]` on the left, `[K, 1]` on the
/// right) and dy given back the removed axes, `da = dy @ bᵀ`, `db = aᵀ @ dy`, each summed over
/// broadcast batch axes to the promoted shape and reshaped to the operand's. A 2-D `b` under a
/// batched `a` gets `db` from one matmul over the flattened rows instead.
fn matmul(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (a, b, dy) = (s.x[0], s.x[1], s.dy);
    let (sa, sb) = (e.shape(a), e.shape(b));
    let pa = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.clone()
    };
    let pb = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.clone()
    };
    let mut dy_shape = e.shape(dy);
    if sa.len() == 1 {
        dy_shape.insert(dy_shape.len() - usize::from(sb.len() > 1), 1);
    }
    if sb.len() == 1 {
        dy_shape.push(1);
    }
    let dy2 = e.reshape(dy, &dy_shape)?;
    let da = want_then(s, 0, || {
        // bᵀ: [.., N, K]; a 1-D b is the row [1, K]
        let bt = if sb.len() == 1 {
            e.reshape(b, &[1, sb[0]])?
        } else {
            e.transpose_last(b)?
        };
        let g = e.op(Op::Matmul, &[dy2, bt], Attrs::new())?;
        let g = e.unbroadcast(g, &pa)?;
        e.reshape(g, &sa)
    })?;
    let db = want_then(s, 1, || {
        if sb.len() == 2 && sa.len() > 2 {
            // a 2-D weight under batched rows (a linear layer): one matmul over all rows
            let rows = sa[..sa.len() - 1].iter().product::<usize>();
            let a2 = e.reshape(a, &[rows, sa[sa.len() - 1]])?;
            let at = e.transpose_last(a2)?;
            let d2 = e.reshape(dy, &[rows, sb[1]])?;
            return e.op(Op::Matmul, &[at, d2], Attrs::new());
        }
        // aᵀ: [.., K, M]; a 1-D a is the column [K, 1]
        let at = if sa.len() == 1 {
            e.reshape(a, &[sa[0], 1])?
        } else {
            e.transpose_last(a)?
        };
        let g = e.op(Op::Matmul, &[at, dy2], Attrs::new())?;
        let g = e.unbroadcast(g, &pb)?;
        e.reshape(g, &sb)
    })?;
    Ok(vec![da, db])
}

/// `layer_norm(x, gamma, beta)` and `rms_norm(x, gamma)` over the last axis, from the recomputed
/// normalized input x̂ and inverse deviation r:
/// `dx = r · (g - mean(g) - x̂ · mean(g · x̂))` with `g = dy · gamma` (rms_norm has no mean
/// term), `dgamma = Σ dy · x̂`, `dbeta = Σ dy`.
fn last_axis_norm(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (x, dy) = (s.x[0], s.dy);
    let is_layer = s.node.op == Op::LayerNorm;
    let shape = e.shape(x);
    let last = shape.len() - 1;
    let eps = s.attrs().of(key::EPS);
    let centered = if is_layer {
        let mu = e.mean(x, &[last], true)?;
        e.sub(x, mu)?
    } else {
        x
    };
    let sq = e.unary(Op::Square, centered)?;
    let var = e.mean(sq, &[last], true)?;
    let var = e.add_scalar(var, eps)?;
    let r = e.unary(Op::Rsqrt, var)?;
    let xhat = e.mul(centered, r)?;
    let dx = want_then(s, 0, || {
        let g = e.mul(dy, s.x[1])?;
        let gx = e.mul(g, xhat)?;
        let proj = e.mean(gx, &[last], true)?;
        let proj = e.mul(xhat, proj)?;
        let mut d = e.sub(g, proj)?;
        if is_layer {
            let mg = e.mean(g, &[last], true)?;
            d = e.sub(d, mg)?;
        }
        e.mul(r, d)
    })?;
    let dgamma = want_then(s, 1, || {
        let g = e.mul(dy, xhat)?;
        e.unbroadcast(g, &[shape[last]])
    })?;
    let mut grads = vec![dx, dgamma];
    if is_layer {
        grads.push(want_then(s, 2, || e.unbroadcast(dy, &[shape[last]]))?);
    }
    Ok(grads)
}

/// `group_norm(x [N, C, *], gamma [C], beta [C])`: through `x` reshaped to `[N, G, -1]`, the
/// layer-norm formula per group; `gamma`/`beta` as `[C, 1, …]` against `x`.
fn group_norm(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (x, dy) = (s.x[0], s.dy);
    let shape = e.shape(x);
    let (n, c) = (shape[0], shape[1]);
    let groups = s.attrs().of(key::GROUPS);
    let grouped = [n, groups, shape.iter().product::<usize>() / (n * groups)];
    let eps = s.attrs().of(key::EPS);
    let xr = e.reshape(x, &grouped)?;
    let mu = e.mean(xr, &[2], true)?;
    let centered = e.sub(xr, mu)?;
    let sq = e.unary(Op::Square, centered)?;
    let var = e.mean(sq, &[2], true)?;
    let var = e.add_scalar(var, eps)?;
    let r = e.unary(Op::Rsqrt, var)?;
    let xhat_r = e.mul(centered, r)?;
    // per-channel sums run over every axis but 1
    let other_axes: Vec<usize> = (0..shape.len()).filter(|&a| a != 1).collect();
    let mut channel = vec![c];
    channel.extend(std::iter::repeat_n(1, shape.len() - 2));
    let dx = want_then(s, 0, || {
        let gamma = e.reshape(s.x[1], &channel)?;
        let g = e.mul(dy, gamma)?;
        let g = e.reshape(g, &grouped)?;
        let gx = e.mul(g, xhat_r)?;
        let proj = e.mean(gx, &[2], true)?;
        let proj = e.mul(xhat_r, proj)?;
        let mg = e.mean(g, &[2], true)?;
        let d = e.sub(g, mg)?;
        let d = e.sub(d, proj)?;
        let d = e.mul(r, d)?;
        e.reshape(d, &shape)
    })?;
    let dgamma = want_then(s, 1, || {
        let xhat = e.reshape(xhat_r, &shape)?;
        let g = e.mul(dy, xhat)?;
        e.sum(g, &other_axes, false)
    })?;
    let dbeta = want_then(s, 2, || e.sum(dy, &other_axes, false))?;
    Ok(vec![dx, dgamma, dbeta])
}

/// The attributes `conv2d` and its backward primitives share.
fn conv_attrs(a: &Attrs) -> Attrs {
    let mut attrs = Attrs::new();
    for name in ["stride", "padding", "dilation", "groups"] {
        attrs.set(name, a.get(name).expect("verified").clone());
    }
    attrs
}

/// `conv2d(x, w, [b])`: the two backward primitives, and the bias summed over N, H, W.
fn conv2d(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (x, w, dy) = (s.x[0], s.x[1], s.dy);
    let attrs = conv_attrs(s.attrs());
    let dx = want_then(s, 0, || {
        let a = attrs.clone().and(key::INPUT_SHAPE, e.shape(x));
        e.op(Op::Conv2dGradInput, &[dy, w], a)
    })?;
    let dw = want_then(s, 1, || {
        let a = attrs.clone().and(key::WEIGHT_SHAPE, e.shape(w));
        e.op(Op::Conv2dGradWeight, &[x, dy], a)
    })?;
    let mut grads = vec![dx, dw];
    if s.x.len() == 3 {
        grads.push(want_then(s, 2, || e.sum(dy, &[0, 2, 3], false))?);
    }
    Ok(grads)
}

/// `cross_entropy(logits [N, C], labels)`: `softmax(logits) - onehot(labels)`, times dy (per
/// row for `none`, divided by N for `mean`).
fn cross_entropy(e: &mut Emit, s: &Site) -> Result<Vec<Option<ValueId>>> {
    let (logits, labels, dy) = (s.x[0], s.x[1], s.dy);
    let [n, c] = [0, 1].map(|i| e.shape(logits)[i]);
    let p = e.op(Op::Softmax, &[logits], Attrs::new().and(key::AXIS, 1))?;
    let classes = e.op(
        Op::Iota,
        &[],
        Attrs::new().and(key::SHAPE, vec![n, c]).and(key::AXIS, 1),
    )?;
    let label = e.op(
        Op::Cast,
        &[labels],
        Attrs::new().and(key::DTYPE, sinter_ir::DType::F32),
    )?;
    let label = e.reshape(label, &[n, 1])?;
    let mut onehot = e.compare(Op::Eq, classes, label)?;
    // f16 logits: the gradient is f16 (comparisons give f32 masks)
    let dtype = e.ty(logits).dtype;
    if dtype != sinter_ir::DType::F32 {
        onehot = e.op(Op::Cast, &[onehot], Attrs::new().and(key::DTYPE, dtype))?;
    }
    let mut d = e.sub(p, onehot)?;
    let reduction = s.attrs().of(key::REDUCTION);
    // rows labelled `ignore_index` get no gradient, and the mean is over the kept rows
    if let Some(ignore) = s.attrs().try_of(key::IGNORE_INDEX) {
        let value = e.constant(ignore as f64)?;
        let ignored = e.compare(Op::Eq, label, value)?;
        let one = e.constant(1.0)?;
        let kept = e.sub(one, ignored)?;
        let kept_d = if dtype != sinter_ir::DType::F32 {
            e.op(Op::Cast, &[kept], Attrs::new().and(key::DTYPE, dtype))?
        } else {
            kept
        };
        d = e.mul(d, kept_d)?;
        if reduction == Reduction::Mean {
            let total = e.op(
                Op::Sum,
                &[kept],
                Attrs::new()
                    .and(key::AXES, vec![0, 1])
                    .and(key::KEEPDIM, false),
            )?;
            // no row kept: the loss is NaN (0/0) but, as in PyTorch, the gradient is 0
            let one = e.constant(1.0)?;
            let total = e.op(Op::Maximum, &[total, one], Attrs::new())?;
            let per_kept = e.div(dy, total)?;
            return Ok(vec![Some(e.mul(d, per_kept)?), None]);
        }
    }
    let scale = match reduction {
        Reduction::Mean => e.scale(dy, 1.0 / n as f64)?,
        Reduction::Sum => dy,
        Reduction::None => e.reshape(dy, &[n, 1])?,
    };
    Ok(vec![Some(e.mul(d, scale)?), None])
}
