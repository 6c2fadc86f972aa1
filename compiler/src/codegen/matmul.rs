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
//! The block shape and split-K are the product's variant, chosen once ([`crate::matmul`]) and
//! stored in the plan; this module only reads them. Split-K is lowered (in `schedule.rs`) as a batched product of K chunks
//! (views of the operands with a leading chunk axis) into a `[splits, .., m, n]` buffer, then a
//! [`SplitSum`] pass ([`emit_split_sum`]) that adds the chunks and applies the epilogue.

use std::fmt::Write;

use super::{ENTRY_ARGS, Emitter, LOOP_BUDGET, MAX_GROUPS, WORKGROUP, decompose, grid, store};
use sinter_ir::DType;
use sinter_ir::artifact::Storage;
use sinter_ir::artifact::WORD_BYTES;

use crate::CompileError;
use crate::kernel::{Matmul, SplitSum};
use crate::layout::View;
use crate::matmul::{Form, PAD, Tile};

mod coop;

pub fn emit(e: &mut Emitter, k: &Matmul) -> Result<(String, [u32; 3], u32), CompileError> {
    let (gx, gy, batch) = grid_of(k)?;
    if k.tile.form == Form::TensorCores {
        return Ok(coop::emit(e, k, [gx, gy, batch]));
    }
    let t = k.tile;
    let Tile {
        bm, bn, bk, tm, tn, ..
    } = t;
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
    let (m, n, kk) = (e.param(k.m, "M"), e.param(k.n, "N"), e.param(k.k, "K"));
    writeln!(s, "    let M = {m};\n    let N = {n};\n    let K = {kk};").unwrap();
    let batch_dims = e.params(&k.batch, "batch");
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
    bind_views(e, &mut s, k);
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
        half: e.storage(k.a.buffer) == Storage::Half,
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
        half: e.storage(k.b.buffer) == Storage::Half,
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
        Some(_) => format!("epilogue({slot}, {})", epilogue_args(rb, "gm", "GN")),
        None => slot.to_string(),
    };
    let (out_dtype, out_storage) = (k.out_dtype, e.storage(k.out.buffer));
    let put = |addr: &str, v: &str| super::store(&arena_o, addr, v, out_dtype, out_storage);
    if quads {
        quad_write(&mut s, t, &put, &value);
    } else {
        scalar_write(&mut s, &put, &value);
    }
    writeln!(s, "}}").unwrap();
    let shared = (sa * bk + bk * sb) * WORD_BYTES as u32;
    Ok((s, [gx, gy, batch], shared))
}

/// Binds `{a,b,o}_base` (the batch entry's first element), `_s0` and `_s1` (the strides of the
/// two matrix axes) of the product's operands and output, given the batch coordinates `b0..`.
fn bind_views(e: &mut Emitter, s: &mut String, k: &Matmul) {
    let rb = k.batch.len();
    for (name, view) in [("a", &k.a), ("b", &k.b), ("o", &k.out)] {
        let mut b = e.base(view.buffer, view.offset, name);
        for axis in 0..rb {
            let st = e.param(view.strides[axis], &format!("{name}.stride[b{axis}]"));
            write!(b, " + b{axis} * {st}").unwrap();
        }
        let (s0, s1) = (
            e.param(view.strides[rb], &format!("{name}.stride[0]")),
            e.param(view.strides[rb + 1], &format!("{name}.stride[1]")),
        );
        writeln!(
            s,
            "    let {name}_base = {b};\n    let {name}_s0 = {s0};\n    let {name}_s1 = {s1};"
        )
        .unwrap();
    }
}

/// The workgroup grid of a matmul (column blocks, row blocks, batch entries), or the error
/// where one dispatch cannot hold it.
fn grid_of(k: &Matmul) -> Result<(u32, u32, u32), CompileError> {
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
    Ok((gx as u32, gy as u32, batch.max(1) as u32))
}

