//! A matmul's variant: the block shape and the split of K it runs with, chosen once per product
//! by [`choose`] from the target's measured block-shape rates ([`crate::target::MatmulRate`]),
//! stored in the kernel plan ([`crate::kernel::Matmul::tile`], the split as lowering's
//! batched product of K chunks), and only read by codegen (`codegen/matmul.rs`).
//!
//! The model: each block of the output is one workgroup; blocks spread evenly over the SMs, an
//! SM running up to `resident` at once at the throughput its occupancy curve gives for that
//! many; the busiest SM sets the time. A shape whose blocks do not fill the SMs takes smaller
//! blocks, or splits a long K into chunks whose partial products a second pass sums.

use serde::{Deserialize, Serialize};
use sinter_ir::artifact::WORD_BYTES;

use crate::target::{MatmulRate, Target};

/// Threads of every matmul workgroup.
const THREADS: u32 = crate::kernel::WORKGROUP;

/// Words of padding after each `k` row of a staged slab whose operand has `k` as its unit
/// stride (at most; scalar tiles pad one word, quad tiles one quad). Staging then writes
/// consecutive threads' `k` to rows `BM + PAD` words apart, spreading them over the 32 banks
/// instead of all landing in one (an 8-way conflict for `BK = 8` without it).
pub const PAD: u32 = 4;

/// Most bytes of workgroup memory the staged slabs of a block take.
const STAGING_BYTES: u32 = 16 << 10;

/// Which units a matmul kernel runs its products on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Form {
    /// `f32` fused multiply-adds, each of the 256 threads accumulating a `tm × tn` micro-tile
    /// (`codegen/matmul.rs`).
    #[default]
    Fma,
    /// Cooperative matrices (tensor cores): 16 × 16 × 16 products of `f16` operands staged in
    /// workgroup memory, accumulated in `f32`; each of the eight subgroups of 32 owns a
    /// `tm × tn` sub-block of the output (`codegen/matmul/coop.rs`). Only products whose
    /// operands are both `f16` take it, so that it changes no operand's rounding, only the
    /// order of the sums.
    TensorCores,
}

/// Block shape of a matmul kernel: a workgroup of 256 threads computes a `bm × bn` block of
/// the output in steps of `bk` along K. In the [`Form::Fma`] kernel each thread owns a
/// `tm × tn` micro-tile (`(bm / tm) * (bn / tn)` is 256); in the [`Form::TensorCores`] kernel
/// each subgroup of 32 owns a `tm × tn` sub-block (`(bm / tm) * (bn / tn)` is 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    #[serde(default)]
    pub form: Form,
    /// Slabs of each operand staged in workgroup memory at once (tensor cores only; the FMA
    /// kernel stages one): with one, each step waits for every subgroup before and after
    /// storing the next slab; with two, the next step's slab goes to the other buffer while
    /// the current one is read, and one barrier per step suffices.
    #[serde(default = "Tile::one_stage")]
    pub stages: u32,
}

impl Tile {
    /// 128 × 128 blocks, slabs 8 deep, 8 × 8 per thread. Measured on the H200 at 4096: BK = 8
    /// reached 31.0 TFLOP/s, BK = 16 21.5 (its larger staging registers cost occupancy).
    pub const LARGE: Tile = Tile {
        bm: 128,
        bn: 128,
        bk: 8,
        tm: 8,
        tn: 8,
        form: Form::Fma,
        stages: 1,
    };
    pub const WIDE: Tile = Tile {
        bm: 64,
        bn: 128,
        bk: 8,
        tm: 4,
        tn: 8,
        form: Form::Fma,
        stages: 1,
    };
    /// [`Tile::WIDE`] with slabs twice as deep (half the barriers per product): faster wherever
    /// `b`'s unit stride is along n, slower where `b` is a transposed view (its staging walks k
    /// across threads and transposes through workgroup memory), so [`deepen`] takes it only in
    /// the first case.
    pub const WIDE_DEEP: Tile = Tile {
        bm: 64,
        bn: 128,
        bk: 16,
        tm: 4,
        tn: 8,
        form: Form::Fma,
        stages: 1,
    };
    pub const MEDIUM: Tile = Tile {
        bm: 64,
        bn: 64,
        bk: 16,
        tm: 4,
        tn: 4,
        form: Form::Fma,
        stages: 1,
    };
    pub const SMALL: Tile = Tile {
        bm: 32,
        bn: 32,
        bk: 32,
        tm: 2,
        tn: 2,
        form: Form::Fma,
        stages: 1,
    };

