//! WGSL for flash attention (see [`crate::flash`]): the forward, the key-block backward (dK,
//! dV) and the query-block backward (dQ), tiled so that no `[Sq, Sk]` value reaches memory.
//!
//! **Tiling.** A workgroup of 256 threads, a 16 × 16 grid `(tx, ty)`, owns a block of 64 "rows"
//! (queries for the forward and dQ, keys for dK/dV) and walks the "columns" (the other side) in
//! blocks of 64. Thread `(tx, ty)` holds the 4 × 4 score micro-tile of rows `ty + 16·a` and
//! columns `tx + 16·b` (a, b < 4) in registers, and accumulates the same rows' outputs over the
//! column quads `tx + 16·q` (columns `4·(tx + 16·q) ..+ 4`, q < ⌈width / 64⌉) as `vec4`s.
//!
//! **Stages.** All operands reach workgroup memory (one `array<vec4<f32>>`, ≤ 32 KiB) in
//! *stages* of one `vec4` per thread, double-buffered: a stage is stored, a barrier passes, the
//! next stage's global loads are issued into registers, the stage is computed, the next one is
//! stored into the other buffer, a barrier passes — one barrier per stage, global latency hidden
//! behind the products. A head-dimension product (`Q·Kᵀ`, `dO·Vᵀ`) stages 16-wide chunks of both
//! operands row-major (rows padded to 20 words, so the `vec4` reads of 8 consecutive threads
//! fall in distinct banks) and reads them as `vec4`s along the head dimension; a column product
//! (`P·V`, `G·K`, …) reads the tile (`P` or `G`, 64 × 68 words, aliasing the product buffers)
//! as `vec4`s along its row and the streamed operand as `vec4`s along its width, 16·64/width
//! rows a stage. Loops over stages have compile-time trip counts; the head dimensions are
//! WGSL constants.
//!
//! **Softmax.** The forward's row maxima combine the 16 threads of a row through workgroup
//! memory once per block; the row sums stay per thread (each rescaled by the row's common
//! factor) and combine once at the end.
//!
//! **Masks.** The score function is the graph's own program, called per element; a column
//! block is skipped, in uniform control flow, when an interval evaluation of that program over
//! the block's coordinate ranges proves every score `-inf` (causal and window masks), which
//! halves a causal attention's work.
//!
//! **Limits.** Any sequence lengths (ragged blocks are masked), head dimensions up to 256 (the
//! accumulators are 16 · ⌈d/64⌉ registers), batch axes with broadcasting. An invocation runs
//! `⌈S/64⌉ · (1 + stages)` loop iterations, stages being `⌈d/16⌉` per head-dimension product and
//! 64 / rows-per-stage per column product; barriers sit in uniform control flow.

use std::fmt::Write;

use sinter_ir::DType;

use super::fused::{FusedKernel, emit_elementwise_fn};
use super::{Emitter, MAX_GROUPS, NAN, NEG_INF, WORKGROUP, decompose};
use crate::flash::FlashKind;
use crate::fused::{Inst, Program, Scalar};
use crate::kernel::Flash;
use crate::layout::View;

/// Rows per workgroup, columns per block, head-dimension chunk of a product stage.
/// Words per `vec4<f32>` quad.
const QUAD: usize = 4;
const BR: usize = 64;
const BC: usize = 64;
const DC: usize = 16;
/// Largest head dimension (the accumulators live in registers).
pub const MAX_HEAD_DIM: usize = 256;

