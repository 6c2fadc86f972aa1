//! Kernel plans: what each dispatch computes, in terms of views of planned buffers.
//!
//! A plan says everything codegen needs except where buffers live; the memory plan supplies
//! that. The WGSL of a plan depends only on its *structure* (ranks, dtypes, op, which arena
//! each operand is in); the numbers (extents, strides, offsets) go into the param block, so
//! dispatches of the same structure share one shader.

use sinter_ir::DType;

use crate::layout::View;

/// One operand of a kernel: a view and its element type.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub view: View,
    pub dtype: DType,
}

/// A scalar instruction of an elementwise body; operands are earlier instruction indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Inst {
    /// Element of input `i` at the current index.
    Load(usize),
    /// An f32 literal.
    Const(f32),
    /// The current index along an output axis, as f32.
    Coord(usize),
    Unary(UnaryFn, usize),
    Binary(BinaryFn, usize, usize),
    /// `a` where `cond != 0` else `b`.
    Select(usize, usize, usize),
    Cast(DType, usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryFn {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Square,
    Relu,
    Sigmoid,
    Tanh,
    Silu,
    Sin,
    Cos,
    GeluErf,
    GeluTanh,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Maximum,
    Minimum,
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Elementwise map over `shape`: every output view has this shape; inputs are broadcast views.
#[derive(Clone, Debug, PartialEq)]
pub struct Elementwise {
    pub shape: Vec<usize>,
    pub inputs: Vec<Operand>,
    pub insts: Vec<Inst>,
    /// Output views and the instruction whose value each stores.
    pub outputs: Vec<(Operand, usize)>,
}

/// A row kernel: the operands are split into `kept` axes (one row per kept index) and
/// `reduced` axes (the elements of a row); a workgroup segment reduces each row.
#[derive(Clone, Debug, PartialEq)]
pub struct Rows {
    pub kind: RowKind,
    pub kept: Vec<usize>,
    pub reduced: Vec<usize>,
    /// Each operand as (offset, kept strides, reduced strides) — see [`RowOperand`].
    pub inputs: Vec<RowOperand>,
    pub outputs: Vec<RowOperand>,
}

/// An operand of a row kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct RowOperand {
    pub buffer: crate::layout::BufferId,
    pub dtype: DType,
    pub offset: usize,
    pub kept_strides: Vec<usize>,
    pub reduced_strides: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowKind {
    /// One value per row: inputs `[x]`, outputs `[y]` (reduced strides of `y` are 0).
    Sum,
    Mean,
    Max,
    Min,
    Logsumexp,
    /// i32 index of the first maximum.
    Argmax,
    /// Same decomposition for input and output.
    Softmax,
    LogSoftmax,
    /// inputs `[x, gamma, beta]`.
    LayerNorm {
        eps: f32,
    },
    /// inputs `[x, gamma]`.
    RmsNorm {
        eps: f32,
    },
    /// Per-row loss `logsumexp(x) - x[label]`; inputs `[logits, labels]` (labels: reduced
    /// strides 0; the class axis is the one reduced axis).
    CrossEntropy,
    /// One value per row: sum (or mean) of `(a - b)^2`; inputs `[a, b]`.
    SquaredError {
        mean: bool,
    },
}

/// Batched matrix product `out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matmul {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Views of rank `batch.len() + 2`: a `[.., m, k]`, b `[.., k, n]`, out `[.., m, n]`.
    pub a: View,
    pub b: View,
    pub out: View,
}

/// 2-D convolution, NCHW / OIHW.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2d {
    pub x: View,
    pub w: View,
    pub bias: Option<View>,
    pub out: View,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pool2d {
    pub max: bool,
    pub x: View,
    pub out: View,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// Gradient of conv2d with respect to its input (`dy` and `w` given) or its weight (`x` and
/// `dy` given); the shapes and attributes are the forward conv's.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dGrad {
    pub wrt_weight: bool,
    /// `dy` for the input gradient, `x` for the weight gradient.
    pub a: View,
    /// `w` for the input gradient, `dy` for the weight gradient.
    pub b: View,
    pub out: View,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

/// Gradient of pooling with respect to its input; `x` is given for max pooling.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2dGrad {
    pub x: Option<View>,
    pub dy: View,
    pub out: View,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// `out[v, d] = sum over positions p with ids[p] == v of dy[p, d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterAdd {
    pub dy: View,
    pub ids: View,
    pub out: View,
}

/// Zeros with `dy` placed where `slice(axis, start, .., step)` reads.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceGrad {
    pub dy: View,
    pub out: View,
    pub axis: usize,
    pub start: usize,
    pub step: usize,
}

