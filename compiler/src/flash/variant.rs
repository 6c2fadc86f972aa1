//! A flash kernel's variant, chosen once ([`choose`]): its form (the `f32` kernels with a
//! [`Tiling`], or the tensor-core kernels), the launch order of its workgroups, and the whole
//! backward's groups of key blocks; and whether an attention's dQ and dK/dV kernels become one
//! kernel of the whole backward ([`merges`]). Lowering stores the variant in the kernel plan
//! ([`crate::kernel::Flash::variant`]), the cost model prices the kernel through the same
//! function, and codegen only reads it.

use sinter_ir::TensorType;

use super::interval::live_per_row_block;
use super::{FlashKind, FlashSpec};
use crate::target::Target;

/// Words per `vec4<f32>` quad.
const QUAD: usize = 4;
/// Largest head dimension of the `f32` kernels (their accumulators are registers).
pub const MAX_HEAD_DIM: usize = 256;

/// What a compile lets the variant choice take (`sinter compile` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choices {
    /// The `f32` kernels' tiling ([`Tiling::DEFAULT`] unless forced; a kernel whose
    /// accumulators would pass its register budget falls back to [`Tiling::A`]).
    pub tiling: Tiling,
    /// Products on tensor cores where the target has cooperative matrices and the kernel a
    /// tensor-core form for its head dimensions ([`tensor_core_form`]): `f16` operands, `f32`
    /// accumulation (`sinter compile --tensor-cores`).
    pub tensor_cores: bool,
    /// An attention's dQ and dK/dV kernels as one kernel of the whole backward where
    /// [`merges`] says it pays (`--flash-backward whole`, the default).
    pub merge_backward: bool,
}

impl Default for Choices {
    fn default() -> Choices {
        Choices {
            tiling: Tiling::DEFAULT,
            tensor_cores: false,
            merge_backward: true,
        }
    }
}

/// How a flash kernel computes its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// `f32` arithmetic on the FMA units with this tiling ([`crate::codegen::flash`]).
    Plain(Tiling),
    /// Cooperative matrices of `f16` operands, `f32` accumulation
    /// ([`crate::codegen::flash::coop`]), [`TC_ROWS`] rows per workgroup.
    TensorCores,
}

/// How a flash kernel runs (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub form: Form,
    /// The order its workgroups start in.
    pub launch: LaunchOrder,
    /// Blocks of rows (queries, or keys for dK/dV) the dispatch has per batch entry, or for the
    /// whole backward its groups of key blocks, one workgroup and one `dQ` partial sum each.
    pub blocks: usize,
}

impl Variant {
    /// Rows (queries, or keys for dK/dV and the whole backward) per block.
    pub fn rows(&self) -> usize {
        match self.form {
            Form::Plain(t) => t.rows,
            Form::TensorCores => TC_ROWS,
        }
    }

    /// Whether a backward kernel of this variant stages `dO` scaled by a power of two and needs
    /// `dO`'s maxima ([`crate::kernel::FlashScale`]): the tensor-core backward, whose `f16`
    /// operands would lose a mean loss's gradients to underflow.
    pub fn scales_gradients(&self, kind: FlashKind) -> bool {
        self.form == Form::TensorCores && kind != FlashKind::Forward
    }
}

/// The variant of a flash kernel of `spec` whose queries have type `q` and values `v` (the
/// kernel's first and third operands) on `target`.
pub fn choose(
    target: &Target,
    choices: &Choices,
    spec: &FlashSpec,
    q: &TensorType,
    v: &TensorType,
) -> Variant {
    let (d, dv) = (q.shape[q.rank() - 1], v.shape[v.rank() - 1]);
    let form = if tensor_core_form(target, choices, spec.kind, d, dv) {
        Form::TensorCores
    } else {
        Form::Plain(choices.tiling.for_kernel(spec.kind, d, dv))
    };
    let rows = match form {
        Form::Plain(t) => t.rows,
        Form::TensorCores => TC_ROWS,
    };
    let space = &spec.score.domain;
    let r = space.len();
    let batch: usize = space[..r - 2].iter().product();
    let by_keys = matches!(spec.kind, FlashKind::BackwardDkDv | FlashKind::Backward);
    let per_block = live_per_row_block(&spec.score, rows, by_keys);
    let (blocks, launch) = match spec.kind {
        FlashKind::Backward => {
            let groups = dq_groups(
                per_block.len(),
                q.size_bytes() as u64,
                target.limits.max_binding,
            );
            let works = group_works(&per_block, groups);
            (groups, LaunchOrder::of(&works, batch, target.rates.sms))
        }
        _ => (
            per_block.len(),
            LaunchOrder::of(&per_block, batch, target.rates.sms),
        ),
    };
    Variant {
        form,
        launch,
        blocks,
    }
}

