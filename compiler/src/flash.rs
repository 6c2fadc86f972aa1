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

    pub fn pattern(&self) -> &'static str {
        match self.kind {
            FlashKind::Forward => "flash_attention_fwd",
            FlashKind::BackwardDkDv => "flash_attention_bwd_dkdv",
            FlashKind::BackwardDq => "flash_attention_bwd_dq",
            FlashKind::Backward => "flash_attention_bwd",
        }
    }

    /// Whether lowering makes this backward kernel and its partner (the dQ or dK/dV kernel of
    /// the same attention) one kernel of the whole backward ([`FlashKind::Backward`]), given
    /// the types of `q` and `v`: where `q` is not broadcast over the score space's batch (the
    /// partial sums range over it) and [`crate::codegen::flash::merges_backward`] says it pays;
    /// never where `tensor_cores` ([`crate::Options::tensor_cores`]) and the split kernels
    /// have tensor-core forms, which the whole backward has not.
    pub fn merges(&self, q: &TensorType, v: &TensorType, tensor_cores: bool) -> bool {
        let r = self.score.domain.len();
        let (d, dv) = (q.shape[q.rank() - 1], v.shape[v.rank() - 1]);
        if tensor_cores && crate::codegen::flash::coop::backward_takes(d, dv) {
            return false;
        }
        q.shape[..q.rank() - 1] == self.score.domain[..r - 1]
            && crate::codegen::flash::merges_backward(
                crate::codegen::flash::Tiling::DEFAULT,
                q.shape[q.rank() - 1],
                v.shape[v.rank() - 1],
            )
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
                    outs.push(q.clone());
                }
                outs
            }
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

/// The share of `[rows × cols]` blocks of the score space that the kernels compute: the rest are
/// proven `-inf` throughout (causal and window masks) and skipped. The same interval evaluation
/// as the kernels' `tile_dead` (see [`crate::codegen::flash`]), on the host, over a grid of at
/// most 64 × 64 blocks (coarser blocks than the kernels' prove less dead: an upper bound), for
/// the cost model.
pub fn live_fraction(score: &Program, rows: usize, cols: usize) -> f64 {
    let r = score.domain.len();
    let (sq, sk) = (score.domain[r - 2], score.domain[r - 1]);
    let (bq, bk) = (rows.max(sq.div_ceil(64)), cols.max(sk.div_ceil(64)));
    let (mut live, mut all) = (0usize, 0usize);
    for i0 in (0..sq).step_by(bq) {
        let height = (i0 + bq).min(sq) - i0;
        let (l, a) = live_in_strip(score, i0, bq, bk, false);
        live += height * l;
        all += height * a;
    }
    live as f64 / all.max(1) as f64
}

/// Live share of each block of `rows` rows of the score space (queries, or keys when
/// `by_keys`: the dK/dV kernel's rows), over at most 64 column blocks, by the interval test of
/// [`live_fraction`]: the work each workgroup of a flash kernel does, for the cost model.
pub fn live_per_row_block(score: &Program, rows: usize, by_keys: bool) -> Vec<f64> {
    let r = score.domain.len();
    let (sq, sk) = (score.domain[r - 2], score.domain[r - 1]);
    let (n_rows, n_cols) = if by_keys { (sk, sq) } else { (sq, sk) };
    (0..n_rows)
        .step_by(rows.max(1))
        .map(|r0| {
            let (live, all) = live_in_strip(score, r0, rows, n_cols.div_ceil(64).max(1), by_keys);
            live as f64 / all.max(1) as f64
        })
        .collect()
}

