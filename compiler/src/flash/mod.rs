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
//!
//! The module by concern: the spec (here: what a kernel computes, its inputs and results),
//! [`semantics`] (its f64 meaning), [`interval`] (which blocks a mask leaves live, on the
//! host), [`variant`] (how a kernel runs: form, tiling, launch order, groups; chosen once).
//! The rules that find these kernels are in `optimize/attention.rs`, their price in
//! [`crate::cost`], their WGSL in [`crate::codegen::flash`].

pub mod interval;
pub mod semantics;
pub mod variant;

use sinter_ir::TensorType;

use crate::fused::Program;
pub use semantics::eval;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FlashKind {
    /// Inputs `q, k, v, score extras..`; outputs `O [batch.., Sq, Dv]`, `L [batch.., Sq, 1]`.
    Forward,
    /// Inputs `q, k, v, dO, L, D, score extras.., dscore extras..`; outputs `dK [batch.., Sk,
    /// D]`, `dV [batch.., Sk, Dv]` over the score space's batch (as `k` and `v` unless they are
    /// broadcast over it, as in grouped-query attention, where the graph sums them).
    BackwardDkDv,
    /// Inputs as [`FlashKind::BackwardDkDv`]; output `dQ` (shaped as `q`).
    BackwardDq,
    /// The whole backward in one kernel per group of key blocks: inputs as
    /// [`FlashKind::BackwardDkDv`]; outputs `dK`, `dV` (as that kernel's) and `dQ` (shaped as
    /// `q`, which must not be broadcast over the score space's batch). Each workgroup walks its
    /// key blocks and adds their share of `dQ` into a partial sum of its own (WGSL has no float
    /// atomics); a second pass adds the groups' partials. Built by lowering from a dQ and a
    /// dK/dV kernel of one attention (`merge-flash-backward`), it computes the scores and `dP`
    /// once where the two kernels compute them twice.
    Backward,
}

/// What a flash kernel computes (see the module docs); its inputs are a kernel node's.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashSpec {
    pub kind: FlashKind,
    /// The score function; its operand 0 is the raw product.
    pub score: Program,
    /// The score function's backward (backward kernels); its operand 0 is `dS`.
    pub dscore: Option<Program>,
    /// The results the kernel stores in `f16`, rounding as a `cast` does: those whose
    /// readers read them through such a cast (`optimize::attention`'s `flash-f16-result`).
    /// `L` is always `f32`; the whole backward's `dQ` partial sums are too, and the kernel
    /// that adds them rounds.
    pub half: HalfResults,
}

/// A set of a flash kernel's result indices (see [`FlashSpec::half`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HalfResults(u8);

impl HalfResults {
    pub const NONE: HalfResults = HalfResults(0);

    pub fn contains(self, result: usize) -> bool {
        result < 8 && self.0 & (1 << result) != 0
    }

    pub fn with(self, result: usize) -> HalfResults {
        debug_assert!(result < 8);
        HalfResults(self.0 | 1 << result)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FlashSpec {
    /// Inputs before the score function's extra operands.
    pub fn fixed_inputs(&self) -> usize {
        match self.kind {
            FlashKind::Forward => 3,
            FlashKind::BackwardDkDv | FlashKind::BackwardDq | FlashKind::Backward => 6,
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

    pub fn pattern(&self) -> crate::kernel::Pattern {
        use crate::kernel::Pattern;
        match self.kind {
            FlashKind::Forward => Pattern::FlashForward,
            FlashKind::BackwardDkDv => Pattern::FlashBackwardDkDv,
            FlashKind::BackwardDq => Pattern::FlashBackwardDq,
            FlashKind::Backward => Pattern::FlashBackward,
        }
    }

    /// Whether result `i` may be stored in `f16`: `O`, dQ, dK and dV, not `L`.
    pub fn may_be_half(&self, i: usize) -> bool {
        match self.kind {
            FlashKind::Forward | FlashKind::BackwardDq => i == 0,
            FlashKind::BackwardDkDv => i < 2,
            FlashKind::Backward => i < 3,
        }
    }

    /// The result types, from the input types: `f32`, whatever the operands' dtypes (a kernel
    /// widens `f16` operands as it loads them), except the [`FlashSpec::half`] ones.
    pub fn output_types(&self, inputs: &[TensorType]) -> Vec<TensorType> {
        let mut outs = self.f32_output_types(inputs);
        for (i, t) in outs.iter_mut().enumerate() {
            if self.half.contains(i) {
                debug_assert!(self.may_be_half(i));
                t.dtype = sinter_ir::DType::F16;
            }
        }
        outs
    }

    fn f32_output_types(&self, inputs: &[TensorType]) -> Vec<TensorType> {
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
            FlashKind::BackwardDkDv | FlashKind::Backward => {
                // over the score space's batch: a k or v broadcast over heads (grouped-query
                // attention) gets one gradient per query head, which the graph sums
                let r = self.score.domain.len();
                let with = |last: usize| {
                    let mut shape = self.score.domain[..r - 2].to_vec();
                    shape.extend([self.score.domain[r - 1], last]);
                    TensorType::f32(shape)
                };
                let mut outs = vec![with(k.shape[k.rank() - 1]), with(v.shape[v.rank() - 1])];
                if self.kind == FlashKind::Backward {
                    outs.push(TensorType::f32(q.shape.clone()));
                }
                outs
            }
            FlashKind::BackwardDq => vec![TensorType::f32(q.shape.clone())],
        }
    }
}

impl std::fmt::Display for FlashSpec {
    /// The kind, then the score function (its operand 0 the raw product `q·kᵀ`) and its
    /// backward (operand 0 `dS`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:?} over {:?}", self.kind, self.score.domain)?;
        write!(f, "score: {}", self.score)?;
        if let Some(g) = &self.dscore {
            write!(f, "dscore: {g}")?;
        }
        if !self.half.is_empty() {
            let half: Vec<String> = (0..8)
                .filter(|&i| self.half.contains(i))
                .map(|i| i.to_string())
                .collect();
            write!(f, "\nresults stored in f16: {}", half.join(", "))?;
        }
        Ok(())
    }
}