    /// 128 × 128 blocks on tensor cores, slabs 32 deep, each subgroup a 32 × 64 sub-block
    /// (2 × 4 accumulators).
    pub const TC_LARGE: Tile = Tile {
        bm: 128,
        bn: 128,
        bk: 32,
        tm: 32,
        tn: 64,
        form: Form::TensorCores,
        stages: 1,
    };
    /// 128 × 256 blocks on tensor cores, each subgroup a 64 × 64 sub-block (4 × 4
    /// accumulators, the most a subgroup holds): the most reuse of each staged slab, for
    /// products with blocks enough to fill the SMs.
    pub const TC_HUGE: Tile = Tile {
        bm: 128,
        bn: 256,
        bk: 32,
        tm: 64,
        tn: 64,
        form: Form::TensorCores,
        stages: 1,
    };
    /// 64 × 128 blocks on tensor cores, each subgroup 32 × 32 (2 × 2 accumulators).
    pub const TC_WIDE: Tile = Tile {
        bm: 64,
        bn: 128,
        bk: 32,
        tm: 32,
        tn: 32,
        form: Form::TensorCores,
        stages: 1,
    };
    /// 64 × 64 blocks on tensor cores, each subgroup 16 × 32 (1 × 2 accumulators): products
    /// of a few hundred rows (a Llama step at sequence 128 runs 512-row products).
    pub const TC_MEDIUM: Tile = Tile {
        bm: 64,
        bn: 64,
        bk: 32,
        tm: 16,
        tn: 32,
        form: Form::TensorCores,
        stages: 1,
    };
    /// 32 × 64 blocks on tensor cores, each subgroup one 16 × 16 accumulator.
    pub const TC_SMALL: Tile = Tile {
        bm: 32,
        bn: 64,
        bk: 32,
        tm: 16,
        tn: 16,
        form: Form::TensorCores,
        stages: 1,
    };

    /// [`Tile::stages`]' default.
    fn one_stage() -> u32 {
        1
    }

    /// Parses `BMxBNxBKxTMxTN` (e.g. `128x128x16x8x8`), or `tc:BMxBNxBKxTMxTN` for the
    /// tensor-core kernel with an optional sixth number, its stages (`tc:128x128x32x32x64x2`),
    /// checking that the shape is one that kernel can run
    /// ([`Tile::check`]).
    pub fn parse(text: &str) -> Result<Tile, String> {
        let (form, dims) = match text.strip_prefix("tc:") {
            Some(rest) => (Form::TensorCores, rest),
            None => (Form::Fma, text),
        };
        let parts: Vec<u32> = dims
            .split('x')
            .map(|p| {
                p.parse::<u32>()
                    .map_err(|_| format!("`{p}` in `{text}` is not a number"))
            })
            .collect::<Result<_, _>>()?;
        let (bm, bn, bk, tm, tn, stages) = match (form, &parts[..]) {
            (_, &[bm, bn, bk, tm, tn]) => (bm, bn, bk, tm, tn, 1),
            (Form::TensorCores, &[bm, bn, bk, tm, tn, stages]) => (bm, bn, bk, tm, tn, stages),
            _ => {
                return Err(format!(
                    "`{text}` needs five numbers: BMxBNxBKxTMxTN (tc:BMxBNxBKxTMxTN[xSTAGES] on \
                     tensor cores)"
                ));
            }
        };
        let t = Tile {
            bm,
            bn,
            bk,
            tm,
            tn,
            form,
            stages,
        };
        Tile::check(t)?;
        Ok(t)
    }

