//! The flash-attention forward and split backward on tensor cores (a kernel whose variant is
//! [`Form::TensorCores`], [`crate::flash::variant`]).
//!
//! **Products (forward).** The two products of a block, `S = Q·Kᵀ` and `P·V`, run as wgpu's cooperative
//! matrices: 16 × 16 × 16 steps of `f16` operands accumulated in `f32`. A workgroup of 256
//! invocations (eight subgroups of 32) owns 64 queries and walks the keys in blocks of 64; the
//! query block's operands are loaded once into each subgroup's registers, each key and value
//! block is staged in workgroup memory as `f16`, and the 16 × 16 result tiles go to the
//! subgroups in turn (tile `sg_id + 8n`), which store them row-major as `f32` to `ss`.
//!
//! **Everything else in `f32`, per invocation.** A cooperative matrix's elements cannot be
//! addressed, so the scores go through workgroup memory: four invocations own a row, each 16
//! of its 64 columns, read from `ss` at a rotation (`rot`) that puts the 32 lanes of a subgroup
//! in 32 distinct banks. They run the graph's own score function (masks, ragged edges and the
//! uniform-mask fast path as in the plain kernels), the online softmax (row maxima combined
//! through two subgroup shuffles, sums per invocation), and write `P` as `f16` to `ps` for the
//! second product.
//!
//! **The output in cooperative accumulators, rescaled rarely.** `P·V` adds into `f32`
//! cooperative accumulators that stay on the tensor cores for the whole walk. Their elements
//! cannot be scaled per row, so the online softmax's reference `m` of a row (its probabilities
//! are `exp(s − m)`) moves only where a block's maximum passes it by more than
//! [`RESCALE_MARGIN`] (FlashAttention-4's conditional rescaling): the probabilities stay below
//! e^8, the softmax is the same whatever the reference (the sums `l` share it), and the
//! accumulators pass through `ss` to be rescaled only in a block where some row's reference
//! moved (`live.y`, through `workgroupUniformLoad`). Past the first blocks that is rare; before,
//! every block's `P·V` went through `ss` to be added per invocation, with a barrier per pass.
//!
//! **Backward** ([`emit_backward`]). The dQ kernel (rows: queries) and the dK/dV kernel (rows:
//! keys, the tile transposed) take the same shape: the row block's two operands in registers,
//! `S` and `dP` through `ss`, `P` and the score gradient in `f32` per invocation, and the
//! accumulated products (`dQ`, or `dV` and `dK`) in cooperative accumulators for the whole
//! walk — no online rescaling, so they never leave the tensor cores until the end. The whole
//! backward's `dQ` partial sums have no such form: with tensor cores the optimizer keeps the
//! backward split.
//!
//! **Precision.** `Q`, `K`, `V`, `P`, `dO` and the score gradient are rounded to `f16` (11
//! significant bits; `Q`, `K` and `V` past f16's ±65504 are out of the mode's range); sums,
//! the softmax and the outputs are `f32`. The opt-in trade of PyTorch's
//! `set_float32_matmul_precision("medium")`: on random inputs the outputs and gradients differ
//! from the `f32` kernels' by up to ~8e-4 of their largest magnitude.
//!
//! **Gradients scaled by a power of two** ([`emit_scale`], [`crate::kernel::FlashScale`]).
//! The gradient of a mean loss is small: in a GPT step `dO` is around 1e-5 and the score
//! gradient around 1e-7, subnormal or zero in `f16` (whose smallest normal is 6.1e-5), which is
//! why fp16 training in PyTorch needs a loss scaler. Here the backward scales itself: a pass
//! before it takes the largest `|dO|` of each batch entry (in chunks, a workgroup each), and
//! the dQ and dK/dV kernels stage `dO · 2^-e` (`e` the largest's exponent), take `D · 2^-e`,
//! and multiply their results by `2^e` — exact in binary, so the scale costs no precision, and
//! the `f16` operands sit near 1 whatever the loss's scale (large gradients no longer overflow
//! the score gradient either). Without it a byte-level GPT trained with `--tensor-cores` lagged
//! the `f32` run's held-out loss by 0.14 after 4000 steps; with it the two agree (BENCHMARKS.md).
//!
//! **What the hardware and naga ask for** (each found on the H200, each costing wrong results
//! or time when missed):
//! - cooperative operations only in control flow that naga's uniformity analysis proves
//!   uniform, and it takes any function's result, `p(i)` included, for non-uniform: the param
//!   block is read directly, loops have fixed trip counts, tiles go to subgroups by a fixed
//!   stride (so the kernel is written for subgroups of 32, which the runtime checks), and the
//!   block-skip verdict reaches all invocations through `workgroupUniformLoad`;
//! - every workgroup array on a 16-byte boundary: the verdict is a whole `vec4<u32>`;
//! - rows of the `f16` tiles padded by 16 bytes ([`PAD`]) against bank conflicts.
//!
//! **Staging one block ahead.** The walked side's blocks (keys and values, or queries and `dO`)
//! are fetched from the arena into registers as `f16` one block ahead: block n + 1's loads are
//! issued once block n sits in workgroup memory, so their latency hides behind block n's
//! products, and each invocation writes its registers to the staged arrays when block n + 1
//! comes ([`Prefetch`]; a block after a skipped one is fetched then).
//!
//! **Wider heads (forward).** Where the key and value blocks would not fit 48 KiB of workgroup
//! memory side by side (head dimensions past 64), they take turns in one array: the value
//! block is staged once the scores are out of the products, while the invocations read them.
//! The accumulators go through `ss` in passes of 32 rows at value width 128. Walking blocks of
//! 32 keys instead, as the backward does past 64, measured slower on the H200 (twice the
//! barriers and rescalings per key; BENCHMARKS.md, "Attention forward + backward").
//!
//! **Wider heads (backward).** Past head dimension 64 the backward walks blocks of 32 keys (or
//! queries): each subgroup then keeps one score tile's A operands in registers (64 registers
//! for both row-block operands at 128, as at 64 with two tiles), and the walked blocks fit
//! workgroup memory with room to spare. The row block's two operands, staged side by side at
//! 64, go through `x1` in turn; the accumulators leave through `ss` in passes of eight tiles.
//!
//! **Limits.** For the forward, head dimensions that are multiples of 16 up to 128, the
//! value's 32, 64 or 128 ([`crate::flash::variant::tc_takes_shape`]); for the backward, 32, 64 or 128 — so that the
//! tiles fit 48 KiB of workgroup memory and divide evenly among the subgroups. Other shapes
//! keep the plain `f32` kernels. Skipped blocks as in the plain kernels.

use super::*;
use crate::flash::variant::{TC_COLS, TC_ROWS, TC_SIDE, TC_SUBGROUPS, tc_backward_cols};

