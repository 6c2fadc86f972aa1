//! Tiled matrix multiply with workgroup memory.
//!
//! A workgroup computes a `BM x BN` block of the output: per step it stages a `BM x BK` slab
//! of `a` and a `BK x BN` slab of `b` in workgroup memory (zero-filled past the edges), then
//! each of the 256 threads accumulates a `TM x TN` micro-tile. A thread's rows and columns are
//! strided by `BM / TM` and `BN / TN` so that neighbouring threads read neighbouring words of
//! workgroup memory and write neighbouring output elements. Batch axes (with broadcasting)
//! map to `workgroup_id.z`.

use std::fmt::Write;

use super::{Emitter, MAX_GROUPS, WORKGROUP, decompose};
use crate::CompileError;
use crate::kernel::Matmul;

/// Block shape of a matmul kernel; `(bm / tm) * (bn / tn)` is always 256 threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

pub const LARGE: Tile = Tile {
    bm: 128,
    bn: 128,
    bk: 8,
    tm: 8,
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

pub fn tile_for(m: usize, n: usize) -> Tile {
    if m >= 256 && n >= 256 {
        LARGE
    } else if m >= 64 && n >= 64 {
        MEDIUM
    } else {
        SMALL
    }
}

pub fn emit(e: &mut Emitter, k: &Matmul) -> Result<(String, [u32; 3], u32), CompileError> {
    let batch: usize = k.batch.iter().product();
    if batch > MAX_GROUPS as usize {
        return Err(CompileError::KernelLimit {
            kernel: "matmul",
            what: format!("{batch} batch entries; one dispatch handles at most {MAX_GROUPS}"),
        });
    }
    let t = tile_for(k.m, k.n);
    let Tile { bm, bn, bk, tm, tn } = t;
    let rb = k.batch.len();
    let a_k_fastest = k.a.strides[rb + 1] == 1;
    let b_n_fastest = k.b.strides[rb + 1] == 1;

    let mut s = String::new();
    writeln!(
        s,
        "const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst BK: u32 = {bk}u;"
    )
    .unwrap();
    writeln!(s, "const TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;").unwrap();
    // Micro-tiles of 4x4 multiples read workgroup memory as vec4: a thread's rows (columns)
    // are quads spread BM / (TM / 4) apart, so neighbouring threads read neighbouring quads.
    let quads = tm % 4 == 0 && tn % 4 == 0;
    if quads {
        writeln!(s, "var<workgroup> As: array<vec4<f32>, {}>;", bm * bk / 4).unwrap();
        writeln!(s, "var<workgroup> Bs: array<vec4<f32>, {}>;", bk * bn / 4).unwrap();
    } else {
        writeln!(s, "var<workgroup> As: array<f32, {}>;", bm * bk).unwrap();
        writeln!(s, "var<workgroup> Bs: array<f32, {}>;", bk * bn).unwrap();
    }
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(
        s,
        "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{"
    )
    .unwrap();
    let (m, n, kk) = (e.param(k.m), e.param(k.n), e.param(k.k));
    writeln!(s, "    let M = {m};\n    let N = {n};\n    let K = {kk};").unwrap();
    let batch_dims = e.params(&k.batch);
    decompose(&mut s, "    ", "wid.z", "b", &batch_dims);
    let arena_a = e.arena(k.a.buffer);
    let arena_b = e.arena(k.b.buffer);
    let arena_o = e.arena(k.out.buffer);
    let mut base = |name: &str, view: &crate::layout::View| {
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
    if quads {
        writeln!(s, "    var acc: array<vec4<f32>, {}>;", tm * tn / 4).unwrap();
    } else {
        writeln!(s, "    var acc: array<f32, {}>;", tm * tn).unwrap();
    }
    let (store_a, store_b) = if quads {
        (
            "As[(kk * BM + mm) / 4u][mm % 4u] = v;",
            "Bs[(kk * BN + nn) / 4u][nn % 4u] = v;",
        )
    } else {
        ("As[kk * BM + mm] = v;", "Bs[kk * BN + nn] = v;")
    };
    writeln!(s, "    let steps = (K + BK - 1u) / BK;").unwrap();
    writeln!(s, "    for (var t = 0u; t < steps; t = t + 1u) {{").unwrap();
    writeln!(s, "        let k0 = t * BK;").unwrap();
    // Stage a: As[kk * BM + mm]; the fastest-varying thread index follows a's unit stride.
    let (a_inner, a_outer) = if a_k_fastest {
        ("kk = i % BK", "mm = i / BK")
    } else {
        ("mm = i % BM", "kk = i / BM")
    };
    writeln!(
        s,
        "        for (var e = 0u; e < {}u; e = e + 1u) {{",
        bm * bk / WORKGROUP
    )
    .unwrap();
    writeln!(s, "            let i = lid + e * {WORKGROUP}u;\n            let {a_inner};\n            let {a_outer};").unwrap();
    writeln!(
        s,
        "            let gm = row0 + mm;\n            let gk = k0 + kk;"
    )
    .unwrap();
    writeln!(s, "            var v = 0.0;").unwrap();
    writeln!(
        s,
        "            if (gm < M && gk < K) {{ v = {arena_a}[a_base + gm * a_s0 + gk * a_s1]; }}"
    )
    .unwrap();
    writeln!(s, "            {store_a}\n        }}").unwrap();
    let (b_inner, b_outer) = if b_n_fastest {
        ("nn = i % BN", "kk = i / BN")
    } else {
        ("kk = i % BK", "nn = i / BK")
    };
    writeln!(
        s,
        "        for (var e = 0u; e < {}u; e = e + 1u) {{",
        bk * bn / WORKGROUP
    )
    .unwrap();
    writeln!(s, "            let i = lid + e * {WORKGROUP}u;\n            let {b_inner};\n            let {b_outer};").unwrap();
    writeln!(
        s,
        "            let gk = k0 + kk;\n            let gn = col0 + nn;"
    )
    .unwrap();
    writeln!(s, "            var v = 0.0;").unwrap();
    writeln!(
        s,
        "            if (gk < K && gn < N) {{ v = {arena_b}[b_base + gk * b_s0 + gn * b_s1]; }}"
    )
    .unwrap();
    writeln!(s, "            {store_b}\n        }}").unwrap();
    writeln!(s, "        workgroupBarrier();").unwrap();
    if quads {
        quad_compute_and_store(&mut s, t, &arena_o);
    } else {
        writeln!(s, "        for (var kk = 0u; kk < BK; kk = kk + 1u) {{").unwrap();
        writeln!(
            s,
            "            var ra: array<f32, {tm}>;\n            var rb: array<f32, {tn}>;"
        )
        .unwrap();
        writeln!(s, "            for (var i = 0u; i < TM; i = i + 1u) {{ ra[i] = As[kk * BM + ty + i * (BM / TM)]; }}").unwrap();
        writeln!(s, "            for (var j = 0u; j < TN; j = j + 1u) {{ rb[j] = Bs[kk * BN + tx + j * (BN / TN)]; }}").unwrap();
        writeln!(s, "            for (var i = 0u; i < TM; i = i + 1u) {{").unwrap();
        writeln!(s, "                for (var j = 0u; j < TN; j = j + 1u) {{").unwrap();
        writeln!(
            s,
            "                    acc[i * TN + j] = fma(ra[i], rb[j], acc[i * TN + j]);"
        )
        .unwrap();
        writeln!(s, "                }}\n            }}\n        }}").unwrap();
        writeln!(s, "        workgroupBarrier();\n    }}").unwrap();
        writeln!(s, "    for (var i = 0u; i < TM; i = i + 1u) {{").unwrap();
        writeln!(s, "        let gm = row0 + ty + i * (BM / TM);").unwrap();
        writeln!(s, "        for (var j = 0u; j < TN; j = j + 1u) {{").unwrap();
        writeln!(s, "            let gn = col0 + tx + j * (BN / TN);").unwrap();
        writeln!(s, "            if (gm < M && gn < N) {{ {arena_o}[o_base + gm * o_s0 + gn * o_s1] = acc[i * TN + j]; }}").unwrap();
        writeln!(s, "        }}\n    }}\n}}").unwrap();
    }
    let gx = k.n.div_ceil(bn as usize);
    let gy = k.m.div_ceil(bm as usize);
    if gx > MAX_GROUPS as usize || gy > MAX_GROUPS as usize {
        return Err(CompileError::KernelLimit {
            kernel: "matmul",
            what: format!(
                "a {}x{} output needs {gy}x{gx} blocks; one dispatch handles {MAX_GROUPS} per axis",
                k.m, k.n
            ),
        });
    }
    let shared = (bm * bk + bk * bn) * 4;
    Ok((s, [gx as u32, gy as u32, batch.max(1) as u32], shared))
}

/// The inner product and the write-back for quad micro-tiles: thread `(tx, ty)` owns output
/// rows `q * BM / HM + ty * 4 + i` and columns `q * BN / HN + tx * 4 + j`.
fn quad_compute_and_store(s: &mut String, t: Tile, arena_o: &str) {
    let (hm, hn) = (t.tm / 4, t.tn / 4);
    let (qa, qb) = (t.bm / 4, t.bn / 4);
    writeln!(s, "        for (var kk = 0u; kk < BK; kk = kk + 1u) {{").unwrap();
    for q in 0..hm {
        writeln!(
            s,
            "            let a{q} = As[kk * {qa}u + {}u + ty];",
            q * qa / hm
        )
        .unwrap();
    }
    for q in 0..hn {
        writeln!(
            s,
            "            let b{q} = Bs[kk * {qb}u + {}u + tx];",
            q * qb / hn
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
    writeln!(s, "        }}\n        workgroupBarrier();\n    }}").unwrap();
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
            writeln!(
                s,
                "            if (gm < M && gn{q} + j < N) {{ {arena_o}[o_base + gm * o_s0 + (gn{q} + j) * o_s1] = acc[{slot}][j]; }}"
            )
            .unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }
    writeln!(s, "}}").unwrap();
}