    /// Whether the kernel of the tile's form can run this shape: for [`Form::Fma`], 256
    /// threads with slabs that divide evenly among them, staged in 16 KiB; for
    /// [`Form::TensorCores`], eight subgroups' sub-blocks of whole 16 × 16 tiles, slabs a
    /// multiple of 16 deep that divide evenly among the 256 threads, one or two stages of them
    /// staged (with the epilogue's scratch) in [`TC_STAGING_BYTES`].
    pub fn check(t: Tile) -> Result<(), String> {
        // in u64: no shape overflows the arithmetic
        let [bm, bn, bk, tm, tn] = [t.bm, t.bn, t.bk, t.tm, t.tn].map(u64::from);
        let threads = u64::from(THREADS);
        let divides = tm > 0 && tn > 0 && bm % tm == 0 && bn % tn == 0;
        let fits = match t.form {
            Form::Fma => {
                divides
                    && t.stages == 1
                    && (bm / tm) * (bn / tn) == threads
                    && (bm * bk) % threads == 0
                    && (bk * bn) % threads == 0
                    && ((bm + u64::from(PAD)) * bk + bk * (bn + u64::from(PAD))) * WORD_BYTES
                        <= u64::from(STAGING_BYTES)
            }
            Form::TensorCores => {
                let side = u64::from(TC_SIDE);
                divides
                    && tm.is_multiple_of(side)
                    && tn.is_multiple_of(side)
                    && (bm / tm) * (bn / tn) == u64::from(TC_SUBGROUPS)
                    && (tm / side) * (tn / side) <= u64::from(TC_MAX_ACCUMULATORS)
                    && bk > 0
                    && (1..=2).contains(&t.stages)
                    && bk.is_multiple_of(side)
                    && (bm * bk).is_multiple_of(threads)
                    && (bk * bn).is_multiple_of(threads)
                    && tc_workgroup_bytes(t) <= u64::from(TC_STAGING_BYTES)
            }
        };
        match (fits, t.form) {
            (true, _) => Ok(()),
            (false, Form::Fma) => Err(format!(
                "tile `{t}` does not give 256 threads with evenly split slabs in 16 KiB"
            )),
            (false, Form::TensorCores) => Err(format!(
                "tile `{t}` does not give 8 subgroups whole 16 x 16 tiles (at most \
                 {TC_MAX_ACCUMULATORS} each) with slabs a multiple of 16 deep, evenly split and \
                 staged (1 or 2 stages) in {} KiB",
                TC_STAGING_BYTES >> 10
            )),
        }
    }
}

/// The side of a cooperative matrix (16 × 16 × 16 products).
pub const TC_SIDE: u32 = 16;
/// Subgroups of a tensor-core matmul's workgroup: 256 threads in subgroups of 32 (the size
/// the runtime requires of an adapter that runs cooperative matrices).
pub const TC_SUBGROUPS: u32 = THREADS / sinter_ir::artifact::COOPERATIVE_SUBGROUP_SIZE;
/// Halves that pad each row of a tensor-core kernel's staged `f16` slabs, so that a
/// cooperative load's 8 rows of 16 bytes fall in distinct banks (see `codegen/flash/coop.rs`).
pub const TC_PAD: u32 = 8;
/// Most bytes of workgroup memory a tensor-core matmul declares: the 48 KiB NVIDIA's Vulkan
/// driver offers a workgroup (the artifact records the kernels' need, and the runtime refuses
/// an adapter that offers less).
const TC_STAGING_BYTES: u32 = 48 << 10;

/// Most accumulators (16 × 16 `f32` cooperative matrices) one subgroup of a tensor-core
/// matmul holds: sixteen take 128 of the 255 registers an invocation may hold on NVIDIA's
/// hardware, leaving room for the operand fragments and the next step's staged loads.
pub const TC_MAX_ACCUMULATORS: u32 = 16;

/// The least workgroup memory a tensor-core matmul of tile `t` declares: its padded `f16`
/// slabs (two, or four with two stages) and one scratch tile per subgroup for the epilogue.
/// Whichever operand layout the kernel meets: the larger of each slab's two orientations
/// ([`tc_slab`]).
pub fn tc_workgroup_bytes(t: Tile) -> u64 {
    [false, true]
        .into_iter()
        .flat_map(|a| [false, true].map(|b| tc_workgroup_bytes_of(t, a, b)))
        .max()
        .unwrap_or_default()
}