/// Queries (or keys, for dK/dV) per workgroup.
const ROWS: usize = TC_ROWS;
/// Keys per column block.
const COLS: usize = TC_COLS;
/// Threads per workgroup: four per row.
const THREADS: usize = 256;
/// Threads that share a row.
const PER_ROW: usize = THREADS / ROWS;
/// The side of a cooperative matrix.
const SIDE: usize = TC_SIDE;
/// Workgroup memory the kernels may declare: what the H200 offers (wgpu's default limit asks
/// for less; the artifact records the kernels' need).
const WORKGROUP_BYTES: usize = 48 << 10;
/// Halves that pad each row of the `f16` tiles: a cooperative load reads 16 bytes from each of
/// 8 rows at once, which fall in one bank group when rows are 128 bytes apart (an 8-way
/// conflict that made the products three quarters of the kernel's time at head dimension
/// 64); 16 more bytes a row spread them over all 32 banks.
const PAD: usize = 8;
/// Subgroups per workgroup: naga lets cooperative operations run only in uniform control flow,
/// so each subgroup takes every [`SUBGROUPS`]-th tile in a loop of fixed trip count (the kernel
/// is written for subgroups of 32, which the runtime checks).
const SUBGROUPS: usize = TC_SUBGROUPS;
/// Banks of workgroup memory, four bytes each.
const BANKS: usize = 32;
/// How far (in the scores' natural-log units) a block's row maximum may pass the reference of
/// the forward's probabilities before the reference moves and the output's accumulators are
/// rescaled: the probabilities stay below e^8 ≈ 2981, well inside `f16`.
const RESCALE_MARGIN: f32 = 8.0;

/// A block staged as `f16` in workgroup memory, row-major from the start of its array: the
/// array, the name of its row stride's constant and the stride in halves.
#[derive(Clone, Copy)]
struct Staged<'a> {
    array: &'a str,
    stride_name: &'a str,
    stride: usize,
}

impl Staged<'_> {
    /// A pointer to the block's half at `offset` (a WGSL term), for a cooperative load.
    fn at(&self, offset: &str) -> String {
        format!("&{}[{offset}]", self.array)
    }
}

/// Writes the kernel `k` (whose variant is [`Form::TensorCores`]) on tensor cores; returns the body, the grid and
/// the workgroup memory in bytes.
pub fn emit(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    match k.spec.kind {
        FlashKind::Forward => emit_forward(e, k),
        _ => emit_backward(e, k),
    }
}

/// Elements of `dO` an invocation of the [`FlashScale`] kernel reads per loop iteration.
///
/// [`FlashScale`]: crate::kernel::FlashScale
const SCALE_UNROLL: usize = 4;
/// Writes the [`FlashScale`] kernel: a workgroup per chunk of a batch entry's `dO` (256
/// invocations, each a strided share of the chunk, then a tree through workgroup memory)
/// writes its chunk's largest `|dO|`. Returns the body, the grid and the workgroup memory in
/// bytes.
///
/// [`FlashScale`]: crate::kernel::FlashScale
pub fn emit_scale(e: &mut Emitter, k: &crate::kernel::FlashScale) -> (String, [u32; 3], u32) {
    let r = k.d_o.rank();
    let batch = k.d_o.shape[..r - 2].to_vec();
    let (rows, width) = (k.d_o.shape[r - 2], k.d_o.shape[r - 1]);
    let nb = batch.len();
    let entries: usize = batch.iter().product();
    if entries > MAX_GROUPS as usize {
        e.refuse(
            "flash attention",
            format!("{entries} batch entries pass the {MAX_GROUPS} workgroups of one dispatch"),
        );
    }
    let chunks = k.out.shape[k.out.rank() - 2];
    let chunk = (rows * width).div_ceil(chunks);
    let mut s = String::new();
    writeln!(s, "var<workgroup> red: array<f32, {THREADS}>;").unwrap();
    writeln!(s, "@compute @workgroup_size({THREADS})").unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    )
    .unwrap();
    let dims = e.params(&batch, "batch");
    decompose(&mut s, "    ", "wid.x", "b", &dims);
    let d_o = bind(&mut s, e, "do", &k.d_o, nb);
    let out = bind(&mut s, e, "out", &k.out, nb);
    let (n, w, len) = (
        e.param(rows * width, "n"),
        e.param(width, "width"),
        e.param(chunk, "chunk"),
    );
    let step = THREADS * SCALE_UNROLL;
    writeln!(
        s,
        "    let n = {n};\n    let w = {w};\n    let first = wid.y * {len};\n    let end = min(first + {len}, n);\n    var m = 0.0;\n    for (var i0 = first + lid; i0 < end; i0 = i0 + {step}u) {{"
    )
    .unwrap();
    for u in 0..SCALE_UNROLL {
        writeln!(
            s,
            "        {{ let i = min(i0 + {}u, n - 1u); m = max(m, select(0.0, abs({}), i0 + {}u < end)); }}",
            u * THREADS,
            d_o.load("i / w", "i % w"),
            u * THREADS
        )
        .unwrap();
    }
    writeln!(s, "    }}\n    red[lid] = m;\n    workgroupBarrier();").unwrap();
    let mut half = THREADS / 2;
    while half > 0 {
        writeln!(
            s,
            "    if (lid < {half}u) {{ red[lid] = max(red[lid], red[lid + {half}u]); }}\n    workgroupBarrier();"
        )
        .unwrap();
        half /= 2;
    }
    writeln!(
        s,
        "    if (lid == 0u) {{ {}[{}] = red[0]; }}\n}}",
        out.stored(),
        out.at("wid.y", "0u")
    )
    .unwrap();
    e.loop_trips(chunk.div_ceil(step) as u64);
    (
        s,
        [entries as u32, chunks as u32, 1],
        (THREADS * DType::F32.size_bytes()) as u32,
    )
}

/// WGSL binding `gs` to the power of two a backward kernel stages `dO` at and `ugs` to its
/// inverse, from the [`FlashScale`] maxima `maxima` (`chunks` of them): `2^-e` for the
/// exponent `e` of the largest, so that `|dO| · gs` is below 2, clamped to `±126` so that
/// both stay normal; 1 where the largest is zero, infinite or NaN (the values then pass as
/// they are, and a NaN still reaches every result it reaches unscaled).
///
/// [`FlashScale`]: crate::kernel::FlashScale
fn gradient_scale(maxima: &Mat, chunks: usize) -> String {
    format!(
        "    var gm = 0.0;\n    for (var c = 0u; c < {chunks}u; c = c + 1u) {{ gm = max(gm, {}); }}\n    let ge = clamp(i32((bitcast<u32>(gm) >> 23u) & 255u) - 127, -126, 126);\n    let gs = select(1.0, bitcast<f32>(u32(127 - ge) << 23u), gm > 0.0 && gm <= 3.4028235e38);\n    let ugs = 1.0 / gs;\n",
        maxima.load("c", "0u")
    )
}

/// Bytes of workgroup memory a kernel declares whose staged arrays hold `halves` and whose
/// walked blocks have `cols` rows: those arrays, `ps` and `ss` (the row block by a walked
/// block) and the verdict's quad.
fn workgroup_bytes(halves: usize, cols: usize) -> usize {
    let f32 = DType::F32.size_bytes();
    let f16 = f32 / 2;
    (halves + ROWS * (cols + PAD)) * f16 + ROWS * cols * f32 + QUAD * f32
}

