//! WGSL for flash attention (see [`crate::flash`]): the forward, the key-block backward (dK,
//! dV) and the query-block backward (dQ), tiled so that no `[Sq, Sk]` value reaches memory.
//!
//! **Tiling** ([`Tiling`], the kernel's variant: [`crate::flash::variant`]). A workgroup of
//! `TX · TY` threads, a grid `(tx, ty)`, owns a block of `BR` "rows" (queries for the forward
//! and dQ, keys for dK/dV) and walks the "columns" (the other side) in blocks of `BC`. Thread
//! `(tx, ty)` holds the `RA × CB` score micro-tile of rows `ty + TY·a` and columns
//! `tx + TX·b` (`RA = BR/TY`, `CB = BC/TX`) in registers, as `vec4`s of four columns, and
//! accumulates the same rows' outputs over the column quads `tx + TX·q` (columns
//! `4·(tx + TX·q) ..+ 4`, q < ⌈width / 4·TX⌉) as `vec4`s. [`Tiling::B`] (128 × 64, 16 × 16
//! threads, 8 × 4) is the default, the fastest measured; a kernel whose accumulators would
//! pass its register budget falls back to [`Tiling::A`] (64 × 64, 4 × 4; with B: dK/dV at head
//! dims above 128, dQ above 192).
//!
//! **Stages.** All operands reach workgroup memory (one `array<vec4<f32>>`, ≤ 32 KiB) in
//! *stages* of whole `vec4`s per thread, double-buffered: a stage is stored, a barrier passes,
//! the next stage's global loads are issued into registers, the stage is computed, the next one
//! is stored into the other buffer, a barrier passes — one barrier per stage, global latency
//! hidden behind the products. A head-dimension product (`Q·Kᵀ`, `dO·Vᵀ`) stages `DC`-wide
//! chunks of both operands row-major (rows padded by one quad, so the `vec4` reads of 8
//! consecutive threads fall in distinct banks) and reads them as `vec4`s along the head
//! dimension; a column product (`P·V`, `G·K`, …) reads the tile (`P` or `G`, `BR` rows of
//! `BC / parts` columns padded by one quad, over the product buffers) as `vec4`s along its row
//! and the streamed operand as `vec4`s along its width, as many rows a stage as 256 quads
//! hold (at most half a part). A tiling whose tile would not fit publishes it in column parts, one after the other.
//! Loops over stages have compile-time trip counts; the head dimensions are WGSL constants.
//!
//! **Softmax.** The forward's row maxima combine the `TX` threads of a row through workgroup
//! memory once per block; the row sums stay per thread (each rescaled by the row's common
//! factor) and combine once at the end. The maxima take WGSL's `max`, not the NaN-propagating
//! `max_nan`: a NaN score makes its row NaN through `exp(NaN − m)` whatever `m` is.
//!
//! **Special values.** A skipped block is skipped whole: a NaN or infinity in a key, value or
//! query that the mask hides from a whole block does not reach that block's rows through the
//! `0 · NaN` of the masked products, as it does in the unfused graph (and in every
//! FlashAttention). Within live blocks the products are the semantics' own.
//!
//! **Masks.** The score function is the graph's own program, called per element; a column
//! block is skipped, in uniform control flow, when an interval evaluation of that program over
//! the block's coordinate ranges proves every score `-inf` (causal and window masks), which
//! halves a causal attention's work. A second interval evaluation (`score_fixed`, and
//! `dscore_fixed` for the backward's) proves a whole block's mask uniform (below a causal
//! diagonal, inside a window's band): every value through which the coordinates reach the
//! score is one value over the block, so the block's elements call the score functions with
//! its corner's coordinates, which the shader compiler hoists, and skip the ragged-edge tests
//! (3–4% of a causal forward + backward on the H200).
//!
//! **Tensor cores.** A kernel whose variant is [`Form::TensorCores`] runs its products as
//! cooperative matrices of `f16` operands ([`coop`]); the whole backward and other shapes keep
//! the `f32` forms here.
//!
//! **Limits.** Any sequence lengths (ragged blocks are masked), head dimensions up to 256 (the
//! accumulators are registers), batch axes with broadcasting. An invocation runs
//! `⌈S/BC⌉ · (1 + stages)` loop iterations, stages being `⌈d/DC⌉` per head-dimension product
//! and `BC` / rows-per-stage per column product; barriers sit in uniform control flow.

use std::fmt::Write;

use sinter_ir::{DType, Op};

use super::fused::emit_elementwise_fn;
use super::{Emitter, MAX_GROUPS, NAN, NEG_INF, decompose};
use crate::flash::FlashKind;
use crate::flash::variant::{Form, LaunchOrder, MAX_HEAD_DIM, Tiling};
use crate::fused::{Inst, Program, Scalar};
use crate::kernel::Flash;
use crate::kernel::FusedKernel;
use crate::layout::View;
use sinter_ir::artifact::Storage;

pub mod coop;

/// Words per `vec4<f32>` quad.
const QUAD: usize = 4;
/// Workgroup memory, in quads: the 32 KiB a browser grants.
const SHARED_QUADS: usize = 2048;
/// Quads of one column-product stage buffer.
const X_SLOT: usize = 256;

/// Where things live in workgroup memory, in quads. Product stages: two buffers of `p_slot`,
/// each the `BR` rows of `A` then the `BC` of `B`, rows of `DC` words padded to `p_row` quads.
/// The tile (`P` or `G`): `BR` rows of `t_row` quads at 0, over the product buffers (it is
/// written after the products and read before the next block's). Column-product stages: two
/// buffers of `X_SLOT` at `x_at`. The forward's row statistics: `BR` rows of `TX` words at
/// `red_at`. The column buffers follow the product buffers and the statistics follow them
/// when all fits in 32 KiB; otherwise the column buffers follow the tile (the products are
/// done when they are stored) and the statistics lie over the second column buffer (they are
/// read before it is first stored).
struct Layout {
    p_row: usize,
    p_b: usize,
    p_slot: usize,
    t_row: usize,
    x_at: usize,
    red_at: usize,
    red_quads: usize,
}

impl Layout {
    fn of(t: &Tiling) -> Layout {
        let p_row = t.chunk / QUAD + 1;
        let p_slot = (t.rows + t.cols) * p_row;
        let t_row = t.cols / t.parts / QUAD + 1;
        let tile = t.rows * t_row;
        let red_quads = t.rows * t.threads_x / QUAD;
        let x_at = (2 * p_slot).max(tile);
        let spread = Layout {
            p_row,
            p_b: t.rows * p_row,
            p_slot,
            t_row,
            x_at,
            red_at: x_at + 2 * X_SLOT,
            red_quads,
        };
        if spread.quads(true) <= SHARED_QUADS {
            spread
        } else {
            Layout {
                x_at: tile,
                red_at: tile + X_SLOT,
                ..spread
            }
        }
    }

    /// The workgroup memory a kernel declares.
    fn quads(&self, forward: bool) -> usize {
        let q = (2 * self.p_slot).max(self.x_at + 2 * X_SLOT);
        if forward {
            q.max(self.red_at + self.red_quads)
        } else {
            q
        }
    }
}

/// `name` when there is one of it, else `name{i}`.
fn indexed(name: &str, i: usize, n: usize) -> String {
    if n == 1 {
        name.to_string()
    } else {
        format!("{name}{i}")
    }
}

/// A thread's `i`-th stage quad of a workgroup of `threads`: `lid`, then `(lid + i·threads)`.
fn stage_quad(i: usize, threads: usize) -> String {
    if i == 0 {
        "lid".to_string()
    } else {
        format!("(lid + {}u)", i * threads)
    }
}

/// `items` summed as a balanced tree: `(a + b) + (c + d)`.
fn sum(items: &[String]) -> String {
    if items.len() == 1 {
        return items[0].clone();
    }
    let (l, r) = items.split_at(items.len().div_ceil(2));
    let side = |s: &[String]| {
        if s.len() == 1 {
            s[0].clone()
        } else {
            format!("({})", sum(s))
        }
    };
    format!("{} + {}", side(l), side(r))
}

/// The `max` of `items` as a balanced tree.
fn max_all(items: &[String]) -> String {
    if items.len() == 1 {
        return items[0].clone();
    }
    let (l, r) = items.split_at(items.len().div_ceil(2));
    format!("max({}, {})", max_all(l), max_all(r))
}

/// A per-row value of a thread's `ra` rows, every entry `init`.
fn per_row(ra: usize, init: &str) -> String {
    if ra == QUAD {
        format!("vec4<f32>({init})")
    } else {
        format!("array<f32, {ra}>({})", vec![init; ra].join(", "))
    }
}

/// An operand read, or a result written, as `[batch.., rows, cols]`: its arena, base word and
/// the param words of its strides.
struct Mat {
    arena: String,
    /// The arena's storage: an `f16` arena's loads widen to `f32`, exactly.
    storage: Storage,
    /// The dtype of the elements: results stored as `f16` values are rounded as a `cast`
    /// rounds ([`crate::kernel::Flash::result_dtype`]); operands are read as they are stored.
    dtype: DType,
    base: String,
    batch: Vec<String>,
    row: String,
    col: String,
}

impl Mat {
    /// `name` names its param words.
    fn new(e: &mut Emitter, v: &View, nb: usize, name: &str) -> Mat {
        let r = v.rank();
        debug_assert_eq!(r, nb + 2, "{v:?}");
        Mat {
            arena: e.arena(v.buffer),
            storage: e.storage(v.buffer),
            dtype: DType::F32,
            base: e.base(v.buffer, v.offset, name),
            batch: (v.strides[..nb].iter().enumerate())
                .map(|(a, &s)| e.param(s, &format!("{name}.stride[b{a}]")))
                .collect(),
            row: e.param(v.strides[r - 2], &format!("{name}.stride[row]")),
            col: e.param(v.strides[r - 1], &format!("{name}.stride[col]")),
        }
    }