/// The coordinates of a matmul kernel's output element `(gm, gn)` in batch entry
/// `b0, b1, ..` as the epilogue function takes them.
fn epilogue_args(rank: usize, gm: &str, gn: &str) -> String {
    let mut args: Vec<String> = (0..rank).map(|a| format!("b{a}")).collect();
    args.extend([gm.to_string(), gn.to_string()]);
    args.join(", ")
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
    let (out_dtype, out_storage) = (k.out_dtype, e.storage(out.buffer));
    let dense_out = quads
        && out_dtype == DType::F32
        && out.is_contiguous()
        && e.element_start(out.buffer, out.offset).is_multiple_of(4);
    e.loop_trips(splits as u64);
    let mut s = String::new();
    if let Some(epi) = &k.epilogue {
        s.push_str(&super::fused::emit_epilogue(e, epi));
    }
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    let per = if quads { 4 } else { 1 };
    // outputs (or quads) per split: the thread count and the partials' plane
    let count = e.param(numel / per, "count");
    let splits_p = e.param(splits, "splits");
    writeln!(
        s,
        "    let gi = (wid.x + wid.y * nwg.x) * {WORKGROUP}u + lid;\n    if (gi >= {count}) {{ return; }}"
    )
    .unwrap();
    let at = if quads { "gi * 4u" } else { "gi" };
    let dims = e.params(&out.shape, "out.shape");
    decompose(&mut s, "    ", at, "c", &dims);
    let base = e.base(k.partials.buffer, k.partials.offset, "partials");
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
    let o_base = e.base(out.buffer, out.offset, "out");
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
        let strides = e.params(&out.strides, "out.stride");
        let mut addr = o_base;
        for (axis, st) in strides.iter().enumerate().take(rank - 1) {
            write!(addr, " + c{axis} * {st}").unwrap();
        }
        let last_stride = &strides[rank - 1];
        if quads {
            for j in 0..4 {
                let v = value(&format!("acc[{j}]"), &format!("{last} + {j}u"));
                let at = format!("{addr} + ({last} + {j}u) * {last_stride}");
                writeln!(
                    s,
                    "    {}",
                    store(&arena_o, &at, &v, out_dtype, out_storage)
                )
                .unwrap();
            }
        } else {
            let v = value("acc", &last);
            let at = format!("{addr} + {last} * {last_stride}");
            writeln!(
                s,
                "    {}",
                store(&arena_o, &at, &v, out_dtype, out_storage)
            )
            .unwrap();
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
    e.storage(view.buffer) == Storage::Word && quad_loads(e, view, unit, per_thread)
}

/// [`vec4_loads`] for an arena of any storage (quads of halves are `vec4<f16>`).
fn quad_loads(e: &Emitter, view: &View, unit: usize, per_thread: u32) -> bool {
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
    /// The arena holds f16 halves (read as f32).
    half: bool,
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
            let element = if self.half {
                format!("f32({}[{index}])", self.arena)
            } else {
                format!("{}[{index}]", self.arena)
            };
            writeln!(
                s,
                "{indent}    {}[e] = select({zero}, {element}, {inside});\n{indent}}}",
                self.reg
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

/// `put(address, value)`: the statement that stores an output element.
type Put<'a> = dyn Fn(&str, &str) -> String + 'a;

fn scalar_write(s: &mut String, put: &Put, value: &dyn Fn(&str) -> String) {
    s.push_str(
        "    for (var i = 0u; i < TM; i = i + 1u) {
        let gm = row0 + ty + i * (BM / TM);
        for (var j = 0u; j < TN; j = j + 1u) {
            let gn = col0 + tx + j * (BN / TN);
",
    );
    let v = value("acc[i * TN + j]").replace("GN", "gn");
    let store = put("o_base + gm * o_s0 + gn * o_s1", &v);
    writeln!(s, "            if (gm < M && gn < N) {{ {store} }}").unwrap();
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

fn quad_write(s: &mut String, t: Tile, put: &Put, value: &dyn Fn(&str) -> String) {
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
            let store = put(&format!("o_base + gm * o_s0 + (gn{q} + j) * o_s1"), &v);
            writeln!(s, "            if (gm < M && gn{q} + j < N) {{ {store} }}").unwrap();
            writeln!(s, "        }}").unwrap();
        }
        writeln!(s, "    }}").unwrap();
    }
}

#[cfg(test)]
mod tests {
    use crate::matmul::Tile;

    /// A product that the variant choice gives WIDE runs with the deeper slabs when `b` is read
    /// along n, and keeps WIDE when `b` is a transposed view or the tile is forced.
    #[test]
    fn wide_products_deepen_where_b_is_read_along_n() {
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
                matmul: crate::matmul::Forced { tile, splits: None },
                ..Default::default()
            };
            let artifact = crate::compile(&graph, &options).expect("compiles").artifact;
            let wgsl = &artifact.kernels[0].wgsl;
            (wgsl.contains("const BM: u32 = 64u;") && wgsl.contains("const BN: u32 = 128u;"))
                .then(|| wgsl.contains("const BK: u32 = 16u;"))
        };
        assert_eq!(bk(true, None), Some(true), "b along n: deeper slabs");
        assert_eq!(bk(false, None), Some(false), "b transposed: WIDE");
        assert_eq!(
            bk(true, Some(Tile::WIDE)),
            Some(false),
            "a forced tile stays"
        );
    }

    /// A batch that `b` is shared by folds into m only while the folded rows fit one dispatch's
    /// row blocks: 64 x 32768 rows of a 4 x 8 product would need 65536 blocks of 32 rows.
    #[test]
    fn a_batch_too_tall_to_fold_keeps_its_grid_axis() {
        let src = "graph t {\n  input a: f32[64, 32768, 4]\n  input b: f32[4, 8]\n  y = matmul(a, b)\n  output y\n}\n";
        let graph = sinter_ir::text::parse(src).expect("valid");
        let options = crate::Options {
            target: crate::Target::portable().with_max_binding(1 << 31),
            ..Default::default()
        };
        let artifact = crate::compile(&graph, &options).expect("compiles").artifact;
        assert!(artifact.kernels[0].wgsl.contains("let b0 = wid.z;"));
    }
}