/// Whether the forward of head dimensions `d`, `dv` stages the key and value blocks in turn in
/// one array (the value block once the scores are out of the products), because both at once
/// would pass [`WORKGROUP_BYTES`].
fn shares_staging(d: usize, dv: usize) -> bool {
    workgroup_bytes(COLS * (d + PAD + dv + PAD), COLS) > WORKGROUP_BYTES
}

/// The forward's staged blocks with the halves of their arrays: `ks` (keys × KS) and `vs`
/// (keys × VS), or `kv` for both in turn where [`shares_staging`].
fn forward_arrays(d: usize, dv: usize) -> Vec<(Staged<'static>, usize)> {
    let block = |array, stride_name, width: usize| {
        let stride = width + PAD;
        let staged = Staged {
            array,
            stride_name,
            stride,
        };
        (staged, COLS * stride)
    };
    if shares_staging(d, dv) {
        vec![block("kv", "KVS", d.max(dv))]
    } else {
        vec![block("ks", "KS", d), block("vs", "VS", dv)]
    }
}

/// Writes the forward of `k` on tensor cores; returns the body, the grid and
/// the workgroup memory in bytes.
fn emit_forward(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    e.cooperative_matrices();
    let (d, dv) = (k.d, k.dv);
    let nb = k.batch.len();
    let shared = shares_staging(d, dv);
    let (mut s, fixed) = score_functions(e, k);
    let arrays = forward_arrays(d, dv);
    let consts: Vec<(&str, usize)> = arrays
        .iter()
        .map(|(a, _)| (a.stride_name, a.stride))
        .collect();
    let declared: Vec<(&str, usize)> = arrays.iter().map(|&(a, n)| (a.array, n)).collect();
    let (ps, bytes) = header(&mut s, &consts, &declared, COLS);
    let (ka, va) = (arrays[0].0, arrays[arrays.len() - 1].0);
    // the query block goes to registers through `ps` (at stride KS) where it fits, else
    // through `kv`
    let qa = if shared {
        ka
    } else {
        Staged { array: "ps", ..ka }
    };
    let grid = launch(e, &mut s, k);
    writeln!(s, "    let row0 = blk * {ROWS}u;").unwrap();
    let q = bind(&mut s, e, "q", &k.q, nb);
    let kk = bind(&mut s, e, "k", &k.k, nb);
    let v = bind(&mut s, e, "v", &k.v, nb);
    let o = bind_result(&mut s, e, "o", k, 0);
    let l = bind_result(&mut s, e, "l", k, 1);
    let mut cx = body(s, nb, fixed);
    // the query block, as f16, to registers: the A operands of the subgroup's score tiles
    // (rows `(sg_id + 8n) / 4`), each 16 × 16 and row-major
    cx.line(1, &staged(&q, qa, d, "", "row0", "SQ"));
    cx.line(1, "workgroupBarrier();");
    let score_tiles = (ROWS / SIDE) * (COLS / SIDE) / SUBGROUPS;
    let mut t = String::new();
    for n in 0..score_tiles {
        t.push_str(&fragments(n, "qa", qa, d, COLS));
    }
    t.push_str("workgroupBarrier();");
    cx.line(1, &t);
    let per = COLS / PER_ROW;
    let pk = Prefetch {
        m: &kk,
        reg: "pk",
        rows: COLS,
        width: d,
        to: ka,
        scale: "",
    };
    let pv = Prefetch {
        m: &v,
        reg: "pv",
        rows: COLS,
        width: dv,
        to: va,
        scale: "",
    };
    // the output's accumulators: the tiles of 64 rows × dv, as `Body::tiles` divides them
    let mut t = String::new();
    for n in 0..(ROWS / SIDE) * (dv / SIDE) / SUBGROUPS {
        writeln!(t, "var ao{n} = coop_mat16x16<f32, C>();").unwrap();
    }
    cx.line(
        1,
        &format!(
            "var m = {NEG_INF};\nvar l = 0.0;\n{t}var x: array<f32, {per}>;\nlet blocks = (SK + {COLS}u - 1u) / {COLS}u;\n{}\n{}\nvar held = blocks;",
            pk.declare(),
            pv.declare()
        ),
    );
    cx.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
    cx.line(1, &format!("let col0 = kb * {COLS}u;"));
    let (i1, j1) = (
        format!("row0 + {}u", ROWS - 1),
        format!("col0 + {}u", COLS - 1),
    );
    // the verdict through workgroup memory: naga takes `tile_dead`'s result for non-uniform,
    // `workgroupUniformLoad`'s for uniform
    let dead = cx.dead(("row0", &i1), ("col0", &j1));
    cx.line(1, &if_live(&dead));
    // the key and value blocks from the registers, the next ones fetched behind the products;
    // where they take turns in one array, the value block once the scores are out
    let (now, next) = pipelined(&[&pk, &pv], if shared { 1 } else { 2 }, "kb", "SK", COLS);
    cx.line(2, &now);
    cx.line(2, "workgroupBarrier();");
    cx.line(2, &next);
    // S = Q·Kᵀ: A row-major from the query block, B = Kᵀ column-major from the key block
    cx.line(2, "// S = Q·Kᵀ, 16 × 16 tiles divided among the subgroups");
    cx.tiles(
        (ROWS / SIDE, COLS / SIDE, d / SIDE),
        &|n, step| {
            (
                format!("qa{n}_{step}"),
                format!(
                    "coopLoad<coop_mat16x16<f16, B>>({}, {})",
                    ka.at(&format!("ct * {}u + {}u", SIDE * ka.stride, SIDE * step)),
                    ka.stride_name
                ),
            )
        },
        Dest::Scores(COLS),
    );
    cx.line(2, "workgroupBarrier();");
    if shared {
        // the key block is out of the products: the value block takes its place
        cx.line(
            2,
            &format!("{}{}", pv.put(), pv.fetch(&format!("col0 + {COLS}u"), "SK")),
        );
    }
    // the thread's scores: columns h·16 + (rot + c) % 16
    cx.line(
        2,
        &format!("let sb = r * {COLS}u + h * {per}u;\nlet pb = r * PS + h * {per}u;"),
    );
    let col = |c: usize| format!("((rot + {c}u) % {per}u)");
    let mut loads = String::new();
    for c in 0..per {
        writeln!(loads, "x[{c}] = ss[sb + {}];", col(c)).unwrap();
    }
    cx.line(2, &loads);
    let (mut fast, mut general) = (String::new(), String::new());
    let corner = cx.coords("row0", "col0");
    for c in 0..per {
        let j = format!("col0 + h * {per}u + {}", col(c));
        writeln!(fast, "x[{c}] = score(x[{c}], {corner});").unwrap();
        writeln!(
            general,
            "x[{c}] = select({NEG_INF}, score(x[{c}], {}), {j} < SK);",
            cx.coords("min(row0 + r, SQ - 1u)", &format!("min({j}, SK - 1u)")),
        )
        .unwrap();
    }
    cx.scores(("row0", &i1), ("col0", &j1), &fast, &general);
    // the row's maximum (see the plain forward on `max`); the reference `m` of its
    // probabilities moves only where the block's maximum passes it by more than
    // RESCALE_MARGIN, so that the accumulators, which cannot be scaled per row in place,
    // rarely need rescaling (the probabilities stay below e^RESCALE_MARGIN, and the softmax
    // is the same whatever the reference); a moved reference of a row that has a sum flags
    // the rescaling through `live.y` (every invocation that flags writes the same value)
    let xs: Vec<String> = (0..per).map(|c| format!("x[{c}]")).collect();
    let mut t = format!("var mb = {};\n", max_all(&xs));
    for lane in (0..PER_ROW.ilog2()).map(|b| 1 << b) {
        writeln!(t, "mb = max(mb, subgroupShuffleXor(mb, {lane}u));").unwrap();
    }
    writeln!(
        t,
        "let moves = mb > m + {RESCALE_MARGIN:?};\nif (moves && m != {NEG_INF}) {{ live.y = 1u; }}\nlet mn = select(m, mb, moves);\nlet ms = select(mn, 0.0, mn == {NEG_INF});\nlet alpha = exp(m - ms);\nm = mn;"
    )
    .unwrap();
    for c in 0..per {
        writeln!(t, "x[{c}] = exp(x[{c}] - ms);").unwrap();
    }
    writeln!(t, "l = l * alpha + {};", sum(&xs)).unwrap();
    for c in 0..per {
        writeln!(t, "ps[pb + {}] = f16(x[{c}]);", col(c)).unwrap();
    }
    cx.line(2, &t);
    // WGSL for the invocation's own row where it lies among the `rows` rows from `first` that
    // a pass through `ss` holds: `what(at, column)` for each of its `dv / 4` columns (taken at
    // its rotation), `at` the element's index in `ss`
    let q = dv / PER_ROW;
    let own_row = |first: usize, rows: usize, what: &dyn Fn(&str, &str) -> String| {
        let mut t = format!(
            "if (r >= {first}u && r < {}u) {{\n  let b = (r - {first}u) * {dv}u + h * {q}u;\n",
            first + rows
        );
        for c in 0..q {
            let at = format!("b + (rot + {c}u) % {q}u");
            let column = format!("h * {q}u + (rot + {c}u) % {q}u");
            writeln!(t, "  {}", what(&at, &column)).unwrap();
        }
        t.push('}');
        t
    };
    // the accumulators' rows times their `alpha`, through `ss`, where a reference moved
    cx.line(2, "if (workgroupUniformLoad(&live).y == 1u) {");
    cx.through_ss("ao", dv, COLS, true, 3, &|first, rows| {
        own_row(first, rows, &|at, _| {
            format!("ss[{at}] = ss[{at}] * alpha;")
        })
    });
    cx.line(2, "}");
    // P·V into the accumulators: A = P row-major, B = V row-major
    cx.line(2, "// P·V");
    cx.ps_times(va, "", (dv, COLS), ps, Dest::Accumulators("ao"));
    cx.line(1, "}");
    cx.line(1, "}");
    // the row's sum, then the results through `ss`
    let mut t = String::from("var lt = l;\n");
    for lane in (0..PER_ROW.ilog2()).map(|b| 1 << b) {
        writeln!(t, "lt = lt + subgroupShuffleXor(lt, {lane}u);").unwrap();
    }
    t.push_str("let i = row0 + r;");
    cx.line(1, &t);
    cx.through_ss("ao", dv, COLS, false, 1, &|first, rows| {
        format!(
            "if (i < SQ) {{\n{}\n}}",
            own_row(first, rows, &|at, column| o
                .store(&o.at("i", column), &format!("ss[{at}] / lt")))
        )
    });
    cx.line(
        1,
        &format!(
            "if (i < SQ && h == 0u) {{ {}[{}] = select(m + log(lt), {NAN}, m == {NEG_INF}); }}",
            l.stored(),
            l.at("i", "0u")
        ),
    );
    // the walk (the staging is unrolled)
    e.loop_trips(k.sk.div_ceil(COLS) as u64);
    let mut s = cx.s;
    s.push_str("}\n");
    (s, grid, bytes)
}