/// Whether an attention's dQ kernel and dK/dV kernel (`spec` either one; `q` and `v` the types
/// of its first and third operands) become one kernel of the whole backward
/// ([`FlashKind::Backward`]): where the compile lets them, `q` is not broadcast over the score
/// space's batch (the partial sums range over it), the whole backward keeps the tiling within
/// its register budget, and the split kernels would not run on tensor cores, a form the whole
/// backward has not. The merge pass and the cost model both ask this.
pub fn merges(
    target: &Target,
    choices: &Choices,
    spec: &FlashSpec,
    q: &TensorType,
    v: &TensorType,
) -> bool {
    let r = spec.score.domain.len();
    let (d, dv) = (q.shape[q.rank() - 1], v.shape[v.rank() - 1]);
    choices.merge_backward
        && !tensor_core_form(target, choices, FlashKind::BackwardDq, d, dv)
        && q.shape[..q.rank() - 1] == spec.score.domain[..r - 1]
        && whole_backward_keeps(choices.tiling, d, dv)
}

/// Rows per workgroup of the tensor-core kernels.
pub const TC_ROWS: usize = 64;
/// Columns per walked block of the tensor-core kernels (the backward's halve past head
/// dimension 64, [`tc_backward_cols`]).
pub const TC_COLS: usize = 64;
/// The side of a cooperative matrix.
pub const TC_SIDE: usize = 16;
/// Subgroups of a tensor-core workgroup (256 invocations in subgroups of 32).
pub const TC_SUBGROUPS: usize = 256 / sinter_ir::artifact::COOPERATIVE_SUBGROUP_SIZE as usize;
/// Largest head dimension of the tensor-core backward.
pub const TC_MAX_BACKWARD_DIM: usize = 128;
/// Largest head dimension of the tensor-core forward.
pub const TC_MAX_FORWARD_DIM: usize = 128;

/// Whether a flash kernel of `kind` with head dimensions `d`, `dv` runs on tensor cores: the
/// compile asks for it, the target has cooperative matrices, and the kernel has such a form
/// ([`tc_takes_shape`]).
pub fn tensor_core_form(
    target: &Target,
    choices: &Choices,
    kind: FlashKind,
    d: usize,
    dv: usize,
) -> bool {
    choices.tensor_cores && target.features.cooperative_matrix && tc_takes_shape(kind, d, dv)
}

/// Whether a kernel of `kind` with head dimensions `d` (queries, keys) and `dv` (values) has
/// a tensor-core form: the forward with head dimensions multiples of 16 up to
/// [`TC_MAX_FORWARD_DIM`] and the value's 32, 64 or 128 (so that each pass of `P·V` has a whole
/// number of tiles per subgroup); the split backward kernels where [`tc_backward_takes`]; not
/// the whole backward.
pub fn tc_takes_shape(kind: FlashKind, d: usize, dv: usize) -> bool {
    match kind {
        FlashKind::Forward => {
            d.is_multiple_of(TC_SIDE)
                && d <= TC_MAX_FORWARD_DIM
                && tc_accumulates(dv, TC_MAX_FORWARD_DIM)
        }
        FlashKind::BackwardDq | FlashKind::BackwardDkDv => tc_backward_takes(d, dv),
        FlashKind::Backward => false,
    }
}

/// Whether the split backward kernels (dQ, dK/dV) of head dimensions `d`, `dv` have
/// tensor-core forms: both 32, 64 or 128 (up to [`TC_MAX_BACKWARD_DIM`]), so that a row of an
/// accumulated product's tiles divides the subgroups, and eight tiles, one per subgroup, cover
/// whole rows on their way out through workgroup memory.
pub fn tc_backward_takes(d: usize, dv: usize) -> bool {
    [d, dv]
        .iter()
        .all(|&w| tc_accumulates(w, TC_MAX_BACKWARD_DIM))
}

/// Whether a product `width` columns wide (up to `most`) can stay in cooperative accumulators:
/// 32, 64 or 128, so that a row of its tiles divides the subgroups and eight tiles, one per
/// subgroup, cover whole rows on their way through workgroup memory.
pub fn tc_accumulates(width: usize, most: usize) -> bool {
    width.is_multiple_of(2 * TC_SIDE)
        && width <= most
        && TC_SUBGROUPS.is_multiple_of(width / TC_SIDE)
}

