//! The op table: for every op, its operands, its attributes with their defaults, and (in
//! [`crate::infer`]) its shape and dtype rule.
//!
//! **Invariant:** this table is the single description of the op set. The parser looks names up
//! here, the verifier checks operand counts and attributes against it, the printer omits
//! attributes equal to their default, `IR.md`'s op list is checked against it, and later passes
//! (autodiff, lowering) match on [`Op`] exhaustively.

use crate::attr::{Attr, Key, key};

/// Every operation of the IR.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Op {
    // unary, elementwise
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
    Gelu,
    // binary, elementwise with broadcasting
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
    Where,
    // reductions
    Sum,
    Mean,
    Max,
    Min,
    Logsumexp,
    Argmax,
    // scans
    Cumsum,
    // shape and layout
    Reshape,
    Permute,
    Transpose,
    BroadcastTo,
    Unsqueeze,
    Squeeze,
    Slice,
    Concat,
    Cast,
    // linear algebra
    Matmul,
    // neural-network ops
    Softmax,
    LogSoftmax,
    LayerNorm,
    RmsNorm,
    GroupNorm,
    Conv2d,
    MaxPool2d,
    AvgPool2d,
    Embedding,
    CrossEntropy,
    MseLoss,
    // backward primitives that autodiff emits (no forward op expresses them)
    Conv2dGradInput,
    Conv2dGradWeight,
    MaxPool2dGrad,
    AvgPool2dGrad,
    EmbeddingGrad,
    SliceGrad,
    // composite, expanded by `expand::expand_composites`
    Attention,
    // a literal scalar
    Constant,
    // index along an axis, as f32 (builds masks)
    Iota,
    // reverse-mode derivative, expanded by autodiff
    Grad,
    // optimizers
    Sgd,
    Adam,
    AdamW,
}

/// Broad family of an op; used by passes that treat a family alike.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpClass {
    Unary,
    Binary,
    Compare,
    Select,
    Reduce,
    ArgReduce,
    /// Prefix scans along an axis.
    Scan,
    View,
    Layout,
    Matmul,
    Nn,
    Loss,
    /// Backward primitives emitted by autodiff.
    Backward,
    Composite,
    Constant,
    Grad,
    Optimizer,
}

/// How many values an operand slot takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Arity {
    One,
    /// Zero or one value; only the last slots of an op may be optional.
    Optional,
    /// One or more values; only the last slot of an op may be variadic.
    Variadic,
}

#[derive(Clone, Copy, Debug)]
pub struct OperandSpec {
    pub name: &'static str,
    pub arity: Arity,
    /// Whether gradients flow into this operand.
    pub differentiable: bool,
}

/// The kind of value an attribute takes.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum AttrKind {
    Int,
    Float,
    Bool,
    /// A string from the given set.
    Str(&'static [&'static str]),
    /// A list of ints; a single int is accepted and repeated `n` times when `n > 0`.
    Ints(usize),
    /// A dtype name (`"f32"`, `"i32"`).
    DType,
}

