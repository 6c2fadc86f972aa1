//! The `precision` pass: a program rewritten as PyTorch's autocast runs it (`sinter compile
//! --precision mixed`), with casts the rest of the compiler treats like any other op.
//!
//! On the values the program's results depend on (its loss and its outputs, not what it computes
//! from gradients: optimizer updates and clipping stay `f32`), each op runs in the dtype of its
//! autocast list:
//!
//! | list | ops | operands |
//! |---|---|---|
//! | f16 | `matmul`, `conv2d` | cast to `f16` (params too: the `f32` param stays the master copy) |
//! | f32 | `attention`, `exp`, `log`, `pow`, `rsqrt`, `reciprocal`, `sum`, `mean`, `logsumexp`, `softmax`, `log_softmax`, the norms, the losses | cast to `f32` |
//! | promote | every other op with float operands | all `f32` where a computed operand is `f32` (scalars do not count); else all `f16` where one is `f16`, params cast to it (a bias added to a product joins it in `f16`, as in PyTorch's `linear`) |
//!
//! Views, `max`, `min`, `argmax`, `embedding` (in its table's dtype) and the user's own casts keep
//! their operands' dtypes. `attention` takes its `f16` operands (the products that make q, k
//! and v) widened to `f32` and gives an `f32` result, which the next product rounds to `f16`:
//! PyTorch's autocast runs SDPA in `f16` with `f32` accumulation, which is no more precise, and
//! kept in `f16` the attention's casts stand between the optimizer's attention rules and the
//! flash kernels (measured on GPT-2-small's layer, compile only: the optimizer then kept score
//! matrices). The flash kernels the attention rules find read those operands from the `f16`
//! products, not from the casts (`optimize::attention`'s `widened`: exact, so the casts cost
//! nothing), their tensor-core forms round what they multiply to `f16` themselves, and they
//! store the gradients of those `f16` operands in `f16` (`flash-f16-result`). Every output and
//! assigned value keeps its dtype (cast back where its op now runs in `f16`), so the program's
//! interface does not change. Autodiff then makes the backward: the gradient of an `f16` value is
//! `f16`, and a param's gradient reaches it through the cast as `f32`.
//!
//! [`crate::loss_scale`] adds the gradient scaler to a training step after this pass.

use sinter_ir::expand::{Rebuild, rebuild_retyping};
use sinter_ir::{Attrs, DType, Graph, GraphError, Node, Op, OpClass, ValueDef, ValueId, key};

/// What `sinter compile --precision` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Every value as the program declares it.
    #[default]
    F32,
    /// The program's products in `f16` (autocast), its gradients scaled.
    Mixed,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Mixed => "mixed",
        }
    }
}

/// The autocast list an op is on (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    F16,
    F32,
    Promote,
    /// Runs on its operands as they are.
    Keep,
}

fn list(op: Op) -> List {
    use Op::*;
    match op {
        Matmul | Conv2d => List::F16,
        Attention => List::F32,
        Exp | Log | Pow | Rsqrt | Reciprocal | Sum | Mean | Logsumexp | Cumsum | Softmax
        | LogSoftmax | LayerNorm | RmsNorm | GroupNorm | CrossEntropy | MseLoss => List::F32,
        Neg | Abs | Sqrt | Square | Relu | Sigmoid | Tanh | Silu | Sin | Cos | Gelu | Add | Sub
        | Mul | Div | Maximum | Minimum | Eq | Lt | Le | Gt | Ge | Where | Concat | MaxPool2d
        | AvgPool2d => List::Promote,
        Max | Min | Argmax | Reshape | Permute | Transpose | BroadcastTo | Unsqueeze | Squeeze
        | Slice | Cast | Embedding | Constant | Iota => List::Keep,
        // never on a forward path the pass rewrites: made by autodiff, or updates
        Conv2dGradInput | Conv2dGradWeight | MaxPool2dGrad | AvgPool2dGrad | EmbeddingGrad
        | SliceGrad | Grad | Sgd | Adam | AdamW => List::Keep,
    }
}