    /// The word address of the batch element's `[row, col]` (row and col as WGSL u32 exprs).
    fn at(&self, row: &str, col: &str) -> String {
        format!(
            "{}_base + ({row}) * {} + ({col}) * {}",
            self.base, self.row, self.col
        )
    }

    /// The element at `[row, col]`, as `f32`.
    fn load(&self, row: &str, col: &str) -> String {
        let x = format!("{}[{}]", self.arena, self.at(row, col));
        if self.storage == Storage::Half {
            format!("f32({x})")
        } else {
            x
        }
    }

    /// The statement that stores the f32 `value` at word `at`, as the result's dtype and the
    /// arena's storage hold it.
    fn store(&self, at: &str, value: &str) -> String {
        crate::codegen::store(&self.arena, at, value, self.dtype, self.storage)
    }

    /// The arena of an `f32` result (the log-sum-exp, maxima, `dQ` partial sums), which
    /// statements read back as well as write.
    fn stored(&self) -> &str {
        debug_assert!(self.dtype == DType::F32 && self.storage == Storage::Word);
        &self.arena
    }
}

/// Binds result `i` of `k` as [`bind`] does, with the dtype the kernel stores it in.
fn bind_result(s: &mut String, e: &mut Emitter, name: &str, k: &Flash, i: usize) -> Mat {
    let nb = k.batch.len();
    Mat {
        dtype: k.result_dtype(i),
        ..bind(s, e, name, &k.outputs[i], nb)
    }
}

/// Binds `let NAME_base = base + Σ b_a · stride_a;` and returns a [`Mat`] whose addresses use it.
fn bind(s: &mut String, e: &mut Emitter, name: &str, v: &View, nb: usize) -> Mat {
    let m = Mat::new(e, v, nb, name);
    let mut expr = m.base.clone();
    for (a, st) in m.batch.iter().enumerate() {
        write!(expr, " + b{a} * {st}").unwrap();
    }
    writeln!(s, "    let {name}_base = {expr};").unwrap();
    Mat {
        base: name.to_string(),
        ..m
    }
}

/// Writes the flash kernel `k` in its variant's form; returns the body, the grid and the
/// workgroup memory in bytes.
pub fn emit(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    // Workgroup and register arrays are indexed by tile coordinates within their sizes; global
    // reads clamp their rows and columns (`min(.., len - 1)`) and writes are masked to the
    // extents, so naga's clamps are redundant (they cost these kernels 12%).
    e.indices_in_range();
    let t = match k.variant.form {
        Form::TensorCores => return coop::emit(e, k),
        Form::Plain(t) => t,
    };
    let lay = Layout::of(&t);
    let nb = k.batch.len();
    if k.d > MAX_HEAD_DIM || k.dv > MAX_HEAD_DIM {
        e.refuse(
            "flash attention",
            format!(
                "head dimensions {} and {} pass the {MAX_HEAD_DIM} its register accumulators hold",
                k.d, k.dv
            ),
        );
    }
    let (mut s, fixed) = score_functions(e, k);
    let forward = k.spec.kind == FlashKind::Forward;
    let quads = lay.quads(forward);
    writeln!(s, "const D: u32 = {}u;\nconst DV: u32 = {}u;", k.d, k.dv).unwrap();
    writeln!(s, "var<workgroup> sm: array<vec4<f32>, {quads}>;").unwrap();
    writeln!(s, "@compute @workgroup_size({})", t.threads()).unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    )
    .unwrap();
    let tx = t.threads_x;
    writeln!(s, "    let tx = lid % {tx}u;\n    let ty = lid / {tx}u;").unwrap();
    // per-thread quad offsets: a product stage's store, the A and B rows read, the tile's
    // element written (quad and component) and its rows read
    let (cq, p_row, t_row) = (t.chunk / QUAD, lay.p_row, lay.t_row);
    writeln!(
        s,
        "    let st_p = (lid / {cq}u) * {p_row}u + lid % {cq}u;\n    let ra = ty * {p_row}u;\n    let rb = {}u + tx * {p_row}u;\n    let tw = ty * {t_row}u + tx / 4u;\n    let tc = tx % 4u;\n    let rt = ty * {t_row}u;",
        lay.p_b
    )
    .unwrap();
    let grid = launch(e, &mut s, k);
    if k.spec.kind != FlashKind::Backward {
        writeln!(s, "    let row0 = blk * {}u;", t.rows).unwrap();
    }
    let q = bind(&mut s, e, "q", &k.q, nb);
    let kk = bind(&mut s, e, "k", &k.k, nb);
    let v = bind(&mut s, e, "v", &k.v, nb);
    let mut cx = Body {
        s,
        nb,
        fixed,
        stages: 0,
        t,
        lay,
        indent: 0,
    };
    match k.spec.kind {
        FlashKind::Forward => {
            let o = bind_result(&mut cx.s, e, "o", k, 0);
            let l = bind_result(&mut cx.s, e, "l", k, 1);
            cx.forward(&q, &kk, &v, &o, &l, k);
        }
        FlashKind::BackwardDq | FlashKind::BackwardDkDv | FlashKind::Backward => {
            let d_o = bind(&mut cx.s, e, "do", k.d_o.as_ref().expect("dO"), nb);
            let lse = bind(&mut cx.s, e, "lse", k.lse.as_ref().expect("L"), nb);
            let delta = bind(&mut cx.s, e, "dd", k.delta.as_ref().expect("D"), nb);
            let outs: Vec<Mat> = (0..k.outputs.len())
                .map(|i| bind_result(&mut cx.s, e, &format!("out{i}"), k, i))
                .collect();
            let ops = Operands {
                q: &q,
                k: &kk,
                v: &v,
                d_o: &d_o,
                lse: &lse,
                delta: &delta,
            };
            match k.spec.kind {
                FlashKind::BackwardDq => cx.backward_dq(&ops, &outs[0], k),
                FlashKind::Backward => {
                    // the workgroup's own partial sum
                    let stride = e.param(k.dq_group_stride, "dq_group_stride");
                    cx.line(1, &format!("let dqp_base = out2_base + blk * {stride};"));
                    let dq = Mat {
                        base: "dqp".to_string(),
                        ..Mat::new(e, &k.outputs[2], nb, "dqp")
                    };
                    let groups = e.param(k.variant.blocks, "dq_groups");
                    cx.backward_dkdv(&ops, &outs[..2], Some((&dq, &groups)), k)
                }
                _ => cx.backward_dkdv(&ops, &outs, None, k),
            }
        }
    }
    // the column-block loop and, per block, the stage loops
    let trips = blocks_of_columns(k, &t) as u64;
    let walk = match k.spec.kind {
        FlashKind::Backward => k.sk.div_ceil(t.rows).div_ceil(k.variant.blocks) as u64,
        _ => 1,
    };
    e.loop_trips(walk * trips * (1 + cx.stages));
    let mut s = cx.s;
    s.push_str("}\n");
    (s, grid, (quads * 16) as u32)
}

/// The score function and its backward as WGSL functions of `(x, batch coords.., i, j)`, the
/// interval function `tile_dead`, and, where the score functions read nothing but `x` and the
/// coordinates, the `*_fixed` functions of [`Verdict::Fixed`] whose names it returns: a tile
/// over which their masks are uniform calls them with its corner's coordinates.
fn score_functions(e: &mut Emitter, k: &Flash) -> (String, Option<Vec<String>>) {
    let nb = k.batch.len();
    let mut s = String::new();
    let fk = |program: &Program, extras: &[View]| FusedKernel {
        program: program.clone(),
        operands: std::iter::once(k.q.clone())
            .chain(extras.iter().cloned())
            .collect(),
        outputs: Vec::new(),
    };
    s.push_str(&emit_elementwise_fn(
        e,
        &fk(&k.spec.score, &k.score_extras),
        "score",
        "x",
    ));
    if let Some(g) = &k.spec.dscore {
        s.push_str(&emit_elementwise_fn(
            e,
            &fk(g, &k.dscore_extras),
            "dscore",
            "x",
        ));
    }
    s.extend(interval_fn(&k.spec.score, nb, "score", Verdict::Dead));
    let fixed = (k.score_extras.is_empty() && k.dscore_extras.is_empty()).then(|| {
        let mut calls = Vec::new();
        let programs = std::iter::once(("score", &k.spec.score))
            .chain(k.spec.dscore.as_ref().map(|g| ("dscore", g)));
        for (name, program) in programs {
            if let Some(f) = interval_fn(program, nb, name, Verdict::Fixed) {
                s.push_str(&f);
                calls.push(format!("{name}_fixed"));
            }
        }
        calls
    });
    (s, fixed)
}