// Workgroup memory, in quads (`vec4<f32>`). Product stages: two buffers, each the 64 rows of
// `A` then the 64 of `B`, rows of `DC` words padded to `P_ROW` quads. The tile (`P` or `G`):
// `BR` rows of `T_ROW` quads, over the product buffers (it is written after the products and
// read before the next block's). Column-product stages: two buffers of `X_SLOT` quads. The
// forward's row statistics: `BR` rows of 16 words.
const P_ROW: usize = DC / QUAD + 1;
const P_B: usize = BR * P_ROW;
const P_SLOT: usize = (BR + BC) * P_ROW;
const T_ROW: usize = BC / QUAD + 1;
const X_AT: usize = 2 * P_SLOT;
const X_SLOT: usize = 256;
const RED_AT: usize = X_AT + 2 * X_SLOT;
const RED_QUADS: usize = BR * 16 / QUAD;
const _: () = assert!(BR * T_ROW <= X_AT && RED_AT + RED_QUADS <= 2048);
// a product stage is one quad of A and one of B per thread
const _: () = assert!(DC * BR / QUAD == WORKGROUP as usize && DC * BC / QUAD == WORKGROUP as usize);

/// An operand read as `[batch.., rows, cols]`: its arena, base word and the param words of its
/// strides.
struct Mat {
    arena: String,
    base: String,
    batch: Vec<String>,
    row: String,
    col: String,
}

impl Mat {
    fn new(e: &mut Emitter, v: &View, nb: usize) -> Mat {
        let r = v.rank();
        debug_assert_eq!(r, nb + 2, "{v:?}");
        Mat {
            arena: e.arena(v.buffer),
            base: e.base(v.buffer, v.offset),
            batch: v.strides[..nb].iter().map(|&s| e.param(s)).collect(),
            row: e.param(v.strides[r - 2]),
            col: e.param(v.strides[r - 1]),
        }
    }

    /// The word address of the batch element's `[row, col]` (row and col as WGSL u32 exprs).
    fn at(&self, row: &str, col: &str) -> String {
        format!(
            "{}_base + ({row}) * {} + ({col}) * {}",
            self.base, self.row, self.col
        )
    }

    /// The element at `[row, col]`.
    fn load(&self, row: &str, col: &str) -> String {
        format!("{}[{}]", self.arena, self.at(row, col))
    }
}