/// `g` as autocast runs it (see the module docs).
pub fn autocast(g: &Graph) -> Result<Graph, GraphError> {
    let region = forward_region(g);
    let mut new = rebuild_retyping(g, |rb, node, inputs| {
        let old_dtype = |i: usize| rb.old.ty(node.inputs[i]).dtype;
        let to: Vec<Option<DType>> = if region[node_index(rb, node)] {
            targets(rb, node, inputs)
        } else {
            // outside the rewritten region: every operand as the program declared it
            (0..inputs.len()).map(|i| Some(old_dtype(i))).collect()
        };
        let mut changed = false;
        let mut cast_inputs = Vec::with_capacity(inputs.len());
        for (&v, want) in inputs.iter().zip(&to) {
            let c = match want {
                Some(d) => cast(rb, v, *d)?,
                None => v,
            };
            changed |= c != v;
            cast_inputs.push(c);
        }
        if !changed {
            return Ok(None);
        }
        rb.add_node(node.op, &cast_inputs, node.attrs.clone())
            .map(Some)
    })?;
    // every output and assigned value keeps its declared dtype (and an output its name)
    for i in 0..new.outputs.len() {
        let (v, want) = (new.outputs[i], g.ty(g.outputs[i]).dtype);
        if new.ty(v).dtype != want {
            let name = new.name_of(v).to_string();
            new.rename(v, format!("{name}.{}", new.ty(v).dtype))?;
            let attrs = Attrs::new().and(key::DTYPE, want);
            let c = new.add_node(Op::Cast, &[v], attrs, Some(&[name]))?[0];
            for o in new.outputs.iter_mut().filter(|o| **o == v) {
                *o = c;
            }
        }
    }
    for i in 0..new.assigns.len() {
        let (v, want) = (new.assigns[i].source, g.ty(g.assigns[i].source).dtype);
        if new.ty(v).dtype != want {
            let attrs = Attrs::new().and(key::DTYPE, want);
            new.assigns[i].source = new.add_node(Op::Cast, &[v], attrs, None)?[0];
        }
    }
    Ok(new)
}

/// The dtype each operand of `node` is cast to (`None`: as it is), by the op's list, from the
/// operands' dtypes in the new graph.
fn targets(rb: &Rebuild, node: &Node, inputs: &[ValueId]) -> Vec<Option<DType>> {
    let ty = |v: ValueId| rb.graph().ty(v);
    let float = |v: ValueId| ty(v).dtype.is_float();
    let each = |d: DType| {
        inputs
            .iter()
            .map(|&v| float(v).then_some(d))
            .collect::<Vec<_>>()
    };
    match list(node.op) {
        List::F16 => each(DType::F16),
        List::F32 => each(DType::F32),
        List::Promote => {
            // a param joins the products' precision (a bias added to a product is part of the
            // f16 op, as in PyTorch's `linear`); computed f32 tensors widen the op
            let param = |v: ValueId| matches!(rb.graph().value(v).def, ValueDef::Param(_));
            let tensor = |v: ValueId| !ty(v).is_scalar();
            let wide =
                (inputs.iter()).any(|&v| tensor(v) && ty(v).dtype == DType::F32 && !param(v));
            let narrow = (inputs.iter()).any(|&v| tensor(v) && ty(v).dtype == DType::F16);
            if wide {
                each(DType::F32)
            } else if narrow {
                each(DType::F16)
            } else {
                vec![None; inputs.len()]
            }
        }
        List::Keep => vec![None; inputs.len()],
    }
}

/// `v` cast to the float dtype `to`, or `v` where it is already `to` or not a float.
fn cast(rb: &mut Rebuild, v: ValueId, to: DType) -> Result<ValueId, GraphError> {
    let dtype = rb.graph().ty(v).dtype;
    if !dtype.is_float() || dtype == to {
        return Ok(v);
    }
    rb.add(Op::Cast, &[v], Attrs::new().and(key::DTYPE, to))
}

/// The index of `node` in the old graph.
fn node_index(rb: &Rebuild, node: &Node) -> usize {
    rb.old
        .producer(node.outputs[0])
        .expect("a node's results are its own")
        .index()
}