/// Writes the batch coordinates `b0..`, `SQ`, `SK` and the workgroup's block (or group of key
/// blocks) `blk` of the variant's blocks, in its launch order; returns the grid. Refuses a grid
/// past [`MAX_GROUPS`] on either axis.
fn launch(e: &mut Emitter, s: &mut String, k: &Flash) -> [u32; 3] {
    let blocks = k.variant.blocks;
    let batch: usize = k.batch.iter().product();
    if batch > MAX_GROUPS as usize || blocks > MAX_GROUPS as usize {
        e.refuse(
            "flash attention",
            format!(
                "{batch} batch entries of {blocks} blocks pass the {MAX_GROUPS} workgroups per axis of one dispatch"
            ),
        );
    }
    let dims = e.params(&k.batch, "batch");
    let order = k.variant.launch;
    let (bi, blk) = if order.batch_fastest() {
        ("wid.x", "wid.y")
    } else {
        ("wid.y", "wid.x")
    };
    decompose(s, "    ", bi, "b", &dims);
    let (sq, sk) = (e.param(k.sq, "SQ"), e.param(k.sk, "SK"));
    writeln!(s, "    let SQ = {sq};\n    let SK = {sk};").unwrap();
    if order == (LaunchOrder::HeaviestFirst { reversed: true }) {
        writeln!(s, "    let blk = {}u - {blk};", blocks - 1).unwrap();
    } else {
        writeln!(s, "    let blk = {blk};").unwrap();
    }
    if order.batch_fastest() {
        [batch as u32, blocks as u32, 1]
    } else {
        [blocks as u32, batch as u32, 1]
    }
}

/// Column blocks a workgroup walks.
fn blocks_of_columns(k: &Flash, t: &Tiling) -> usize {
    match k.spec.kind {
        FlashKind::Forward | FlashKind::BackwardDq => k.sk.div_ceil(t.cols),
        FlashKind::BackwardDkDv | FlashKind::Backward => k.sq.div_ceil(t.cols),
    }
}

/// The backward kernels' inputs.
struct Operands<'a> {
    q: &'a Mat,
    k: &'a Mat,
    v: &'a Mat,
    d_o: &'a Mat,
    lse: &'a Mat,
    delta: &'a Mat,
}

/// A block of rows of an operand: the matrix, its first row and its row count (WGSL exprs).
#[derive(Clone, Copy)]
struct Rows<'a> {
    m: &'a Mat,
    row0: &'a str,
    rows: &'a str,
}

/// `acc[a][b] = Σ_d A[a.row0 + ty + TY·a, d] · B[b.row0 + tx + TX·b, d]` over `d < len`, `acc`
/// an `array<vec4<f32>, RA · CB/4>` (quad `a · CB/4 + b/4`, component `b % 4`).
struct Product<'a> {
    acc: &'a str,
    a: Rows<'a>,
    b: Rows<'a>,
    len: usize,
}

/// `acc[a·nq + q] += Σ_c T[ty + TY·a, c] · X[x.row0 + c, 4·(tx + TX·q) ..+ 4]` over the block's
/// columns `c`, for the tile `T` in workgroup memory; `acc` an `array<vec4<f32>, RA·nq>`.
struct ColumnProduct<'a> {
    acc: &'a str,
    x: Rows<'a>,
    width: usize,
    /// Quads of the accumulator per row.
    nq: usize,
    /// Quads per staged row of X.
    row_quads: usize,
    /// X rows per stage.
    rows_per_stage: usize,
}

impl ColumnProduct<'_> {
    fn new<'a>(acc: &'a str, x: Rows<'a>, width: usize, t: &Tiling) -> ColumnProduct<'a> {
        let nq = t.nq(width);
        let row_quads = t.threads_x * nq;
        // a power of two that a part's columns hold an even number of times (the first stage
        // of every part uses buffer 0)
        let rows_per_stage = (1 << (X_SLOT / row_quads).ilog2()).min(t.cols / t.parts / 2);
        ColumnProduct {
            acc,
            x,
            width,
            nq,
            row_quads,
            rows_per_stage,
        }
    }
}

struct Body {
    s: String,
    nb: usize,
    /// The `*_fixed` interval functions of the score functions, when they read nothing but `x`
    /// and the coordinates (see [`Body::scores`]).
    fixed: Option<Vec<String>>,
    /// Stage-loop iterations per column block.
    stages: u64,
    t: Tiling,
    lay: Layout,
    /// Indentation added to every line (inside the whole backward's walk over key blocks).
    indent: usize,
}

const COMP: [&str; 4] = ["x", "y", "z", "w"];

impl Body {
    fn line(&mut self, indent: usize, text: &str) {
        for l in text.lines() {
            writeln!(self.s, "{}{l}", "    ".repeat(self.indent + indent)).unwrap();
        }
    }

    /// The batch coordinates and `(i, j)` as arguments of `score`/`dscore`.
    fn coords(&self, i: &str, j: &str) -> String {
        let mut a: Vec<String> = (0..self.nb).map(|x| format!("b{x}")).collect();
        a.push(i.to_string());
        a.push(j.to_string());
        a.join(", ")
    }

    /// The interval functions' arguments for query range `i` and key range `j` (each `lo, hi`).
    fn tile_args(&self, i: (&str, &str), j: (&str, &str)) -> String {
        let mut a: Vec<String> = (0..self.nb).map(|x| format!("b{x}")).collect();
        a.extend([i.0, i.1, j.0, j.1].map(String::from));
        a.join(", ")
    }

    /// `tile_dead` of query range `i` and key range `j` (each `lo, hi`).
    fn dead(&self, i: (&str, &str), j: (&str, &str)) -> String {
        format!("tile_dead({})", self.tile_args(i, j))
    }

    /// Emits the per-element `general` text, or, where the kernel has a fast path, `fast` for
    /// the tiles inside both lengths whose masks are uniform (see [`Verdict::Fixed`]) and
    /// `general` for the others.
    fn scores(&mut self, i: (&str, &str), j: (&str, &str), fast: &str, general: &str) {
        let Some(calls) = &self.fixed else {
            self.line(2, general);
            return;
        };
        let mut terms = vec![format!("{} < SQ", i.1), format!("{} < SK", j.1)];
        let args = self.tile_args(i, j);
        terms.extend(calls.iter().map(|f| format!("{f}({args})")));
        self.line(2, &format!("if ({}) {{", terms.join(" && ")));
        self.line(3, fast);
        self.line(2, "} else {");
        self.line(3, general);
        self.line(2, "}");
    }

    /// Quads per thread of a product stage of `rows` rows.
    fn product_quads(&self, rows: usize) -> usize {
        rows * self.t.chunk / QUAD / self.t.threads()
    }

    /// Quads per thread of a column stage.
    fn column_quads(&self) -> usize {
        X_SLOT / self.t.threads()
    }

    /// The staging registers: the products' `pa`, `pb` and the column stages' `px`.
    fn staging_registers(&self) -> String {
        let mut t = String::new();
        for (name, n) in [
            ("pa", self.product_quads(self.t.rows)),
            ("pb", self.product_quads(self.t.cols)),
            ("px", self.column_quads()),
        ] {
            for i in 0..n {
                writeln!(t, "var {}: vec4<f32>;", indexed(name, i, n)).unwrap();
            }
        }
        t
    }

    /// Declares the score tiles `names` and the staging registers.
    fn declare_registers(&mut self, names: &[&str]) {
        let n = self.t.ra() * self.t.cg();
        let mut t = String::new();
        for name in names {
            writeln!(t, "var {name}: array<vec4<f32>, {n}>;").unwrap();
        }
        t.push_str(&self.staging_registers());
        self.line(1, &t);
    }

    /// The score quad and component of micro-tile element `(a, b)`.
    fn elem(&self, v: &str, a: usize, b: usize) -> String {
        format!("{v}[{}].{}", a * self.t.cg() + b / QUAD, COMP[b % QUAD])
    }

    /// WGSL that loads the thread's `i`-th quad of a head-dimension stage of `r` (quad
    /// `u = lid + i·threads`: row `u / (DC/4)`, words `d0 + 4·(u % (DC/4)) ..+ 4`, zero past the
    /// ends) into `reg`.
    fn load_product_quad(
        &mut self,
        indent: usize,
        reg: &str,
        i: usize,
        r: Rows,
        len: usize,
        d0: &str,
    ) {
        let (dc, cq) = (self.t.chunk, self.t.chunk / QUAD);
        let u = stage_quad(i, self.t.threads());
        let partial = !len.is_multiple_of(dc);
        let comps: Vec<String> = (0..4)
            .map(|c| {
                if partial {
                    format!(
                        "select(0.0, {}, ok && gd + {c}u < {len}u)",
                        r.m.load("gr_", &format!("min(gd + {c}u, {}u)", len - 1))
                    )
                } else {
                    format!(
                        "select(0.0, {}, ok)",
                        r.m.load("gr_", &format!("gd + {c}u"))
                    )
                }
            })
            .collect();
        self.line(
            indent,
            &format!(
                "{{ let gr = {} + {u} / {cq}u; let gd = {d0} + (lid % {cq}u) * 4u; let ok = gr < {}; let gr_ = min(gr, {} - 1u);\n  {reg} = vec4<f32>({}); }}",
                r.row0,
                r.rows,
                r.rows,
                comps.join(", ")
            ),
        );
    }

    /// Loads stage `stage` (a WGSL expr) of a head-dimension product into `pa..`, `pb..`.
    fn load_product(&mut self, indent: usize, p: &Product, stage: &str) {
        let d0 = format!("({stage}) * {}u", self.t.chunk);
        for (name, r) in [("pa", p.a), ("pb", p.b)] {
            let rows = if name == "pa" {
                self.t.rows
            } else {
                self.t.cols
            };
            let n = self.product_quads(rows);
            for i in 0..n {
                self.load_product_quad(indent, &indexed(name, i, n), i, r, p.len, &d0);
            }
        }
    }

    /// Stores `pa..`, `pb..` into the product buffer at quad `slot` (a WGSL expr).
    fn store_product(&mut self, indent: usize, slot: &str) {
        let mut t = Vec::new();
        let stride = self.t.threads() / (self.t.chunk / QUAD) * self.lay.p_row;
        for (name, rows, at) in [("pa", self.t.rows, 0), ("pb", self.t.cols, self.lay.p_b)] {
            let n = self.product_quads(rows);
            for i in 0..n {
                let at = at + i * stride;
                let off = if at == 0 {
                    String::new()
                } else {
                    format!(" + {at}u")
                };
                t.push(format!("sm[{slot}{off} + st_p] = {};", indexed(name, i, n)));
            }
        }
        self.line(indent, &t.join("\n"));
    }

