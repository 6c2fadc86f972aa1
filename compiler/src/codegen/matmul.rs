//! Tiled matrix multiply with workgroup memory.
//!
//! A workgroup computes a `BM x BN` block of the output. Per step it stages a `BM x BK` slab of
//! `a` and a `BK x BN` slab of `b` in workgroup memory (zero-filled past the edges) and each of
//! the 256 threads accumulates a `TM x TN` micro-tile; the next step's slabs are loaded into
//! registers while the current ones are multiplied, hiding global-memory latency. A thread's
//! rows and columns are spread so that neighbouring threads read neighbouring words of
//! workgroup memory (as `vec4` quads when `TM` and `TN` are multiples of 4). Batch axes (with
//! broadcasting) map to `workgroup_id.z`.

use std::fmt::Write;

use super::{Emitter, LOOP_BUDGET, MAX_GROUPS, WORKGROUP, decompose};
use sinter_ir::artifact::WORD_BYTES;

use crate::CompileError;
use crate::kernel::Matmul;
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

/// Picks the largest block shape that still gives the GPU enough blocks to fill it. Measured on
/// the H200 (square sizes, TFLOP/s): 512 → MEDIUM 5.8 (LARGE 2.7); 1024 → WIDE 16.8 (LARGE
/// 11.7); 1536 → WIDE 21.1 (LARGE 17.4); 2048 and 4096 → LARGE 30.3 and 31.0 (WIDE 25.3).
pub fn tile_for(m: usize, n: usize) -> Tile {
    let blocks = |t: Tile| m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize);
    if blocks(LARGE) >= 256 {
        LARGE
    } else if n >= 128 && blocks(WIDE) >= 128 {
        WIDE
    } else if m >= 64 && n >= 64 {
        MEDIUM
    } else {
        SMALL
    }
}

pub fn emit(
    e: &mut Emitter,
    k: &Matmul,
    forced: Option<Tile>,
) -> Result<(String, [u32; 3], u32), CompileError> {
    let batch: usize = k.batch.iter().product();
    let t = forced.unwrap_or_else(|| tile_for(k.m, k.n));
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
    // Loop iterations per invocation (see `LOOP_BUDGET`): the K loop, and per K step the
    // staging loops and the product's loops, unless they are written out (`unrolled`).
    let (ea, eb) = (bm * bk / WORKGROUP, bk * bn / WORKGROUP);
    let steps = (k.k as u64).div_ceil(u64::from(bk));
    let staging = u64::from(2 * (ea + eb));
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
    let a_walks_k = k.a.strides[rb + 1] == 1;
    let b_walks_k = k.b.strides[rb + 1] != 1;
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
    let arena_a = e.arena(k.a.buffer);
    let arena_b = e.arena(k.b.buffer);
    let arena_o = e.arena(k.out.buffer);
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

    // Staging: each thread moves `ea` elements of a and `eb` of b per step. The fastest-varying
    // thread index follows each operand's unit stride, so global reads coalesce.
    writeln!(
        s,
        "    var pa: array<f32, {ea}>;\n    var pb: array<f32, {eb}>;"
    )
    .unwrap();
    let a_split = if a_walks_k {
        ("kk = i % BK", "mm = i / BK")
    } else {
        ("mm = i % BM", "kk = i / BM")
    };
    let b_split = if b_walks_k {
        ("kk = i % BK", "nn = i / BK")
    } else {
        ("nn = i % BN", "kk = i / BN")
    };
    // `for (var e = 0u; e < n; ...)`, or `n` blocks each binding `e`, when unrolled.
    let open = |s: &mut String, indent: &str, n: u32, e: u32| {
        if !unrolled {
            writeln!(s, "{indent}for (var e = 0u; e < {n}u; e = e + 1u) {{").unwrap();
        } else {
            writeln!(s, "{indent}{{ let e = {e}u;").unwrap();
        }
    };
    let copies = |n: u32| if unrolled { n } else { 1 };
    let load = |s: &mut String, indent: &str, k0: &str| {
        for copy in 0..copies(ea) {
            open(s, indent, ea, copy);
            writeln!(
            s,
            "{indent}    let i = lid + e * {WORKGROUP}u;\n{indent}    let {};\n{indent}    let {};",
            a_split.0, a_split.1
        )
        .unwrap();
            writeln!(
                s,
                "{indent}    let gm = row0 + mm;\n{indent}    let gk = {k0} + kk;"
            )
            .unwrap();
            writeln!(s, "{indent}    pa[e] = select(0.0, {arena_a}[a_base + min(gm, M - 1u) * a_s0 + min(gk, K - 1u) * a_s1], gm < M && gk < K);").unwrap();
            writeln!(s, "{indent}}}").unwrap();
        }
        for copy in 0..copies(eb) {
            open(s, indent, eb, copy);
            writeln!(
            s,
            "{indent}    let i = lid + e * {WORKGROUP}u;\n{indent}    let {};\n{indent}    let {};",
            b_split.0, b_split.1
        )
        .unwrap();
            writeln!(
                s,
                "{indent}    let gk = {k0} + kk;\n{indent}    let gn = col0 + nn;"
            )
            .unwrap();
            writeln!(s, "{indent}    pb[e] = select(0.0, {arena_b}[b_base + min(gk, K - 1u) * b_s0 + min(gn, N - 1u) * b_s1], gk < K && gn < N);").unwrap();
            writeln!(s, "{indent}}}").unwrap();
        }
    };
    let (put_a, put_b) = if quads {
        (
            "As[(kk * SA + mm) / 4u][mm % 4u]",
            "Bs[(kk * SB + nn) / 4u][nn % 4u]",
        )
    } else {
        ("As[kk * SA + mm]", "Bs[kk * SB + nn]")
    };
    let store = |s: &mut String, indent: &str| {
        for copy in 0..copies(ea) {
            open(s, indent, ea, copy);
            writeln!(
            s,
            "{indent}    let i = lid + e * {WORKGROUP}u;\n{indent}    let {};\n{indent}    let {};",
            a_split.0, a_split.1
        )
        .unwrap();
            writeln!(s, "{indent}    {put_a} = pa[e];\n{indent}}}").unwrap();
        }
        for copy in 0..copies(eb) {
            open(s, indent, eb, copy);
            writeln!(
            s,
            "{indent}    let i = lid + e * {WORKGROUP}u;\n{indent}    let {};\n{indent}    let {};",
            b_split.0, b_split.1
        )
        .unwrap();
            writeln!(s, "{indent}    {put_b} = pb[e];\n{indent}}}").unwrap();
        }
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