/// The backward's staged blocks `x1` (head dimension `d`) and `x2` (`dv`), each in its own
/// array (one array for both, with the second at an offset, cost the H200's driver 9% at
/// head dimension 64), with the halves of the arrays. The row block's operands, 64 rows each,
/// go through them first: side by side where the walked blocks are as long, else in turn
/// through `x1`, which is then as large as either.
fn backward_arrays(d: usize, dv: usize) -> ([(Staged<'static>, usize); 2], bool) {
    let cols = tc_backward_cols(d, dv);
    let (s1, s2) = (d + PAD, dv + PAD);
    let side_by_side = cols >= ROWS;
    let x1 = Staged {
        array: "x1",
        stride_name: "X1S",
        stride: s1,
    };
    let x2 = Staged {
        array: "x2",
        stride_name: "X2S",
        stride: s2,
    };
    let x1_halves = if side_by_side {
        cols * s1
    } else {
        (cols * s1).max(ROWS * s1.max(s2))
    };
    ([(x1, x1_halves), (x2, cols * s2)], side_by_side)
}

/// Writes the dQ or dK/dV kernel of `k` on tensor cores. Rows are queries
/// (dQ) or keys (dK/dV), 64 a workgroup; the walk takes the other side in blocks of
/// [`tc_backward_cols`]. The row block's operands (`Q`, `dO` or `K`, `V`) are loaded once into
/// registers as A operands; per block the other side's (`K`, `V` or `Q`, `dO`) are staged as
/// `f16` in `x1` (head dimension `d`) and `x2` (`dv`). `S` and `dP` come from the products
/// into `ss` one after the other; each invocation turns its elements into `P` and the score
/// gradient `G` in `f32` (as the plain kernels do) and writes `G` (and, for dK/dV, first `P`)
/// as `f16` to `ps`; the accumulated products (`dQ += G·K`, or `dV += Pᵀ·dO` and `dK += Gᵀ·Q`,
/// the tile being transposed) stay in cooperative accumulators for the whole walk and reach
/// the outputs through `ss` at the end.
pub fn emit_backward(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    e.cooperative_matrices();
    let (d, dv) = (k.d, k.dv);
    let cols = tc_backward_cols(d, dv);
    let nb = k.batch.len();
    let by_keys = k.spec.kind == FlashKind::BackwardDkDv;
    let (mut s, fixed) = score_functions(e, k);
    let ([(x1, n1), (x2, n2)], side_by_side) = backward_arrays(d, dv);
    let consts = [(x1.stride_name, x1.stride), (x2.stride_name, x2.stride)];
    let (ps, bytes) = header(&mut s, &consts, &[(x1.array, n1), (x2.array, n2)], cols);
    let (rows_len, cols_len) = if by_keys { ("SK", "SQ") } else { ("SQ", "SK") };
    let grid = launch(e, &mut s, k);
    writeln!(s, "    let row0 = blk * {ROWS}u;").unwrap();
    let q = bind(&mut s, e, "q", &k.q, nb);
    let kk = bind(&mut s, e, "k", &k.k, nb);
    let v = bind(&mut s, e, "v", &k.v, nb);
    let d_o = bind(&mut s, e, "do", k.d_o.as_ref().expect("dO"), nb);
    let lse = bind(&mut s, e, "lse", k.lse.as_ref().expect("L"), nb);
    let delta = bind(&mut s, e, "dd", k.delta.as_ref().expect("D"), nb);
    // dO, and so dP, D and the score gradient, scaled by a power of two (`FlashScale`), the
    // results by its inverse: exact, and the f16 operands stay clear of underflow
    let maxima = k.d_o_scale.as_ref().expect("dO maxima");
    let chunks = maxima.shape[maxima.rank() - 2];
    let maxima_mat = bind(&mut s, e, "gm", maxima, nb);
    s.push_str(&gradient_scale(&maxima_mat, chunks));
    let outs: Vec<Mat> = (0..k.outputs.len())
        .map(|i| bind_result(&mut s, e, &format!("out{i}"), k, i))
        .collect();
    let mut cx = body(s, nb, fixed);
    // the row block's operands (A, row-major) and the walked side's (B)
    let (a1, a2, b1, b2) = if by_keys {
        (&kk, &v, &q, &d_o)
    } else {
        (&q, &d_o, &kk, &v)
    };
    // the row block to the subgroups' registers, through `x1` and `x2` side by side, or
    // through `x1` in turn
    let score_tiles = (ROWS / SIDE) * (cols / SIDE) / SUBGROUPS;
    // dO is the row block's second operand (dQ) or the walked side's (dK/dV)
    let (row_scale, walk_scale) = if by_keys {
        ("", " * gs")
    } else {
        (" * gs", "")
    };
    let second = if side_by_side {
        x2
    } else {
        Staged {
            array: x1.array,
            ..x2
        }
    };
    let both = [(a1, "fa", x1, d, ""), (a2, "fb", second, dv, row_scale)];
    let passes: Vec<&[_]> = if side_by_side {
        vec![&both]
    } else {
        both.chunks(1).collect()
    };
    for pass in passes {
        let mut t = String::new();
        for &(m, _, to, width, scale) in pass {
            t.push_str(&staged(m, to, width, scale, "row0", rows_len));
            t.push('\n');
        }
        t.push_str("workgroupBarrier();\n");
        for n in 0..score_tiles {
            for &(_, name, to, width, _) in pass {
                t.push_str(&fragments(n, name, to, width, cols));
            }
        }
        t.push_str("workgroupBarrier();");
        cx.line(1, &t);
    }
    // the accumulators: dQ (rows × d), or dK (rows × d) and dV (rows × dv)
    let accumulators: Vec<(&str, usize)> = if by_keys {
        vec![("ak", d), ("av", dv)]
    } else {
        vec![("aq", d)]
    };
    let mut t = String::new();
    for &(name, width) in &accumulators {
        for n in 0..(ROWS / SIDE) * (width / SIDE) / SUBGROUPS {
            writeln!(t, "var {name}{n} = coop_mat16x16<f32, C>();").unwrap();
        }
    }
    let per = cols / PER_ROW;
    let p1 = Prefetch {
        m: b1,
        reg: "p1",
        rows: cols,
        width: d,
        to: x1,
        scale: "",
    };
    let p2 = Prefetch {
        m: b2,
        reg: "p2",
        rows: cols,
        width: dv,
        to: x2,
        scale: walk_scale,
    };
    write!(
        t,
        "var x: array<f32, {per}>;\nvar y: array<f32, {per}>;\nlet blocks = ({cols_len} + {cols}u - 1u) / {cols}u;\n{}\n{}\nvar held = blocks;",
        p1.declare(),
        p2.declare()
    )
    .unwrap();
    if !by_keys {
        // the row's query: its L and D, once
        let i = "min(row0 + r, SQ - 1u)";
        write!(
            t,
            "\nlet lq = {};\nlet dq = {} * gs;",
            lse.load(i, "0u"),
            delta.load(i, "0u")
        )
        .unwrap();
    }
    cx.line(1, &t);
    cx.line(1, "for (var cb = 0u; cb < blocks; cb = cb + 1u) {");
    cx.line(1, &format!("let col0 = cb * {cols}u;"));
    let (r1, c1) = (
        format!("row0 + {}u", ROWS - 1),
        format!("col0 + {}u", cols - 1),
    );
    let (queries, keys) = if by_keys {
        (("col0", c1.as_str()), ("row0", r1.as_str()))
    } else {
        (("row0", r1.as_str()), ("col0", c1.as_str()))
    };
    let dead = cx.dead(queries, keys);
    cx.line(1, &if_live(&dead));
    // the walked blocks from the registers, the next ones fetched behind the products
    let (now, next) = pipelined(&[&p1, &p2], 2, "cb", cols_len, cols);
    cx.line(2, &now);
    cx.line(2, "workgroupBarrier();");
    cx.line(2, &next);
    // S (or Sᵀ) and dP (or dPᵀ): B = the staged block transposed (column-major)
    let col = |c: usize| format!("((rot + {c}u) % {per}u)");
    cx.line(
        2,
        &format!("let sb = r * {cols}u + h * {per}u;\nlet pb = r * PS + h * {per}u;"),
    );
    for (reg, a, x, width) in [("x", "fa", x1, d), ("y", "fb", x2, dv)] {
        cx.tiles(
            (ROWS / SIDE, cols / SIDE, width / SIDE),
            &|n, step| {
                (
                    format!("{a}{n}_{step}"),
                    format!(
                        "coopLoad<coop_mat16x16<f16, B>>({}, {})",
                        x.at(&format!("ct * {}u + {}u", SIDE * x.stride, SIDE * step)),
                        x.stride_name
                    ),
                )
            },
            Dest::Scores(cols),
        );
        let mut t = String::from("workgroupBarrier();\n");
        for c in 0..per {
            writeln!(t, "{reg}[{c}] = ss[sb + {}];", col(c)).unwrap();
        }
        t.push_str("workgroupBarrier();");
        cx.line(2, &t);
    }
    // P into x, G into y (see the plain kernels' `probabilities_and_gradients`)
    let (mut fast, mut general) = (String::new(), String::new());
    let corner = cx.coords(queries.0, keys.0);
    for c in 0..per {
        let other = format!("col0 + h * {per}u + {}", col(c));
        let (i, j) = if by_keys {
            (other.clone(), "row0 + r".to_string())
        } else {
            ("row0 + r".to_string(), other.clone())
        };
        let (lq, dq) = if by_keys {
            let ic = format!("min({i}, SQ - 1u)");
            (
                lse.load(&ic, "0u"),
                format!("{} * gs", delta.load(&ic, "0u")),
            )
        } else {
            ("lq".to_string(), "dq".to_string())
        };
        let co = cx.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)"));
        writeln!(
            fast,
            "{{ let pr = exp(score(x[{c}], {corner}) - {lq}); y[{c}] = dscore(pr * (y[{c}] - {dq}), {corner}); x[{c}] = pr; }}"
        )
        .unwrap();
        writeln!(
            general,
            "{{ let live = {i} < SQ && {j} < SK; let pr = select(0.0, exp(score(x[{c}], {co}) - {lq}), live); y[{c}] = select(0.0, dscore(pr * (y[{c}] - {dq}), {co}), live); x[{c}] = pr; }}"
        )
        .unwrap();
    }
    cx.scores(queries, keys, &fast, &general);
    // the accumulated products: A = P or G from `ps` (row-major), B = a staged block
    // (row-major)
    let write = |reg: &str| {
        let mut t = String::new();
        for c in 0..per {
            writeln!(t, "ps[pb + {}] = f16({reg}[{c}]);", col(c)).unwrap();
        }
        t.push_str("workgroupBarrier();");
        t
    };
    let products = if by_keys {
        vec![("x", "av", x2, dv), ("y", "ak", x1, d)]
    } else {
        vec![("y", "aq", x1, d)]
    };
    for (i, &(reg, acc, x, width)) in products.iter().enumerate() {
        if i > 0 {
            // every subgroup done reading `ps` before it is written again
            cx.line(2, "workgroupBarrier();");
        }
        cx.line(2, &write(reg));
        cx.ps_times(x, "", (width, cols), ps, Dest::Accumulators(acc));
    }
    cx.line(1, "}");
    cx.line(1, "}");
    // the results through `ss`, eight tiles at a time
    for (out, &(acc, width)) in outs.iter().zip(&accumulators) {
        cx.write_accumulator(acc, width, out, rows_len, cols, " * ugs");
    }
    // the walk and the results' loops (the staging is unrolled)
    let walked = if by_keys { k.sq } else { k.sk };
    let results: usize = accumulators.iter().map(|&(_, w)| ROWS * w / THREADS).sum();
    e.loop_trips(walked.div_ceil(cols) as u64 + results as u64 + chunks as u64);
    let mut s = cx.s;
    s.push_str("}\n");
    (s, grid, bytes)
}

/// Declares the constants `consts` (name, value), the staged `f16` arrays `arrays` (name,
/// halves), `ss` (64 rows of the walked block's `cols` words, `f32`), `ps` (the same in `f16`,
/// padded) and the block-skip verdict, and opens `main` with the invocation's row `r`, quarter
/// `h` and rotation `rot`; returns the stride of `ps` and the bytes of workgroup memory
/// declared.
fn header(
    s: &mut String,
    consts: &[(&str, usize)],
    arrays: &[(&str, usize)],
    cols: usize,
) -> (usize, u32) {
    let ps = cols + PAD;
    for &(name, value) in consts.iter().chain(&[("PS", ps)]) {
        writeln!(s, "const {name}: u32 = {value}u;").unwrap();
    }
    let declared = arrays
        .iter()
        .map(|&(name, n)| (name, "f16", n))
        .chain([("ss", "f32", ROWS * cols), ("ps", "f16", ROWS * ps)]);
    for (name, ty, n) in declared {
        writeln!(s, "var<workgroup> {name}: array<{ty}, {n}>;").unwrap();
    }
    // a whole quad: the H200's driver places the arrays after it, and a cooperative load from
    // an array that starts off a 16-byte boundary reads from the boundary below (a `u32` here
    // shifted every operand by two halves)
    writeln!(s, "var<workgroup> live: vec4<u32>;").unwrap();
    writeln!(s, "@compute @workgroup_size({THREADS})").unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_id) sg_id: u32) {{"
    )
    .unwrap();
    // the row an invocation owns, its share of the columns and its rotation (see `rotation`);
    // the PER_ROW invocations of a row are neighbouring lanes of one subgroup
    let (spread, quarters) = rotation(cols);
    writeln!(
        s,
        "    let me = sg_id * sg_size + sg_lane;\n    let r = me / {PER_ROW}u;\n    let h = me % {PER_ROW}u;\n    let rot = {spread}u * (r % {}u) + h / {quarters}u;",
        sinter_ir::artifact::COOPERATIVE_SUBGROUP_SIZE as usize / PER_ROW,
    )
    .unwrap();
    let halves: usize = arrays.iter().map(|a| a.1).sum();
    (ps, workgroup_bytes(halves, cols) as u32)
}