    /// One stage's products from the buffer at quad `slot`.
    fn compute_product(&mut self, indent: usize, acc: &str, slot: &str) {
        let (ra, cb, cg) = (self.t.ra(), self.t.cb(), self.t.cg());
        let (txs, tys, p_row) = (self.t.threads_x, self.t.threads_y, self.lay.p_row);
        for s4 in 0..self.t.chunk / QUAD {
            let mut t = String::new();
            for a in 0..ra {
                write!(
                    t,
                    "let qa{a} = sm[{slot} + ra + {}u]; ",
                    a * tys * p_row + s4
                )
                .unwrap();
            }
            for b in 0..cb {
                write!(
                    t,
                    "let qb{b} = sm[{slot} + rb + {}u];",
                    b * txs * p_row + s4
                )
                .unwrap();
                t.push(if b == cb - 1 { '\n' } else { ' ' });
            }
            for c in COMP {
                t.push_str("  { ");
                for g in 0..cg {
                    let qs: Vec<String> = (0..QUAD)
                        .map(|k| format!("qb{}.{c}", QUAD * g + k))
                        .collect();
                    write!(
                        t,
                        "let {} = vec4<f32>({}); ",
                        indexed("bc", g, cg),
                        qs.join(", ")
                    )
                    .unwrap();
                }
                for a in 0..ra {
                    for g in 0..cg {
                        let n = a * cg + g;
                        write!(
                            t,
                            "{acc}[{n}] = fma(vec4<f32>(qa{a}.{c}), {}, {acc}[{n}]); ",
                            indexed("bc", g, cg)
                        )
                        .unwrap();
                    }
                }
                t.push_str("}\n");
            }
            self.line(indent, &format!("{{ {t}}}"));
        }
    }

    /// Head-dimension products, one after the other, each into its accumulator (zeroed here);
    /// ends with a barrier, every product buffer free.
    fn products(&mut self, indent: usize, ps: &[Product]) {
        let n_acc = self.t.ra() * self.t.cg();
        for p in ps {
            self.line(indent, &format!("{} = array<vec4<f32>, {n_acc}>();", p.acc));
        }
        self.load_product(indent, &ps[0], "0u");
        self.store_product(indent, "0u");
        self.line(indent, "workgroupBarrier();");
        let mut first = 0;
        let p_slot = self.lay.p_slot;
        for (i, p) in ps.iter().enumerate() {
            let n = p.len.div_ceil(self.t.chunk);
            self.stages += n as u64;
            let next = ps.get(i + 1);
            self.line(
                indent,
                &format!("for (var s = 0u; s < {n}u; s = s + 1u) {{"),
            );
            let slot = format!("((s + {first}u) % 2u) * {p_slot}u");
            let other = format!("((s + {}u) % 2u) * {p_slot}u", first + 1);
            self.line(indent + 1, &format!("let so = {slot};\nlet sn = {other};"));
            let more = format!("s + 1u < {n}u");
            match next {
                Some(np) => {
                    self.line(indent + 1, &format!("if ({more}) {{"));
                    self.load_product(indent + 2, p, "s + 1u");
                    self.line(indent + 1, "} else {");
                    self.load_product(indent + 2, np, "0u");
                    self.line(indent + 1, "}");
                }
                None => {
                    self.line(indent + 1, &format!("if ({more}) {{"));
                    self.load_product(indent + 2, p, "s + 1u");
                    self.line(indent + 1, "}");
                }
            }
            self.compute_product(indent + 1, p.acc, "so");
            if next.is_some() {
                self.store_product(indent + 1, "sn");
            } else {
                self.line(indent + 1, &format!("if ({more}) {{"));
                self.store_product(indent + 2, "sn");
                self.line(indent + 1, "}");
            }
            self.line(indent + 1, "workgroupBarrier();");
            self.line(indent, "}");
            first += n;
        }
    }

    /// The first row of column part `part` of X.
    fn part_row0(&self, c: &ColumnProduct, part: usize) -> String {
        match part * self.t.cols / self.t.parts {
            0 => c.x.row0.to_string(),
            at => format!("{} + {at}u", c.x.row0),
        }
    }

    /// Loads stage `stage` (a WGSL expr) of a column product's X (part `part`) into `px..`:
    /// the thread's quads `u = lid + i·threads` (row `u / row_quads`, words
    /// `4·(u % row_quads) ..+ 4`), zero past the ends.
    fn load_column_stage(&mut self, indent: usize, c: &ColumnProduct, stage: &str, part: usize) {
        let (rq, rs) = (c.row_quads, c.rows_per_stage);
        let partial = !c.width.is_multiple_of(QUAD * rq);
        let comps: Vec<String> = (0..4)
            .map(|k| {
                if partial {
                    format!(
                        "select(0.0, {}, ok && gc + {k}u < {w}u)",
                        c.x.m
                            .load("gr_", &format!("min(gc + {k}u, {}u)", c.width - 1)),
                        w = c.width
                    )
                } else {
                    format!(
                        "select(0.0, {}, ok)",
                        c.x.m.load("gr_", &format!("gc + {k}u"))
                    )
                }
            })
            .collect();
        let row0 = self.part_row0(c, part);
        let n = self.column_quads();
        for i in 0..n {
            let u = stage_quad(i, self.t.threads());
            let in_stage = if rq * rs < X_SLOT {
                format!(" && {u} < {}u", rq * rs)
            } else {
                String::new()
            };
            self.line(
                indent,
                &format!(
                    "{{ let gr = {row0} + ({stage}) * {rs}u + {u} / {rq}u; let gc = ({u} % {rq}u) * 4u; let ok = gr < {}{in_stage}; let gr_ = min(gr, {} - 1u);\n  {} = vec4<f32>({}); }}",
                    c.x.rows,
                    c.x.rows,
                    indexed("px", i, n),
                    comps.join(", ")
                ),
            );
        }
    }