/// The order in which a flash kernel's workgroups start: the hardware starts them in dispatch
/// order, `x` fastest, each on an SM that frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchOrder {
    /// A batch entry's blocks together (`x` the block), sharing its keys in the cache: where
    /// every block does the same work.
    Blocks,
    /// Every batch entry's block of the most work first (`x` the batch entry, `y` the block,
    /// from the last when `reversed`): where a causal or window mask makes blocks differ and
    /// the dispatch is a few waves, the heaviest started last would be the tail that all the
    /// others wait for. Measured on the H200 at S = 2048 causal: 4.99 → 4.34 ms forward +
    /// backward. With many waves the tail is short and the cache sharing of [`Blocks`] wins
    /// (S = 8192 causal, 3072 forward workgroups: 66.7 → 68.1–69.8 ms), and blocks of equal
    /// work lose by it (1–3%, and the whole backward's snake-paired groups at S = 4096).
    ///
    /// [`Blocks`]: LaunchOrder::Blocks
    HeaviestFirst { reversed: bool },
}

/// Most workgroups (16 waves of one per SM) a dispatch may have for
/// [`LaunchOrder::HeaviestFirst`].
const HEAVIEST_FIRST_WORKGROUPS: usize = 16 * crate::codegen::matmul::SMS;

impl LaunchOrder {
    /// The order for `batch` entries of blocks (or groups) of works `per_block` (by
    /// [`live_per_row_block`], or [`group_works`]): heaviest first where they differ by more
    /// than a tenth and the dispatch is a few waves, from the end whose half holds more work.
    pub fn of(per_block: &[f64], batch: usize) -> LaunchOrder {
        let most = per_block.iter().copied().fold(0.0, f64::max);
        let least = per_block.iter().copied().fold(most, f64::min);
        if most - least <= 0.1 * most || per_block.len() * batch > HEAVIEST_FIRST_WORKGROUPS {
            return LaunchOrder::Blocks;
        }
        let half = per_block.len() / 2;
        let (head, tail) = per_block.split_at(half);
        let tail = &tail[tail.len() - head.len()..];
        LaunchOrder::HeaviestFirst {
            reversed: tail.iter().sum::<f64>() > head.iter().sum::<f64>(),
        }
    }

    /// Whether the batch entry is the dispatch's fastest axis (`x`).
    pub fn batch_fastest(self) -> bool {
        matches!(self, LaunchOrder::HeaviestFirst { .. })
    }

    /// The block of each workgroup, in launch order, over `batch` entries of `n` blocks.
    pub fn launches(self, n: usize, batch: usize) -> Vec<usize> {
        match self {
            LaunchOrder::Blocks => (0..batch).flat_map(|_| 0..n).collect(),
            LaunchOrder::HeaviestFirst { reversed } => (0..n)
                .map(|i| if reversed { n - 1 - i } else { i })
                .flat_map(|b| std::iter::repeat_n(b, batch))
                .collect(),
        }
    }
}

/// The work of each of the whole backward's `groups` groups of key blocks, from the blocks'
/// works: the blocks each walks in the kernel's snake order (g, 2G − 1 − g, 2G + g, …).
pub fn group_works(per_block: &[f64], groups: usize) -> Vec<f64> {
    let walk = per_block.len().div_ceil(groups.max(1));
    (0..groups)
        .map(|g| {
            (0..walk)
                .map(|wk| {
                    if wk % 2 == 0 {
                        wk * groups + g
                    } else {
                        (wk + 1) * groups - 1 - g
                    }
                })
                .filter_map(|b| per_block.get(b))
                .sum()
        })
        .collect()
}