/// Keys (queries, for dK/dV) per walked block of the tensor-core backward of head dimensions
/// `d`, `dv`: 64 up to head dimension 64; past it 32, so that each subgroup keeps one score
/// tile and with it one row of A operands (16 × 16 × 2 per 16 of the head) in registers, and
/// the two walked blocks fit workgroup memory.
pub fn tc_backward_cols(d: usize, dv: usize) -> usize {
    if d.max(dv) <= TC_COLS {
        TC_COLS
    } else {
        TC_COLS / 2
    }
}

/// The blocking of the flash kernels (see the module docs): `rows` (`BR`) per workgroup,
/// `cols` (`BC`) per column block, a `threads_x × threads_y` (`TX × TY`) thread grid,
/// head-dimension chunks of `chunk` (`DC`) words per product stage, and the tile published in
/// `parts` column parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiling {
    pub rows: usize,
    pub cols: usize,
    pub threads_x: usize,
    pub threads_y: usize,
    pub chunk: usize,
    pub parts: usize,
}

impl Tiling {
    /// 64 × 64 blocks, 256 threads, a 4 × 4 micro-tile: the first tiling, and the one a kernel
    /// falls back to when another's accumulators pass the register budget.
    pub const A: Tiling = Tiling {
        rows: 64,
        cols: 64,
        threads_x: 16,
        threads_y: 16,
        chunk: 16,
        parts: 1,
    };
    /// 128 rows × 64 columns, 256 threads, 8 × 4: each staged key/value chunk serves twice the
    /// rows; the 128 × 64 tile is published in two halves. The default: the fastest of the four
    /// on the H200 (BENCHMARKS.md, "Flash tilings").
    pub const B: Tiling = Tiling {
        rows: 128,
        cols: 64,
        threads_x: 16,
        threads_y: 16,
        chunk: 16,
        parts: 2,
    };
    /// The tiling every kernel takes unless [`Choices::tiling`] names another.
    pub const DEFAULT: Tiling = Tiling::B;
    /// 64 × 64 blocks, 128 threads (8 across the columns, 16 across the rows), 4 × 8.
    pub const C: Tiling = Tiling {
        rows: 64,
        cols: 64,
        threads_x: 8,
        threads_y: 16,
        chunk: 16,
        parts: 1,
    };
    /// 128 rows × 64 columns, 128 threads (8 × 16), 8 × 8 like the best matmul; its
    /// accumulators fit the register budgets only in the forward (heads up to 96), dQ and
    /// dK/dV (both up to 32).
    pub const D: Tiling = Tiling {
        rows: 128,
        cols: 64,
        threads_x: 8,
        threads_y: 16,
        chunk: 16,
        parts: 2,
    };
    /// The tilings by the names `sinter compile --flash-tile` and `SINTER_FLASH_TILE` take.
    pub const NAMED: [(&'static str, Tiling); 4] = [
        ("a", Tiling::A),
        ("b", Tiling::B),
        ("c", Tiling::C),
        ("d", Tiling::D),
    ];

    /// The tiling called `name` in [`Tiling::NAMED`].
    pub fn named(name: &str) -> Option<Tiling> {
        Tiling::NAMED
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|&(_, t)| t)
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads_x * self.threads_y
    }

    /// Rows per thread (`RA`).
    pub(crate) fn ra(&self) -> usize {
        self.rows / self.threads_y
    }

    /// Columns per thread (`CB`).
    pub(crate) fn cb(&self) -> usize {
        self.cols / self.threads_x
    }

    /// Score quads per row of a thread.
    pub(crate) fn cg(&self) -> usize {
        self.cb() / QUAD
    }

    /// Quads per row of an accumulator over `width` columns.
    pub(crate) fn nq(&self, width: usize) -> usize {
        width.div_ceil(QUAD * self.threads_x).max(1)
    }