/// Binds `let NAME_base = base + Σ b_a · stride_a;` and returns a [`Mat`] whose addresses use it.
fn bind(s: &mut String, e: &mut Emitter, name: &str, v: &View, nb: usize) -> Mat {
    let m = Mat::new(e, v, nb);
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

pub fn emit(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    let nb = k.batch.len();
    let blocks_of = match k.spec.kind {
        FlashKind::Forward | FlashKind::BackwardDq => k.sq,
        FlashKind::BackwardDkDv => k.sk,
    };
    let batch: usize = k.batch.iter().product();
    let blocks = blocks_of.div_ceil(BR);
    if k.d > MAX_HEAD_DIM || k.dv > MAX_HEAD_DIM {
        e.refuse(
            "flash attention",
            format!(
                "head dimensions {} and {} pass the {MAX_HEAD_DIM} its register accumulators hold",
                k.d, k.dv
            ),
        );
    }
    if batch > MAX_GROUPS as usize || blocks > MAX_GROUPS as usize {
        e.refuse(
            "flash attention",
            format!(
                "{batch} batch entries of {blocks} blocks pass the {MAX_GROUPS} workgroups per axis of one dispatch"
            ),
        );
    }
    let mut s = String::new();
    // the score function and its backward as WGSL functions of (x, batch coords.., i, j)
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
    s.push_str(&tile_dead_fn(&k.spec.score, nb));
    let forward = k.spec.kind == FlashKind::Forward;
    let quads = if forward { RED_AT + RED_QUADS } else { RED_AT };
    writeln!(s, "const D: u32 = {}u;\nconst DV: u32 = {}u;", k.d, k.dv).unwrap();
    writeln!(s, "var<workgroup> sm: array<vec4<f32>, {quads}>;").unwrap();
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    )
    .unwrap();
    writeln!(s, "    let tx = lid % 16u;\n    let ty = lid / 16u;").unwrap();
    // per-thread quad offsets: a product stage's store, the A and B rows read, the tile's
    // element written (quad and component) and its rows read
    writeln!(
        s,
        "    let st_p = (lid / 4u) * {P_ROW}u + lid % 4u;\n    let ra = ty * {P_ROW}u;\n    let rb = {P_B}u + tx * {P_ROW}u;\n    let tw = ty * {T_ROW}u + tx / 4u;\n    let tc = tx % 4u;\n    let rt = ty * {T_ROW}u;"
    )
    .unwrap();
    let dims = e.params(&k.batch);
    decompose(&mut s, "    ", "wid.y", "b", &dims);
    let (sq, sk) = (e.param(k.sq), e.param(k.sk));
    writeln!(s, "    let SQ = {sq};\n    let SK = {sk};").unwrap();
    writeln!(s, "    let row0 = wid.x * {BR}u;").unwrap();
    let q = bind(&mut s, e, "q", &k.q, nb);
    let kk = bind(&mut s, e, "k", &k.k, nb);
    let v = bind(&mut s, e, "v", &k.v, nb);
    let mut cx = Body { s, nb, stages: 0 };
    match k.spec.kind {
        FlashKind::Forward => {
            let o = bind(&mut cx.s, e, "o", &k.outputs[0], nb);
            let l = bind(&mut cx.s, e, "l", &k.outputs[1], nb);
            cx.forward(&q, &kk, &v, &o, &l, k);
        }
        FlashKind::BackwardDq | FlashKind::BackwardDkDv => {
            let d_o = bind(&mut cx.s, e, "do", k.d_o.as_ref().expect("dO"), nb);
            let lse = bind(&mut cx.s, e, "lse", k.lse.as_ref().expect("L"), nb);
            let delta = bind(&mut cx.s, e, "dd", k.delta.as_ref().expect("D"), nb);
            let outs: Vec<Mat> = k
                .outputs
                .iter()
                .enumerate()
                .map(|(i, view)| bind(&mut cx.s, e, &format!("out{i}"), view, nb))
                .collect();
            let ops = Operands {
                q: &q,
                k: &kk,
                v: &v,
                d_o: &d_o,
                lse: &lse,
                delta: &delta,
            };
            if k.spec.kind == FlashKind::BackwardDq {
                cx.backward_dq(&ops, &outs[0], k);
            } else {
                cx.backward_dkdv(&ops, &outs, k);
            }
        }
    }
    // the column-block loop and, per block, the stage loops
    let trips = blocks_of_columns(k) as u64;
    e.loop_trips(trips * (1 + cx.stages));
    let mut s = cx.s;
    s.push_str("}\n");
    (s, [blocks as u32, batch as u32, 1], (quads * 16) as u32)
}

/// Column blocks a workgroup walks.
fn blocks_of_columns(k: &Flash) -> usize {
    match k.spec.kind {
        FlashKind::Forward | FlashKind::BackwardDq => k.sk.div_ceil(BC),
        FlashKind::BackwardDkDv => k.sq.div_ceil(BC),
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

/// `acc[a][b] = Σ_d A[a.row0 + ty + 16a, d] · B[b.row0 + tx + 16b, d]` over `d < len`, `acc` a
/// `array<vec4<f32>, 4>` (component b).
struct Product<'a> {
    acc: &'a str,
    a: Rows<'a>,
    b: Rows<'a>,
    len: usize,
}

impl Product<'_> {
    fn stages(&self) -> usize {
        self.len.div_ceil(DC)
    }
}

/// `acc[a·nq + q] += Σ_c T[ty + 16a, c] · X[x.row0 + c, 4·(tx + 16q) ..+ 4]` over the block's
/// columns `c`, for the tile `T` in workgroup memory; `acc` an `array<vec4<f32>, 4·nq>`.
struct ColumnProduct<'a> {
    acc: &'a str,
    x: Rows<'a>,
    width: usize,
}

impl ColumnProduct<'_> {
    /// Quads of the accumulator per row.
    fn nq(&self) -> usize {
        self.width.div_ceil(64).max(1)
    }

    /// Quads per staged row of X.
    fn row_quads(&self) -> usize {
        16 * self.nq()
    }

    /// X rows per stage.
    fn rows_per_stage(&self) -> usize {
        16 / self.nq().next_power_of_two()
    }

    fn stages(&self) -> usize {
        BC / self.rows_per_stage()
    }
}