/// `out[i.., d] = table[ids[i..], d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub table: View,
    pub ids: View,
    pub out: View,
}

#[derive(Clone, Debug, PartialEq)]
pub enum KernelPlan {
    Elementwise(Elementwise),
    Rows(Rows),
    Matmul(Matmul),
    Conv2d(Conv2d),
    Pool2d(Pool2d),
    Gather(Gather),
    Conv2dGrad(Conv2dGrad),
    Pool2dGrad(Pool2dGrad),
    ScatterAdd(ScatterAdd),
    SliceGrad(SliceGrad),
}

impl KernelPlan {
    /// The name of the pattern (`sinter inspect --json`'s `pattern`).
    pub fn pattern(&self) -> &'static str {
        match self {
            KernelPlan::Elementwise(_) => "elementwise",
            KernelPlan::Rows(r) => match r.kind {
                RowKind::Sum | RowKind::Mean | RowKind::Max | RowKind::Min => "reduce",
                RowKind::Logsumexp => "logsumexp",
                RowKind::Argmax => "argmax",
                RowKind::Softmax => "softmax",
                RowKind::LogSoftmax => "log_softmax",
                RowKind::LayerNorm { .. } => "layer_norm",
                RowKind::RmsNorm { .. } => "rms_norm",
                RowKind::CrossEntropy => "cross_entropy",
                RowKind::SquaredError { .. } => "squared_error",
            },
            KernelPlan::Matmul(_) => "matmul",
            KernelPlan::Conv2d(_) => "conv2d",
            KernelPlan::Pool2d(p) => {
                if p.max {
                    "max_pool2d"
                } else {
                    "avg_pool2d"
                }
            }
            KernelPlan::Gather(_) => "gather",
            KernelPlan::Conv2dGrad(c) => {
                if c.wrt_weight {
                    "conv2d_grad_weight"
                } else {
                    "conv2d_grad_input"
                }
            }
            KernelPlan::Pool2dGrad(p) => {
                if p.x.is_some() {
                    "max_pool2d_grad"
                } else {
                    "avg_pool2d_grad"
                }
            }
            KernelPlan::ScatterAdd(_) => "scatter_add",
            KernelPlan::SliceGrad(_) => "slice_grad",
        }
    }

    /// Buffers read and written, for liveness.
    pub fn buffers(&self) -> (Vec<crate::layout::BufferId>, Vec<crate::layout::BufferId>) {
        match self {
            KernelPlan::Elementwise(e) => (
                e.inputs.iter().map(|o| o.view.buffer).collect(),
                e.outputs.iter().map(|(o, _)| o.view.buffer).collect(),
            ),
            KernelPlan::Rows(r) => (
                r.inputs.iter().map(|o| o.buffer).collect(),
                r.outputs.iter().map(|o| o.buffer).collect(),
            ),
            KernelPlan::Matmul(m) => (vec![m.a.buffer, m.b.buffer], vec![m.out.buffer]),
            KernelPlan::Conv2d(c) => {
                let mut reads = vec![c.x.buffer, c.w.buffer];
                reads.extend(c.bias.as_ref().map(|b| b.buffer));
                (reads, vec![c.out.buffer])
            }
            KernelPlan::Pool2d(p) => (vec![p.x.buffer], vec![p.out.buffer]),
            KernelPlan::Gather(g) => (vec![g.table.buffer, g.ids.buffer], vec![g.out.buffer]),
            KernelPlan::Conv2dGrad(c) => (vec![c.a.buffer, c.b.buffer], vec![c.out.buffer]),
            KernelPlan::Pool2dGrad(p) => {
                let mut reads = vec![p.dy.buffer];
                reads.extend(p.x.as_ref().map(|x| x.buffer));
                (reads, vec![p.out.buffer])
            }
            KernelPlan::ScatterAdd(s) => (vec![s.dy.buffer, s.ids.buffer], vec![s.out.buffer]),
            KernelPlan::SliceGrad(s) => (vec![s.dy.buffer], vec![s.out.buffer]),
        }
    }
}