    /// Stores `px..` into the column buffer at quad `slot` (a WGSL expr).
    fn store_column_stage(&self, slot: &str) -> String {
        let n = self.column_quads();
        (0..n)
            .map(|i| {
                let off = if i == 0 {
                    String::new()
                } else {
                    format!(" + {}u", i * self.t.threads())
                };
                format!("sm[{slot} + lid{off}] = {};", indexed("px", i, n))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One stage's column products (tile columns `stage · rows_per_stage ..` of the part) from
    /// the buffer at quad `slot`.
    fn compute_column(&mut self, indent: usize, c: &ColumnProduct, slot: &str, stage: &str) {
        let (nq, rq, rs) = (c.nq, c.row_quads, c.rows_per_stage);
        let (ra, txs, tys, t_row) = (
            self.t.ra(),
            self.t.threads_x,
            self.t.threads_y,
            self.lay.t_row,
        );
        self.line(indent, &format!("let tq = ({stage}) * {}u;", rs / QUAD));
        for j4 in 0..rs / QUAD {
            let mut t = String::new();
            for a in 0..ra {
                write!(t, "let t{a} = sm[rt + tq + {}u]; ", a * tys * t_row + j4).unwrap();
            }
            t.push('\n');
            for (jj, comp) in COMP.iter().enumerate() {
                t.push_str("  { ");
                for q in 0..nq {
                    write!(
                        t,
                        "let x{q} = sm[{slot} + tx + {}u]; ",
                        (QUAD * j4 + jj) * rq + txs * q
                    )
                    .unwrap();
                }
                for a in 0..ra {
                    for q in 0..nq {
                        let n = a * nq + q;
                        write!(
                            t,
                            "{acc}[{n}] = fma(vec4<f32>(t{a}.{comp}), x{q}, {acc}[{n}]); ",
                            acc = c.acc
                        )
                        .unwrap();
                    }
                }
                t.push_str("}\n");
            }
            self.line(indent, &format!("{{ {t}}}"));
        }
    }

    /// Loads and stores a column product's first stage of part `part` (before the barrier that
    /// publishes that part of the tile).
    fn column_first_stage(&mut self, indent: usize, c: &ColumnProduct, part: usize) {
        self.load_column_stage(indent, c, "0u", part);
        let at = format!("{}u", self.lay.x_at);
        let store = self.store_column_stage(&at);
        self.line(indent, &store);
    }

    /// The column product's stages over part `part`, its first already stored and the tile
    /// part published; ends with a barrier.
    fn column_product(&mut self, indent: usize, c: &ColumnProduct, part: usize) {
        let n = self.t.cols / self.t.parts / c.rows_per_stage;
        debug_assert!(
            n.is_multiple_of(2),
            "a column product's first stage uses buffer 0"
        );
        self.stages += n as u64;
        self.line(
            indent,
            &format!("for (var s = 0u; s < {n}u; s = s + 1u) {{"),
        );
        let x_at = self.lay.x_at;
        self.line(
            indent + 1,
            &format!(
                "let so = {x_at}u + (s % 2u) * {X_SLOT}u;\nlet sn = {x_at}u + ((s + 1u) % 2u) * {X_SLOT}u;"
            ),
        );
        self.line(indent + 1, &format!("if (s + 1u < {n}u) {{"));
        self.load_column_stage(indent + 2, c, "s + 1u", part);
        self.line(indent + 1, "}");
        self.compute_column(indent + 1, c, "so", "s");
        let store = self.store_column_stage("sn");
        self.line(
            indent + 1,
            &format!("if (s + 1u < {n}u) {{ {store} }}\nworkgroupBarrier();"),
        );
        self.line(indent, "}");
    }

    /// `c` over the tile `v` (see [`Body::write_tile`]), part by part: the first stage of the
    /// streamed operand loaded, the part written, then the product; inside a column block
    /// (indent 2).
    fn tile_product(&mut self, v: &str, c: &ColumnProduct) {
        for part in 0..self.t.parts {
            self.tile_part(v, c, part);
        }
    }

    /// Part `part` of [`Body::tile_product`].
    fn tile_part(&mut self, v: &str, c: &ColumnProduct, part: usize) {
        self.column_first_stage(2, c, part);
        self.write_tile(2, v, part);
        self.line(2, "workgroupBarrier();");
        self.column_product(2, c, part);
    }

    /// Writes the columns of part `part` of `v` (a score micro-tile) to the tile.
    fn write_tile(&mut self, indent: usize, v: &str, part: usize) {
        let (cb, parts) = (self.t.cb(), self.t.parts);
        let (txs, tys, t_row) = (self.t.threads_x, self.t.threads_y, self.lay.t_row);
        let bs = part * cb / parts..(part + 1) * cb / parts;
        let mut t = String::new();
        for a in 0..self.t.ra() {
            let row: Vec<String> = bs
                .clone()
                .map(|b| {
                    format!(
                        "sm[tw + {}u][tc] = {};",
                        a * tys * t_row + txs * (b - bs.start) / QUAD,
                        self.elem(v, a, b)
                    )
                })
                .collect();
            writeln!(t, "{}", row.join(" ")).unwrap();
        }
        self.line(indent, &t);
    }

    /// Zeroes a column product's accumulator.
    fn declare_acc(&mut self, c: &ColumnProduct) {
        self.line(
            1,
            &format!("var {}: array<vec4<f32>, {}>;", c.acc, self.t.ra() * c.nq),
        );
    }

    /// Writes the rows' accumulator `acc` (`width` columns), each value as `value(expr, a)` for
    /// row `ty + TY·a`, to `out`; rows past `rows` (a WGSL expr) are not written.
    fn store_rows(
        &mut self,
        out: &Mat,
        acc: &str,
        width: usize,
        rows: &str,
        value: &dyn Fn(&str, usize) -> String,
    ) {
        self.write_rows(1, out, acc, width, ("row0", rows), &|out, at, x, a| {
            out.store(at, &value(x, a))
        });
    }

    /// The statements `store(out, address, element, a)` that write each element of the
    /// accumulator `acc` (`width` columns) of rows `first + ty + TY·a` (a < RA of the current
    /// tiling) to `out`; rows past `rows` and columns past `width` are not written.
    fn write_rows(
        &mut self,
        indent: usize,
        out: &Mat,
        acc: &str,
        width: usize,
        (first, rows): (&str, &str),
        store: &dyn Fn(&Mat, &str, &str, usize) -> String,
    ) {
        let (txs, tys) = (self.t.threads_x, self.t.threads_y);
        let nq = self.t.nq(width);
        for a in 0..self.t.ra() {
            let mut t = format!(
                "{{ let i = {first} + ty + {}u;\n  if (i < {rows}) {{\n",
                tys * a
            );
            for q in 0..nq {
                for (k, comp) in COMP.iter().enumerate() {
                    let col = format!("(tx + {}u) * 4u + {k}u", txs * q);
                    let x = format!("{acc}[{}].{comp}", a * nq + q);
                    let store = store(out, &out.at("i", &col), &x, a);
                    if QUAD * (txs * q + txs - 1) + k < width {
                        writeln!(t, "    {store}").unwrap();
                    } else {
                        writeln!(t, "    if ({col} < {width}u) {{ {store} }}").unwrap();
                    }
                }
            }
            t.push_str("  }\n}");
            self.line(indent, &t);
        }
    }

    /// The quad of the forward's row statistics where thread `(tx, ty)` keeps row
    /// `ty + TY·a` (component `tc`), or, with `k4`, the row's quad `k4`.
    fn red(&self, a: usize, k4: Option<usize>) -> String {
        let row_quads = self.t.threads_x / QUAD;
        let at = self.lay.red_at;
        let rows = a * self.t.threads_y * row_quads;
        match k4 {
            None => format!("sm[{at}u + ty * {row_quads}u + tx / 4u + {rows}u][tc]"),
            Some(k4) => format!("sm[{at}u + ty * {row_quads}u + {}u]", rows + k4),
        }
    }

    fn forward(&mut self, q: &Mat, k: &Mat, v: &Mat, o: &Mat, l: &Mat, f: &Flash) {
        let (ra, cb, cg) = (self.t.ra(), self.t.cb(), self.t.cg());
        let (txs, tys, bc, br) = (self.t.threads_x, self.t.threads_y, self.t.cols, self.t.rows);
        let t = self.t;
        let pv = ColumnProduct::new(
            "acc",
            Rows {
                m: v,
                row0: "col0",
                rows: "SK",
            },
            f.dv,
            &t,
        );
        let nq = pv.nq;
        self.declare_registers(&["x"]);
        self.line(
            1,
            &format!(
                "var m = {};\nvar l = {};",
                per_row(ra, NEG_INF),
                per_row(ra, "0.0")
            ),
        );
        self.declare_acc(&pv);
        self.line(1, &format!("let blocks = (SK + {bc}u - 1u) / {bc}u;"));
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.line(1, &format!("let col0 = kb * {bc}u;"));
        let dead = self.dead(
            ("row0", &format!("row0 + {}u", br - 1)),
            ("col0", &format!("col0 + {}u", bc - 1)),
        );
        self.line(1, &format!("if (!{dead}) {{"));
        self.products(
            2,
            &[Product {
                acc: "x",
                a: Rows {
                    m: q,
                    row0: "row0",
                    rows: "SQ",
                },
                b: Rows {
                    m: k,
                    row0: "col0",
                    rows: "SK",
                },
                len: f.d,
            }],
        );
        // scores, -inf past the keys
        let (mut fast, mut general) = (String::new(), String::new());
        let corner = self.coords("row0", "col0");
        for a in 0..ra {
            for b in 0..cb {
                let (i, j) = (
                    format!("row0 + ty + {}u", tys * a),
                    format!("col0 + tx + {}u", txs * b),
                );
                let x = self.elem("x", a, b);
                writeln!(fast, "{x} = score({x}, {corner});").unwrap();
                writeln!(
                    general,
                    "{x} = select({NEG_INF}, score({x}, {}), {j} < SK);",
                    self.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)")),
                )
                .unwrap();
            }
        }
        let (i1, j1) = (format!("row0 + {}u", br - 1), format!("col0 + {}u", bc - 1));
        self.scores(("row0", &i1), ("col0", &j1), &fast, &general);
        // this thread's row maxima to the row statistics. WGSL's `max` need not return a NaN
        // operand (nor, through SPIR-V's `FMax`, anything defined), and need not: a NaN score
        // makes its probability `exp(NaN - m)` NaN whatever the maximum `m`, so the row's sum,
        // outputs and log-sum-exp are NaN as the semantics say; a row without NaN gets its
        // maximum exactly. `max_nan` here cost ~6 instructions a pair, 150 pairs a block.
        for a in 0..ra {
            let mut t = String::new();
            let maxima: Vec<String> = (0..cg)
                .map(|g| {
                    let x = format!("x[{}]", a * cg + g);
                    format!("max(max({x}.x, {x}.y), max({x}.z, {x}.w))")
                })
                .collect();
            write!(t, "{} = {};", self.red(a, None), max_all(&maxima)).unwrap();
            self.line(2, &t);
        }
        self.column_first_stage(2, &pv, 0);
        self.line(2, "workgroupBarrier();");
        // the rows' new maxima; probabilities to the tile, sums and accumulators rescaled
        for a in 0..ra {
            let mut t = format!("{{ var mb = m[{a}];\n");
            for k4 in 0..txs / QUAD {
                writeln!(
                    t,
                    "  {{ let r = {}; mb = max(max(mb, max(r.x, r.y)), max(r.z, r.w)); }}",
                    self.red(a, Some(k4))
                )
                .unwrap();
            }
            write!(
                t,
                "  let ms = select(mb, 0.0, mb == {NEG_INF});\n  let alpha = exp(m[{a}] - ms);\n  m[{a}] = mb;\n"
            )
            .unwrap();
            let mut sums = String::new();
            for g in 0..cg {
                let x = format!("x[{}]", a * cg + g);
                writeln!(t, "  {x} = exp({x} - vec4<f32>(ms));").unwrap();
                write!(sums, " + ({x}.x + {x}.y) + ({x}.z + {x}.w)").unwrap();
            }
            writeln!(t, "  l[{a}] = l[{a}] * alpha{sums};").unwrap();
            for qq in 0..nq {
                writeln!(t, "  acc[{n}] = acc[{n}] * alpha;", n = a * nq + qq).unwrap();
            }
            t.push('}');
            self.line(2, &t);
        }
        self.write_tile(2, "x", 0);
        self.line(2, "workgroupBarrier();");
        self.column_product(2, &pv, 0);
        for part in 1..self.t.parts {
            self.tile_part("x", &pv, part);
        }
        self.line(1, "}");
        self.line(1, "}");
        // the rows' sums, then the results
        for a in 0..ra {
            let r = self.red(a, None);
            self.line(1, &format!("{r} = l[{a}];"));
        }
        self.line(
            1,
            &format!("workgroupBarrier();\nvar lt = {};", per_row(ra, "0.0")),
        );
        for a in 0..ra {
            let mut t = String::from("{ ");
            let parts: Vec<String> = (0..txs / QUAD).map(|k4| format!("r{k4}")).collect();
            for k4 in 0..txs / QUAD {
                write!(t, "let r{k4} = {}; ", self.red(a, Some(k4))).unwrap();
            }
            write!(
                t,
                "let r = {}; lt[{a}] = (r.x + r.y) + (r.z + r.w); }}",
                sum(&parts)
            )
            .unwrap();
            self.line(1, &t);
        }
        self.store_rows(o, "acc", f.dv, "SQ", &|x, a| format!("{x} / lt[{a}]"));
        for a in 0..ra {
            self.line(
                1,
                &format!(
                    "{{ let i = row0 + ty + {}u; if (i < SQ && tx == 0u) {{ {}[{}] = select(m[{a}] + log(lt[{a}]), {NAN}, m[{a}] == {NEG_INF}); }} }}",
                    tys * a,
                    l.stored(),
                    l.at("i", "0u")
                ),
            );
        }
    }

    /// `P` (into `x`) and the score gradient `G` (into `y`) of the tile from its products `x`
    /// (`Q·Kᵀ`) and `y` (`dO·Vᵀ`); `lse`/`delta` are read per query. `transposed`: rows are
    /// keys and columns queries.
    fn probabilities_and_gradients(&mut self, lse: &Mat, delta: &Mat, transposed: bool) {
        let (txs, tys) = (self.t.threads_x, self.t.threads_y);
        // per query: L and D (rows' or columns' queries)
        let query = |n: usize| {
            if transposed {
                format!("col0 + tx + {}u", txs * n)
            } else {
                format!("row0 + ty + {}u", tys * n)
            }
        };
        let queries = if transposed { self.t.cb() } else { self.t.ra() };
        let mut t = String::new();
        for n in 0..queries {
            let ic = format!("min({}, SQ - 1u)", query(n));
            writeln!(
                t,
                "let lq{n} = {}; let dq{n} = {};",
                lse.load(&ic, "0u"),
                delta.load(&ic, "0u")
            )
            .unwrap();
        }
        self.line(2, &t);
        let (rows, cols) = (
            ("row0", format!("row0 + {}u", self.t.rows - 1)),
            ("col0", format!("col0 + {}u", self.t.cols - 1)),
        );
        let (qs, ks) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let corner = self.coords(qs.0, ks.0);
        let (mut fast, mut general) = (String::new(), String::new());
        for a in 0..self.t.ra() {
            for b in 0..self.t.cb() {
                let (r, c) = (
                    format!("row0 + ty + {}u", tys * a),
                    format!("col0 + tx + {}u", txs * b),
                );
                let (i, j, n) = if transposed { (c, r, b) } else { (r, c, a) };
                let co = self.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)"));
                let (x, y) = (self.elem("x", a, b), self.elem("y", a, b));
                writeln!(
                    fast,
                    "{{ let pr = exp(score({x}, {corner}) - lq{n}); {y} = dscore(pr * ({y} - dq{n}), {corner}); {x} = pr; }}"
                )
                .unwrap();
                write!(
                    general,
                    "{{ let live = {i} < SQ && {j} < SK; let pr = select(0.0, exp(score({x}, {co}) - lq{n}), live);\n  {y} = select(0.0, dscore(pr * ({y} - dq{n}), {co}), live); {x} = pr; }}\n"
                )
                .unwrap();
            }
        }
        self.scores((qs.0, &qs.1), (ks.0, &ks.1), &fast, &general);
    }

    fn backward_dq(&mut self, o: &Operands, out: &Mat, f: &Flash) {
        let t = self.t;
        let (bc, br) = (t.cols, t.rows);
        let gk = ColumnProduct::new(
            "acc",
            Rows {
                m: o.k,
                row0: "col0",
                rows: "SK",
            },
            f.d,
            &t,
        );
        self.declare_registers(&["x", "y"]);
        self.declare_acc(&gk);
        self.line(1, &format!("let blocks = (SK + {bc}u - 1u) / {bc}u;"));
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.line(1, &format!("let col0 = kb * {bc}u;"));
        let dead = self.dead(
            ("row0", &format!("row0 + {}u", br - 1)),
            ("col0", &format!("col0 + {}u", bc - 1)),
        );
        self.line(1, &format!("if (!{dead}) {{"));
        let (qr, dor) = (
            Rows {
                m: o.q,
                row0: "row0",
                rows: "SQ",
            },
            Rows {
                m: o.d_o,
                row0: "row0",
                rows: "SQ",
            },
        );
        let (kr, vr) = (
            Rows {
                m: o.k,
                row0: "col0",
                rows: "SK",
            },
            Rows {
                m: o.v,
                row0: "col0",
                rows: "SK",
            },
        );
        self.products(
            2,
            &[
                Product {
                    acc: "x",
                    a: qr,
                    b: kr,
                    len: f.d,
                },
                Product {
                    acc: "y",
                    a: dor,
                    b: vr,
                    len: f.dv,
                },
            ],
        );
        self.probabilities_and_gradients(o.lse, o.delta, false);
        self.tile_product("y", &gk);
        self.line(1, "}");
        self.line(1, "}");
        self.store_rows(out, "acc", f.d, "SQ", &|x, _| x.to_string());
    }

    /// The key-block backward: dK and dV over the workgroup's key block; with `dq` (the
    /// workgroup's `dQ` partial sum and the group count, a WGSL expr), the whole backward
    /// ([`FlashKind::Backward`]): the workgroup walks its group's key blocks and adds
    /// each column block's `dQ` share (`Gᵀ·K`, see [`Body::dq_share`]) into its partial sum,
    /// which the first key block stores whole (zeros where its blocks are dead).
    fn backward_dkdv(&mut self, o: &Operands, outs: &[Mat], dq: Option<(&Mat, &str)>, f: &Flash) {
        let t = self.t;
        let (bc, br) = (t.cols, t.rows);
        let (qr, dor) = (
            Rows {
                m: o.q,
                row0: "col0",
                rows: "SQ",
            },
            Rows {
                m: o.d_o,
                row0: "col0",
                rows: "SQ",
            },
        );
        let (kr, vr) = (
            Rows {
                m: o.k,
                row0: "row0",
                rows: "SK",
            },
            Rows {
                m: o.v,
                row0: "row0",
                rows: "SK",
            },
        );
        let pdo = ColumnProduct::new("dv", dor, f.dv, &t);
        let gq = ColumnProduct::new("dk", qr, f.d, &t);
        self.declare_registers(&["x", "y"]);
        self.declare_acc(&pdo);
        self.declare_acc(&gq);
        let live = match dq {
            Some((_, groups)) => {
                let share = self.dq_tiling();
                self.line(
                    1,
                    &format!("var dqa: array<vec4<f32>, {}>;", share.ra() * share.nq(f.d)),
                );
                self.line(
                    1,
                    &format!(
                        "let KB = (SK + {br}u - 1u) / {br}u;\nlet walk = (KB + {groups} - 1u) / {groups};"
                    ),
                );
                self.line(1, "for (var wk = 0u; wk < walk; wk = wk + 1u) {");
                // a snake order (group g takes blocks g, 2G − 1 − g, 2G + g, …) evens out the
                // groups' work under a causal mask, where later key blocks have fewer queries
                self.line(
                    2,
                    &format!("let kblk = select(wk * {groups} + blk, (wk + 1u) * {groups} - 1u - blk, (wk & 1u) == 1u);\nlet row0 = kblk * {br}u;"),
                );
                // the first walk step stores every row of the partial sum, blocks or none
                self.line(2, "if (kblk < KB || wk == 0u) {");
                self.indent += 2;
                for c in [&pdo, &gq] {
                    self.line(
                        1,
                        &format!("{} = array<vec4<f32>, {}>();", c.acc, t.ra() * c.nq),
                    );
                }
                "kblk < KB && "
            }
            None => "",
        };
        self.line(1, &format!("let blocks = (SQ + {bc}u - 1u) / {bc}u;"));
        self.line(1, "for (var qb = 0u; qb < blocks; qb = qb + 1u) {");
        self.line(1, &format!("let col0 = qb * {bc}u;"));
        // rows are keys, columns queries: the tile is dead when its transpose is
        let dead = self.dead(
            ("col0", &format!("col0 + {}u", bc - 1)),
            ("row0", &format!("row0 + {}u", br - 1)),
        );
        self.line(1, &format!("if ({live}!{dead}) {{"));
        self.products(
            2,
            &[
                Product {
                    acc: "x",
                    a: kr,
                    b: qr,
                    len: f.d,
                },
                Product {
                    acc: "y",
                    a: vr,
                    b: dor,
                    len: f.dv,
                },
            ],
        );
        self.probabilities_and_gradients(o.lse, o.delta, true);
        // dV += P·dO, then dK += G·Q through the same tile
        self.tile_product("x", &pdo);
        self.tile_product("y", &gq);
        if let Some((dq, _)) = dq {
            self.dq_share(o.k, f);
            self.add_dq(dq, Some("dqa"), f.d);
            self.line(1, "} else if (wk == 0u) {");
            self.add_dq(dq, None, f.d);
        }
        self.line(1, "}");
        self.line(1, "}");
        self.store_rows(&outs[0], "dk", f.d, "SK", &|x, _| x.to_string());
        self.store_rows(&outs[1], "dv", f.dv, "SK", &|x, _| x.to_string());
        if dq.is_some() {
            self.indent -= 2;
            self.line(2, "}");
            self.line(1, "}");
        }
    }

    /// The tiling of the whole backward's `dQ` share (see [`Body::dq_share`]): the block's
    /// `BC` queries as rows, its `BR` keys as columns, in parts of as many keys as fit
    /// transposed below the column-product buffers.
    fn dq_tiling(&self) -> Tiling {
        let t = self.t;
        let mut keys = t.rows;
        while t.cols * (keys / QUAD + 1) > self.lay.x_at && keys > t.threads_y {
            keys /= 2;
        }
        debug_assert!(t.cols * (keys / QUAD + 1) <= self.lay.x_at);
        Tiling {
            rows: t.cols,
            cols: t.rows,
            parts: t.rows / keys,
            ..t
        }
    }

    /// The column block's share of `dQ`, `Gᵀ·K` (its `BC` queries by the head dim), into
    /// `dqa`: `G` (in the score registers `y`, rows keys) written transposed to workgroup
    /// memory, part by part, and multiplied with the block's keys as a column product, the
    /// block's queries its rows.
    fn dq_share(&mut self, k: &Mat, f: &Flash) {
        let (t, t_row) = (self.t, self.lay.t_row);
        let share = self.dq_tiling();
        let keys = share.cols / share.parts;
        let share_row = keys / QUAD + 1;
        self.t = share;
        self.lay.t_row = share_row;
        let c = ColumnProduct::new(
            "dqa",
            Rows {
                m: k,
                row0: "row0",
                rows: "SK",
            },
            f.d,
            &share,
        );
        self.line(
            2,
            &format!(
                "dqa = array<vec4<f32>, {}>();\n{{\nlet rt = ty * {share_row}u;\nlet tw2 = tx * {share_row}u + ty / 4u;\nlet tc2 = ty % 4u;",
                share.ra() * c.nq
            ),
        );
        let (txs, tys, cg) = (t.threads_x, t.threads_y, t.cg());
        for part in 0..share.parts {
            self.column_first_stage(2, &c, part);
            // key ty + TY·a of the block is key ty + TY·(a − a0) of the part
            let a0 = part * keys / tys;
            let mut w = String::new();
            for a in a0..a0 + keys / tys {
                let row: Vec<String> = (0..t.cb())
                    .map(|b| {
                        format!(
                            "sm[tw2 + {}u][tc2] = y[{}].{};",
                            txs * b * share_row + tys / QUAD * (a - a0),
                            a * cg + b / QUAD,
                            COMP[b % QUAD]
                        )
                    })
                    .collect();
                writeln!(w, "{}", row.join(" ")).unwrap();
            }
            self.line(2, &w);
            self.line(2, "workgroupBarrier();");
            self.column_product(2, &c, part);
        }
        self.line(2, "}");
        self.t = t;
        self.lay.t_row = t_row;
    }

    /// Adds `acc` (the `dQ` share of the column block's queries, as [`Body::dq_share`] lays
    /// it out) into the partial sum `dq`, or stores it there on the first walk step; zeros
    /// without `acc` (a dead block on the first step).
    fn add_dq(&mut self, dq: &Mat, acc: Option<&str>, width: usize) {
        let t = self.t;
        self.t = self.dq_tiling();
        let store = |dq: &Mat, at: &str, x: &str, _| {
            let arena = dq.stored();
            match acc {
                Some(_) => format!(
                    "{{ let at = {at}; if (wk == 0u) {{ {arena}[at] = {x}; }} else {{ {arena}[at] = {arena}[at] + {x}; }} }}"
                ),
                None => format!("{arena}[{at}] = 0.0;"),
            }
        };
        self.write_rows(2, dq, acc.unwrap_or("dqa"), width, ("col0", "SQ"), &store);
        self.t = t;
    }
}

/// What an interval function of a score program (see [`interval_fn`]) answers about a tile of
/// batch entry `b..`, queries `i0..=i1` and keys `j0..=j1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Every score is `-inf`: the tile is skipped.
    Dead,
    /// Every value through which the coordinates reach the score (see [`boundaries`]) is one
    /// value over the tile, so the program gives each element the score it gives at the
    /// tile's corner: the mask, evaluated once, is uniform (a causal tile below the diagonal).
    Fixed,
}

