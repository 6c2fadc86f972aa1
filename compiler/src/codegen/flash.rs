//! WGSL for flash attention (see [`crate::flash`]): the forward, the key-block backward (dK,
//! dV) and the query-block backward (dQ), tiled so that no `[Sq, Sk]` value reaches memory.
//!
//! **Tiling.** A workgroup of 256 threads, a 16 × 16 grid `(tx, ty)`, owns a block of 64 "rows"
//! (queries for the forward and dQ, keys for dK/dV) and walks the "columns" (the other side) in
//! blocks of 32. Thread `(tx, ty)` holds the score micro-tile of rows `ty + 16·a` (a < 4) and
//! columns `tx + 16·b` (b < 2) in registers, and accumulates the rows' outputs over columns
//! `tx + 16·c` of the result. Products over the head dimension stage 16-wide chunks of both
//! operands in workgroup memory (transposed, padded against bank conflicts); products over the
//! column block read a 64 × 32 tile of probabilities from workgroup memory and stage 64-wide
//! chunks of the streamed operand. Row statistics (max, sum) combine the 16 threads of a row
//! through workgroup memory.
//!
//! **Masks.** The score function is the graph's own program, called per element; a column
//! block is skipped, in uniform control flow, when an interval evaluation of that program over
//! the block's coordinate ranges proves every score `-inf` (causal and window masks), which
//! halves a causal attention's work.
//!
//! **Limits.** Any sequence lengths (ragged blocks are masked), head dimensions up to 256 (the
//! accumulators are 4 · ⌈d/16⌉ registers), batch axes with broadcasting. Every fixed-trip loop
//! is written out, so an invocation runs `⌈S/32⌉ · (⌈d/16⌉ + ⌈dv/64⌉ + …)` loop iterations in
//! all; barriers sit in uniform control flow.

use std::fmt::Write;

use sinter_ir::DType;

use super::fused::{FusedKernel, emit_elementwise_fn};
use super::{Emitter, MAX_GROUPS, WORKGROUP, decompose};
use crate::flash::FlashKind;
use crate::fused::{Inst, Program, Scalar};
use crate::kernel::Flash;
use crate::layout::View;