/// Workgroup bytes of a tensor-core matmul of tile `t` whose `a` and `b` are read along k
/// (`a_walks_k`, `b_walks_k`) or across it.
pub fn tc_workgroup_bytes_of(t: Tile, a_walks_k: bool, b_walks_k: bool) -> u64 {
    let halves = |x, walks_k| {
        let (rows, row) = tc_slab(x, t.bk, walks_k);
        rows * row
    };
    let slabs = (halves(t.bm, a_walks_k) + halves(t.bn, b_walks_k)) * 2 * u64::from(t.stages);
    slabs + u64::from(TC_SUBGROUPS * TC_SIDE * TC_SIDE) * WORD_BYTES
}

/// A tensor-core slab of `x` (BM or BN) by `bk` as (rows, padded row) in halves: its rows run
/// along the axis the operand's loads walk, k or (for a transposed view) x.
pub fn tc_slab(x: u32, bk: u32, walks_k: bool) -> (u64, u64) {
    let (rows, row) = if walks_k { (x, bk) } else { (bk, x) };
    (u64::from(rows), u64::from(row) + u64::from(TC_PAD))
}

impl std::fmt::Display for Tile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.form == Form::TensorCores {
            f.write_str("tc:")?;
        }
        write!(
            f,
            "{}x{}x{}x{}x{}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )?;
        if self.stages != 1 {
            write!(f, "x{}", self.stages)?;
        }
        Ok(())
    }
}

/// A choice forced for every product (`sinter compile` tuning flags, tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forced {
    /// One block shape for every product.
    pub tile: Option<Tile>,
    /// The number of K chunks of every product, 1 for none; a count that does not divide K
    /// becomes the largest one below it that does.
    pub splits: Option<usize>,
}

/// The shape of a product: `batch` entries of `[m, k] x [k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// How a product runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub tile: Tile,
    /// K chunks (split-K), 1 for none.
    pub splits: usize,
}

/// Shortest K chunk the automatic split-K choice takes: shorter chunks measured slower than
/// their block counts predict (per-block costs, and partials traffic).
const MIN_CHUNK: usize = 512;
/// Largest split-K partial buffer the automatic choice allocates, in bytes.
const MAX_PARTIALS: usize = 64 << 20;
/// Split counts the automatic choice considers (each must divide K).
const SPLITS: [usize; 6] = [1, 2, 3, 4, 6, 8];

/// Time, in units of one block's work at a full SM's rate, that an SM takes for `blocks`
/// blocks: rounds of `resident` blocks, the last one possibly short (and slower per block).
fn sm_time(rate: &MatmulRate, blocks: usize) -> f64 {
    let (mut left, mut t) = (blocks, 0.0);
    while left > 0 {
        let c = left.min(rate.resident);
        t += c as f64 / rate.occupancy[c - 1];
        left -= c;
    }
    t
}

/// Estimated nanoseconds of `shape` with `rate`'s block shape and K cut into `splits` chunks:
/// the busiest SM's blocks ([`sm_time`]; blocks spread evenly), plus the pass that sums the
/// partials (a read of each, a write of the result).
fn estimate(target: &Target, rate: &MatmulRate, shape: Shape, splits: usize) -> f64 {
    let (t, r) = (rate.tile, &target.rates);
    let Shape { batch, m, n, k } = shape;
    let blocks = batch * splits * m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    let block_flops = 2.0 * f64::from(t.bm * t.bn) * (k / splits) as f64;
    let sm_flops_per_ns = rate.tflops * 1e3 / r.sms as f64;
    let product = sm_time(rate, blocks.div_ceil(r.sms)) * block_flops / sm_flops_per_ns;
    if splits == 1 {
        return product;
    }
    let sum_bytes = ((splits + 1) * batch * m * n) as f64 * WORD_BYTES as f64;
    product * rate.split_penalty + sum_bytes / r.split_sum_bytes_per_ns + r.split_sum_ns
}