/// The instructions through which a score program's coordinates reach its result: those that
/// depend on coordinates (and constants) only and are read by an instruction that depends on
/// the score `x` (or are the result), each with whether its value is exact at zero (`+0.0`,
/// never `-0.0`: comparisons, coordinates, constants and `where`s of such), which an interval
/// `[0, 0]` cannot tell apart.
fn boundaries(p: &Program) -> Vec<(usize, bool)> {
    let n = p.insts.len();
    let mut coords_only = vec![false; n];
    let mut exact = vec![false; n];
    for (i, inst) in p.insts.iter().enumerate() {
        (coords_only[i], exact[i]) = match inst {
            Inst::Const(bits) => (true, *bits != (-0.0f32).to_bits()),
            Inst::Coord(_) => (true, true),
            Inst::Load(_) | Inst::Reduced(_) => (false, false),
            Inst::Map(f, args) => (
                args.iter().all(|&a| coords_only[a as usize]),
                match f {
                    Scalar::Op(Op::Eq | Op::Lt | Op::Le | Op::Gt | Op::Ge) => true,
                    Scalar::Op(Op::Where) => exact[args[1] as usize] && exact[args[2] as usize],
                    _ => false,
                },
            ),
        };
    }
    let out = p.outputs[0].value as usize;
    let mut read_by_score = vec![false; n];
    for (i, inst) in p.insts.iter().enumerate() {
        if let Inst::Map(_, args) = inst
            && !coords_only[i]
        {
            for &a in args {
                read_by_score[a as usize] = true;
            }
        }
    }
    (0..n)
        .filter(|&i| {
            coords_only[i]
                && !matches!(p.insts[i], Inst::Const(_))
                && (read_by_score[i] || i == out)
        })
        .map(|i| (i, exact[i]))
        .collect()
}