/// The default of an attribute.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum AttrDefault {
    Required,
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(&'static str),
    Ints(&'static [i64]),
    /// Computed from the operand types by the op's shape rule; the text says how.
    Derived(&'static str),
}

impl AttrDefault {
    /// The default as an attribute value, when it does not depend on operand types.
    pub fn value(self) -> Option<Attr> {
        match self {
            AttrDefault::Int(v) => Some(Attr::Int(v)),
            AttrDefault::Float(v) => Some(Attr::Float(v)),
            AttrDefault::Bool(v) => Some(Attr::Bool(v)),
            AttrDefault::Str(v) => Some(Attr::Str(v.to_string())),
            AttrDefault::Ints(v) => Some(Attr::ints(v)),
            AttrDefault::Required | AttrDefault::Derived(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AttrSpec {
    pub name: &'static str,
    pub kind: AttrKind,
    pub default: AttrDefault,
}

/// One row of the op table.
#[derive(Debug)]
pub struct OpSpec {
    pub op: Op,
    pub name: &'static str,
    pub class: OpClass,
    pub operands: &'static [OperandSpec],
    pub attrs: &'static [AttrSpec],
    /// One line of semantics, for `IR.md` and `--help` texts.
    pub summary: &'static str,
}

impl OpSpec {
    pub fn attr(&self, name: &str) -> Option<&AttrSpec> {
        self.attrs.iter().find(|a| a.name == name)
    }

    /// Smallest and largest operand count (`None`: unbounded).
    pub fn operand_range(&self) -> (usize, Option<usize>) {
        let mut min = 0;
        let mut max = Some(0);
        for o in self.operands {
            match o.arity {
                Arity::One => {
                    min += 1;
                    max = max.map(|m| m + 1);
                }
                Arity::Optional => max = max.map(|m| m + 1),
                Arity::Variadic => {
                    min += 1;
                    max = None;
                }
            }
        }
        (min, max)
    }

    /// The operand slot that the `i`-th operand fills.
    pub fn operand_slot(&self, i: usize) -> &OperandSpec {
        let last = self.operands.len() - 1;
        &self.operands[i.min(last)]
    }
}

impl Op {
    pub fn spec(self) -> &'static OpSpec {
        let spec = &OPS[self as usize];
        debug_assert_eq!(spec.op, self);
        spec
    }

    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn class(self) -> OpClass {
        self.spec().class
    }

    pub fn from_name(name: &str) -> Option<Op> {
        OPS.iter().find(|s| s.name == name).map(|s| s.op)
    }

    pub fn all() -> impl Iterator<Item = Op> {
        OPS.iter().map(|s| s.op)
    }

    /// Elementwise ops: each output element depends only on the same-index (broadcast) inputs.
    pub fn is_elementwise(self) -> bool {
        matches!(
            self.class(),
            OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Select
        ) || self == Op::Cast
    }
}

const fn one(name: &'static str) -> OperandSpec {
    OperandSpec {
        name,
        arity: Arity::One,
        differentiable: true,
    }
}
const fn nondiff(name: &'static str) -> OperandSpec {
    OperandSpec {
        name,
        arity: Arity::One,
        differentiable: false,
    }
}
const fn optional(name: &'static str) -> OperandSpec {
    OperandSpec {
        name,
        arity: Arity::Optional,
        differentiable: true,
    }
}
const fn variadic(name: &'static str, differentiable: bool) -> OperandSpec {
    OperandSpec {
        name,
        arity: Arity::Variadic,
        differentiable,
    }
}
const fn attr<K>(key: Key<K>, default: AttrDefault) -> AttrSpec {
    AttrSpec {
        name: key.name,
        kind: key.kind,
        default,
    }
}

const X: &[OperandSpec] = &[one("x")];
const AB: &[OperandSpec] = &[one("a"), one("b")];
const AB_NONDIFF: &[OperandSpec] = &[nondiff("a"), nondiff("b")];
const REDUCE_ATTRS: &[AttrSpec] = &[
    attr(key::AXES, AttrDefault::Derived("all axes")),
    attr(key::KEEPDIM, AttrDefault::Bool(false)),
];
const SOFTMAX_ATTRS: &[AttrSpec] = &[attr(key::AXIS, AttrDefault::Int(-1))];
const POOL_ATTRS: &[AttrSpec] = &[
    attr(key::KERNEL, AttrDefault::Required),
    attr(key::STRIDE, AttrDefault::Derived("kernel")),
    attr(key::PADDING, AttrDefault::Ints(&[0, 0])),
];
const CONV_ATTRS_TAIL: [AttrSpec; 4] = [
    attr(key::STRIDE, AttrDefault::Ints(&[1, 1])),
    attr(key::PADDING, AttrDefault::Ints(&[0, 0])),
    attr(key::DILATION, AttrDefault::Ints(&[1, 1])),
    attr(key::GROUPS, AttrDefault::Int(1)),
];
const POOL_GRAD_ATTRS: &[AttrSpec] = &[
    attr(key::KERNEL, AttrDefault::Required),
    attr(key::STRIDE, AttrDefault::Required),
    attr(key::PADDING, AttrDefault::Ints(&[0, 0])),
];
const ADAM_OPERANDS: &[OperandSpec] = &[
    nondiff("param"),
    nondiff("grad"),
    nondiff("m"),
    nondiff("v"),
    nondiff("step"),
    OperandSpec {
        name: "lr",
        arity: Arity::Optional,
        differentiable: false,
    },
    OperandSpec {
        name: "bias_corrections",
        arity: Arity::Optional,
        differentiable: false,
    },
];

macro_rules! unary {
    ($op:ident, $name:literal, $summary:literal) => {
        OpSpec {
            op: Op::$op,
            name: $name,
            class: OpClass::Unary,
            operands: X,
            attrs: &[],
            summary: $summary,
        }
    };
}
macro_rules! binary {
    ($op:ident, $name:literal, $class:ident, $operands:ident, $summary:literal) => {
        OpSpec {
            op: Op::$op,
            name: $name,
            class: OpClass::$class,
            operands: $operands,
            attrs: &[],
            summary: $summary,
        }
    };
}
macro_rules! reduce {
    ($op:ident, $name:literal, $summary:literal) => {
        OpSpec {
            op: Op::$op,
            name: $name,
            class: OpClass::Reduce,
            operands: X,
            attrs: REDUCE_ATTRS,
            summary: $summary,
        }
    };
}

/// The op table, in the order of [`Op`]'s variants.
#[rustfmt::skip]
pub static OPS: &[OpSpec] = &[
    unary!(Neg, "neg", "-x"),
    unary!(Abs, "abs", "|x|"),
    unary!(Exp, "exp", "e^x"),
    unary!(Log, "log", "natural logarithm"),
    unary!(Sqrt, "sqrt", "square root"),
    unary!(Rsqrt, "rsqrt", "1 / sqrt(x)"),
    unary!(Reciprocal, "reciprocal", "1 / x"),
    unary!(Square, "square", "x * x"),
    unary!(Relu, "relu", "max(x, 0)"),
    unary!(Sigmoid, "sigmoid", "1 / (1 + e^-x)"),
    unary!(Tanh, "tanh", "hyperbolic tangent"),
    unary!(Silu, "silu", "x * sigmoid(x)"),
    unary!(Sin, "sin", "sine"),
    unary!(Cos, "cos", "cosine"),
    OpSpec { op: Op::Gelu, name: "gelu", class: OpClass::Unary, operands: X,
        attrs: &[attr(key::APPROXIMATE, AttrDefault::Str("none"))],
        summary: "x * Phi(x) (erf form), or the tanh approximation" },
    binary!(Add, "add", Binary, AB, "a + b"),
    binary!(Sub, "sub", Binary, AB, "a - b"),
    binary!(Mul, "mul", Binary, AB, "a * b"),
    binary!(Div, "div", Binary, AB, "a / b"),
    binary!(Pow, "pow", Binary, AB, "a ^ b"),
    binary!(Maximum, "maximum", Binary, AB, "elementwise max; ties send half the gradient to each side"),
    binary!(Minimum, "minimum", Binary, AB, "elementwise min; ties send half the gradient to each side"),
    binary!(Eq, "eq", Compare, AB_NONDIFF, "1.0 where a == b else 0.0"),
    binary!(Lt, "lt", Compare, AB_NONDIFF, "1.0 where a < b else 0.0"),
    binary!(Le, "le", Compare, AB_NONDIFF, "1.0 where a <= b else 0.0"),
    binary!(Gt, "gt", Compare, AB_NONDIFF, "1.0 where a > b else 0.0"),
    binary!(Ge, "ge", Compare, AB_NONDIFF, "1.0 where a >= b else 0.0"),
    OpSpec { op: Op::Where, name: "where", class: OpClass::Select,
        operands: &[nondiff("cond"), one("a"), one("b")], attrs: &[],
        summary: "a where cond != 0 else b" },
    reduce!(Sum, "sum", "sum over axes"),
    reduce!(Mean, "mean", "mean over axes"),
    reduce!(Max, "max", "max over axes; ties share the gradient evenly"),
    reduce!(Min, "min", "min over axes; ties share the gradient evenly"),
    reduce!(Logsumexp, "logsumexp", "log(sum(exp(x))) over axes, computed stably"),
    OpSpec { op: Op::Argmax, name: "argmax", class: OpClass::ArgReduce, operands: &[nondiff("x")],
        attrs: &[attr(key::AXIS, AttrDefault::Required),
                 attr(key::KEEPDIM, AttrDefault::Bool(false)),
                 attr(key::LAST, AttrDefault::Bool(false))],
        summary: "index (i32) of the first maximum along axis (the last with last=true)" },
    OpSpec { op: Op::Cumsum, name: "cumsum", class: OpClass::Scan, operands: X,
        attrs: &[attr(key::AXIS, AttrDefault::Required),
                 attr(key::EXCLUSIVE, AttrDefault::Bool(false)),
                 attr(key::REVERSE, AttrDefault::Bool(false))],
        summary: "running sum along axis (exclusive: of the elements before; reverse: from the end)" },
    OpSpec { op: Op::Reshape, name: "reshape", class: OpClass::View, operands: X,
        attrs: &[attr(key::SHAPE, AttrDefault::Required)],
        summary: "same elements in C order, new shape; one entry may be -1" },
    OpSpec { op: Op::Permute, name: "permute", class: OpClass::View, operands: X,
        attrs: &[attr(key::PERM, AttrDefault::Required)],
        summary: "output axis i is input axis perm[i]" },
    OpSpec { op: Op::Transpose, name: "transpose", class: OpClass::View, operands: X,
        attrs: &[attr(key::DIM0, AttrDefault::Required),
                 attr(key::DIM1, AttrDefault::Required)],
        summary: "swap two axes" },
    OpSpec { op: Op::BroadcastTo, name: "broadcast_to", class: OpClass::View, operands: X,
        attrs: &[attr(key::SHAPE, AttrDefault::Required)],
        summary: "numpy broadcast to shape" },
    OpSpec { op: Op::Unsqueeze, name: "unsqueeze", class: OpClass::View, operands: X,
        attrs: &[attr(key::AXIS, AttrDefault::Required)],
        summary: "insert a size-1 axis at axis (of the output)" },
    OpSpec { op: Op::Squeeze, name: "squeeze", class: OpClass::View, operands: X,
        attrs: &[attr(key::AXIS, AttrDefault::Required)],
        summary: "remove a size-1 axis" },
    OpSpec { op: Op::Slice, name: "slice", class: OpClass::View, operands: X,
        attrs: &[attr(key::AXIS, AttrDefault::Required),
                 attr(key::START, AttrDefault::Required),
                 attr(key::END, AttrDefault::Required),
                 attr(key::STEP, AttrDefault::Int(1))],
        summary: "elements start, start+step, ... < end along axis" },
    OpSpec { op: Op::Concat, name: "concat", class: OpClass::Layout, operands: &[variadic("xs", true)],
        attrs: &[attr(key::AXIS, AttrDefault::Required)],
        summary: "join along axis" },
    OpSpec { op: Op::Cast, name: "cast", class: OpClass::Layout, operands: X,
        attrs: &[attr(key::DTYPE, AttrDefault::Required)],
        summary: "convert element type; f32 to i32 truncates toward zero (differentiable f32 to f32 only)" },
    OpSpec { op: Op::Matmul, name: "matmul", class: OpClass::Matmul, operands: AB, attrs: &[],
        summary: "torch.matmul: 1-D promotion, batched with broadcasting" },
    OpSpec { op: Op::Softmax, name: "softmax", class: OpClass::Nn, operands: X, attrs: SOFTMAX_ATTRS,
        summary: "exp(x - max) / sum(exp(x - max)) along axis" },
    OpSpec { op: Op::LogSoftmax, name: "log_softmax", class: OpClass::Nn, operands: X, attrs: SOFTMAX_ATTRS,
        summary: "x - logsumexp(x) along axis" },
    OpSpec { op: Op::LayerNorm, name: "layer_norm", class: OpClass::Nn,
        operands: &[one("x"), one("gamma"), one("beta")],
        attrs: &[attr(key::EPS, AttrDefault::Float(1e-5))],
        summary: "(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased var)" },
    OpSpec { op: Op::RmsNorm, name: "rms_norm", class: OpClass::Nn, operands: &[one("x"), one("gamma")],
        attrs: &[attr(key::EPS, AttrDefault::Float(1e-6))],
        summary: "x / sqrt(mean(x^2) + eps) * gamma over the last axis" },
    OpSpec { op: Op::GroupNorm, name: "group_norm", class: OpClass::Nn,
        operands: &[one("x"), one("gamma"), one("beta")],
        attrs: &[attr(key::GROUPS, AttrDefault::Required),
                 attr(key::EPS, AttrDefault::Float(1e-5))],
        summary: "normalize each group of C/groups channels of [N, C, ...] over channels and space" },
    OpSpec { op: Op::Conv2d, name: "conv2d", class: OpClass::Nn,
        operands: &[one("x"), one("w"), optional("b")],
        attrs: &[attr(key::STRIDE, AttrDefault::Ints(&[1, 1])),
                 attr(key::PADDING, AttrDefault::Ints(&[0, 0])),
                 attr(key::DILATION, AttrDefault::Ints(&[1, 1])),
                 attr(key::GROUPS, AttrDefault::Int(1))],
        summary: "2-D cross-correlation, x NCHW, w OIHW (I = C/groups), zero padding" },
    OpSpec { op: Op::MaxPool2d, name: "max_pool2d", class: OpClass::Nn, operands: X, attrs: POOL_ATTRS,
        summary: "max over windows of NCHW; padding counts as -inf" },
    OpSpec { op: Op::AvgPool2d, name: "avg_pool2d", class: OpClass::Nn, operands: X, attrs: POOL_ATTRS,
        summary: "mean over windows of NCHW; zero padding counts toward the divisor" },
    OpSpec { op: Op::Embedding, name: "embedding", class: OpClass::Nn,
        operands: &[one("table"), nondiff("ids")], attrs: &[],
        summary: "rows of table [V, D] picked by i32 ids; out ids.shape + [D]" },
    OpSpec { op: Op::CrossEntropy, name: "cross_entropy", class: OpClass::Loss,
        operands: &[one("logits"), nondiff("labels")],
        attrs: &[attr(key::REDUCTION, AttrDefault::Str("mean")),
                 attr(key::IGNORE_INDEX, AttrDefault::Derived("none: every label is a class"))],
        summary: "-log_softmax(logits)[label] for logits [N, C], i32 labels [N]" },
    OpSpec { op: Op::MseLoss, name: "mse_loss", class: OpClass::Loss, operands: AB,
        attrs: &[attr(key::REDUCTION, AttrDefault::Str("mean"))],
        summary: "(a - b)^2, reduced" },
    OpSpec { op: Op::Conv2dGradInput, name: "conv2d_grad_input", class: OpClass::Backward,
        operands: &[one("dy"), one("w")],
        attrs: &[attr(key::INPUT_SHAPE, AttrDefault::Required),
                 CONV_ATTRS_TAIL[0], CONV_ATTRS_TAIL[1], CONV_ATTRS_TAIL[2], CONV_ATTRS_TAIL[3]],
        summary: "gradient of conv2d with respect to its input x (of shape input_shape)" },
    OpSpec { op: Op::Conv2dGradWeight, name: "conv2d_grad_weight", class: OpClass::Backward,
        operands: &[one("x"), one("dy")],
        attrs: &[attr(key::WEIGHT_SHAPE, AttrDefault::Required),
                 CONV_ATTRS_TAIL[0], CONV_ATTRS_TAIL[1], CONV_ATTRS_TAIL[2], CONV_ATTRS_TAIL[3]],
        summary: "gradient of conv2d with respect to its weight (of shape weight_shape)" },
    OpSpec { op: Op::MaxPool2dGrad, name: "max_pool2d_grad", class: OpClass::Backward,
        operands: &[nondiff("x"), one("dy")], attrs: POOL_GRAD_ATTRS,
        summary: "dy routed to the first maximum of each window of x, summed where windows overlap" },
    OpSpec { op: Op::AvgPool2dGrad, name: "avg_pool2d_grad", class: OpClass::Backward,
        operands: &[one("dy")],
        attrs: &[attr(key::INPUT_SHAPE, AttrDefault::Required),
                 POOL_GRAD_ATTRS[0], POOL_GRAD_ATTRS[1], POOL_GRAD_ATTRS[2]],
        summary: "dy / window area spread over each window, summed where windows overlap" },
    OpSpec { op: Op::EmbeddingGrad, name: "embedding_grad", class: OpClass::Backward,
        operands: &[one("dy"), nondiff("ids")],
        attrs: &[attr(key::NUM_EMBEDDINGS, AttrDefault::Required)],
        summary: "rows of dy [ids.shape.., D] summed into a [num_embeddings, D] table at ids" },
    OpSpec { op: Op::SliceGrad, name: "slice_grad", class: OpClass::Backward,
        operands: &[one("dy")],
        attrs: &[attr(key::SHAPE, AttrDefault::Required),
                 attr(key::AXIS, AttrDefault::Required),
                 attr(key::START, AttrDefault::Required),
                 attr(key::END, AttrDefault::Required),
                 attr(key::STEP, AttrDefault::Int(1))],
        summary: "zeros of `shape` with dy placed where slice(axis, start, end, step) reads" },
    OpSpec { op: Op::Attention, name: "attention", class: OpClass::Composite,
        operands: &[one("q"), one("k"), one("v"), OperandSpec { name: "mask", arity: Arity::Optional, differentiable: false }],
        attrs: &[attr(key::SCALE, AttrDefault::Derived("1/sqrt(head_dim)")),
                 attr(key::CAUSAL, AttrDefault::Bool(false)),
                 attr(key::WINDOW, AttrDefault::Int(0)),
                 attr(key::MASK_KIND, AttrDefault::Str("boolean"))],
        summary: "softmax(scale * q k^T + mask) v on [batch, heads, seq, head_dim]" },
    OpSpec { op: Op::Constant, name: "constant", class: OpClass::Constant, operands: &[],
        attrs: &[attr(key::VALUE, AttrDefault::Required)],
        summary: "a scalar f32 literal (may be inf or -inf, not nan)" },
    OpSpec { op: Op::Iota, name: "iota", class: OpClass::Constant, operands: &[],
        attrs: &[attr(key::SHAPE, AttrDefault::Required),
                 attr(key::AXIS, AttrDefault::Required)],
        summary: "f32 tensor of the given shape whose element is its index along axis" },
    OpSpec { op: Op::Grad, name: "grad", class: OpClass::Grad,
        operands: &[nondiff("loss"), variadic("wrt", false)], attrs: &[],
        summary: "d loss / d wrt_i for each wrt_i (an input, param or state)" },
    OpSpec { op: Op::Sgd, name: "sgd", class: OpClass::Optimizer,
        operands: &[nondiff("param"), nondiff("grad"), OperandSpec { name: "momentum_buf", arity: Arity::Optional, differentiable: false },
                   OperandSpec { name: "lr", arity: Arity::Optional, differentiable: false }],
        attrs: &[attr(key::LR, AttrDefault::Derived("required unless the lr operand is given")),
                 attr(key::MOMENTUM, AttrDefault::Float(0.0)),
                 attr(key::DAMPENING, AttrDefault::Float(0.0)),
                 attr(key::NESTEROV, AttrDefault::Bool(false)),
                 attr(key::WEIGHT_DECAY, AttrDefault::Float(0.0))],
        summary: "torch.optim.SGD step: new param (and new momentum buffer)" },
    OpSpec { op: Op::Adam, name: "adam", class: OpClass::Optimizer, operands: ADAM_OPERANDS,
        attrs: &[attr(key::LR, AttrDefault::Float(1e-3)),
                 attr(key::BETA1, AttrDefault::Float(0.9)),
                 attr(key::BETA2, AttrDefault::Float(0.999)),
                 attr(key::EPS, AttrDefault::Float(1e-8)),
                 attr(key::WEIGHT_DECAY, AttrDefault::Float(0.0))],
        summary: "torch.optim.Adam step t: new param, m, v" },
    OpSpec { op: Op::AdamW, name: "adamw", class: OpClass::Optimizer, operands: ADAM_OPERANDS,
        attrs: &[attr(key::LR, AttrDefault::Float(1e-3)),
                 attr(key::BETA1, AttrDefault::Float(0.9)),
                 attr(key::BETA2, AttrDefault::Float(0.999)),
                 attr(key::EPS, AttrDefault::Float(1e-8)),
                 attr(key::WEIGHT_DECAY, AttrDefault::Float(1e-2))],
        summary: "torch.optim.AdamW step t (decoupled weight decay): new param, m, v" },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_enum_order_with_unique_names() {
        for (i, spec) in OPS.iter().enumerate() {
            assert_eq!(spec.op as usize, i, "{} is out of order", spec.name);
            assert_eq!(Op::from_name(spec.name), Some(spec.op));
        }
    }

    #[test]
    fn every_attribute_comes_from_one_key() {
        for spec in OPS {
            for a in spec.attrs {
                assert!(
                    key::ALL.contains(&(a.name, a.kind)),
                    "{}: `{}` is not a key of attr::key",
                    spec.name,
                    a.name
                );
            }
        }
        for (name, kind) in key::ALL {
            assert!(
                OPS.iter()
                    .any(|s| s.attr(name).is_some_and(|a| a.kind == *kind)),
                "key `{name}` is declared by no op"
            );
        }
    }

    #[test]
    fn only_trailing_slots_are_optional_or_variadic() {
        for spec in OPS {
            let mut seen_non_one = false;
            for o in spec.operands {
                if o.arity == Arity::One {
                    assert!(
                        !seen_non_one,
                        "{}: required operand after optional",
                        spec.name
                    );
                } else {
                    seen_non_one = true;
                }
            }
        }
    }
}