    /// Floats a thread keeps as accumulators in a kernel of `kind` with head dimensions `d`
    /// (queries, keys) and `dv` (values): score tiles and output rows.
    pub(crate) fn registers(&self, kind: FlashKind, d: usize, dv: usize) -> usize {
        let tile = self.ra() * self.cb();
        let out = |w: usize| self.ra() * QUAD * self.nq(w);
        match kind {
            FlashKind::Forward => tile + out(dv),
            FlashKind::BackwardDq => 2 * tile + out(d),
            FlashKind::BackwardDkDv => 2 * tile + out(d) + out(dv),
            // and the dQ share of a column block: its columns' rows over the head dim
            FlashKind::Backward => {
                2 * tile + out(d) + out(dv) + self.cols / self.threads_y * QUAD * self.nq(d)
            }
        }
    }

    /// This tiling for a kernel, or [`Tiling::A`] where its accumulators would pass the
    /// kernel's [`register_budget`].
    pub fn for_kernel(self, kind: FlashKind, d: usize, dv: usize) -> Tiling {
        if self.registers(kind, d, dv) <= register_budget(kind) {
            self
        } else {
            Tiling::A
        }
    }
}

/// Accumulator floats per thread that a kernel of `kind` may keep before its tiling falls back
/// to [`Tiling::A`]: what A needs at the widest head in the dK/dV kernel (160), and in the
/// dK/dV kernel the 192 that B needs at head dim 128. Measured on the H200 (BENCHMARKS.md,
/// "Flash tilings"): B's dK/dV at head dim 128 is faster than A's; B's dQ at head dim 256 (also
/// 192 floats) is slower than A's causal, so the other kernels keep 160. The whole backward
/// keeps B at head dim 128 too (224 floats), faster than the two kernels.
pub(crate) fn register_budget(kind: FlashKind) -> usize {
    match kind {
        FlashKind::BackwardDkDv => Tiling::B.registers(kind, 128, 128),
        FlashKind::Backward => Tiling::B.registers(kind, 128, 128),
        FlashKind::Forward | FlashKind::BackwardDq => {
            Tiling::A.registers(FlashKind::BackwardDkDv, MAX_HEAD_DIM, MAX_HEAD_DIM)
        }
    }
}

/// Whether a dQ and a dK/dV kernel of head dims `d`, `dv` are better made one
/// ([`FlashKind::Backward`]) as far as the tiling goes: where that kernel keeps `tiling` itself within its register
/// budget (head dims up to 128 with [`Tiling::B`]). Measured on the H200 at head dims 64 and
/// 128 (BENCHMARKS.md, "The whole backward in one kernel"), the merged kernel was 12–23%
/// faster than the two; wider heads fall back to tiling A, not measured merged.
fn whole_backward_keeps(tiling: Tiling, d: usize, dv: usize) -> bool {
    tiling.for_kernel(FlashKind::Backward, d, dv) == tiling
}

/// Most bytes the whole backward's `dQ` partial sums take.
const DQ_PARTIAL_BYTES: u64 = 1 << 30;

/// How many groups the whole backward ([`FlashKind::Backward`]) splits `key_blocks` key
/// blocks into, one workgroup per group and batch entry, each with its own `dQ` partial sum of
/// `dq_bytes`: as many as the partials' budget (1 GiB, and one binding) allows, up to one
/// block each, then evened out so that every group walks the same number of blocks or one
/// fewer.
pub fn dq_groups(key_blocks: usize, dq_bytes: u64, max_binding: u64) -> usize {
    let room = DQ_PARTIAL_BYTES.min(max_binding) / dq_bytes.max(1);
    let most = (room as usize).clamp(1, key_blocks.max(1));
    let walk = key_blocks.max(1).div_ceil(most);
    key_blocks.max(1).div_ceil(walk)
}

/// The order in which a flash kernel's workgroups start: the hardware starts them in dispatch
/// order, `x` fastest, each on an SM that frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LaunchOrder {
    /// A batch entry's blocks together (`x` the block), sharing its keys in the cache: where
    /// every block does the same work.
    Blocks,
    /// Every batch entry's block of the most work first (`x` the batch entry, `y` the block,
    /// from the last when `reversed`): where a causal or window mask makes blocks differ and
    /// the dispatch is a few waves, the heaviest started last would be the tail that all the
    /// others wait for (measured on the H200: BENCHMARKS.md, "heaviest blocks first"). With
    /// many waves the tail is short and the cache sharing of [`Blocks`] wins, and blocks of
    /// equal work lose by it.
    ///
    /// [`Blocks`]: LaunchOrder::Blocks
    HeaviestFirst { reversed: bool },
}

/// Most waves (of one workgroup per SM) a dispatch may have for [`LaunchOrder::HeaviestFirst`].
const HEAVIEST_FIRST_WAVES: usize = 16;

