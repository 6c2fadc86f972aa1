//! [`eval_node`]: the semantics of one node, dispatched by an exhaustive match on [`Op`].
//!
//! Adding an op to the table without giving it semantics here does not compile.

use crate::attr::Attrs;
use crate::attr::key;
use crate::infer::infer;
use crate::interp::tensor::{Tensor, split_at_axis};
use crate::interp::{
    EvalError, attention, backward, conv, elementwise, embedding, layout, loss, matmul, norm,
    optim, reduce,
};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// Evaluates one node: `op` with `attrs` on `inputs`, producing values of `out_types`.
///
/// The node is checked first with the op's shape rule (so `attrs` may be given as a user would
/// write them: defaults are filled and negative axes normalized here), and the types it infers
/// must equal `out_types`. Index errors name the operand slot (`ids`, `labels`); [`evaluate`]
/// names the graph value instead.
///
/// [`evaluate`]: super::evaluate()
pub fn eval_node(
    node_op: Op,
    attrs: &Attrs,
    inputs: &[&Tensor],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, EvalError> {
    let spec = node_op.spec();
    let names: Vec<String> = (0..inputs.len())
        .map(|i| spec.operand_slot(i).name.to_string())
        .collect();
    eval_named(node_op, attrs, inputs, out_types, &names)
}

/// [`eval_node`] with the operands' names for error messages.
pub(crate) fn eval_named(
    op: Op,
    attrs: &Attrs,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    names: &[String],
) -> Result<Vec<Tensor>, EvalError> {
    for (t, name) in inputs.iter().zip(names) {
        if t.data.len() != t.ty.numel() {
            return Err(EvalError::DataLength {
                name: name.clone(),
                ty: t.ty.clone(),
                expected: t.ty.numel(),
                actual: t.data.len(),
            });
        }
    }
    let mut attrs = attrs.clone();
    let types: Vec<TensorType> = inputs.iter().map(|t| t.ty.clone()).collect();
    let inferred = infer(op, &types, &mut attrs).map_err(|source| EvalError::Type {
        op: op.name(),
        source,
    })?;
    if inferred != out_types {
        return Err(EvalError::ResultTypes {
            op: op.name(),
            expected: inferred,
            actual: out_types.to_vec(),
        });
    }
    let cx = Cx {
        op,
        attrs: &attrs,
        inputs,
        names,
        out: out_types,
    };
    let mut results = cx.eval()?;
    // an f16 result holds f16 numbers: computed in f64 from its operands, rounded once
    for t in &mut results {
        if t.ty.dtype == DType::F16 {
            for x in &mut t.data {
                *x = DType::F16.round(*x);
            }
        }
    }
    Ok(results)
}

/// One checked node: normalized attributes, operands and result types.
pub(crate) struct Cx<'a> {
    pub op: Op,
    pub attrs: &'a Attrs,
    pub inputs: &'a [&'a Tensor],
    pub names: &'a [String],
    pub out: &'a [TensorType],
}

impl Cx<'_> {
    pub fn x(&self, i: usize) -> &Tensor {
        self.inputs[i]
    }

    pub fn optional(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).copied()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// The type of the (first) result.
    pub fn out(&self) -> &TensorType {
        &self.out[0]
    }

    fn eval(&self) -> Result<Vec<Tensor>, EvalError> {
        use Op::*;
        let one = |t: Tensor| Ok(vec![t]);
        match self.op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu => one(elementwise::unary(self)),
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq | Lt | Le | Gt | Ge => {
                one(elementwise::binary(self))
            }
            Where => one(elementwise::select(self)),
            Sum | Mean | Max | Min | Logsumexp => one(reduce::reduce(self)),
            Argmax => one(reduce::argmax(self)),
            Cumsum => one(reduce::cumsum(self)),
            Softmax | LogSoftmax => one(reduce::softmax(self)),
            Reshape | Unsqueeze | Squeeze => one(self.x(0).clone().with_type(self.out().clone())),
            Permute => one(layout::permute(self, &self.attrs.of(key::PERM))),
            Transpose => one(layout::transpose(self)),
            BroadcastTo => one(layout::broadcast_to(self)),
            Slice => one(layout::slice(self)),
            Concat => one(layout::concat(self)),
            Cast => one(elementwise::cast(self)),
            Matmul => one(matmul::matmul(self.x(0), self.x(1), self.out())),
            LayerNorm => one(norm::layer_norm(self)),
            RmsNorm => one(norm::rms_norm(self)),
            GroupNorm => one(norm::group_norm(self)),
            Conv2d => one(conv::conv2d(self)),
            MaxPool2d | AvgPool2d => one(conv::pool2d(self)),
            Embedding => one(embedding::embedding(self)?),
            CrossEntropy => one(loss::cross_entropy(self)?),
            MseLoss => one(loss::mse_loss(self)),
            Attention => one(attention::attention(self)),
            Constant => one(Tensor::scalar(self.attrs.of(key::VALUE))),
            Iota => one(iota(self.out(), self.attrs.of(key::AXIS))),
            Conv2dGradInput => one(backward::conv2d_grad_input(self)),
            Conv2dGradWeight => one(backward::conv2d_grad_weight(self)),
            MaxPool2dGrad => one(backward::max_pool2d_grad(self)),
            AvgPool2dGrad => one(backward::avg_pool2d_grad(self)),
            EmbeddingGrad => one(backward::embedding_grad(self)?),
            SliceGrad => one(backward::slice_grad(self)),
            Grad => Err(EvalError::NeedsPass {
                op: "grad",
                pass: "autodiff",
            }),
            Sgd => optim::sgd(self),
            Adam | AdamW => optim::adam(self),
        }
    }
}

/// `iota`: every element is its index along `axis`.
fn iota(ty: &TensorType, axis: usize) -> Tensor {
    debug_assert_eq!(ty.dtype, DType::F32);
    let (outer, n, inner) = split_at_axis(&ty.shape, axis);
    let mut data = Vec::with_capacity(ty.numel());
    for _ in 0..outer {
        for i in 0..n {
            data.extend(std::iter::repeat_n(i as f64, inner));
        }
    }
    Tensor::new(ty.clone(), data)
}

impl Cx<'_> {
    /// Element `element` of the i32 operand `operand`, as an index below `bound`.
    pub fn index(&self, operand: usize, element: usize, bound: usize) -> Result<usize, EvalError> {
        let v = self.x(operand).data[element];
        if v.fract() != 0.0 || v.is_nan() {
            return Err(EvalError::NotAnInteger {
                name: self.name(operand).to_string(),
                index: element,
                value: v,
            });
        }
        if v < 0.0 || v >= bound as f64 {
            return Err(EvalError::IndexOutOfRange {
                op: self.op.name(),
                value_name: self.name(operand).to_string(),
                index: v as i64,
                bound,
            });
        }
        Ok(v as usize)
    }
}