/// The form a product of `rows` output rows runs in: [`Form::TensorCores`] where
/// `f16_operands` (both operands are `f16`), the rows fill a cooperative matrix (a decode
/// step's one-row products would waste 15 of its 16) and the target has `f16` and cooperative
/// matrices and lists block shapes for them, else [`Form::Fma`].
pub fn form(target: &Target, f16_operands: bool, rows: usize) -> Form {
    let listed = target
        .rates
        .matmul
        .iter()
        .any(|r| r.tile.form == Form::TensorCores);
    let features = &target.features;
    if f16_operands
        && rows >= TC_SIDE as usize
        && features.f16
        && features.cooperative_matrix
        && listed
    {
        Form::TensorCores
    } else {
        Form::Fma
    }
}

/// The block shape and K split of `shape` in `form` with the least estimated time
/// ([`estimate`]), and that time: among the target's measured block shapes of that form not
/// much larger than the output, and the split counts that divide K into chunks of at least
/// [`MIN_CHUNK`] with partials of at most [`MAX_PARTIALS`] bytes (and within `max_binding`).
/// `forced` fixes either choice (a forced tile of the other form is not taken).
pub fn choose(
    target: &Target,
    shape: Shape,
    forced: Forced,
    max_binding: u64,
    form: Form,
) -> (Variant, f64) {
    let Shape { batch, m, n, k } = shape;
    let divides = |s: usize| k.is_multiple_of(s);
    let partials = |s: usize| s * batch * m * n * WORD_BYTES as usize;
    let split_options: Vec<usize> = match forced.splits {
        Some(s) => vec![(1..=s.min(k)).rev().find(|&s| divides(s)).unwrap_or(1)],
        None => SPLITS
            .into_iter()
            .filter(|&s| {
                s == 1 || (divides(s) && k / s >= MIN_CHUNK && partials(s) <= MAX_PARTIALS)
            })
            .collect(),
    };
    // partials that would not fit one binding: unsplit
    let split_options: Vec<usize> = match split_options
        .iter()
        .copied()
        .filter(|&s| s == 1 || partials(s) as u64 <= max_binding)
        .collect::<Vec<_>>()
    {
        kept if kept.is_empty() => vec![1],
        kept => kept,
    };
    // the block shapes of this form whose workgroup memory the target offers
    let offered = |t: &Tile| {
        t.form == Form::Fma || tc_workgroup_bytes(*t) <= u64::from(target.limits.workgroup_bytes)
    };
    let rates: Vec<MatmulRate> = (target.rates.matmul.iter())
        .filter(|r| r.tile.form == form && offered(&r.tile))
        .copied()
        .collect();
    assert!(
        !rates.is_empty(),
        "a target lists block shapes of every form it chooses ({form:?})"
    );
    let fits = |t: &Tile| (t.bm as usize) <= m.max(32) && (t.bn as usize) <= n.max(32);
    let candidates: Vec<MatmulRate> = match forced.tile.filter(|t| t.form == form) {
        Some(tile) => {
            // the rate of the nearest measured tile, by block size
            let like = rates
                .iter()
                .find(|x| x.tile.bm * x.tile.bn <= tile.bm * tile.bn)
                .unwrap_or(&rates[rates.len() - 1]);
            vec![MatmulRate { tile, ..*like }]
        }
        None => {
            let fitting: Vec<MatmulRate> =
                rates.iter().filter(|x| fits(&x.tile)).copied().collect();
            if fitting.is_empty() {
                vec![rates[rates.len() - 1]]
            } else {
                fitting
            }
        }
    };
    let mut best = (
        Variant {
            tile: candidates[0].tile,
            splits: 1,
        },
        f64::INFINITY,
    );
    for rate in &candidates {
        for &splits in &split_options {
            let t = estimate(target, rate, shape, splits);
            if t < best.1 {
                best = (
                    Variant {
                        tile: rate.tile,
                        splits,
                    },
                    t,
                );
            }
        }
    }
    best
}