/// The columns of the strip of `height` rows from `r0` (queries, or keys when `by_keys`) that
/// are live and in all, swept in blocks of `width` columns, each block tested whole by
/// [`block_dead`] over every batch coordinate.
fn live_in_strip(
    score: &Program,
    r0: usize,
    height: usize,
    width: usize,
    by_keys: bool,
) -> (usize, usize) {
    let r = score.domain.len();
    let (sq, sk) = (score.domain[r - 2], score.domain[r - 1]);
    let (n_rows, n_cols) = if by_keys { (sk, sq) } else { (sq, sk) };
    let batch: Vec<(f64, f64)> = score.domain[..r - 2]
        .iter()
        .map(|&n| (0.0, n.saturating_sub(1) as f64))
        .collect();
    let range = |lo: usize, len: usize, end: usize| (lo as f64, (lo + len).min(end) as f64 - 1.0);
    let row = range(r0, height, n_rows);
    let (mut live, mut all) = (0usize, 0usize);
    for c0 in (0..n_cols).step_by(width) {
        let col = range(c0, width, n_cols);
        let size = (col.1 - col.0 + 1.0) as usize;
        all += size;
        let (i, j) = if by_keys { (col, row) } else { (row, col) };
        if !block_dead(score, &batch, i, j) {
            live += size;
        }
    }
    (live, all)
}