impl LaunchOrder {
    /// The order for `batch` entries of blocks (or groups) of works `per_block` (by
    /// [`live_per_row_block`], or [`group_works`]) over `sms` SMs: heaviest first where they differ by more
    /// than a tenth and the dispatch is a few waves, from the end whose half holds more work.
    pub fn of(per_block: &[f64], batch: usize, sms: usize) -> LaunchOrder {
        let most = per_block.iter().copied().fold(0.0, f64::max);
        let least = per_block.iter().copied().fold(most, f64::min);
        if most - least <= 0.1 * most || per_block.len() * batch > HEAVIEST_FIRST_WAVES * sms {
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

/// Elements of a batch entry's `dO` that one workgroup of the [`FlashScale`] kernel takes the
/// maximum of, at least: 32 for each invocation.
///
/// [`FlashScale`]: crate::kernel::FlashScale
pub const SCALE_CHUNK: usize = 32 * 256;
/// Most chunks a batch entry's `dO` is cut into (each backward workgroup reads them all).
const MAX_SCALE_CHUNKS: usize = 64;

/// Chunks the [`FlashScale`] kernel cuts a batch entry's `elements` of `dO` into, one
/// workgroup each: enough workgroups to spread the pass over the GPU (one per entry left most
/// of the H200 idle during it), few enough values for the backward to read.
///
/// [`FlashScale`]: crate::kernel::FlashScale
pub fn scale_chunks(elements: usize) -> usize {
    elements.div_ceil(SCALE_CHUNK).clamp(1, MAX_SCALE_CHUNKS)
}

impl std::fmt::Display for Tiling {
    /// `rows x cols, threads_x x threads_y threads`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = Tiling::NAMED
            .iter()
            .find(|(_, t)| t == self)
            .map(|(n, _)| *n);
        if let Some(n) = name {
            write!(f, "{} ", n.to_ascii_uppercase())?;
        }
        write!(
            f,
            "{}x{} blocks, {}x{} threads",
            self.rows, self.cols, self.threads_x, self.threads_y
        )
    }
}

impl std::fmt::Display for Variant {
    /// The form (tiling), the blocks or groups, the launch order.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.form {
            Form::Plain(t) => write!(f, "f32, tiling {t}")?,
            Form::TensorCores => write!(f, "tensor cores, {TC_ROWS} rows")?,
        }
        write!(f, ", {} blocks", self.blocks)?;
        match self.launch {
            LaunchOrder::Blocks => Ok(()),
            LaunchOrder::HeaviestFirst { .. } => f.write_str(", heaviest first"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::interval::tests::causal;

    #[test]
    fn causal_blocks_start_heaviest_first() {
        let p = causal(1024, 1024, 0.0);
        // query blocks: the last sees the most keys; key blocks: the first is seen by the most
        let queries = live_per_row_block(&p, 128, false);
        let keys = live_per_row_block(&p, 128, true);
        assert!(queries.windows(2).all(|w| w[0] < w[1]), "{queries:?}");
        let order = LaunchOrder::of(&queries, 48, 132);
        assert_eq!(order, LaunchOrder::HeaviestFirst { reversed: true });
        assert_eq!(order.launches(8, 1), [7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(order.launches(2, 2), [1, 1, 0, 0]);
        let order = LaunchOrder::of(&keys, 48, 132);
        assert_eq!(order, LaunchOrder::HeaviestFirst { reversed: false });
        assert_eq!(order.launches(3, 1), [0, 1, 2]);
        // no mask: a batch entry's blocks together
        let mut p = p;
        p.outputs[0].value = 0;
        let all = live_per_row_block(&p, 128, false);
        assert_eq!(LaunchOrder::of(&all, 48, 132), LaunchOrder::Blocks);
        assert_eq!(LaunchOrder::Blocks.launches(2, 2), [0, 1, 0, 1]);
        // many waves: the cache sharing of a batch entry's blocks wins
        assert_eq!(LaunchOrder::of(&queries, 48 * 64, 132), LaunchOrder::Blocks);
        // the whole backward's groups: one block each differ; snake pairs do equal work
        assert_eq!(group_works(&keys, 8), keys);
        let pairs = group_works(&keys, 4);
        assert!(
            pairs.iter().all(|&w| (w - pairs[0]).abs() < 1e-9),
            "{pairs:?}"
        );
        assert_eq!(LaunchOrder::of(&pairs, 48, 132), LaunchOrder::Blocks);
    }
}