/// The block shape a product runs with, given [`choose`]'s `tile`: [`Tile::WIDE_DEEP`] for
/// [`Tile::WIDE`] when `b_along_n` (`b`'s unit stride is along n, where the deeper slabs
/// measured faster), else `tile`. The rates keep WIDE's for both.
pub fn deepen(tile: Tile, b_along_n: bool) -> Tile {
    if tile == Tile::WIDE && b_along_n {
        Tile::WIDE_DEEP
    } else {
        tile
    }
}

/// The variant lowering builds `shape` with: [`choose`]'s in `form`, deepened where
/// `b_along_n` unless the tile is forced.
pub fn variant(
    target: &Target,
    shape: Shape,
    forced: Forced,
    max_binding: u64,
    b_along_n: bool,
    form: Form,
) -> Variant {
    let (mut v, _) = choose(target, shape, forced, max_binding, form);
    if forced.tile.is_none() {
        v.tile = deepen(v.tile, b_along_n);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(m: usize, k: usize, n: usize, forced: Forced) -> (Tile, usize) {
        let shape = Shape { batch: 1, m, n, k };
        let (v, _) = choose(&Target::h200(), shape, forced, u64::MAX, Form::Fma);
        (v.tile, v.splits)
    }

    /// The GPT-2-small training step's products (forward, input and weight gradients) get the
    /// block shape and split that measured fastest among those tried on the H200 (or within 3%;
    /// 2048x768x3072 and 768x2048x2304 inside the step, where LARGE ran 13-16% slower than
    /// alone, `bench/README.md`, "Block shapes inside the step").
    #[test]
    fn gpt2_shapes_take_their_measured_block_shapes() {
        let cases = [
            // (m, k, n): tile, splits
            ((2048, 768, 2304), Tile::WIDE, 1),
            ((2048, 768, 768), Tile::MEDIUM, 1),
            ((2048, 768, 3072), Tile::WIDE, 1),
            ((2048, 3072, 768), Tile::WIDE, 2),
            ((2048, 2304, 768), Tile::WIDE, 2),
            ((768, 2048, 768), Tile::WIDE, 4),
            ((768, 2048, 2304), Tile::WIDE, 4),
            ((3072, 2048, 768), Tile::WIDE, 4),
            ((768, 2048, 3072), Tile::WIDE, 4),
            ((4096, 4096, 4096), Tile::LARGE, 1),
        ];
        for ((m, k, n), tile, splits) in cases {
            assert_eq!(
                pick(m, k, n, Forced::default()),
                (tile, splits),
                "{m}x{k}x{n}"
            );
        }
    }

    /// A product that `choose` gives WIDE runs with the deeper slabs when `b` is read along n,
    /// and keeps WIDE when `b` is a transposed view; other tiles and forced tiles stay.
    #[test]
    fn wide_products_deepen_where_b_is_read_along_n() {
        assert_eq!(deepen(Tile::WIDE, true), Tile::WIDE_DEEP);
        assert_eq!(deepen(Tile::WIDE, false), Tile::WIDE);
        assert_eq!(deepen(Tile::LARGE, true), Tile::LARGE);
        let target = Target::h200();
        let shape = Shape {
            batch: 1,
            m: 2048,
            n: 2304,
            k: 768,
        };
        let free = Forced::default();
        let wide = Forced {
            tile: Some(Tile::WIDE),
            splits: None,
        };
        assert_eq!(
            variant(&target, shape, free, u64::MAX, true, Form::Fma).tile,
            Tile::WIDE_DEEP
        );
        assert_eq!(
            variant(&target, shape, free, u64::MAX, false, Form::Fma).tile,
            Tile::WIDE
        );
        assert_eq!(
            variant(&target, shape, wide, u64::MAX, true, Form::Fma).tile,
            Tile::WIDE
        );
    }

    #[test]
    fn small_outputs_take_small_blocks_and_forced_splits_divide_k() {
        let free = Forced::default();
        assert_eq!(pick(17, 64, 300, free), (Tile::SMALL, 1));
        assert_eq!(pick(512, 512, 512, free), (Tile::MEDIUM, 1));
        // a long K over few blocks is split
        assert_eq!(pick(1, 600_000, 1, free).1, 8);
        // forced: the largest count up to the one asked for that divides K
        let forced = |tile, splits| Forced {
            tile,
            splits: Some(splits),
        };
        assert_eq!(
            pick(64, 129, 64, forced(Some(Tile::LARGE), 4)),
            (Tile::LARGE, 3)
        );
        assert_eq!(pick(64, 17, 64, forced(None, 4)).1, 1);
        assert_eq!(pick(64, 17, 64, forced(None, 1)).1, 1);
    }

    /// Split partials that would pass the binding limit are not taken.
    #[test]
    fn splits_stay_within_one_binding() {
        let shape = Shape {
            batch: 1,
            m: 1,
            n: 1,
            k: 600_000,
        };
        let target = Target::h200();
        assert_eq!(
            choose(&target, shape, Forced::default(), u64::MAX, Form::Fma)
                .0
                .splits,
            8
        );
        assert_eq!(
            choose(&target, shape, Forced::default(), 8, Form::Fma)
                .0
                .splits,
            2
        );
        let forced = Forced {
            tile: None,
            splits: Some(8),
        };
        assert_eq!(choose(&target, shape, forced, 4, Form::Fma).0.splits, 1);
    }

    #[test]
    fn tensor_core_tiles_hold_at_most_sixteen_accumulators_per_subgroup() {
        // 64 x 64 per subgroup: 16 accumulators
        let wide = Tile::parse("tc:128x256x32x64x64").expect("sixteen accumulators");
        assert_eq!((wide.bm, wide.bn), (128, 256));
        // 128 x 64 per subgroup: 32 (its slabs fit)
        let e = Tile::parse("tc:256x256x16x128x64").expect_err("thirty-two accumulators");
        assert!(e.contains("at most 16 each"), "{e}");
    }

    /// Products of f16 operands take the tensor-core block shapes where the target has
    /// cooperative matrices (and f16), the FMA ones elsewhere; a 512-row product (a Llama
    /// step at sequence 128, batch 4) takes blocks small enough to spread over the SMs.
    #[test]
    fn f16_products_choose_tensor_core_shapes() {
        let h200 = Target::h200();
        assert_eq!(form(&h200, true, 512), Form::TensorCores);
        assert_eq!(form(&h200, true, 4), Form::Fma, "a decode step's rows");
        assert_eq!(form(&h200, false, 512), Form::Fma);
        assert_eq!(form(&Target::portable(), true, 512), Form::Fma);
        let mut no_f16 = Target::h200();
        no_f16.features.f16 = false;
        assert_eq!(form(&no_f16, true, 512), Form::Fma);
        for t in [
            Tile::TC_HUGE,
            Tile::TC_LARGE,
            Tile::TC_WIDE,
            Tile::TC_MEDIUM,
            Tile::TC_SMALL,
        ] {
            assert_eq!(Tile::check(t), Ok(()), "{t}");
            assert_eq!(Tile::parse(&t.to_string()), Ok(t));
        }
        let pick = |m, k, n| {
            let shape = Shape { batch: 1, m, n, k };
            choose(&h200, shape, Forced::default(), u64::MAX, Form::TensorCores).0
        };
        assert_eq!(pick(4096, 4096, 4096).tile, Tile::TC_HUGE);
        let small = pick(512, 576, 576).tile;
        assert_eq!(small.form, Form::TensorCores);
        assert!(
            small.bm * small.bn < Tile::TC_LARGE.bm * Tile::TC_LARGE.bn,
            "{small}"
        );
        // a forced FMA tile does not apply to a tensor-core product, nor the reverse
        let forced = Forced {
            tile: Some(Tile::LARGE),
            splits: None,
        };
        let shape = Shape {
            batch: 1,
            m: 2048,
            n: 768,
            k: 768,
        };
        let (v, _) = choose(&h200, shape, forced, u64::MAX, Form::TensorCores);
        assert_eq!(v.tile.form, Form::TensorCores);
    }
}