/// The rotation `rot = spread · (r % 8) + h / quarters` at which the invocation of row `r` and
/// quarter `h` reads its `cols / 4` columns of a row of `ss` (column `(rot + c) % (cols / 4)`
/// of its quarter at step `c`), so that the 32 lanes of a subgroup (8 rows, 4 quarters) read
/// 32 distinct banks: the rows start in one bank (`cols` is a multiple of 32 words), the
/// quarters `quarters` apart start in one bank too, and the rotation spreads the lanes that
/// share a start over the quarter's columns.
fn rotation(cols: usize) -> (usize, usize) {
    let spread = PER_ROW * (cols / PER_ROW) / BANKS;
    (spread, PER_ROW / spread)
}

/// WGSL binding `{name}{n}_{step}` to the A operands (16 × 16, row-major) of the rows of the
/// subgroup's score tile `sg_id + 8n` (of a row of `cols / 16` tiles), `width` halves deep,
/// from the staged row block `x`.
fn fragments(n: usize, name: &str, x: Staged, width: usize, cols: usize) -> String {
    let mut t = String::new();
    for step in 0..width / SIDE {
        let at = x.at(&format!(
            "((sg_id + {}u) / {}u) * {}u + {}u",
            n * SUBGROUPS,
            cols / SIDE,
            SIDE * x.stride,
            SIDE * step
        ));
        writeln!(
            t,
            "let {name}{n}_{step} = coopLoadT<coop_mat16x16<f16, A>>({at}, {});",
            x.stride_name
        )
        .unwrap();
    }
    t
}