/// `fn tile_dead(..) -> bool` ([`Verdict::Dead`]) or `fn {name}_fixed(..) -> bool`
/// ([`Verdict::Fixed`]; `None` when no coordinate reaches the score, which then is always
/// fixed): the interval evaluation of `p` over a tile.
fn interval_fn(p: &Program, nb: usize, name: &str, verdict: Verdict) -> Option<String> {
    let watched = match verdict {
        Verdict::Dead => Vec::new(),
        Verdict::Fixed => boundaries(p),
    };
    if verdict == Verdict::Fixed && watched.is_empty() {
        return None;
    }
    let mut s = String::new();
    let mut params: Vec<String> = (0..nb).map(|a| format!("b{a}: u32")).collect();
    params.extend(["i0: u32", "i1: u32", "j0: u32", "j1: u32"].map(String::from));
    let fname = match verdict {
        Verdict::Dead => "tile_dead".to_string(),
        Verdict::Fixed => format!("{name}_fixed"),
    };
    writeln!(s, "fn {fname}({}) -> bool {{", params.join(", ")).unwrap();
    writeln!(
        s,
        "    let NEG = f32_bits(0xff800000u);\n    let POS = f32_bits(0x7f800000u);"
    )
    .unwrap();
    let dtypes = p.dtypes();
    // the verdict reads the result, or the boundaries, which no later instruction feeds
    let needed = match verdict {
        Verdict::Dead => p.insts.len(),
        Verdict::Fixed => watched.iter().map(|&(b, _)| b + 1).max().unwrap_or(0),
    };
    for (i, inst) in p.insts.iter().enumerate().take(needed) {
        let bounds: Option<(String, String)> = if dtypes[i] == DType::I32 {
            None
        } else {
            match inst {
                Inst::Load(_) | Inst::Reduced(_) => None,
                Inst::Const(bits) => {
                    let c = super::f32_literal(f32::from_bits(*bits));
                    Some((c.clone(), c))
                }
                Inst::Coord(k) => {
                    let k = *k as usize;
                    Some(if k < nb {
                        (format!("f32(b{k})"), format!("f32(b{k})"))
                    } else if k == nb {
                        ("f32(i0)".to_string(), "f32(i1)".to_string())
                    } else {
                        ("f32(j0)".to_string(), "f32(j1)".to_string())
                    })
                }
                Inst::Map(f, args) => {
                    let a = args[0] as usize;
                    let b = args.get(1).map(|&x| x as usize);
                    match (f, b) {
                        (Scalar::Op(Op::Add), Some(b)) => {
                            Some((format!("lo{a} + lo{b}"), format!("hi{a} + hi{b}")))
                        }
                        (Scalar::Op(Op::Sub), Some(b)) => {
                            Some((format!("lo{a} - hi{b}"), format!("hi{a} - lo{b}")))
                        }
                        (Scalar::Op(Op::Neg), _) => Some((format!("-hi{a}"), format!("-lo{a}"))),
                        (Scalar::Op(Op::Abs), _) => Some((
                            format!(
                                "select(select(0.0, -hi{a}, hi{a} <= 0.0), lo{a}, lo{a} >= 0.0)"
                            ),
                            format!("max(abs(lo{a}), abs(hi{a}))"),
                        )),
                        (Scalar::Op(Op::Mul), Some(b)) => {
                            let prods = [
                                format!("lo{a} * lo{b}"),
                                format!("lo{a} * hi{b}"),
                                format!("hi{a} * lo{b}"),
                                format!("hi{a} * hi{b}"),
                            ];
                            Some((
                                format!(
                                    "min(min({}, {}), min({}, {}))",
                                    prods[0], prods[1], prods[2], prods[3]
                                ),
                                format!(
                                    "max(max({}, {}), max({}, {}))",
                                    prods[0], prods[1], prods[2], prods[3]
                                ),
                            ))
                        }
                        (Scalar::Op(op @ (Op::Lt | Op::Le | Op::Gt | Op::Ge)), Some(b)) => {
                            // 1 when certainly true, 0 when certainly false, [0, 1] otherwise
                            let (t, fl) = match op {
                                Op::Lt => (format!("hi{a} < lo{b}"), format!("lo{a} >= hi{b}")),
                                Op::Le => (format!("hi{a} <= lo{b}"), format!("lo{a} > hi{b}")),
                                Op::Gt => (format!("lo{a} > hi{b}"), format!("hi{a} <= lo{b}")),
                                _ => (format!("lo{a} >= hi{b}"), format!("hi{a} < lo{b}")),
                            };
                            Some((
                                format!("select(0.0, 1.0, {t})"),
                                format!("select(1.0, 0.0, {fl})"),
                            ))
                        }
                        (Scalar::Op(Op::Where), _) => {
                            let (c, x, y) = (args[0] as usize, args[1] as usize, args[2] as usize);
                            writeln!(
                                s,
                                "    let z{i} = lo{c} == 0.0 && hi{c} == 0.0;\n    let nz{i} = lo{c} > 0.0 || hi{c} < 0.0;"
                            )
                            .unwrap();
                            Some((
                                format!(
                                    "select(select(min(lo{x}, lo{y}), lo{x}, nz{i}), lo{y}, z{i})"
                                ),
                                format!(
                                    "select(select(max(hi{x}, hi{y}), hi{x}, nz{i}), hi{y}, z{i})"
                                ),
                            ))
                        }
                        (Scalar::Cast(_), _) => Some((format!("lo{a}"), format!("hi{a}"))),
                        _ => None,
                    }
                }
            }
        };
        match bounds {
            // NaN bounds (inf - inf, 0 · inf) mean nothing is known
            Some((lo, hi)) => writeln!(
                s,
                "    let lo{i}_ = {lo};\n    let hi{i}_ = {hi};\n    let unknown{i} = is_nan_f32(lo{i}_) || is_nan_f32(hi{i}_);\n    let lo{i} = select(lo{i}_, NEG, unknown{i});\n    let hi{i} = select(hi{i}_, POS, unknown{i});"
            )
            .unwrap(),
            None => writeln!(s, "    let lo{i} = NEG;\n    let hi{i} = POS;").unwrap(),
        }
    }
    let verdict = match verdict {
        Verdict::Dead => format!("hi{} == NEG", p.outputs[0].value),
        Verdict::Fixed => watched
            .iter()
            .map(|&(b, exact)| {
                if exact {
                    format!("lo{b} == hi{b}")
                } else {
                    format!("(lo{b} == hi{b} && lo{b} != 0.0)")
                }
            })
            .collect::<Vec<_>>()
            .join(" && "),
    };
    writeln!(s, "    return {verdict};\n}}").unwrap();
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::variant::register_budget;
    use crate::fused::{Output, broadcast_access};

    /// A score program over `[2, 64, 64]` (`x` operand 0): `insts` after `Load(0)`, `Coord(1)`
    /// (`i`) and `Coord(2)` (`j`), the last one the result.
    fn program(insts: Vec<Inst>) -> Program {
        let domain = vec![2, 64, 64];
        let x = broadcast_access(DType::F32, &domain, &domain);
        let mut all = vec![Inst::Load(0), Inst::Coord(1), Inst::Coord(2)];
        all.extend(insts);
        Program {
            domain: domain.clone(),
            reduce: vec![],
            operands: vec![x.clone()],
            outputs: vec![Output {
                value: all.len() as u32 - 1,
                access: x,
            }],
            insts: all,
            phases: vec![],
        }
    }

    fn map(op: Op, args: &[u32]) -> Inst {
        Inst::Map(Scalar::Op(op), args.to_vec())
    }

    fn constant(c: f32) -> Inst {
        Inst::Const(c.to_bits())
    }

    /// The coordinates reach a score through the values that depend on them alone and feed the
    /// score: a causal mask's comparison, not `i` and `j` themselves; an additive mask built
    /// from them; a bias proportional to `i − j`, whose zero may be `-0.0`.
    #[test]
    fn the_coordinates_reach_the_score_through_its_boundaries() {
        let neg_inf = || constant(f32::NEG_INFINITY);
        // where(j <= i, 0.125 · x, -inf)
        let causal = program(vec![
            constant(0.125),
            map(Op::Mul, &[0, 3]),
            map(Op::Le, &[2, 1]),
            neg_inf(),
            map(Op::Where, &[5, 4, 6]),
        ]);
        assert_eq!(boundaries(&causal), [(5, true)]);
        // x + where(j <= i, 0, -inf)
        let additive = program(vec![
            map(Op::Le, &[2, 1]),
            constant(0.0),
            neg_inf(),
            map(Op::Where, &[3, 4, 5]),
            map(Op::Add, &[0, 6]),
        ]);
        assert_eq!(boundaries(&additive), [(6, true)]);
        // the same with a -0.0 branch: an interval [0, 0] would not say which zero
        let mut signed = additive.clone();
        signed.insts[4] = constant(-0.0);
        assert_eq!(boundaries(&signed), [(6, false)]);
        // x · (i − j)
        let bias = program(vec![map(Op::Sub, &[1, 2]), map(Op::Mul, &[0, 3])]);
        assert_eq!(boundaries(&bias), [(3, false)]);
        let text = interval_fn(&bias, 1, "score", Verdict::Fixed).expect("a boundary");
        assert!(
            text.contains("return (lo3 == hi3 && lo3 != 0.0);"),
            "{text}"
        );
        // a score that ignores the coordinates is fixed everywhere: no function
        let plain = program(vec![constant(0.125), map(Op::Mul, &[0, 3])]);
        assert!(boundaries(&plain).is_empty());
        assert_eq!(interval_fn(&plain, 1, "score", Verdict::Fixed), None);
        assert!(interval_fn(&plain, 1, "score", Verdict::Dead).is_some());
    }

    /// Every named tiling, as every kernel at every head width uses it, fits what its
    /// emitter assumes: whole quads per thread in every stage, 32 KiB of workgroup memory, the
    /// tile, column buffers and row statistics apart, even column-stage counts, and the
    /// register budget.
    #[test]
    fn register_budgets() {
        assert_eq!(register_budget(FlashKind::Forward), 160);
        assert_eq!(register_budget(FlashKind::BackwardDq), 160);
        assert_eq!(register_budget(FlashKind::BackwardDkDv), 192);
        // B takes dK/dV up to head dim 128, A above
        let dkdv = |d| Tiling::B.for_kernel(FlashKind::BackwardDkDv, d, d);
        assert_eq!((dkdv(128), dkdv(129)), (Tiling::B, Tiling::A));
        let dq = |d| Tiling::B.for_kernel(FlashKind::BackwardDq, d, d);
        assert_eq!((dq(192), dq(256)), (Tiling::B, Tiling::A));
    }

    #[test]
    fn tilings_fit() {
        let kinds = [
            FlashKind::Forward,
            FlashKind::BackwardDq,
            FlashKind::BackwardDkDv,
        ];
        for &(name, named) in &Tiling::NAMED {
            for kind in kinds {
                for d in (1..=MAX_HEAD_DIM).step_by(7).chain([MAX_HEAD_DIM]) {
                    let t = named.for_kernel(kind, d, d);
                    let why = format!("tiling {name} ({t:?}), {kind:?}, d = {d}");
                    assert!(t.registers(kind, d, d) <= register_budget(kind), "{why}");
                    assert!(t.threads() <= 256, "{why}");
                    assert!(
                        t.rows.is_multiple_of(t.threads_y) && t.cols.is_multiple_of(t.threads_x),
                        "{why}"
                    );
                    assert!(
                        t.cb().is_multiple_of(QUAD) && t.threads_x.is_multiple_of(QUAD),
                        "{why}"
                    );
                    assert!(t.cb().is_multiple_of(t.parts), "{why}");
                    let cq = t.chunk / QUAD;
                    assert!(
                        t.chunk.is_multiple_of(QUAD) && t.threads().is_multiple_of(cq),
                        "{why}"
                    );
                    for rows in [t.rows, t.cols] {
                        assert!((rows * cq).is_multiple_of(t.threads()), "{why}");
                    }
                    assert!(X_SLOT.is_multiple_of(t.threads()), "{why}");
                    let lay = Layout::of(&t);
                    assert!(lay.quads(true) <= SHARED_QUADS, "{why}");
                    assert!(
                        t.rows * lay.t_row <= lay.x_at,
                        "{why}: tile over the column buffers"
                    );
                    assert!(
                        lay.red_at >= lay.x_at + X_SLOT,
                        "{why}: statistics over the first column buffer"
                    );
                    let m = Mat {
                        arena: String::new(),
                        storage: Storage::Word,
                        dtype: DType::F32,
                        base: String::new(),
                        batch: Vec::new(),
                        row: String::new(),
                        col: String::new(),
                    };
                    let x = Rows {
                        m: &m,
                        row0: "",
                        rows: "",
                    };
                    let c = ColumnProduct::new("acc", x, d, &t);
                    let part = t.cols / t.parts;
                    assert!(c.rows_per_stage >= QUAD, "{why}");
                    assert!(part.is_multiple_of(2 * c.rows_per_stage), "{why}");
                }
            }
        }
        // the default keeps its historical layout (the WGSL snapshots pin its text)
        let a = Layout::of(&Tiling::A);
        assert_eq!((a.p_slot, a.x_at, a.red_at), (640, 1280, 1792));
        assert_eq!((a.quads(false), a.quads(true)), (1792, 2048));
    }
}
