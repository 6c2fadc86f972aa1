//! The semantics of the flash kernels in f64, on the interpreter's tensors (see the parent
//! module's docs): what every test holds the kernels to.

use sinter_ir::interp::Tensor;
use sinter_ir::{DType, Op, TensorType};

use super::{FlashKind, FlashSpec};

/// The semantics of a flash kernel in f64 (see the module docs), on the interpreter's tensors:
/// the results [`FlashSpec::half`] names rounded to `f16`, as a `cast` rounds.
pub fn eval(spec: &FlashSpec, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut outs = eval_f32(spec, inputs);
    for (i, t) in outs.iter_mut().enumerate() {
        if spec.half.contains(i) {
            let data = t.data.iter().map(|&x| DType::F16.round(x)).collect();
            *t = Tensor::new(TensorType::new(DType::F16, t.ty.shape.clone()), data);
        }
    }
    outs
}

fn eval_f32(spec: &FlashSpec, inputs: &[Tensor]) -> Vec<Tensor> {
    use crate::fused::eval::eval as run;
    use sinter_ir::Attrs;
    use sinter_ir::interp::eval_node;
    // f16 operands widened, exactly, as the kernels load them
    let widened: Vec<Tensor> = (inputs.iter())
        .map(|t| match t.ty.dtype {
            DType::F16 => Tensor::new(TensorType::f32(t.ty.shape.clone()), t.data.clone()),
            _ => t.clone(),
        })
        .collect();
    let inputs = &widened[..];
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    let space = spec.score.domain.clone();
    let scores_ty = TensorType::f32(space.clone());
    let transpose = |t: &Tensor| {
        let r = t.ty.rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let attrs = Attrs::new().and(sinter_ir::key::PERM, perm.clone());
        let mut shape = t.ty.shape.clone();
        shape.swap(r - 2, r - 1);
        eval_node(Op::Permute, &attrs, &[t], &[TensorType::f32(shape)])
            .expect("a valid permute")
            .remove(0)
    };
    let matmul = |a: &Tensor, b: &Tensor, out: Vec<usize>| {
        eval_node(Op::Matmul, &Attrs::new(), &[a, b], &[TensorType::f32(out)])
            .expect("a valid matmul")
            .remove(0)
    };
    let x = matmul(q, &transpose(k), space.clone());
    let fixed = spec.fixed_inputs();
    let mut score_in = vec![x];
    score_in.extend(inputs[fixed..fixed + spec.score_extras()].iter().cloned());
    let s = run(&spec.score, &score_in).remove(0);
    debug_assert_eq!(s.ty, scores_ty);
    let sk = *space.last().expect("rank 2 or more");
    let rows = s.data.len() / sk;
    let dv = v.ty.shape[v.ty.rank() - 1];
    let mut out_shape = space[..space.len() - 1].to_vec();
    match spec.kind {
        FlashKind::Forward => {
            let mut p = vec![0.0; s.data.len()];
            let mut l = vec![0.0; rows];
            for r in 0..rows {
                let row = &s.data[r * sk..(r + 1) * sk];
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| {
                    if m.is_nan() || x.is_nan() {
                        f64::NAN
                    } else {
                        m.max(x)
                    }
                });
                let z: f64 = row.iter().map(|&x| (x - m).exp()).sum();
                for (j, &x) in row.iter().enumerate() {
                    p[r * sk + j] = (x - m).exp() / z;
                }
                l[r] = m + z.ln();
            }
            let p = Tensor::new(scores_ty, p);
            out_shape.push(dv);
            let o = matmul(&p, v, out_shape.clone());
            out_shape.pop();
            out_shape.push(1);
            vec![o, Tensor::new(TensorType::f32(out_shape), l)]
        }
        FlashKind::BackwardDkDv | FlashKind::BackwardDq | FlashKind::Backward => {
            let (d_o, lse, delta) = (&inputs[3], &inputs[4], &inputs[5]);
            let p: Vec<f64> = (0..s.data.len())
                .map(|e| (s.data[e] - lse.data[e / sk]).exp())
                .collect();
            let dp = matmul(d_o, &transpose(v), space.clone());
            let ds: Vec<f64> = (0..s.data.len())
                .map(|e| p[e] * (dp.data[e] - delta.data[e / sk]))
                .collect();
            let dscore = spec.dscore.as_ref().expect("a backward kernel has dscore");
            let mut g_in = vec![Tensor::new(scores_ty.clone(), ds)];
            let from = fixed + spec.score_extras();
            g_in.extend(inputs[from..from + spec.dscore_extras()].iter().cloned());
            let g = run(dscore, &g_in).remove(0);
            let p = Tensor::new(scores_ty, p);
            let d_q = || {
                let mut shape = space[..space.len() - 1].to_vec();
                shape.push(q.ty.shape[q.ty.rank() - 1]);
                reduce_to(matmul(&g, k, shape), &q.ty)
            };
            if spec.kind == FlashKind::BackwardDq {
                return vec![d_q()];
            }
            let mut kshape = space[..space.len() - 2].to_vec();
            kshape.push(sk);
            let mut dk_shape = kshape.clone();
            dk_shape.push(k.ty.shape[k.ty.rank() - 1]);
            let mut dv_shape = kshape;
            dv_shape.push(dv);
            let mut outs = vec![
                matmul(&transpose(&g), q, dk_shape),
                matmul(&transpose(&p), d_o, dv_shape),
            ];
            if spec.kind == FlashKind::Backward {
                outs.push(d_q());
            }
            outs
        }
    }
}

/// `t` summed over the axes along which a tensor of type `like` was broadcast to `t`'s shape.
fn reduce_to(t: Tensor, like: &TensorType) -> Tensor {
    if t.ty.shape == like.shape {
        return t;
    }
    let lead = t.ty.rank() - like.rank();
    let broadcast = |a: usize| a < lead || (like.shape[a - lead] == 1 && t.ty.shape[a] != 1);
    let axes: Vec<usize> = (0..t.ty.rank()).filter(|&a| broadcast(a)).collect();
    let kept: Vec<usize> = (0..t.ty.rank())
        .filter(|&a| !broadcast(a))
        .map(|a| t.ty.shape[a])
        .collect();
    let attrs = sinter_ir::Attrs::new()
        .and(sinter_ir::key::AXES, axes)
        .and(sinter_ir::key::KEEPDIM, false);
    let summed = sinter_ir::interp::eval_node(Op::Sum, &attrs, &[&t], &[TensorType::f32(kept)])
        .expect("a valid sum")
        .remove(0);
    Tensor::new(like.clone(), summed.data)
}