/// The emitter state of a tensor-core kernel (its 64 × 64 blocks are tiling A's shape, which
/// the shared helpers read).
fn body(s: String, nb: usize, fixed: Option<Vec<String>>) -> Body {
    Body {
        s,
        nb,
        fixed,
        stages: 0,
        t: Tiling::A,
        lay: Layout::of(&Tiling::A),
        indent: 0,
    }
}

/// Opens the block's body where `dead` (a WGSL bool) is false: naga takes `tile_dead`'s result
/// for non-uniform, `workgroupUniformLoad`'s for uniform, so the verdict passes through
/// workgroup memory.
fn if_live(dead: &str) -> String {
    format!(
        "if (lid == 0u) {{ live = vec4<u32>(select(1u, 0u, {dead}), 0u, 0u, 0u); }}\nif (workgroupUniformLoad(&live).x == 1u) {{"
    )
}

/// WGSL that stages 64 rows from `first` of `m` (`width` words each, times `scale` as in
/// [`Prefetch`]) to the block `to`, zero past `len`, through registers (as [`Prefetch`] does,
/// in its own scope).
fn staged(m: &Mat, to: Staged, width: usize, scale: &str, first: &str, len: &str) -> String {
    let p = Prefetch {
        m,
        reg: "staging",
        rows: ROWS,
        width,
        to,
        scale,
    };
    format!("{{\n{}\n{}{}}}", p.declare(), p.fetch(first, len), p.put())
}