/// Rows per workgroup, columns per block, head-dimension chunk, value chunk.
const BR: usize = 64;
const BC: usize = 32;
const DC: usize = 16;
const VC: usize = 64;
/// Largest head dimension (the accumulators live in registers).
pub const MAX_HEAD_DIM: usize = 256;

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
            self.name(),
            self.row,
            self.col
        )
    }

    fn name(&self) -> &str {
        // the base variable is named after the arena word holding the base, made unique by
        // the caller through `bind`
        &self.base
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

fn load(m: &Mat, row: &str, col: &str) -> String {
    format!("{}[{}]", m.arena, m.at(row, col))
}

pub fn emit(e: &mut Emitter, k: &Flash) -> (String, [u32; 3], u32) {
    let nb = k.batch.len();
    let (rows_len, blocks_of) = match k.spec.kind {
        FlashKind::Forward | FlashKind::BackwardDq => (k.sq, k.sq),
        FlashKind::BackwardDkDv => (k.sk, k.sk),
    };
    let _ = rows_len;
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
    let nv_out = match k.spec.kind {
        FlashKind::Forward => k.dv,
        FlashKind::BackwardDq => k.d,
        FlashKind::BackwardDkDv => k.d.max(k.dv),
    };
    let nv = nv_out.div_ceil(16).max(1);
    writeln!(s, "const BR: u32 = {BR}u;\nconst BC: u32 = {BC}u;").unwrap();
    writeln!(s, "var<workgroup> At: array<f32, {}>;", DC * (BR + 1)).unwrap();
    writeln!(s, "var<workgroup> Bt: array<f32, {}>;", DC * (BC + 1)).unwrap();
    writeln!(s, "var<workgroup> Ps: array<f32, {}>;", BR * (BC + 1)).unwrap();
    let two_tiles = k.spec.kind == FlashKind::BackwardDkDv;
    if two_tiles {
        writeln!(s, "var<workgroup> Gs: array<f32, {}>;", BR * (BC + 1)).unwrap();
    }
    writeln!(s, "var<workgroup> Vs: array<f32, {}>;", BC * VC).unwrap();
    // row statistics: only the forward combines rows (its online softmax)
    let forward = k.spec.kind == FlashKind::Forward;
    if forward {
        writeln!(s, "var<workgroup> red: array<f32, {}>;", BR * 17).unwrap();
    }
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    )
    .unwrap();
    writeln!(s, "    let tx = lid % 16u;\n    let ty = lid / 16u;").unwrap();
    let dims = e.params(&k.batch);
    decompose(&mut s, "    ", "wid.y", "b", &dims);
    let (sq, sk, d, dv) = (e.param(k.sq), e.param(k.sk), e.param(k.d), e.param(k.dv));
    writeln!(
        s,
        "    let SQ = {sq};\n    let SK = {sk};\n    let D = {d};\n    let DV = {dv};"
    )
    .unwrap();
    writeln!(s, "    let row0 = wid.x * BR;").unwrap();
    let q = bind(&mut s, e, "q", &k.q, nb);
    let kk = bind(&mut s, e, "k", &k.k, nb);
    let v = bind(&mut s, e, "v", &k.v, nb);
    let mut cx = Body {
        s,
        nv,
        nb,
        loops: 0,
    };
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
            if k.spec.kind == FlashKind::BackwardDq {
                cx.backward_dq(&q, &kk, &v, &d_o, &lse, &delta, &outs[0], k);
            } else {
                cx.backward_dkdv(&q, &kk, &v, &d_o, &lse, &delta, &outs, k);
            }
        }
    }
    e.loop_trips(cx.loops);
    let mut s = cx.s;
    s.push_str("}\n");
    let words = DC * (BR + 1)
        + DC * (BC + 1)
        + BR * (BC + 1) * if two_tiles { 2 } else { 1 }
        + BC * VC
        + if forward { BR * 17 } else { 0 };
    (s, [blocks as u32, batch as u32, 1], (words * 4) as u32)
}

