//! Tiled matrix multiply with workgroup memory.
//!
//! A workgroup computes a `BM x BN` block of the output. Per step it stages a `BM x BK` slab of
//! `a` and a `BK x BN` slab of `b` in workgroup memory (zero-filled past the edges) and each of
//! the 256 threads accumulates a `TM x TN` micro-tile; the next step's slabs are loaded into
//! registers while the current ones are multiplied, hiding global-memory latency. A thread's
//! rows and columns are spread so that neighbouring threads read neighbouring words of
//! workgroup memory (as `vec4` quads when `TM` and `TN` are multiples of 4). Batch axes (with
//! broadcasting) map to `workgroup_id.z`. Staging reads an operand as `vec4` quads (through a
//! `vec4<f32>` binding of its arena) where its unit stride, extents and offset guarantee
//! 16-byte alignment at compile time ([`vec4_loads`]), else as scalars.
//!
//! [`choose`] picks the block shape and split-K per product from a model of how its blocks fill
//! the H200's 132 SMs. Split-K is lowered (in `schedule.rs`) as a batched product of K chunks
//! (views of the operands with a leading chunk axis) into a `[splits, .., m, n]` buffer, then a
//! [`SplitSum`] pass ([`emit_split_sum`]) that adds the chunks and applies the epilogue.

use std::fmt::Write;

use super::{ENTRY_ARGS, Emitter, LOOP_BUDGET, MAX_GROUPS, WORKGROUP, decompose, grid};
use sinter_ir::artifact::WORD_BYTES;

use crate::CompileError;
use crate::kernel::{Matmul, SplitSum};
use crate::layout::View;

/// Block shape of a matmul kernel; `(bm / tm) * (bn / tn)` is always 256 threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

/// Measured on the H200 at 4096: BK = 8 reached 31.0 TFLOP/s, BK = 16 21.5 (its larger staging
/// registers cost occupancy).
pub const LARGE: Tile = Tile {
    bm: 128,
    bn: 128,
    bk: 8,
    tm: 8,
    tn: 8,
};
pub const WIDE: Tile = Tile {
    bm: 64,
    bn: 128,
    bk: 8,
    tm: 4,
    tn: 8,
};
/// [`WIDE`] with slabs twice as deep (half the barriers per product). Measured on the H200
/// against WIDE at the GPT-2-small shapes (`bench/README.md`, "Deeper slabs"): 5–8% faster
/// wherever `b`'s unit stride is along n, 23–24% slower where `b` is a transposed view (its
/// staging walks k across threads and transposes through workgroup memory), so [`deepen`]
/// takes it only in the first case.
pub const WIDE_DEEP: Tile = Tile {
    bm: 64,
    bn: 128,
    bk: 16,
    tm: 4,
    tn: 8,
};
pub const MEDIUM: Tile = Tile {
    bm: 64,
    bn: 64,
    bk: 16,
    tm: 4,
    tn: 4,
};
pub const SMALL: Tile = Tile {
    bm: 32,
    bn: 32,
    bk: 32,
    tm: 2,
    tn: 2,
};

impl std::fmt::Display for Tile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{}x{}x{}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )
    }
}

impl Tile {
    /// Parses `BMxBNxBKxTMxTN` (e.g. `128x128x16x8x8`), checking that the shape is one this
    /// kernel can run: 256 threads, slabs that divide evenly among them, quads or scalars.
    pub fn parse(text: &str) -> Result<Tile, String> {
        let parts: Vec<u32> = text
            .split('x')
            .map(|p| {
                p.parse::<u32>()
                    .map_err(|_| format!("`{p}` in `{text}` is not a number"))
            })
            .collect::<Result<_, _>>()?;
        let [bm, bn, bk, tm, tn] = parts[..] else {
            return Err(format!("`{text}` needs five numbers: BMxBNxBKxTMxTN"));
        };
        let t = Tile { bm, bn, bk, tm, tn };
        let fits = tm > 0
            && tn > 0
            && bm % tm == 0
            && bn % tn == 0
            && (bm / tm) * (bn / tn) == WORKGROUP
            && (bm * bk) % WORKGROUP == 0
            && (bk * bn) % WORKGROUP == 0
            && ((bm + PAD) * bk + bk * (bn + PAD)) * WORD_BYTES as u32 <= 16384;
        if fits {
            Ok(t)
        } else {
            Err(format!(
                "tile `{text}` does not give 256 threads with evenly split slabs in 16 KiB"
            ))
        }
    }
}

/// Words of padding after each `k` row of a staged slab whose operand has `k` as its unit
/// stride (at most; scalar tiles pad one word, quad tiles one quad). Staging then writes
/// consecutive threads' `k` to rows `BM + PAD` words apart, spreading them over the 32 banks
/// instead of all landing in one (an 8-way conflict for `BK = 8` without it).
const PAD: u32 = 4;

/// Streaming multiprocessors of the GPU the block-count model plans for (the H200's 132).
pub const SMS: usize = 132;