/// The next block's operands, fetched into registers while the current block's products run
/// (the global loads' latency hidden behind them), and written to the staged block `to` when
/// that block comes: `rows` rows of `width` words of `m`, into the register array `reg`.
struct Prefetch<'a> {
    m: &'a Mat,
    reg: &'static str,
    rows: usize,
    width: usize,
    to: Staged<'a>,
    /// A WGSL factor the values are multiplied by before they are rounded to `f16` (` * gs`
    /// for `dO` in the backward), or empty.
    scale: &'a str,
}

impl Prefetch<'_> {
    /// Values of a block that each invocation stages.
    fn per_thread(&self) -> usize {
        self.rows * self.width / THREADS
    }

    /// Declares the register array.
    fn declare(&self) -> String {
        format!("var {}: array<f16, {}>;", self.reg, self.per_thread())
    }

    /// WGSL that fetches the block's rows from `first` (zero past `len`) into the registers,
    /// unrolled (the registers are indexed by constants only).
    fn fetch(&self, first: &str, len: &str) -> String {
        let mut t = String::new();
        for n in 0..self.per_thread() {
            let e = format!("lid + {}u", n * THREADS);
            let (j, c) = (
                format!("({e}) / {}u", self.width),
                format!("({e}) % {}u", self.width),
            );
            writeln!(
                t,
                "{{ let g = {first} + {j}; {}[{n}] = f16(select(0.0, {}{}, g < {len})); }}",
                self.reg,
                self.m.load(&format!("min(g, {len} - 1u)"), &c),
                self.scale,
            )
            .unwrap();
        }
        t
    }

    /// WGSL that writes the registers to the staged block.
    fn put(&self) -> String {
        let mut t = String::new();
        let x = &self.to;
        for n in 0..self.per_thread() {
            let e = format!("lid + {}u", n * THREADS);
            writeln!(
                t,
                "{}[(({e}) / {w}u) * {} + ({e}) % {w}u] = {}[{n}];",
                x.array,
                x.stride_name,
                self.reg,
                w = self.width
            )
            .unwrap();
        }
        t
    }
}

/// WGSL for the walk's block `block` (the loop variable, its blocks `cols` long): `now` makes
/// the registers of `operands` hold it (a block after a skipped one was not prefetched;
/// `held`, uniform, records which block they hold) and writes the first `put` of them to
/// their staged blocks; `next`, once those are behind a barrier, fetches the block after it
/// into their registers. (The others are the caller's to write, then fetch.)
fn pipelined(
    operands: &[&Prefetch],
    put: usize,
    block: &str,
    len: &str,
    cols: usize,
) -> (String, String) {
    let mut now = format!("if (held != {block}) {{\n");
    for o in operands {
        now.push_str(&o.fetch("col0", len));
    }
    now.push_str("}\n");
    let mut next = format!("held = {block} + 1u;\n");
    for o in &operands[..put] {
        now.push_str(&o.put());
        next.push_str(&o.fetch(&format!("col0 + {cols}u"), len));
    }
    (now, next)
}

/// Where [`Body::tiles`] puts a product's result tiles.
#[derive(Clone, Copy)]
enum Dest<'a> {
    /// Stored row-major to `ss`, rows of this many words.
    Scores(usize),
    /// Added to the cooperative accumulators `{name}{n}`.
    Accumulators(&'a str),
}

impl Body {
    /// Writes the accumulators `{acc}{n}` (the tiles of 64 rows × `width` columns, as
    /// [`Body::tiles`] divides them) to the rows of `out` below `len`, times `scale` (a WGSL
    /// factor), through `ss` (64 × `cols` words) in as few passes as it takes.
    fn write_accumulator(
        &mut self,
        acc: &str,
        width: usize,
        out: &Mat,
        len: &str,
        cols: usize,
        scale: &str,
    ) {
        self.through_ss(acc, width, cols, false, 1, &|first, rows| {
            format!(
                "for (var n = 0u; n < {}u; n = n + 1u) {{ let e = lid + n * {THREADS}u; let i = {first}u + e / {width}u; let c = e % {width}u; if (row0 + i < {len}) {{ {} }} }}",
                rows * width / THREADS,
                out.store(&out.at("row0 + i", "c"), &format!("ss[e]{scale}"))
            )
        });
    }

    /// Passes the accumulators `{acc}{n}` (the tiles of 64 rows × `width` columns, as
    /// [`Body::tiles`] divides them: tile `sg_id + 8n` of a row of `width / 16` tiles, so each
    /// `n` covers whole rows, 2048 words) through `ss` (64 × `cols` words), in as few passes as
    /// it takes. A pass stores them row-major from `ss[0]`, and once a barrier has passed runs
    /// `each(first, rows)`: WGSL for the pass's `rows` rows from row `first`, at row stride
    /// `width`. Where `back`, another barrier, then the accumulators are loaded back from `ss`.
    /// The WGSL goes at `indent`.
    fn through_ss(
        &mut self,
        acc: &str,
        width: usize,
        cols: usize,
        back: bool,
        indent: usize,
        each: &dyn Fn(usize, usize) -> String,
    ) {
        let tiles = width / SIDE;
        let rows = SUBGROUPS / tiles * SIDE;
        let words = rows * width;
        let (count, per_pass) = (ROWS / rows, (ROWS * cols / words).max(1));
        for first in (0..count).step_by(per_pass) {
            let at = |n: usize| {
                format!(
                    "&ss[{}u + (sg_id / {tiles}u) * {}u + (sg_id % {tiles}u) * {SIDE}u]",
                    (n - first) * words,
                    SIDE * width
                )
            };
            let ns = first..count.min(first + per_pass);
            let mut t = String::from("workgroupBarrier();\n");
            for n in ns.clone() {
                // naga 30 writes SPIR-V for a cooperative store only from plain `let` operands
                writeln!(
                    t,
                    "{{ let res = {acc}{n}; coopStoreT(res, {}, {width}u); }}",
                    at(n)
                )
                .unwrap();
            }
            writeln!(
                t,
                "workgroupBarrier();\n{}",
                each(first * rows, ns.len() * rows)
            )
            .unwrap();
            if back {
                t.push_str("workgroupBarrier();\n");
                for n in ns {
                    writeln!(
                        t,
                        "{acc}{n} = coopLoadT<coop_mat16x16<f32, C>>({}, {width}u);",
                        at(n)
                    )
                    .unwrap();
                }
            }
            self.line(indent, &t);
        }
    }