/// Per value of `g`: whether it is computed from a gradient or an optimizer's result (a `grad`
/// node's or an optimizer's results, and everything computed from them).
pub(crate) fn from_gradients(g: &Graph) -> Vec<bool> {
    let mut from = vec![false; g.values.len()];
    for node in &g.nodes {
        let tainted = matches!(node.op.class(), OpClass::Grad | OpClass::Optimizer)
            || node.inputs.iter().any(|v| from[v.index()]);
        if tainted {
            for &o in &node.outputs {
                from[o.index()] = true;
            }
        }
    }
    from
}

/// Per node of `g`: whether the pass rewrites it, being on a path to a `grad` node's loss or to
/// an output or assigned value, and not computed from a gradient or an optimizer's result.
fn forward_region(g: &Graph) -> Vec<bool> {
    let from_gradient = from_gradients(g);
    let mut needed = vec![false; g.values.len()];
    for &v in &g.outputs {
        needed[v.index()] = true;
    }
    for a in &g.assigns {
        needed[a.source.index()] = true;
    }
    for node in &g.nodes {
        if node.op == Op::Grad {
            needed[node.inputs[0].index()] = true;
        }
    }
    let mut region = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate().rev() {
        let wanted = node.outputs.iter().any(|o| needed[o.index()]);
        let clean = !node.outputs.iter().any(|o| from_gradient[o.index()]);
        if wanted && clean {
            region[i] = true;
            for &v in &node.inputs {
                needed[v.index()] = true;
            }
        } else if wanted {
            // a gradient-side node: what it reads from the forward is still needed as declared
            for &v in &node.inputs {
                needed[v.index()] = true;
            }
        }
    }
    region
}

#[cfg(test)]
mod tests {
    use super::*;

    fn autocast_text(src: &str) -> String {
        let g = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
        sinter_ir::text::print(&autocast(&g).expect("autocasts"))
    }

    #[test]
    fn products_run_in_f16_and_the_loss_in_f32() {
        let text = autocast_text(
            "graph t {
  input x: f32[4, 8]
  input labels: i32[4]
  param w: f32[8, 3] = normal(std=0.1, seed=1)
  param b: f32[3] = zeros
  logits = add(matmul(x, w), b)
  loss = cross_entropy(logits, labels)
  train loss with adamw(lr=0.01)
  output loss, logits
}
",
        );
        let g = sinter_ir::text::parse(&text).expect("prints valid text");
        let dtypes = |op: Op| -> Vec<Vec<DType>> {
            g.nodes
                .iter()
                .filter(|n| n.op == op)
                .map(|n| n.inputs.iter().map(|&v| g.ty(v).dtype).collect())
                .collect()
        };
        // x and w cast to f16 for the product; the bias joins it in f16 (as PyTorch's linear
        // does); the loss in f32; the optimizer updates the f32 params from f32 gradients
        assert_eq!(dtypes(Op::Matmul), [vec![DType::F16, DType::F16]], "{text}");
        assert_eq!(dtypes(Op::Add)[0], [DType::F16, DType::F16], "{text}");
        assert_eq!(dtypes(Op::CrossEntropy)[0][0], DType::F32, "{text}");
        assert!(dtypes(Op::AdamW).iter().flatten().all(|&d| d == DType::F32));
        let logits = g.lookup("logits").expect("kept");
        assert_eq!(g.ty(logits).dtype, DType::F32);
    }

    #[test]
    fn outputs_keep_their_dtype_and_f32_programs_without_products_stay_as_they_are() {
        let src = "graph t {\n  input x: f32[4, 8]\n  input w: f32[8, 8]\n  y = relu(matmul(x, w))\n  output y\n}\n";
        let text = autocast_text(src);
        let g = sinter_ir::text::parse(&text).expect("valid");
        assert_eq!(g.ty(g.lookup("y").expect("kept")).dtype, DType::F32);
        assert!(text.contains("relu("), "{text}");
        let plain = "graph t {\n  input x: f32[4]\n  y = exp(x)\n  output y\n}\n";
        assert_eq!(
            autocast_text(plain),
            sinter_ir::text::print(&sinter_ir::text::parse(plain).unwrap())
        );
    }
}