/// Whether `score` is certainly `-inf` over the coordinate box (see [`live_fraction`]).
fn block_dead(p: &Program, batch: &[(f64, f64)], i: (f64, f64), j: (f64, f64)) -> bool {
    use crate::fused::{Inst, Scalar};
    const ALL: (f64, f64) = (f64::NEG_INFINITY, f64::INFINITY);
    let nb = batch.len();
    let mut v: Vec<(f64, f64)> = Vec::with_capacity(p.insts.len());
    let dtypes = p.dtypes();
    for (n, inst) in p.insts.iter().enumerate() {
        let b = if dtypes[n] == sinter_ir::DType::I32 {
            ALL
        } else {
            match inst {
                Inst::Load(_) | Inst::Reduced(_) => ALL,
                Inst::Const(bits) => {
                    let c = f64::from(f32::from_bits(*bits));
                    (c, c)
                }
                Inst::Coord(k) => match *k as usize {
                    k if k < nb => batch[k],
                    k if k == nb => i,
                    _ => j,
                },
                Inst::Map(f, args) => {
                    let a = v[args[0] as usize];
                    let b = args.get(1).map(|&x| v[x as usize]);
                    match (f, b) {
                        (Scalar::Op(Op::Add), Some(b)) => (a.0 + b.0, a.1 + b.1),
                        (Scalar::Op(Op::Sub), Some(b)) => (a.0 - b.1, a.1 - b.0),
                        (Scalar::Op(Op::Neg), _) => (-a.1, -a.0),
                        (Scalar::Op(Op::Abs), _) => {
                            let lo = if a.0 >= 0.0 {
                                a.0
                            } else if a.1 <= 0.0 {
                                -a.1
                            } else {
                                0.0
                            };
                            (lo, a.0.abs().max(a.1.abs()))
                        }
                        (Scalar::Op(Op::Mul), Some(b)) => {
                            let p = [a.0 * b.0, a.0 * b.1, a.1 * b.0, a.1 * b.1];
                            (
                                p.iter().copied().fold(f64::INFINITY, f64::min),
                                p.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                            )
                        }
                        (Scalar::Op(op @ (Op::Lt | Op::Le | Op::Gt | Op::Ge)), Some(b)) => {
                            let (t, f) = match op {
                                Op::Lt => (a.1 < b.0, a.0 >= b.1),
                                Op::Le => (a.1 <= b.0, a.0 > b.1),
                                Op::Gt => (a.0 > b.1, a.1 <= b.0),
                                _ => (a.0 >= b.1, a.1 < b.0),
                            };
                            (if t { 1.0 } else { 0.0 }, if f { 0.0 } else { 1.0 })
                        }
                        (Scalar::Op(Op::Where), _) => {
                            let (x, y) = (v[args[1] as usize], v[args[2] as usize]);
                            if a == (0.0, 0.0) {
                                y
                            } else if a.0 > 0.0 || a.1 < 0.0 {
                                x
                            } else {
                                (x.0.min(y.0), x.1.max(y.1))
                            }
                        }
                        (Scalar::Cast(_), _) => a,
                        _ => ALL,
                    }
                }
            }
        };
        // NaN bounds (inf − inf, 0 · inf) mean nothing is known
        v.push(if b.0.is_nan() || b.1.is_nan() { ALL } else { b });
    }
    v[p.outputs[0].value as usize].1 == f64::NEG_INFINITY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::{Inst, Output, Scalar, broadcast_access};
    use sinter_ir::DType;

    /// `where(j <= i + offset, x, -inf)` over `[2, sq, sk]`, with `x` operand 0.
    fn causal(sq: usize, sk: usize, offset: f32) -> Program {
        let domain = vec![2, sq, sk];
        let x = broadcast_access(DType::F32, &domain, &domain);
        Program {
            domain: domain.clone(),
            reduce: vec![],
            operands: vec![x.clone()],
            insts: vec![
                Inst::Load(0),
                Inst::Coord(1),
                Inst::Coord(2),
                Inst::Const(offset.to_bits()),
                Inst::Map(Scalar::Op(Op::Add), vec![1, 3]),
                Inst::Map(Scalar::Op(Op::Le), vec![2, 4]),
                Inst::Const(f32::NEG_INFINITY.to_bits()),
                Inst::Map(Scalar::Op(Op::Where), vec![5, 0, 6]),
            ],
            phases: vec![],
            outputs: vec![Output {
                value: 7,
                access: x,
            }],
        }
    }

    #[test]
    fn a_causal_mask_leaves_about_half_the_blocks_live() {
        let f = live_fraction(&causal(4096, 4096, 0.0), 64, 32);
        // the diagonal blocks stay: (1 + 1/64 + …) / 2
        assert!((0.5..0.53).contains(&f), "{f}");
    }

    #[test]
    fn without_a_mask_every_block_is_live() {
        let mut p = causal(512, 512, 0.0);
        p.outputs[0].value = 0;
        assert_eq!(live_fraction(&p, 64, 32), 1.0);
    }

    #[test]
    fn a_mask_that_hides_everything_leaves_nothing_live() {
        // j <= i − 10000: no key is visible to any query
        assert_eq!(live_fraction(&causal(300, 200, -10000.0), 64, 32), 0.0);
    }

    #[test]
    fn causal_blocks_start_heaviest_first() {
        let p = causal(1024, 1024, 0.0);
        // query blocks: the last sees the most keys; key blocks: the first is seen by the most
        let queries = live_per_row_block(&p, 128, false);
        let keys = live_per_row_block(&p, 128, true);
        assert!(queries.windows(2).all(|w| w[0] < w[1]), "{queries:?}");
        let order = LaunchOrder::of(&queries, 48);
        assert_eq!(order, LaunchOrder::HeaviestFirst { reversed: true });
        assert_eq!(order.launches(8, 1), [7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(order.launches(2, 2), [1, 1, 0, 0]);
        let order = LaunchOrder::of(&keys, 48);
        assert_eq!(order, LaunchOrder::HeaviestFirst { reversed: false });
        assert_eq!(order.launches(3, 1), [0, 1, 2]);
        // no mask: a batch entry's blocks together
        let mut p = p;
        p.outputs[0].value = 0;
        let all = live_per_row_block(&p, 128, false);
        assert_eq!(LaunchOrder::of(&all, 48), LaunchOrder::Blocks);
        assert_eq!(LaunchOrder::Blocks.launches(2, 2), [0, 1, 0, 1]);
        // many waves: the cache sharing of a batch entry's blocks wins
        assert_eq!(LaunchOrder::of(&queries, 48 * 64), LaunchOrder::Blocks);
        // the whole backward's groups: one block each differ; snake pairs do equal work
        assert_eq!(group_works(&keys, 8), keys);
        let pairs = group_works(&keys, 4);
        assert!(
            pairs.iter().all(|&w| (w - pairs[0]).abs() < 1e-9),
            "{pairs:?}"
        );
        assert_eq!(LaunchOrder::of(&pairs, 48), LaunchOrder::Blocks);
    }
}