/// Throughput model of one block shape on the H200, fitted to measurements of the GPT-2-small
/// training shapes (2048x768x768 .. 4096x4096x4096, each tile and split count; `bench/README.md`).
struct Model {
    tile: Tile,
    /// Blocks one SM runs at once.
    resident: usize,
    /// An SM's throughput with `c` blocks resident (entry `c - 1`), relative to a full SM: one
    /// block alone does not hide its own latencies.
    occupancy: &'static [f64],
    /// TFLOP/s with every SM full.
    tflops: f64,
    /// Factor on the time of a split product (LARGE's chunked products ran ~10% slower than
    /// their block counts predict, MEDIUM's ~5%, WIDE's not).
    split_penalty: f64,
}

const MODELS: [Model; 4] = [
    // Alone, LARGE's blocks ran at 37.5 TFLOP/s (4096^3 and the GPT-2-small shapes); inside
    // the GPT-2-small step its 2048x768x3072 products ran 13-16% slower than that (and slower
    // than WIDE's 16-deep slabs, which kept their speed), so the model takes the in-step rate.
    Model {
        tile: LARGE,
        resident: 2,
        occupancy: &[0.72, 1.0],
        tflops: 32.5,
        split_penalty: 1.1,
    },
    Model {
        tile: WIDE,
        resident: 3,
        occupancy: &[0.68, 0.92, 1.0],
        tflops: 30.0,
        split_penalty: 1.0,
    },
    Model {
        tile: MEDIUM,
        resident: 8,
        occupancy: &[0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        tflops: 26.0,
        split_penalty: 1.05,
    },
    Model {
        tile: SMALL,
        resident: 8,
        occupancy: &[0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        tflops: 6.0,
        split_penalty: 1.0,
    },
];

/// Shortest K chunk the automatic split-K choice takes: shorter chunks measured slower than
/// their block counts predict (per-block costs, and partials traffic).
const MIN_CHUNK: usize = 512;
/// Largest split-K partial buffer the automatic choice allocates, in bytes.
const MAX_PARTIALS: usize = 64 << 20;
/// Split counts the automatic choice considers (each must divide K).
const SPLITS: [usize; 6] = [1, 2, 3, 4, 6, 8];
/// Effective bandwidth of the split-K sum (bytes per ns), fitted with the models above.
const SUM_BYTES_PER_NS: f64 = 1e3;

/// Time, in units of one block's work at a full SM's rate, that an SM takes for `blocks`
/// blocks: rounds of `resident` blocks, the last one possibly short (and slower per block).
fn sm_time(model: &Model, blocks: usize) -> f64 {
    let (mut left, mut t) = (blocks, 0.0);
    while left > 0 {
        let c = left.min(model.resident);
        t += c as f64 / model.occupancy[c - 1];
        left -= c;
    }
    t
}

/// Estimated nanoseconds of a product of `batch` `[m, k] x [k, n]` matrices with `model`'s
/// tile and `k` cut into `splits` chunks: the busiest SM's blocks ([`sm_time`]; blocks spread
/// evenly), plus the pass that sums the partials (a read of each, a write of the result).
fn estimate(model: &Model, batch: usize, m: usize, n: usize, k: usize, splits: usize) -> f64 {
    let t = model.tile;
    let blocks = batch * splits * m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    let block_flops = 2.0 * f64::from(t.bm * t.bn) * (k / splits) as f64;
    let sm_flops_per_ns = model.tflops * 1e3 / SMS as f64;
    let product = sm_time(model, blocks.div_ceil(SMS)) * block_flops / sm_flops_per_ns;
    if splits == 1 {
        return product;
    }
    let sum_bytes = ((splits + 1) * batch * m * n) as f64 * WORD_BYTES as f64;
    product * model.split_penalty + sum_bytes / SUM_BYTES_PER_NS + 2e3
}

/// Picks the block shape and the number of K chunks (split-K) of a product of `batch`
/// `[m, k] x [k, n]` matrices by the estimated time of its blocks on the H200's SMs
/// ([`estimate`]): a shape whose blocks do not fill the SMs takes smaller blocks, or splits a
/// long K into chunks whose partial products a second pass sums. Blocks much larger than the
/// output are not considered. `tile` and `splits` force either choice (a forced split count
/// that does not divide K becomes the largest one below it that does).
pub fn choose(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    tile: Option<Tile>,
    splits: Option<usize>,
) -> (Tile, usize) {
    let divides = |s: usize| k.is_multiple_of(s);
    let split_options: Vec<usize> = match splits {
        Some(s) => vec![(1..=s.min(k)).rev().find(|&s| divides(s)).unwrap_or(1)],
        None => SPLITS
            .into_iter()
            .filter(|&s| {
                s == 1
                    || (divides(s)
                        && k / s >= MIN_CHUNK
                        && s * batch * m * n * WORD_BYTES as usize <= MAX_PARTIALS)
            })
            .collect(),
    };
    let fits = |t: &Tile| (t.bm as usize) <= m.max(32) && (t.bn as usize) <= n.max(32);
    let forced;
    let models: Vec<&Model> = match tile {
        Some(t) => {
            // the model of the nearest measured tile, by block size
            let like = MODELS
                .iter()
                .find(|x| x.tile.bm * x.tile.bn <= t.bm * t.bn)
                .unwrap_or(&MODELS[MODELS.len() - 1]);
            forced = Model { tile: t, ..*like };
            vec![&forced]
        }
        None => MODELS.iter().filter(|x| fits(&x.tile)).collect(),
    };
    let mut best = (models[0].tile, 1, f64::INFINITY);
    for model in models {
        for &s in &split_options {
            let t = estimate(model, batch, m, n, k, s);
            if t < best.2 {
                best = (model.tile, s, t);
            }
        }
    }
    (best.0, best.1)
}

/// The block shape a product runs with, given [`choose`]'s `tile`: [`WIDE_DEEP`] for [`WIDE`]
/// when `b_along_n` (`b`'s unit stride is along n, where the deeper slabs measured faster),
/// else `tile`. [`choose`]'s model keeps WIDE's rate for both.
pub fn deepen(tile: Tile, b_along_n: bool) -> Tile {
    if tile == WIDE && b_along_n {
        WIDE_DEEP
    } else {
        tile
    }
}

pub fn emit(e: &mut Emitter, k: &Matmul) -> Result<(String, [u32; 3], u32), CompileError> {
    let batch: usize = k.batch.iter().product();
    let t = k.tile;
    let (gx, gy) = (k.n.div_ceil(t.bn as usize), k.m.div_ceil(t.bm as usize));
    if batch > MAX_GROUPS as usize || gx > MAX_GROUPS as usize || gy > MAX_GROUPS as usize {
        return Err(CompileError::KernelLimit {
            kernel: "matmul",
            what: format!(
                "{batch} batch entries of {}x{} outputs need {batch}x{gy}x{gx} blocks; one dispatch handles {MAX_GROUPS} per axis",
                k.m, k.n
            ),
        });
    }
    let Tile { bm, bn, bk, tm, tn } = t;
    let quads = tm % 4 == 0 && tn % 4 == 0;
    let rb = k.batch.len();
    let (ea, eb) = (bm * bk / WORKGROUP, bk * bn / WORKGROUP);
    // Staging walks each operand's unit stride across consecutive threads (coalesced reads);
    // `a` walks k when k is its unit stride, else m; `b` walks n when n is, else k.
    let a_walks_k = k.a.strides[rb + 1] == 1;
    let b_walks_k = k.b.strides[rb + 1] != 1;
    let a_vec = vec4_loads(e, &k.a, if a_walks_k { rb + 1 } else { rb }, ea);
    let b_vec = vec4_loads(e, &k.b, if b_walks_k { rb } else { rb + 1 }, eb);
    let loads = |n: u32, vec: bool| if vec { n / 4 } else { n };
    let (la, lb) = (loads(ea, a_vec), loads(eb, b_vec));
    // Loop iterations per invocation (see `LOOP_BUDGET`): the K loop, and per K step the
    // staging loops and the product's loops, unless they are written out (`unrolled`).
    let steps = (k.k as u64).div_ceil(u64::from(bk));
    let staging = u64::from(2 * (la + lb));
    let product = if quads {
        u64::from(bk)
    } else {
        u64::from(bk * (tm + tn + tm + tm * tn))
    };
    let write = if quads {
        u64::from(tm * (tn / 4) * 4)
    } else {
        u64::from(tm + tm * tn)
    };
    let plain = steps * (1 + staging + product) + staging + write;
    let unrolled = plain > LOOP_BUDGET;
    e.loop_trips(if unrolled { steps + write } else { plain });

    let mut s = String::new();
    if let Some(epi) = &k.epilogue {
        s.push_str(&super::fused::emit_epilogue(e, epi));
    }
    writeln!(
        s,
        "const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst BK: u32 = {bk}u;"
    )
    .unwrap();
    writeln!(s, "const TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;").unwrap();
    let word = if quads { "vec4<f32>" } else { "f32" };
    let per = if quads { 4 } else { 1 };
    // Row strides of the staged slabs: padded where staging walks `k` across threads (see PAD).
    let pad = if quads { PAD } else { 1 };
    let sa = bm + if a_walks_k { pad } else { 0 };
    let sb = bn + if b_walks_k { pad } else { 0 };
    writeln!(s, "const SA: u32 = {sa}u;\nconst SB: u32 = {sb}u;").unwrap();
    writeln!(s, "var<workgroup> As: array<{word}, {}>;", sa * bk / per).unwrap();
    writeln!(s, "var<workgroup> Bs: array<{word}, {}>;", bk * sb / per).unwrap();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{").unwrap();
    let (m, n, kk) = (e.param(k.m), e.param(k.n), e.param(k.k));
    writeln!(s, "    let M = {m};\n    let N = {n};\n    let K = {kk};").unwrap();
    let batch_dims = e.params(&k.batch);
    decompose(&mut s, "    ", "wid.z", "b", &batch_dims);
    // the output's binding first: an operand's quads alias comes after the plain arenas
    let arena_o = e.arena(k.out.buffer);
    let arena_a = if a_vec {
        e.arena_quads(k.a.buffer)
    } else {
        e.arena(k.a.buffer)
    };
    let arena_b = if b_vec {
        e.arena_quads(k.b.buffer)
    } else {
        e.arena(k.b.buffer)
    };
    let mut base = |name: &str, view: &View| {
        let mut b = e.base(view.buffer, view.offset);
        for axis in 0..rb {
            let st = e.param(view.strides[axis]);
            write!(b, " + b{axis} * {st}").unwrap();
        }
        let (s0, s1) = (e.param(view.strides[rb]), e.param(view.strides[rb + 1]));
        writeln!(
            s,
            "    let {name}_base = {b};\n    let {name}_s0 = {s0};\n    let {name}_s1 = {s1};"
        )
        .unwrap();
    };
    base("a", &k.a);
    base("b", &k.b);
    base("o", &k.out);
    writeln!(s, "    let row0 = wid.y * BM;\n    let col0 = wid.x * BN;").unwrap();
    writeln!(
        s,
        "    let tx = lid % (BN / TN);\n    let ty = lid / (BN / TN);"
    )
    .unwrap();
    writeln!(s, "    var acc: array<{word}, {}>;", tm * tn / per).unwrap();

    // Staging: each thread moves `ea` elements of a and `eb` of b per step, as `ea / 4` and
    // `eb / 4` quads where `vec4_loads` allows.
    let a_op = Staged {
        reg: "pa",
        slab: "As",
        stride: "SA",
        x: "m",
        extent: "M",
        origin: "row0",
        block: "BM",
        k_first: false,
        walks_k: a_walks_k,
        vec: a_vec,
        count: la,
        arena: arena_a,
    };
    let b_op = Staged {
        reg: "pb",
        slab: "Bs",
        stride: "SB",
        x: "n",
        extent: "N",
        origin: "col0",
        block: "BN",
        k_first: true,
        walks_k: b_walks_k,
        vec: b_vec,
        count: lb,
        arena: arena_b,
    };
    for op in [&a_op, &b_op] {
        let ty = if op.vec { "vec4<f32>" } else { "f32" };
        writeln!(s, "    var {}: array<{ty}, {}>;", op.reg, op.count).unwrap();
    }
    let load = |s: &mut String, indent: &str, k0: &str| {
        a_op.load(s, indent, k0, unrolled);
        b_op.load(s, indent, k0, unrolled);
    };
    let store = |s: &mut String, indent: &str| {
        a_op.store(s, indent, quads, unrolled);
        b_op.store(s, indent, quads, unrolled);
    };
    load(&mut s, "    ", "0u");
    store(&mut s, "    ");
    writeln!(s, "    workgroupBarrier();").unwrap();
    writeln!(s, "    let steps = (K + BK - 1u) / BK;").unwrap();
    writeln!(s, "    for (var t = 0u; t < steps; t = t + 1u) {{").unwrap();
    writeln!(s, "        let more = t + 1u < steps;").unwrap();
    writeln!(s, "        if (more) {{").unwrap();
    load(&mut s, "            ", "(t + 1u) * BK");
    writeln!(s, "        }}").unwrap();
    if quads {
        quad_product(&mut s, t, unrolled, sa, sb);
    } else {
        scalar_product(&mut s, t, unrolled);
    }
    writeln!(s, "        workgroupBarrier();\n        if (more) {{").unwrap();
    store(&mut s, "            ");
    writeln!(s, "        }}\n        workgroupBarrier();\n    }}").unwrap();
    // the stored value: the product, or the epilogue of it at its coordinates
    let value = |slot: &str| match &k.epilogue {
        Some(_) => {
            let mut args: Vec<String> = (0..rb).map(|a| format!("b{a}")).collect();
            args.extend(["gm".to_string(), "GN".to_string()]);
            format!("epilogue({slot}, {})", args.join(", "))
        }
        None => slot.to_string(),
    };
    if quads {
        quad_write(&mut s, t, &arena_o, &value);
    } else {
        scalar_write(&mut s, &arena_o, &value);
    }
    writeln!(s, "}}").unwrap();
    let shared = (sa * bk + bk * sb) * WORD_BYTES as u32;
    Ok((s, [gx as u32, gy as u32, batch.max(1) as u32], shared))
}

/// The second pass of split-K: one thread per output element, or per quad of consecutive
/// outputs when `n` is a multiple of 4 and both buffers are 16-byte aligned (quads read and,
/// for a contiguous output, written through the arenas' `vec4<f32>` aliases), summing the
/// partials in order `s = 0, 1, ..` and storing the epilogue of the sum.
pub fn emit_split_sum(e: &mut Emitter, k: &SplitSum) -> (String, [u32; 3], u32) {
    let out = &k.out;
    let rank = out.rank();
    let splits = k.partials.shape[0];
    let numel = out.numel();
    let n = out.shape[rank - 1];
    let quads = e.quad_aliases()
        && n.is_multiple_of(4)
        && e.element_start(k.partials.buffer, k.partials.offset)
            .is_multiple_of(4)
        && k.partials.is_contiguous();
    let dense_out =
        quads && out.is_contiguous() && e.element_start(out.buffer, out.offset).is_multiple_of(4);
    e.loop_trips(splits as u64);
    let mut s = String::new();
    if let Some(epi) = &k.epilogue {
        s.push_str(&super::fused::emit_epilogue(e, epi));
    }
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    let per = if quads { 4 } else { 1 };
    // outputs (or quads) per split: the thread count and the partials' plane
    let count = e.param(numel / per);
    let splits_p = e.param(splits);
    writeln!(
        s,
        "    let gi = (wid.x + wid.y * nwg.x) * {WORKGROUP}u + lid;\n    if (gi >= {count}) {{ return; }}"
    )
    .unwrap();
    let at = if quads { "gi * 4u" } else { "gi" };
    let dims = e.params(&out.shape);
    decompose(&mut s, "    ", at, "c", &dims);
    let base = e.base(k.partials.buffer, k.partials.offset);
    let (zero, arena, index) = if quads {
        (
            "vec4<f32>(0.0)",
            e.arena_quads(k.partials.buffer),
            format!("({base} >> 2u) + t * {count} + gi"),
        )
    } else {
        (
            "0.0",
            e.arena(k.partials.buffer),
            format!("{base} + t * {count} + gi"),
        )
    };
    writeln!(s, "    var acc = {zero};").unwrap();
    writeln!(
        s,
        "    for (var t = 0u; t < {splits_p}; t = t + 1u) {{ acc = acc + {arena}[{index}]; }}"
    )
    .unwrap();
    let value = |v: &str, last: &str| match &k.epilogue {
        Some(_) => {
            let mut args: Vec<String> = (0..rank - 1).map(|a| format!("c{a}")).collect();
            args.push(last.to_string());
            format!("epilogue({v}, {})", args.join(", "))
        }
        None => v.to_string(),
    };
    let last = format!("c{}", rank - 1);
    let o_base = e.base(out.buffer, out.offset);
    if dense_out {
        let arena_o = e.arena_quads(out.buffer);
        let lanes: Vec<String> = (0..4)
            .map(|j| value(&format!("acc[{j}]"), &format!("{last} + {j}u")))
            .collect();
        writeln!(
            s,
            "    {arena_o}[({o_base} >> 2u) + gi] = vec4<f32>({});",
            lanes.join(", ")
        )
        .unwrap();
    } else {
        let arena_o = e.arena(out.buffer);
        let strides = e.params(&out.strides);
        let mut addr = o_base;
        for (axis, st) in strides.iter().enumerate().take(rank - 1) {
            write!(addr, " + c{axis} * {st}").unwrap();
        }
        let last_stride = &strides[rank - 1];
        if quads {
            for j in 0..4 {
                let v = value(&format!("acc[{j}]"), &format!("{last} + {j}u"));
                writeln!(
                    s,
                    "    {arena_o}[{addr} + ({last} + {j}u) * {last_stride}] = {v};"
                )
                .unwrap();
            }
        } else {
            let v = value("acc", &last);
            writeln!(s, "    {arena_o}[{addr} + {last} * {last_stride}] = {v};").unwrap();
        }
    }
    writeln!(s, "}}").unwrap();
    (s, grid(numel.div_ceil(per).div_ceil(WORKGROUP as usize)), 0)
}

/// Whether staging may load `view`'s elements as quads along its axis `unit` (the axis it
/// walks across threads): that axis has stride 1 and an extent that is a positive multiple of
/// 4, every other stride (of an axis longer than 1) and the first element's place in its arena
/// are multiples of 4 (so every quad is 16-byte aligned and lies inside the operand or wholly
/// past its edge), and each thread stages whole quads (`per_thread`, its elements per step, a
/// multiple of 4). Checked at compile time on the view's offset and strides; otherwise staging
/// loads scalars.
fn vec4_loads(e: &Emitter, view: &View, unit: usize, per_thread: u32) -> bool {
    e.quad_aliases()
        && per_thread.is_multiple_of(4)
        && view.strides[unit] == 1
        && view.shape[unit] >= 4
        && view.shape[unit].is_multiple_of(4)
        && e.element_start(view.buffer, view.offset).is_multiple_of(4)
        && (0..view.rank()).all(|axis| {
            // an extent-1 axis is only read at coordinate 0
            axis == unit || view.strides[axis].is_multiple_of(4) || view.shape[axis] == 1
        })
}

/// One operand's staging: `reg` holds the next step's elements (or quads) per thread, `slab`
/// the staged step in workgroup memory, row `k` at `k * stride`. The operand's other axis is
/// `x` (m for a, n for b), of extent `extent` from `origin` in blocks of `block`; `k_first` when
/// its address is `base + k * s0 + x * s1` (b) rather than `base + x * s0 + k * s1` (a).
struct Staged {
    reg: &'static str,
    slab: &'static str,
    stride: &'static str,
    x: &'static str,
    extent: &'static str,
    origin: &'static str,
    block: &'static str,
    k_first: bool,
    walks_k: bool,
    vec: bool,
    /// Loads (elements or quads) per thread per step.
    count: u32,
    /// The arena binding it is read through (`array<vec4<f32>>` when `vec`).
    arena: String,
}

impl Staged {
    /// The name of the operand (`a` or `b`), its base and strides.
    fn name(&self) -> &'static str {
        if self.k_first { "b" } else { "a" }
    }

    /// `for (var e = 0u; e < count; ...) {` (or, unrolled, a block binding `e` to `copy`) with
    /// `i`, `kk` and the `x` offset bound; the caller closes it.
    fn open(&self, s: &mut String, indent: &str, unrolled: bool, copy: u32) {
        let n = self.count;
        if unrolled {
            writeln!(s, "{indent}{{ let e = {copy}u;").unwrap();
        } else {
            writeln!(s, "{indent}for (var e = 0u; e < {n}u; e = e + 1u) {{").unwrap();
        }
        let (x, block) = (self.x, self.block);
        writeln!(s, "{indent}    let i = lid + e * {WORKGROUP}u;").unwrap();
        let (walked, across, width) = if self.walks_k {
            ("kk".to_string(), format!("{x}{x}"), "BK")
        } else {
            (format!("{x}{x}"), "kk".to_string(), block)
        };
        if self.vec {
            writeln!(
                s,
                "{indent}    let {walked} = (i % ({width} / 4u)) * 4u;\n{indent}    let {across} = i / ({width} / 4u);"
            )
            .unwrap();
        } else {
            writeln!(
                s,
                "{indent}    let {walked} = i % {width};\n{indent}    let {across} = i / {width};"
            )
            .unwrap();
        }
    }

    fn copies(&self, unrolled: bool) -> u32 {
        if unrolled { self.count } else { 1 }
    }

    /// Loads the step whose first `k` is `k0` into the registers; past the edges, zeros.
    fn load(&self, s: &mut String, indent: &str, k0: &str, unrolled: bool) {
        let (x, ext, name) = (self.x, self.extent, self.name());
        for copy in 0..self.copies(unrolled) {
            self.open(s, indent, unrolled, copy);
            let gx = format!("{indent}    let g{x} = {} + {x}{x};", self.origin);
            let gk = format!("{indent}    let gk = {k0} + kk;");
            if self.k_first {
                writeln!(s, "{gk}\n{gx}").unwrap();
            } else {
                writeln!(s, "{gx}\n{gk}").unwrap();
            }
            // the last in-range index of the walked axis: the last quad's first one for quads
            let last = |axis: &str, walked: bool| {
                if walked && self.vec {
                    format!("{axis} - 4u")
                } else {
                    format!("{axis} - 1u")
                }
            };
            let kc = format!("min(gk, {})", last("K", self.walks_k));
            let xc = format!("min(g{x}, {})", last(ext, !self.walks_k));
            let (c0, c1) = if self.k_first { (kc, xc) } else { (xc, kc) };
            let addr = format!("{name}_base + {c0} * {name}_s0 + {c1} * {name}_s1");
            let (zero, index) = if self.vec {
                ("vec4<f32>(0.0)", format!("({addr}) >> 2u"))
            } else {
                ("0.0", addr)
            };
            let (xin, kin) = (format!("g{x} < {ext}"), "gk < K".to_string());
            let inside = if self.k_first {
                format!("{kin} && {xin}")
            } else {
                format!("{xin} && {kin}")
            };
            writeln!(
                s,
                "{indent}    {}[e] = select({zero}, {}[{index}], {inside});\n{indent}}}",
                self.reg, self.arena
            )
            .unwrap();
        }
    }

    /// Stores the registers into the slab (`quads`: the slab is an array of `vec4<f32>`).
    fn store(&self, s: &mut String, indent: &str, quads: bool, unrolled: bool) {
        let (x, slab, st, reg) = (self.x, self.slab, self.stride, self.reg);
        let put = |at: &str| {
            if quads {
                // rows are quads apart: the lane is x's
                format!("{slab}[({at}) / 4u][{x}{x} % 4u]")
            } else {
                format!("{slab}[{at}]")
            }
        };
        for copy in 0..self.copies(unrolled) {
            self.open(s, indent, unrolled, copy);
            if !self.vec {
                let at = put(&format!("kk * {st} + {x}{x}"));
                writeln!(s, "{indent}    {at} = {reg}[e];").unwrap();
            } else if !self.walks_k && quads {
                // a quad along x is a quad of the slab's row (x is a multiple of 4)
                writeln!(
                    s,
                    "{indent}    {slab}[(kk * {st} + {x}{x}) / 4u] = {reg}[e];"
                )
                .unwrap();
            } else {
                for j in 0..4 {
                    let at = if self.walks_k {
                        put(&format!("(kk + {j}u) * {st} + {x}{x}"))
                    } else {
                        put(&format!("kk * {st} + {x}{x} + {j}u"))
                    };
                    writeln!(s, "{indent}    {at} = {reg}[e][{j}];").unwrap();
                }
            }
            writeln!(s, "{indent}}}").unwrap();
        }
    }
}

/// One step's products for scalar micro-tiles: thread `(tx, ty)` owns rows `ty + i * BM / TM`
/// and columns `tx + j * BN / TN`. `unrolled` writes every loop out.
fn scalar_product(s: &mut String, t: Tile, unrolled: bool) {
    if !unrolled {
        s.push_str(
            "        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            var ra: array<f32, TM>;
            var rb: array<f32, TN>;
            for (var i = 0u; i < TM; i = i + 1u) { ra[i] = As[kk * SA + ty + i * (BM / TM)]; }
            for (var j = 0u; j < TN; j = j + 1u) { rb[j] = Bs[kk * SB + tx + j * (BN / TN)]; }
            for (var i = 0u; i < TM; i = i + 1u) {
                for (var j = 0u; j < TN; j = j + 1u) {
                    acc[i * TN + j] = fma(ra[i], rb[j], acc[i * TN + j]);
                }
            }
        }
",
        );
        return;
    }
    for kk in 0..t.bk {
        writeln!(s, "        {{").unwrap();
        for i in 0..t.tm {
            writeln!(
                s,
                "            let ra{i} = As[{kk}u * SA + ty + {i}u * (BM / TM)];"
            )
            .unwrap();
        }
        for j in 0..t.tn {
            writeln!(
                s,
                "            let rb{j} = Bs[{kk}u * SB + tx + {j}u * (BN / TN)];"
            )
            .unwrap();
        }
        for i in 0..t.tm {
            for j in 0..t.tn {
                let slot = i * t.tn + j;
                writeln!(
                    s,
                    "            acc[{slot}] = fma(ra{i}, rb{j}, acc[{slot}]);"
                )
                .unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
}

fn scalar_write(s: &mut String, arena_o: &str, value: &dyn Fn(&str) -> String) {
    s.push_str(
        "    for (var i = 0u; i < TM; i = i + 1u) {
        let gm = row0 + ty + i * (BM / TM);
        for (var j = 0u; j < TN; j = j + 1u) {
            let gn = col0 + tx + j * (BN / TN);
",
    );
    let v = value("acc[i * TN + j]").replace("GN", "gn");
    writeln!(
        s,
        "            if (gm < M && gn < N) {{ {arena_o}[o_base + gm * o_s0 + gn * o_s1] = {v}; }}"
    )
    .unwrap();
    s.push_str("        }\n    }\n");
}

/// One step's products for quad micro-tiles: thread `(tx, ty)` owns output rows
/// `q * BM / HM + ty * 4 + i` and columns `q * BN / HN + tx * 4 + j`.
fn quad_product(s: &mut String, t: Tile, unrolled: bool, sa: u32, sb: u32) {
    let (hm, hn) = (t.tm / 4, t.tn / 4);
    // row strides of the staged slabs, in quads (padded where staging walks k across threads)
    let (qa, qb) = (sa / 4, sb / 4);
    for kk in 0..if unrolled { t.bk } else { 1 } {
        if unrolled {
            writeln!(s, "        {{ let kk = {kk}u;").unwrap();
        } else {
            writeln!(s, "        for (var kk = 0u; kk < BK; kk = kk + 1u) {{").unwrap();
        }
        for q in 0..hm {
            writeln!(
                s,
                "            let a{q} = As[kk * {qa}u + {}u + ty];",
                q * t.bm / 4 / hm
            )
            .unwrap();
        }
        for q in 0..hn {
            writeln!(
                s,
                "            let b{q} = Bs[kk * {qb}u + {}u + tx];",
                q * t.bn / 4 / hn
            )
            .unwrap();
        }
        for r in 0..t.tm {
            for q in 0..hn {
                let slot = r * hn + q;
                writeln!(
                    s,
                    "            acc[{slot}] = fma(vec4<f32>(a{}[{}]), b{q}, acc[{slot}]);",
                    r / 4,
                    r % 4
                )
                .unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
}

fn quad_write(s: &mut String, t: Tile, arena_o: &str, value: &dyn Fn(&str) -> String) {
    let (hm, hn) = (t.tm / 4, t.tn / 4);
    for r in 0..t.tm {
        writeln!(
            s,
            "    {{\n        let gm = row0 + {}u + ty * 4u + {}u;",
            (r / 4) * (t.bm / hm),
            r % 4
        )
        .unwrap();
        for q in 0..hn {
            let slot = r * hn + q;
            writeln!(
                s,
                "        let gn{q} = col0 + {}u + tx * 4u;",
                q * (t.bn / hn)
            )
            .unwrap();
            writeln!(s, "        for (var j = 0u; j < 4u; j = j + 1u) {{").unwrap();
            let v = value(&format!("acc[{slot}][j]")).replace("GN", &format!("gn{q} + j"));
            writeln!(
                s,
                "            if (gm < M && gn{q} + j < N) {{ {arena_o}[o_base + gm * o_s0 + (gn{q} + j) * o_s1] = {v}; }}"
            )
            .unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPT-2-small training step's products (forward, input and weight gradients) get the
    /// block shape and split that measured fastest among those tried on the H200 (or within 3%;
    /// 2048x768x3072 and 768x2048x2304 inside the step, where LARGE ran 13-16% slower than
    /// alone, `bench/README.md`, "Block shapes inside the step").
    #[test]
    fn gpt2_shapes_take_their_measured_block_shapes() {
        let cases = [
            // (m, k, n): tile, splits
            ((2048, 768, 2304), WIDE, 1),
            ((2048, 768, 768), MEDIUM, 1),
            ((2048, 768, 3072), WIDE, 1),
            ((2048, 3072, 768), WIDE, 2),
            ((2048, 2304, 768), WIDE, 2),
            ((768, 2048, 768), WIDE, 4),
            ((768, 2048, 2304), WIDE, 4),
            ((3072, 2048, 768), WIDE, 4),
            ((768, 2048, 3072), WIDE, 4),
            ((4096, 4096, 4096), LARGE, 1),
        ];
        for ((m, k, n), tile, splits) in cases {
            assert_eq!(
                choose(1, m, n, k, None, None),
                (tile, splits),
                "{m}x{k}x{n}"
            );
        }
    }

    /// A product that `choose` gives WIDE runs with the deeper slabs when `b` is read along n,
    /// and keeps WIDE when `b` is a transposed view; other tiles and forced tiles stay.
    #[test]
    fn wide_products_deepen_where_b_is_read_along_n() {
        assert_eq!(deepen(WIDE, true), WIDE_DEEP);
        assert_eq!(deepen(WIDE, false), WIDE);
        assert_eq!(deepen(LARGE, true), LARGE);
        // `c = a · b` with `b` stored as `[768, 2304]` (read along n) or transposed from
        // `[2304, 768]`: whether the kernel's 64 × 128 blocks take 16-deep slabs
        let bk = |along_n: bool, tile: Option<Tile>| {
            let (stored, b) = if along_n {
                ("768, 2304", "b")
            } else {
                ("2304, 768", "transpose(b, dim0=0, dim1=1)")
            };
            let src = format!(
                "graph t {{\n  input a: f32[2048, 768]\n  input b: f32[{stored}]\n  c = matmul(a, {b})\n  output c\n}}\n"
            );
            let graph = sinter_ir::text::parse(&src).expect("valid");
            let options = crate::Options {
                matmul_tile: tile,
                ..Default::default()
            };
            let artifact = crate::compile(&graph, &options).expect("compiles").artifact;
            let wgsl = &artifact.kernels[0].wgsl;
            (wgsl.contains("const BM: u32 = 64u;") && wgsl.contains("const BN: u32 = 128u;"))
                .then(|| wgsl.contains("const BK: u32 = 16u;"))
        };
        assert_eq!(bk(true, None), Some(true), "b along n: deeper slabs");
        assert_eq!(bk(false, None), Some(false), "b transposed: WIDE");
        assert_eq!(bk(true, Some(WIDE)), Some(false), "a forced tile stays");
    }

    /// A batch that `b` is shared by folds into m only while the folded rows fit one dispatch's
    /// row blocks: 64 x 32768 rows of a 4 x 8 product would need 65536 blocks of 32 rows.
    #[test]
    fn a_batch_too_tall_to_fold_keeps_its_grid_axis() {
        let src = "graph t {\n  input a: f32[64, 32768, 4]\n  input b: f32[4, 8]\n  y = matmul(a, b)\n  output y\n}\n";
        let graph = sinter_ir::text::parse(src).expect("valid");
        let options = crate::Options {
            max_binding_size: 1 << 31,
            ..Default::default()
        };
        let artifact = crate::compile(&graph, &options).expect("compiles").artifact;
        assert!(artifact.kernels[0].wgsl.contains("let b0 = wid.z;"));
    }

    #[test]
    fn small_outputs_take_small_blocks_and_forced_splits_divide_k() {
        assert_eq!(choose(1, 17, 300, 64, None, None), (SMALL, 1));
        assert_eq!(choose(1, 512, 512, 512, None, None), (MEDIUM, 1));
        // a long K over few blocks is split
        assert_eq!(choose(1, 1, 1, 600_000, None, None).1, 8);
        // forced: the largest count up to the one asked for that divides K
        assert_eq!(choose(1, 64, 64, 129, Some(LARGE), Some(4)), (LARGE, 3));
        assert_eq!(choose(1, 64, 64, 17, None, Some(4)).1, 1);
        assert_eq!(choose(1, 64, 64, 17, None, Some(1)).1, 1);
    }
}