    /// The product of `ps` (64 rows × `depth`, row-major, at row stride `ps`) and the `width`
    /// columns from `first` (a WGSL term: empty, or ending in ` + `) of the staged block `x`
    /// (row-major), its tiles put where `dest` says.
    fn ps_times(
        &mut self,
        x: Staged,
        first: &str,
        (width, depth): (usize, usize),
        ps: usize,
        dest: Dest,
    ) {
        self.tiles(
            (ROWS / SIDE, width / SIDE, depth / SIDE),
            &|_, step| {
                (
                    format!(
                        "coopLoadT<coop_mat16x16<f16, A>>(&ps[rt * {}u + {}u], PS)",
                        SIDE * ps,
                        SIDE * step
                    ),
                    format!(
                        "coopLoadT<coop_mat16x16<f16, B>>({}, {})",
                        x.at(&format!(
                            "{first}{}u + ct * {SIDE}u",
                            SIDE * step * x.stride
                        )),
                        x.stride_name
                    ),
                )
            },
            dest,
        );
    }

    /// The `rows × cols` result tiles (16 × 16) of a product of `steps` 16-deep steps, tile
    /// `sg_id + 8n` to subgroup `sg_id` (`n` unrolled), put where `dest` says.
    /// `operands(n, step)` gives the A and B operands of a step, in terms of the tile's `rt`
    /// and `ct`.
    fn tiles(
        &mut self,
        (rows, cols, steps): (usize, usize, usize),
        operands: &dyn Fn(usize, usize) -> (String, String),
        dest: Dest,
    ) {
        debug_assert!((rows * cols).is_multiple_of(SUBGROUPS));
        let mut t = String::new();
        for n in 0..rows * cols / SUBGROUPS {
            writeln!(
                t,
                "{{\n  let tile = sg_id + {}u;\n  let rt = tile / {cols}u;\n  let ct = tile % {cols}u;",
                n * SUBGROUPS
            )
            .unwrap();
            let acc = match dest {
                Dest::Accumulators(name) => format!("{name}{n}"),
                Dest::Scores(_) => {
                    t.push_str("  var acc = coop_mat16x16<f32, C>();\n");
                    "acc".to_string()
                }
            };
            for step in 0..steps {
                let (a, b) = operands(n, step);
                writeln!(t, "  {acc} = coopMultiplyAdd({a}, {b}, {acc});").unwrap();
            }
            if let Dest::Scores(words) = dest {
                // naga 30 writes SPIR-V for a cooperative store only from plain `let` operands
                writeln!(
                    t,
                    "  let res = acc;\n  let at = rt * {}u + ct * {SIDE}u;\n  coopStoreT(res, &ss[at], {words}u);",
                    SIDE * words
                )
                .unwrap();
            }
            t.push_str("}\n");
        }
        self.line(2, &t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::variant::{TC_MAX_FORWARD_DIM, tc_takes_shape};
    const SUBGROUP_SIZE: usize = sinter_ir::artifact::COOPERATIVE_SUBGROUP_SIZE as usize;

    /// Every head dimension the forms take fits the H200's 48 KiB of workgroup memory, every
    /// array stays a multiple of 16 bytes (so each starts on a 16-byte boundary), and so does
    /// the backward's second staged block within `xs`.
    #[test]
    fn tiles_fit_and_stay_aligned() {
        let f32 = DType::F32.size_bytes();
        let f16 = f32 / 2;
        let check = |arrays: &[usize], cols: usize, what: &str| {
            let halves: usize = arrays.iter().sum();
            assert!(workgroup_bytes(halves, cols) <= WORKGROUP_BYTES, "{what}");
            for bytes in arrays
                .iter()
                .map(|n| n * f16)
                .chain([ROWS * (cols + PAD) * f16, ROWS * cols * f32])
            {
                assert_eq!(bytes % 16, 0, "{what}");
            }
        };
        let (mut forwards, mut backwards) = (0, 0);
        for d in (SIDE..=TC_MAX_FORWARD_DIM).step_by(SIDE) {
            for dv in (SIDE..=TC_MAX_FORWARD_DIM).step_by(SIDE) {
                let what = format!("d {d} dv {dv}");
                if tc_takes_shape(FlashKind::Forward, d, dv) {
                    forwards += 1;
                    let arrays: Vec<usize> = forward_arrays(d, dv).iter().map(|a| a.1).collect();
                    check(&arrays, COLS, &what);
                }
                if tc_takes_shape(FlashKind::BackwardDq, d, dv) {
                    backwards += 1;
                    let cols = tc_backward_cols(d, dv);
                    let ([(_, n1), (_, n2)], side_by_side) = backward_arrays(d, dv);
                    check(&[n1, n2], cols, &what);
                    // the row block's operands fit, side by side or in turn through `x1`
                    let need = if side_by_side {
                        ROWS * (d + PAD)
                    } else {
                        ROWS * (d.max(dv) + PAD)
                    };
                    assert!(
                        need <= n1 && (!side_by_side || ROWS * (dv + PAD) <= n2),
                        "{what}"
                    );
                }
            }
        }
        // d: 16, 32, ..., 128; dv: 32, 64, 128; the backward's 32, 64, 128 both
        assert_eq!((forwards, backwards), (8 * 3, 3 * 3));
        assert!(!tc_takes_shape(FlashKind::BackwardDq, 96, 96));
        assert!(tc_takes_shape(FlashKind::Forward, 128, 128));
        assert!(shares_staging(128, 128) && !shares_staging(64, 64));
        assert!(!tc_takes_shape(FlashKind::Forward, 64, 96));
        assert!(tc_takes_shape(FlashKind::BackwardDq, 128, 128));
        assert!(!tc_takes_shape(FlashKind::BackwardDkDv, 128, 48));
        assert_eq!(
            (tc_backward_cols(64, 64), tc_backward_cols(64, 128)),
            (64, 32)
        );
    }

    /// At every walked-block width, a subgroup's 32 lanes read `ss` from 32 distinct banks at
    /// every step.
    #[test]
    fn rotated_reads_take_distinct_banks() {
        for cols in [COLS, COLS / 2] {
            let per = cols / PER_ROW;
            let (spread, quarters) = rotation(cols);
            for c in 0..per {
                let mut banks: Vec<usize> = (0..SUBGROUP_SIZE)
                    .map(|me| {
                        let (r, h) = (me / PER_ROW, me % PER_ROW);
                        let rot = spread * (r % (SUBGROUP_SIZE / PER_ROW)) + h / quarters;
                        (r * cols + h * per + (rot + c) % per) % BANKS
                    })
                    .collect();
                banks.sort_unstable();
                banks.dedup();
                assert_eq!(banks.len(), BANKS, "cols {cols} step {c}");
            }
        }
    }

    /// Eight consecutive padded `f16` rows start in eight distinct 16-byte bank groups (a
    /// row's length in 16-byte units is odd), so a cooperative load's 8 rows never collide.
    #[test]
    fn padded_rows_spread_over_the_banks() {
        for width in (SIDE..=TC_MAX_FORWARD_DIM)
            .step_by(SIDE)
            .chain([COLS, COLS / 2])
        {
            let units = (width + PAD) * DType::F32.size_bytes() / 2 / 16;
            assert_eq!(units % 2, 1, "{width}");
        }
    }
}
