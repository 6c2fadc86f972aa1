//! Which blocks of a flash kernel's score space a mask leaves live, proven on the host by an
//! interval evaluation of the score function over each block's coordinate ranges: the same
//! test as the kernels' `tile_dead` ([`crate::codegen::flash`]), for the cost model and the
//! variant choice (the work of each workgroup, [`super::variant::LaunchOrder`]).

use sinter_ir::Op;

use crate::fused::Program;

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
pub(crate) mod tests {
    use super::*;
    use crate::fused::{Inst, Output, Scalar, broadcast_access};
    use sinter_ir::DType;

    /// `where(j <= i + offset, x, -inf)` over `[2, sq, sk]`, with `x` operand 0.
    pub(crate) fn causal(sq: usize, sk: usize, offset: f32) -> Program {
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
}
