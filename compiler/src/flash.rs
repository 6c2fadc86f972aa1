//! Flash attention as the optimizer finds it: the forward and the two backward kernels of
//! FlashAttention-2 (arXiv 2307.08691, Algorithms 1 and 2), parametrized by the graph's own score
//! function, so that any attention the e-graph recognizes — the `attention` composite or one
//! written by hand, with any mask — runs without an `[Sq, Sk]` buffer.
//!
//! For a batch index `b` (any number of batch axes, broadcasting as in `matmul`), query `i` and
//! key `j`:
//! - `x_ij = Σ_d q[b, i, d] · k[b, j, d]`, the raw product;
//! - `s_ij = score(x_ij, …)`, an elementwise [`Program`] over `[batch.., Sq, Sk]` whose operand 0
//!   is `x` and whose other operands are masks or biases broadcast into that space (scale,
//!   additive and boolean masks, and causal or window masks as `iota` coordinates);
//! - forward: `m_i = max_j s_ij`, `ℓ_i = Σ_j exp(s_ij − m_i)`, `O_i = Σ_j exp(s_ij − m_i) v_j / ℓ_i`
//!   and `L_i = m_i + log ℓ_i` (the log-sum-exp the backward needs);
//! - backward, with `P_ij = exp(s_ij − L_i)`, `dP_ij = Σ_e dO[i, e] · v[j, e]`,
//!   `D_i = Σ_e dO[i, e] · O[i, e]` and `G_ij = dscore(P_ij · (dP_ij − D_i), …)` (the gradient of
//!   the raw product, through the score function's backward, another elementwise program whose
//!   operand 0 is `dS`): `dQ_i = Σ_j G_ij k_j` (one kernel per query block), and
//!   `dK_j = Σ_i G_ij q_i`, `dV_j = Σ_i P_ij dO_i` (one kernel per key block).
//!
//! A row whose scores are all `-inf` gives NaN (as the softmax it replaces), and so does one
//! with a NaN score.

use sinter_ir::interp::Tensor;
use sinter_ir::{Op, TensorType};

use crate::fused::Program;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FlashKind {
    /// Inputs `q, k, v, score extras..`; outputs `O [batch.., Sq, Dv]`, `L [batch.., Sq, 1]`.
    Forward,
    /// Inputs `q, k, v, dO, L, D, score extras.., dscore extras..`; outputs `dK`, `dV` (shaped
    /// as `k` and `v`).
    BackwardDkDv,
    /// Inputs as [`FlashKind::BackwardDkDv`]; output `dQ` (shaped as `q`).
    BackwardDq,
}

/// What a flash kernel computes (see the module docs); its inputs are a kernel node's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashSpec {
    pub kind: FlashKind,
    /// The score function; its operand 0 is the raw product.
    pub score: Program,
    /// The score function's backward (backward kernels); its operand 0 is `dS`.
    pub dscore: Option<Program>,
}

impl FlashSpec {
    /// Inputs before the score function's extra operands.
    pub fn fixed_inputs(&self) -> usize {
        match self.kind {
            FlashKind::Forward => 3,
            FlashKind::BackwardDkDv | FlashKind::BackwardDq => 6,
        }
    }

    /// Extra operands of the score function (after its operand 0).
    pub fn score_extras(&self) -> usize {
        self.score.operands.len() - 1
    }

    /// Extra operands of the score function's backward.
    pub fn dscore_extras(&self) -> usize {
        self.dscore.as_ref().map_or(0, |p| p.operands.len() - 1)
    }

    pub fn pattern(&self) -> &'static str {
        match self.kind {
            FlashKind::Forward => "flash_attention_fwd",
            FlashKind::BackwardDkDv => "flash_attention_bwd_dkdv",
            FlashKind::BackwardDq => "flash_attention_bwd_dq",
        }
    }

    /// The result types, from the input types.
    pub fn output_types(&self, inputs: &[TensorType]) -> Vec<TensorType> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        match self.kind {
            FlashKind::Forward => {
                let mut o = self.score.domain.clone();
                let sk = o.pop().expect("a score space of rank 2 or more");
                debug_assert_eq!(sk, k.shape[k.rank() - 2]);
                let mut l = o.clone();
                l.push(1);
                o.push(v.shape[v.rank() - 1]);
                vec![TensorType::f32(o), TensorType::f32(l)]
            }
            FlashKind::BackwardDkDv => vec![k.clone(), v.clone()],
            FlashKind::BackwardDq => vec![q.clone()],
        }
    }
}

/// The semantics of a flash kernel in f64 (see the module docs), on the interpreter's tensors.
pub fn eval(spec: &FlashSpec, inputs: &[Tensor]) -> Vec<Tensor> {
    use crate::fused::eval::eval as run;
    use sinter_ir::Attrs;
    use sinter_ir::interp::eval_node;
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
        FlashKind::BackwardDkDv | FlashKind::BackwardDq => {
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
            let sum_to = |t: Tensor, like: &TensorType| reduce_to(t, like);
            match spec.kind {
                FlashKind::BackwardDq => {
                    let mut shape = space[..space.len() - 1].to_vec();
                    shape.push(q.ty.shape[q.ty.rank() - 1]);
                    vec![sum_to(matmul(&g, k, shape), &q.ty)]
                }
                _ => {
                    let mut kshape = space[..space.len() - 2].to_vec();
                    kshape.push(sk);
                    let mut dk_shape = kshape.clone();
                    dk_shape.push(k.ty.shape[k.ty.rank() - 1]);
                    let mut dv_shape = kshape;
                    dv_shape.push(dv);
                    let dk = matmul(&transpose(&g), q, dk_shape);
                    let dvv = matmul(&transpose(&p), d_o, dv_shape);
                    vec![sum_to(dk, &k.ty), sum_to(dvv, &v.ty)]
                }
            }
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