struct Body {
    s: String,
    nb: usize,
    /// Stage-loop iterations per column block.
    stages: u64,
}

const COMP: [&str; 4] = ["x", "y", "z", "w"];

impl Body {
    fn line(&mut self, indent: usize, text: &str) {
        for l in text.lines() {
            writeln!(self.s, "{}{l}", "    ".repeat(indent)).unwrap();
        }
    }

    /// The batch coordinates and `(i, j)` as arguments of `score`/`dscore`.
    fn coords(&self, i: &str, j: &str) -> String {
        let mut a: Vec<String> = (0..self.nb).map(|x| format!("b{x}")).collect();
        a.push(i.to_string());
        a.push(j.to_string());
        a.join(", ")
    }

    /// `tile_dead`'s arguments for query range `i` and key range `j` (each `lo, hi`).
    fn dead(&self, i: (&str, &str), j: (&str, &str)) -> String {
        let mut a: Vec<String> = (0..self.nb).map(|x| format!("b{x}")).collect();
        a.extend([i.0, i.1, j.0, j.1].map(String::from));
        format!("tile_dead({})", a.join(", "))
    }

    /// WGSL that loads this thread's quad of a head-dimension stage of `r` (row `lid / 4`,
    /// words `d0 + 4·(lid % 4) ..+ 4`, zero past the ends) into `reg`.
    fn load_product_quad(&mut self, indent: usize, reg: &str, r: Rows, len: usize, d0: &str) {
        let partial = !len.is_multiple_of(DC);
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
                "{{ let gr = {} + lid / 4u; let gd = {d0} + (lid % 4u) * 4u; let ok = gr < {}; let gr_ = min(gr, {} - 1u);\n  {reg} = vec4<f32>({}); }}",
                r.row0,
                r.rows,
                r.rows,
                comps.join(", ")
            ),
        );
    }

    /// Loads stage `stage` (a WGSL expr) of a head-dimension product into `pa`, `pb`.
    fn load_product(&mut self, indent: usize, p: &Product, stage: &str) {
        let d0 = format!("({stage}) * {DC}u");
        self.load_product_quad(indent, "pa", p.a, p.len, &d0);
        self.load_product_quad(indent, "pb", p.b, p.len, &d0);
    }

    /// Stores `pa`, `pb` into the product buffer at quad `slot` (a WGSL expr).
    fn store_product(&mut self, indent: usize, slot: &str) {
        self.line(
            indent,
            &format!("sm[{slot} + st_p] = pa;\nsm[{slot} + {P_B}u + st_p] = pb;"),
        );
    }

    /// One stage's products from the buffer at quad `slot`.
    fn compute_product(&mut self, indent: usize, acc: &str, slot: &str) {
        for s4 in 0..DC / QUAD {
            let mut t = String::new();
            for a in 0..4 {
                write!(
                    t,
                    "let qa{a} = sm[{slot} + ra + {}u]; ",
                    a * 16 * P_ROW + s4
                )
                .unwrap();
            }
            for b in 0..4 {
                write!(t, "let qb{b} = sm[{slot} + rb + {}u];", b * 16 * P_ROW + s4).unwrap();
                t.push(if b == 3 { '\n' } else { ' ' });
            }
            for c in COMP {
                write!(
                    t,
                    "  {{ let bc = vec4<f32>(qb0.{c}, qb1.{c}, qb2.{c}, qb3.{c}); "
                )
                .unwrap();
                for a in 0..4 {
                    write!(
                        t,
                        "{acc}[{a}] = fma(vec4<f32>(qa{a}.{c}), bc, {acc}[{a}]); "
                    )
                    .unwrap();
                }
                t.push_str("}\n");
            }
            self.line(indent, &format!("{{ {t}}}"));
        }
    }

    /// Head-dimension products, one after the other, each into its accumulator (zeroed here);
    /// ends with a barrier, every product buffer free.
    fn products(&mut self, indent: usize, ps: &[Product]) {
        for p in ps {
            self.line(indent, &format!("{} = array<vec4<f32>, 4>();", p.acc));
        }
        self.load_product(indent, &ps[0], "0u");
        self.store_product(indent, "0u");
        self.line(indent, "workgroupBarrier();");
        let mut first = 0;
        for (i, p) in ps.iter().enumerate() {
            let n = p.stages();
            self.stages += n as u64;
            let next = ps.get(i + 1);
            self.line(
                indent,
                &format!("for (var s = 0u; s < {n}u; s = s + 1u) {{"),
            );
            let slot = format!("((s + {first}u) % 2u) * {P_SLOT}u");
            let other = format!("((s + {}u) % 2u) * {P_SLOT}u", first + 1);
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

    /// Loads stage `stage` (a WGSL expr) of a column product's X into `px`: this thread's quad
    /// (row `lid / row_quads`, words `4·(lid % row_quads) ..+ 4`), zero past the ends.
    fn load_column_stage(&mut self, indent: usize, c: &ColumnProduct, stage: &str) {
        let (rq, rs) = (c.row_quads(), c.rows_per_stage());
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
        let in_stage = if rq * rs < X_SLOT {
            format!(" && lid < {}u", rq * rs)
        } else {
            String::new()
        };
        self.line(
            indent,
            &format!(
                "{{ let gr = {} + ({stage}) * {rs}u + lid / {rq}u; let gc = (lid % {rq}u) * 4u; let ok = gr < {}{in_stage}; let gr_ = min(gr, {} - 1u);\n  px = vec4<f32>({}); }}",
                c.x.row0,
                c.x.rows,
                c.x.rows,
                comps.join(", ")
            ),
        );
    }

    /// One stage's column products (tile columns `stage · rows_per_stage ..`) from the buffer at
    /// quad `slot`.
    fn compute_column(&mut self, indent: usize, c: &ColumnProduct, slot: &str, stage: &str) {
        let (nq, rq, rs) = (c.nq(), c.row_quads(), c.rows_per_stage());
        self.line(indent, &format!("let tq = ({stage}) * {}u;", rs / QUAD));
        for j4 in 0..rs / QUAD {
            let mut t = String::new();
            for a in 0..4 {
                write!(t, "let t{a} = sm[rt + tq + {}u]; ", a * 16 * T_ROW + j4).unwrap();
            }
            t.push('\n');
            for (jj, comp) in COMP.iter().enumerate() {
                t.push_str("  { ");
                for q in 0..nq {
                    write!(
                        t,
                        "let x{q} = sm[{slot} + tx + {}u]; ",
                        (QUAD * j4 + jj) * rq + 16 * q
                    )
                    .unwrap();
                }
                for a in 0..4 {
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

    /// Loads and stores a column product's first stage (before the barrier that publishes the
    /// tile).
    fn column_first_stage(&mut self, indent: usize, c: &ColumnProduct) {
        self.load_column_stage(indent, c, "0u");
        self.line(indent, &format!("sm[{X_AT}u + lid] = px;"));
    }

    /// The column product's stages, its first already stored and the tile published; ends with
    /// a barrier.
    fn column_product(&mut self, indent: usize, c: &ColumnProduct) {
        let n = c.stages();
        debug_assert!(
            n.is_multiple_of(2),
            "a column product's first stage uses buffer 0"
        );
        self.stages += n as u64;
        self.line(
            indent,
            &format!("for (var s = 0u; s < {n}u; s = s + 1u) {{"),
        );
        self.line(
            indent + 1,
            &format!(
                "let so = {X_AT}u + (s % 2u) * {X_SLOT}u;\nlet sn = {X_AT}u + ((s + 1u) % 2u) * {X_SLOT}u;"
            ),
        );
        self.line(indent + 1, &format!("if (s + 1u < {n}u) {{"));
        self.load_column_stage(indent + 2, c, "s + 1u");
        self.line(indent + 1, "}");
        self.compute_column(indent + 1, c, "so", "s");
        self.line(
            indent + 1,
            &format!("if (s + 1u < {n}u) {{ sm[sn + lid] = px; }}\nworkgroupBarrier();"),
        );
        self.line(indent, "}");
    }

    /// `c` over the tile `v` (see [`Body::write_tile`]): the first stage of the streamed operand
    /// loaded, the tile written, then the product; inside a column block (indent 2).
    fn tile_product(&mut self, v: &str, c: &ColumnProduct) {
        self.column_first_stage(2, c);
        self.write_tile(2, v);
        self.line(2, "workgroupBarrier();");
        self.column_product(2, c);
    }

    /// Writes `v[a][b]` (an `array<vec4<f32>, 4>`) to the tile.
    fn write_tile(&mut self, indent: usize, v: &str) {
        let mut t = String::new();
        for a in 0..4 {
            let row: Vec<String> = COMP
                .iter()
                .enumerate()
                .map(|(b, comp)| {
                    format!(
                        "sm[tw + {}u][tc] = {v}[{a}].{comp};",
                        a * 16 * T_ROW + QUAD * b
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
            &format!("var {}: array<vec4<f32>, {}>;", c.acc, QUAD * c.nq()),
        );
    }

    /// Writes the rows' accumulator `acc` (`width` columns), each value as `value(expr, a)` for
    /// row `ty + 16a`, to `out`; rows past `rows` (a WGSL expr) are not written.
    fn store_rows(
        &mut self,
        out: &Mat,
        acc: &str,
        width: usize,
        rows: &str,
        value: &dyn Fn(&str, usize) -> String,
    ) {
        let nq = width.div_ceil(64).max(1);
        for a in 0..4 {
            let mut t = format!(
                "{{ let i = row0 + ty + {}u;\n  if (i < {rows}) {{\n",
                16 * a
            );
            for q in 0..nq {
                for (k, comp) in COMP.iter().enumerate() {
                    let col = format!("(tx + {}u) * 4u + {k}u", 16 * q);
                    let v = value(&format!("{acc}[{}].{comp}", a * nq + q), a);
                    let store = format!("{}[{}] = {v};", out.arena, out.at("i", &col));
                    if 64 * q + QUAD * 15 + k < width {
                        writeln!(t, "    {store}").unwrap();
                    } else {
                        writeln!(t, "    if ({col} < {width}u) {{ {store} }}").unwrap();
                    }
                }
            }
            t.push_str("  }\n}");
            self.line(1, &t);
        }
    }

    fn forward(&mut self, q: &Mat, k: &Mat, v: &Mat, o: &Mat, l: &Mat, f: &Flash) {
        let pv = ColumnProduct {
            acc: "acc",
            x: Rows {
                m: v,
                row0: "col0",
                rows: "SK",
            },
            width: f.dv,
        };
        let nq = pv.nq();
        self.line(
            1,
            &format!(
                "var x: array<vec4<f32>, 4>;\nvar pa: vec4<f32>;\nvar pb: vec4<f32>;\nvar px: vec4<f32>;\nvar m = vec4<f32>({NEG_INF});\nvar l = vec4<f32>(0.0);"
            ),
        );
        self.declare_acc(&pv);
        self.line(1, &format!("let blocks = (SK + {BC}u - 1u) / {BC}u;"));
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.line(1, &format!("let col0 = kb * {BC}u;"));
        let dead = self.dead(
            ("row0", &format!("row0 + {}u", BR - 1)),
            ("col0", &format!("col0 + {}u", BC - 1)),
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
        // scores, -inf past the keys; this thread's row maxima to the row statistics
        for a in 0..4 {
            let mut t = String::new();
            for (b, comp) in COMP.iter().enumerate() {
                let (i, j) = (
                    format!("row0 + ty + {}u", 16 * a),
                    format!("col0 + tx + {}u", 16 * b),
                );
                writeln!(
                    t,
                    "x[{a}].{comp} = select({NEG_INF}, score(x[{a}].{comp}, {}), {j} < SK);",
                    self.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)")),
                )
                .unwrap();
            }
            write!(
                t,
                "sm[{RED_AT}u + ty * 4u + tx / 4u + {}u][tc] = max_nan(max_nan(x[{a}].x, x[{a}].y), max_nan(x[{a}].z, x[{a}].w));",
                a * 16 * QUAD
            )
            .unwrap();
            self.line(2, &t);
        }
        self.column_first_stage(2, &pv);
        self.line(2, "workgroupBarrier();");
        // the rows' new maxima; probabilities to the tile, sums and accumulators rescaled
        for a in 0..4 {
            let mut t = format!("{{ var mb = m[{a}];\n");
            for k4 in 0..4 {
                let r = format!("sm[{RED_AT}u + ty * 4u + {}u]", a * 16 * QUAD + k4);
                writeln!(
                    t,
                    "  {{ let r = {r}; mb = max_nan(max_nan(mb, max_nan(r.x, r.y)), max_nan(r.z, r.w)); }}"
                )
                .unwrap();
            }
            write!(
                t,
                "  let ms = select(mb, 0.0, mb == {NEG_INF});\n  let alpha = exp(m[{a}] - ms);\n  m[{a}] = mb;\n  x[{a}] = exp(x[{a}] - vec4<f32>(ms));\n  l[{a}] = l[{a}] * alpha + (x[{a}].x + x[{a}].y) + (x[{a}].z + x[{a}].w);\n"
            )
            .unwrap();
            for qq in 0..nq {
                writeln!(t, "  acc[{n}] = acc[{n}] * alpha;", n = a * nq + qq).unwrap();
            }
            t.push('}');
            self.line(2, &t);
        }
        self.write_tile(2, "x");
        self.line(2, "workgroupBarrier();");
        self.column_product(2, &pv);
        self.line(1, "}");
        self.line(1, "}");
        // the rows' sums, then the results
        for a in 0..4 {
            self.line(
                1,
                &format!(
                    "sm[{RED_AT}u + ty * 4u + tx / 4u + {}u][tc] = l[{a}];",
                    a * 16 * QUAD
                ),
            );
        }
        self.line(1, "workgroupBarrier();\nvar lt = vec4<f32>(0.0);");
        for a in 0..4 {
            let mut t = String::from("{ ");
            for k4 in 0..4 {
                write!(
                    t,
                    "let r{k4} = sm[{RED_AT}u + ty * 4u + {}u]; ",
                    a * 16 * QUAD + k4
                )
                .unwrap();
            }
            write!(
                t,
                "let r = (r0 + r1) + (r2 + r3); lt[{a}] = (r.x + r.y) + (r.z + r.w); }}"
            )
            .unwrap();
            self.line(1, &t);
        }
        self.store_rows(o, "acc", f.dv, "SQ", &|x, a| format!("{x} / lt[{a}]"));
        for a in 0..4 {
            self.line(
                1,
                &format!(
                    "{{ let i = row0 + ty + {}u; if (i < SQ && tx == 0u) {{ {}[{}] = select(m[{a}] + log(lt[{a}]), {NAN}, m[{a}] == {NEG_INF}); }} }}",
                    16 * a,
                    l.arena,
                    l.at("i", "0u")
                ),
            );
        }
    }

    /// `P` (into `x`) and the score gradient `G` (into `y`) of the tile from its products `x`
    /// (`Q·Kᵀ`) and `y` (`dO·Vᵀ`); `lse`/`delta` are read per query. `transposed`: rows are
    /// keys and columns queries.
    fn probabilities_and_gradients(&mut self, lse: &Mat, delta: &Mat, transposed: bool) {
        // per query: L and D (rows' or columns' queries)
        let query = |n: usize| {
            if transposed {
                format!("col0 + tx + {}u", 16 * n)
            } else {
                format!("row0 + ty + {}u", 16 * n)
            }
        };
        let mut t = String::new();
        for n in 0..4 {
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
        for a in 0..4 {
            let mut t = String::new();
            for (b, comp) in COMP.iter().enumerate() {
                let (r, c) = (
                    format!("row0 + ty + {}u", 16 * a),
                    format!("col0 + tx + {}u", 16 * b),
                );
                let (i, j, n) = if transposed { (c, r, b) } else { (r, c, a) };
                let co = self.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)"));
                write!(
                    t,
                    "{{ let live = {i} < SQ && {j} < SK; let pr = select(0.0, exp(score(x[{a}].{comp}, {co}) - lq{n}), live);\n  y[{a}].{comp} = select(0.0, dscore(pr * (y[{a}].{comp} - dq{n}), {co}), live); x[{a}].{comp} = pr; }}\n"
                )
                .unwrap();
            }
            self.line(2, &t);
        }
    }

    fn backward_dq(&mut self, o: &Operands, out: &Mat, f: &Flash) {
        let gk = ColumnProduct {
            acc: "acc",
            x: Rows {
                m: o.k,
                row0: "col0",
                rows: "SK",
            },
            width: f.d,
        };
        self.line(
            1,
            "var x: array<vec4<f32>, 4>;\nvar y: array<vec4<f32>, 4>;\nvar pa: vec4<f32>;\nvar pb: vec4<f32>;\nvar px: vec4<f32>;",
        );
        self.declare_acc(&gk);
        self.line(1, &format!("let blocks = (SK + {BC}u - 1u) / {BC}u;"));
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.line(1, &format!("let col0 = kb * {BC}u;"));
        let dead = self.dead(
            ("row0", &format!("row0 + {}u", BR - 1)),
            ("col0", &format!("col0 + {}u", BC - 1)),
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

    fn backward_dkdv(&mut self, o: &Operands, outs: &[Mat], f: &Flash) {
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
        let pdo = ColumnProduct {
            acc: "dv",
            x: dor,
            width: f.dv,
        };
        let gq = ColumnProduct {
            acc: "dk",
            x: qr,
            width: f.d,
        };
        self.line(
            1,
            "var x: array<vec4<f32>, 4>;\nvar y: array<vec4<f32>, 4>;\nvar pa: vec4<f32>;\nvar pb: vec4<f32>;\nvar px: vec4<f32>;",
        );
        self.declare_acc(&pdo);
        self.declare_acc(&gq);
        self.line(1, &format!("let blocks = (SQ + {BC}u - 1u) / {BC}u;"));
        self.line(1, "for (var qb = 0u; qb < blocks; qb = qb + 1u) {");
        self.line(1, &format!("let col0 = qb * {BC}u;"));
        // rows are keys, columns queries: the tile is dead when its transpose is
        let dead = self.dead(
            ("col0", &format!("col0 + {}u", BC - 1)),
            ("row0", &format!("row0 + {}u", BR - 1)),
        );
        self.line(1, &format!("if (!{dead}) {{"));
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
        self.line(1, "}");
        self.line(1, "}");
        self.store_rows(&outs[0], "dk", f.d, "SK", &|x, _| x.to_string());
        self.store_rows(&outs[1], "dv", f.dv, "SK", &|x, _| x.to_string());
    }
}

/// `fn tile_dead(batch coords.., i0, i1, j0, j1) -> bool`: whether the score program is
/// certainly `-inf` for every query in `[i0, i1]` and key in `[j0, j1]`, by interval arithmetic
/// over its instructions (the raw product and values read from memory are unknown). `false` is
/// always safe.
fn tile_dead_fn(p: &Program, nb: usize) -> String {
    use sinter_ir::Op;
    let mut s = String::new();
    let mut params: Vec<String> = (0..nb).map(|a| format!("b{a}: u32")).collect();
    params.extend(["i0: u32", "i1: u32", "j0: u32", "j1: u32"].map(String::from));
    writeln!(s, "fn tile_dead({}) -> bool {{", params.join(", ")).unwrap();
    writeln!(
        s,
        "    let NEG = f32_bits(0xff800000u);\n    let POS = f32_bits(0x7f800000u);"
    )
    .unwrap();
    let dtypes = p.dtypes();
    for (i, inst) in p.insts.iter().enumerate() {
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
    let out = p.outputs[0].value;
    writeln!(s, "    return hi{out} == NEG;\n}}").unwrap();
    s
}