struct Body {
    s: String,
    /// Output columns per thread: `⌈width / 16⌉`.
    nv: usize,
    nb: usize,
    /// Loop iterations one invocation runs (see `LOOP_BUDGET`).
    loops: u64,
}

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

    /// `T[a][b] = Σ_d A[row0 + ty + 16a, d] · B[col0 + tx + 16b, d]` over `len` (a WGSL
    /// expression) in 16-wide chunks staged transposed; `A`/`B` rows past `a_rows`/`b_rows`
    /// read as 0. Leaves `T` in `var t: array<f32, 8>` named `acc_name`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &mut self,
        acc_name: &str,
        a: &Mat,
        a_row0: &str,
        a_rows: &str,
        b: &Mat,
        b_row0: &str,
        b_rows: &str,
        len: &str,
        trips: u64,
    ) {
        self.line(2, &format!("var {acc_name}: array<f32, 8>;"));
        self.line(
            2,
            &format!("for (var d0 = 0u; d0 < {len}; d0 = d0 + {DC}u) {{"),
        );
        self.loops += trips;
        // stage A: BR x DC = 1024 words, 4 per thread, d fastest
        for u in 0..(BR * DC / WORKGROUP as usize) {
            self.line(
                3,
                &format!(
                    "{{ let e = lid + {}u; let rr = e / {DC}u; let dd = e % {DC}u; let gr = {a_row0} + rr; let gd = d0 + dd;\n  At[dd * {}u + rr] = select(0.0, {}, gr < {a_rows} && gd < {len}); }}",
                    u * WORKGROUP as usize,
                    BR + 1,
                    load(a, &format!("min(gr, {a_rows} - 1u)"), &format!("min(gd, {len} - 1u)"))
                ),
            );
        }
        for u in 0..(BC * DC / WORKGROUP as usize) {
            self.line(
                3,
                &format!(
                    "{{ let e = lid + {}u; let rr = e / {DC}u; let dd = e % {DC}u; let gr = {b_row0} + rr; let gd = d0 + dd;\n  Bt[dd * {}u + rr] = select(0.0, {}, gr < {b_rows} && gd < {len}); }}",
                    u * WORKGROUP as usize,
                    BC + 1,
                    load(b, &format!("min(gr, {b_rows} - 1u)"), &format!("min(gd, {len} - 1u)"))
                ),
            );
        }
        self.line(3, "workgroupBarrier();");
        for dd in 0..DC {
            let mut t = String::new();
            for ai in 0..4 {
                write!(
                    t,
                    "let a{ai} = At[{}u + ty + {}u]; ",
                    dd * (BR + 1),
                    16 * ai
                )
                .unwrap();
            }
            for bi in 0..2 {
                write!(
                    t,
                    "let b{bi} = Bt[{}u + tx + {}u]; ",
                    dd * (BC + 1),
                    16 * bi
                )
                .unwrap();
            }
            for ai in 0..4 {
                for bi in 0..2 {
                    write!(
                        t,
                        "{acc_name}[{}] = fma(a{ai}, b{bi}, {acc_name}[{}]); ",
                        ai * 2 + bi,
                        ai * 2 + bi
                    )
                    .unwrap();
                }
            }
            self.line(3, &format!("{{ {t}}}"));
        }
        self.line(3, "workgroupBarrier();");
        self.line(2, "}");
    }

    /// `acc[a][c] += Σ_col T[a][col] · X[col0 + col, c]` for the tile `T` in `tile` (a 64 × 32
    /// workgroup array) and output columns `tx + 16c` of width `width`, the streamed operand `X`
    /// staged in 64-wide chunks; `X` rows past `x_rows` read as 0.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &mut self,
        acc: &str,
        tile: &str,
        x: &Mat,
        col0: &str,
        x_rows: &str,
        width: &str,
        trips: u64,
    ) {
        self.line(
            2,
            &format!("for (var v0 = 0u; v0 < {width}; v0 = v0 + {VC}u) {{"),
        );
        self.loops += trips;
        for u in 0..(BC * VC / WORKGROUP as usize) {
            self.line(
                3,
                &format!(
                    "{{ let e = lid + {}u; let cc = e / {VC}u; let vc = e % {VC}u; let gr = {col0} + cc; let gc = v0 + vc;\n  Vs[e] = select(0.0, {}, gr < {x_rows} && gc < {width}); }}",
                    u * WORKGROUP as usize,
                    load(x, &format!("min(gr, {x_rows} - 1u)"), &format!("min(gc, {width} - 1u)"))
                ),
            );
        }
        self.line(3, "workgroupBarrier();");
        // this chunk's four output columns of the thread: tx + 16·q, q < 4
        self.line(3, "let c0 = v0 / 16u;");
        self.line(3, "var part: array<f32, 16>;");
        for col in 0..BC {
            let mut t = String::new();
            for ai in 0..4 {
                write!(
                    t,
                    "let p{ai} = {tile}[(ty + {}u) * {}u + {col}u]; ",
                    16 * ai,
                    BC + 1
                )
                .unwrap();
            }
            for qi in 0..4 {
                write!(t, "let x{qi} = Vs[{}u + tx + {}u]; ", col * VC, 16 * qi).unwrap();
            }
            for ai in 0..4 {
                for qi in 0..4 {
                    write!(
                        t,
                        "part[{}] = fma(p{ai}, x{qi}, part[{}]); ",
                        ai * 4 + qi,
                        ai * 4 + qi
                    )
                    .unwrap();
                }
            }
            self.line(3, &format!("{{ {t}}}"));
        }
        let nv = self.nv;
        for ai in 0..4 {
            for qi in 0..4 {
                self.line(
                    3,
                    &format!(
                        "if (c0 + {qi}u < {nv}u) {{ {acc}[{ai}u * {nv}u + c0 + {qi}u] = {acc}[{ai}u * {nv}u + c0 + {qi}u] + part[{}]; }}",
                        ai * 4 + qi
                    ),
                );
            }
        }
        self.line(3, "workgroupBarrier();");
        self.line(2, "}");
    }

    /// `dst[a] = combine over the 16 threads of row ty + 16a of src[a]` (both WGSL arrays or
    /// expressions indexed by `a`), through `red`.
    fn row_combine(&mut self, dst: &str, src: &dyn Fn(usize) -> String, max: bool, init: &str) {
        self.line(2, "workgroupBarrier();");
        for ai in 0..4 {
            self.line(
                2,
                &format!("red[(ty + {}u) * 17u + tx] = {};", 16 * ai, src(ai)),
            );
        }
        self.line(2, "workgroupBarrier();");
        for ai in 0..4 {
            let mut t = format!("var r = {init}; ");
            for x in 0..16 {
                let v = format!("red[(ty + {}u) * 17u + {x}u]", 16 * ai);
                if max {
                    write!(t, "r = max_nan(r, {v}); ").unwrap();
                } else {
                    write!(t, "r = r + {v}; ").unwrap();
                }
            }
            self.line(2, &format!("{{ {t}{dst}[{ai}] = r; }}"));
        }
    }

    fn forward(&mut self, q: &Mat, k: &Mat, v: &Mat, o: &Mat, l: &Mat, f: &Flash) {
        let nv = self.nv;
        let chunks = f.d.div_ceil(DC) as u64;
        let vchunks = f.dv.div_ceil(VC) as u64;
        let blocks = f.sk.div_ceil(BC) as u64;
        self.line(1, "var m: array<f32, 4>;\n    var l: array<f32, 4>;");
        self.line(1, &format!("var acc: array<f32, {}>;", 4 * nv));
        self.line(1, "for (var a = 0u; a < 4u; a = a + 1u) { m[a] = bitcast<f32>(0xff800000u); l[a] = 0.0; }");
        self.loops += 4;
        self.line(1, "let blocks = (SK + BC - 1u) / BC;");
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.loops += blocks;
        self.line(1, "let col0 = kb * BC;");
        let dead = self.dead(("row0", "row0 + BR - 1u"), ("col0", "col0 + BC - 1u"));
        self.line(1, &format!("if (!{dead}) {{"));
        self.product("x", q, "row0", "SQ", k, "col0", "SK", "D", blocks * chunks);
        // scores, masked past the ends
        for ai in 0..4 {
            for bi in 0..2 {
                let (i, j) = (
                    format!("row0 + ty + {}u", 16 * ai),
                    format!("col0 + tx + {}u", 16 * bi),
                );
                self.line(
                    2,
                    &format!(
                        "x[{n}] = select(bitcast<f32>(0xff800000u), score(x[{n}], {}), {j} < SK);",
                        self.coords(&format!("min({i}, SQ - 1u)"), &format!("min({j}, SK - 1u)")),
                        n = ai * 2 + bi
                    ),
                );
            }
        }
        self.line(2, "var mb: array<f32, 4>;");
        self.row_combine(
            "mb",
            &|a| format!("max_nan(x[{}], x[{}])", a * 2, a * 2 + 1),
            true,
            "bitcast<f32>(0xff800000u)",
        );
        self.line(
            2,
            "var alpha: array<f32, 4>;\n        var ps: array<f32, 4>;",
        );
        for ai in 0..4 {
            self.line(
                2,
                &format!(
                    "{{ let mn = max_nan(m[{ai}], mb[{ai}]); let ms = select(mn, 0.0, mn == bitcast<f32>(0xff800000u));\n  alpha[{ai}] = exp(m[{ai}] - ms); m[{ai}] = mn;\n  let p0 = exp(x[{a0}] - ms); let p1 = exp(x[{a1}] - ms);\n  Ps[(ty + {r}u) * {w}u + tx] = p0; Ps[(ty + {r}u) * {w}u + tx + 16u] = p1; ps[{ai}] = p0 + p1; }}",
                    a0 = ai * 2,
                    a1 = ai * 2 + 1,
                    r = 16 * ai,
                    w = BC + 1
                ),
            );
        }
        self.line(2, "var sb: array<f32, 4>;");
        self.row_combine("sb", &|a| format!("ps[{a}]"), false, "0.0");
        for ai in 0..4 {
            self.line(
                2,
                &format!(
                    "l[{ai}] = l[{ai}] * alpha[{ai}] + sb[{ai}];\n        for (var c = 0u; c < {nv}u; c = c + 1u) {{ acc[{ai}u * {nv}u + c] = acc[{ai}u * {nv}u + c] * alpha[{ai}]; }}"
                ),
            );
            self.loops += blocks * nv as u64;
        }
        self.line(2, "workgroupBarrier();");
        self.accumulate("acc", "Ps", v, "col0", "SK", "DV", blocks * vchunks);
        self.line(1, "}");
        self.line(1, "}");
        // results
        for ai in 0..4 {
            self.line(
                1,
                &format!(
                    "{{ let i = row0 + ty + {r}u;\n  if (i < SQ) {{\n    for (var c = 0u; c < {nv}u; c = c + 1u) {{ let col = tx + 16u * c; if (col < DV) {{ {}[{}] = acc[{ai}u * {nv}u + c] / l[{ai}]; }} }}\n    if (tx == 0u) {{ {}[{}] = select(m[{ai}] + log(l[{ai}]), bitcast<f32>(0x7fc00000u), m[{ai}] == bitcast<f32>(0xff800000u)); }}\n  }}\n}}",
                    o.arena,
                    o.at("i", "col"),
                    l.arena,
                    l.at("i", "0u"),
                    r = 16 * ai
                ),
            );
            self.loops += nv as u64;
        }
    }

    /// `tile_dead`'s arguments for query range `i` and key range `j` (each `lo, hi`).
    fn dead(&self, i: (&str, &str), j: (&str, &str)) -> String {
        let mut a: Vec<String> = (0..self.nb).map(|x| format!("b{x}")).collect();
        a.extend([i.0, i.1, j.0, j.1].map(String::from));
        format!("tile_dead({})", a.join(", "))
    }

    /// `P` and `dS`-derived `G` of the tile at (rows, columns) = (`ri`, `cj`): `x` holds the raw
    /// products, `y` the `dP` products; `lse`/`delta` are read per query.
    #[allow(clippy::too_many_arguments)]
    fn probabilities_and_gradients(
        &mut self,
        lse: &Mat,
        delta: &Mat,
        transposed: bool,
        g_tile: &str,
    ) {
        for ai in 0..4 {
            for bi in 0..2 {
                let n = ai * 2 + bi;
                let (r, c) = (
                    format!("row0 + ty + {}u", 16 * ai),
                    format!("col0 + tx + {}u", 16 * bi),
                );
                // queries and keys: the forward orientation has rows = queries
                let (i, j, iq_max, jk_max) = if transposed {
                    (c.clone(), r.clone(), "SQ", "SK")
                } else {
                    (r.clone(), c.clone(), "SQ", "SK")
                };
                let (ic, jc) = (
                    format!("min({i}, {iq_max} - 1u)"),
                    format!("min({j}, {jk_max} - 1u)"),
                );
                let live = format!("({i} < SQ && {j} < SK)");
                self.line(
                    2,
                    &format!(
                        "{{ let s = score(x[{n}], {co}); let pr = select(0.0, exp(s - {}), {live}); let ds = pr * (y[{n}] - {});\n  let g = select(0.0, dscore(ds, {co}), {live});\n  Ps[(ty + {ra}u) * {w}u + tx + {cb}u] = pr; {g_tile}[(ty + {ra}u) * {w}u + tx + {cb}u] = g; }}",
                        format_args!("{}[{}]", lse.arena, lse.at(&ic, "0u")),
                        format_args!("{}[{}]", delta.arena, delta.at(&ic, "0u")),
                        co = self.coords(&ic, &jc),
                        ra = 16 * ai,
                        cb = 16 * bi,
                        w = BC + 1
                    ),
                );
            }
        }
        self.line(2, "workgroupBarrier();");
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_dq(
        &mut self,
        q: &Mat,
        k: &Mat,
        v: &Mat,
        d_o: &Mat,
        lse: &Mat,
        delta: &Mat,
        out: &Mat,
        f: &Flash,
    ) {
        let nv = self.nv;
        let blocks = f.sk.div_ceil(BC) as u64;
        self.line(1, &format!("var acc: array<f32, {}>;", 4 * nv));
        self.line(1, "let blocks = (SK + BC - 1u) / BC;");
        self.line(1, "for (var kb = 0u; kb < blocks; kb = kb + 1u) {");
        self.loops += blocks;
        self.line(1, "let col0 = kb * BC;");
        let dead = self.dead(("row0", "row0 + BR - 1u"), ("col0", "col0 + BC - 1u"));
        self.line(1, &format!("if (!{dead}) {{"));
        self.product(
            "x",
            q,
            "row0",
            "SQ",
            k,
            "col0",
            "SK",
            "D",
            blocks * f.d.div_ceil(DC) as u64,
        );
        self.product(
            "y",
            d_o,
            "row0",
            "SQ",
            v,
            "col0",
            "SK",
            "DV",
            blocks * f.dv.div_ceil(DC) as u64,
        );
        self.probabilities_and_gradients(lse, delta, false, "Ps");
        self.accumulate(
            "acc",
            "Ps",
            k,
            "col0",
            "SK",
            "D",
            blocks * f.d.div_ceil(VC) as u64,
        );
        self.line(1, "}");
        self.line(1, "}");
        self.store_rows(out, "SQ", "D");
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_dkdv(
        &mut self,
        q: &Mat,
        k: &Mat,
        v: &Mat,
        d_o: &Mat,
        lse: &Mat,
        delta: &Mat,
        outs: &[Mat],
        f: &Flash,
    ) {
        let nv = self.nv;
        let blocks = f.sq.div_ceil(BC) as u64;
        self.line(
            1,
            &format!(
                "var dk: array<f32, {}>;\n    var dv: array<f32, {}>;",
                4 * nv,
                4 * nv
            ),
        );
        self.line(1, "let blocks = (SQ + BC - 1u) / BC;");
        self.line(1, "for (var qb = 0u; qb < blocks; qb = qb + 1u) {");
        self.loops += blocks;
        self.line(1, "let col0 = qb * BC;");
        // rows are keys, columns queries: the tile is dead when its transpose is
        let dead = self.dead(("col0", "col0 + BC - 1u"), ("row0", "row0 + BR - 1u"));
        self.line(1, &format!("if (!{dead}) {{"));
        self.product(
            "x",
            k,
            "row0",
            "SK",
            q,
            "col0",
            "SQ",
            "D",
            blocks * f.d.div_ceil(DC) as u64,
        );
        self.product(
            "y",
            v,
            "row0",
            "SK",
            d_o,
            "col0",
            "SQ",
            "DV",
            blocks * f.dv.div_ceil(DC) as u64,
        );
        // P is written to Ps and G to Gs with rows = keys
        self.probabilities_and_gradients(lse, delta, true, "Gs");
        self.accumulate(
            "dv",
            "Ps",
            d_o,
            "col0",
            "SQ",
            "DV",
            blocks * f.dv.div_ceil(VC) as u64,
        );
        self.accumulate(
            "dk",
            "Gs",
            q,
            "col0",
            "SQ",
            "D",
            blocks * f.d.div_ceil(VC) as u64,
        );
        self.line(1, "}");
        self.line(1, "}");
        let _ = v;
        self.store_rows_named(&outs[0], "dk", "SK", "D");
        self.store_rows_named(&outs[1], "dv", "SK", "DV");
    }

    fn store_rows(&mut self, out: &Mat, rows: &str, width: &str) {
        self.store_rows_named(out, "acc", rows, width);
    }

    fn store_rows_named(&mut self, out: &Mat, acc: &str, rows: &str, width: &str) {
        let nv = self.nv;
        for ai in 0..4 {
            self.line(
                1,
                &format!(
                    "{{ let i = row0 + ty + {r}u;\n  if (i < {rows}) {{ for (var c = 0u; c < {nv}u; c = c + 1u) {{ let col = tx + 16u * c; if (col < {width}) {{ {}[{}] = {acc}[{ai}u * {nv}u + c]; }} }} }}\n}}",
                    out.arena,
                    out.at("i", "col"),
                    r = 16 * ai
                ),
            );
            self.loops += nv as u64;
        }
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
        "    let NEG = bitcast<f32>(0xff800000u);\n    let POS = bitcast<f32>(0x7f800000u);"
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
