//! The matmul on tensor cores ([`Form::TensorCores`](crate::matmul::Form)): a product of two
//! `f16` operands as wgpu's cooperative matrices, 16 × 16 × 16 steps accumulated in `f32`.
//!
//! **Blocks.** A workgroup of 256 invocations (eight subgroups of 32) computes a `BM × BN`
//! block of the output; subgroup `sg_id` owns the `TM × TN` sub-block at
//! `((sg_id / (BN / TN)) · TM, (sg_id % (BN / TN)) · TN)`, as `TM / 16 × TN / 16` cooperative
//! accumulators that stay on the tensor cores for the whole walk along K.
//!
//! **Staging.** Per step, a `BM × BK` slab of `a` and a `BK × BN` slab of `b` are staged in
//! workgroup memory as `f16`, each with its rows along the axis its loads walk (the operand's
//! unit stride) and padded by [`TC_PAD`](crate::matmul::TC_PAD) halves against bank
//! conflicts, zero past the edges:
//! `a` read along k is staged row-major (rows of k, loaded with `coopLoadT`), `a` read along m
//! (a transposed view) column-major (rows of m, loaded with `coopLoad`), and likewise `b` by k
//! or by n. So an invocation's consecutive elements land in consecutive halves of the slab,
//! never scattered across its rows. Each invocation moves its
//! share of the next step's slabs into registers while the current ones are multiplied (as
//! the FMA kernel does), walking each operand's unit-stride axis across consecutive
//! invocations, as `vec4<f16>` quads where the view's alignment allows (the FMA kernel's rule,
//! [`super::quad_loads`]). An arena that holds `f16` values in words is read as `f32` and
//! converted, exactly. With one stage ([`Tile::stages`]) the registers go to the slabs between
//! two barriers (after every subgroup has read the current slabs, before any reads the next);
//! with two, step `t` reads the stage `t % 2` and stores the next step's slabs to the other,
//! which the previous step read before the barrier that ended it: one barrier per step.
//!
//! **Epilogue.** A cooperative matrix's elements cannot be addressed, so each accumulator
//! leaves through workgroup memory: every subgroup stores 16 × 16 tiles to its own `f32`
//! scratch, and its 32 invocations apply the epilogue to eight elements of each and store them,
//! masked at the output's edges; a barrier after the stores and one after the reads. One
//! scratch tile, not two passing two accumulators per barrier pair: the second tile costs the
//! smaller blocks occupancy (BENCHMARKS.md, "The paired epilogue withdrawn"). The epilogue and
//! the output's dtype are the FMA kernel's.
//!
//! **Indices.** Every arena read is clamped into the operand and every store masked, and every
//! workgroup and register index is bounded by the tile's constants, so the kernel declares
//! [`Emitter::indices_in_range`]: naga's clamping of each index (which the drivers do not
//! hoist out of the cooperative loads' address arithmetic) is dropped at run time.
//!
//! **What naga asks for** (as in the flash kernels, `codegen/flash/coop.rs`): cooperative
//! operations only in control flow its uniformity analysis proves uniform, so the param block
//! is read directly ([`Emitter::cooperative_matrices`]), the K loop's trip count comes from
//! it, and the accumulators go to subgroups by their fixed place; a cooperative store only
//! from a plain `let`.
//!
//! **Emulated** ([`crate::target::Features::cooperative_emulated`]). The same kernel with its
//! cooperative operations written in plain WGSL: invocation `l` of a subgroup (numbered
//! `lid / 32`) holds elements `l + 32q` of each accumulator, as the epilogue reads them, an
//! operand is its offset in the staged slab, and a product sums its sixteen terms from there.
//! It checks everything but the hardware's matrix operations themselves (staging, indices,
//! edges, batches, split-K, epilogues) against the interpreter on any adapter.

use std::fmt::Write;

use sinter_ir::artifact::{Storage, WORD_BYTES};

use super::{Emitter, Form, Tile, WORKGROUP, bind_views, decompose, epilogue_args, quad_loads};
use crate::kernel::Matmul;
use crate::matmul::{TC_SIDE, TC_SUBGROUPS, tc_slab, tc_workgroup_bytes, tc_workgroup_bytes_of};

/// Elements of one cooperative matrix.
const TILE: u32 = TC_SIDE * TC_SIDE;
/// Invocations of a subgroup.
const LANES: u32 = WORKGROUP / TC_SUBGROUPS;
/// Elements of a matrix each invocation of its subgroup stores (and, emulated, holds).
const PER_LANE: u32 = TILE / LANES;
/// Elements of a quad load (`vec4<f16>`).
const QUAD: u32 = 4;

/// How the cooperative operations are written: wgpu's cooperative matrices, or plain WGSL in
/// which invocation `sg_lane` of a subgroup holds elements `sg_lane + 32q` (`q < 8`) of each
/// accumulator in an `array<f32, 8>` and an operand is its offset in the staged slab.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ops {
    Hardware,
    Emulated,
}

impl Ops {
    /// A zeroed accumulator.
    fn zero(self) -> String {
        match self {
            Ops::Hardware => "coop_mat16x16<f32, C>()".into(),
            Ops::Emulated => format!("array<f32, {PER_LANE}>()"),
        }
    }

    /// A load of an `f16` operand (`role` `A` or `B`) from `slab[at..]`, row-major or
    /// column-major with rows (columns) `stride` apart (emulated: the offset, read where the
    /// product is taken, by [`Ops::helpers`]' layout).
    fn load(self, role: char, row_major: bool, slab: &str, at: &str, stride: &str) -> String {
        match self {
            Ops::Hardware => {
                let f = if row_major { "coopLoadT" } else { "coopLoad" };
                format!("{f}<coop_mat16x16<f16, {role}>>(&{slab}[{at}], {stride})")
            }
            Ops::Emulated => at.to_string(),
        }
    }

    /// `acc + a · b`.
    fn multiply_add(self, a: &str, b: &str, acc: &str) -> String {
        match self {
            Ops::Hardware => format!("coopMultiplyAdd({a}, {b}, {acc})"),
            Ops::Emulated => format!("multiply_add({a}, {b}, {acc}, sg_lane)"),
        }
    }

    /// Stores the accumulator `value` (a plain `let`) row-major to `Cs[at..]`, rows 16 apart.
    fn store(self, value: &str, at: &str) -> String {
        match self {
            Ops::Hardware => format!("coopStoreT({value}, &Cs[{at}], {TC_SIDE}u);"),
            Ops::Emulated => format!("store_Cs({value}, {at}, sg_lane);"),
        }
    }

    /// Loop iterations (back-edges) of one product or store in the emulated form (one per
    /// element an invocation holds); the hardware form and the emulated loads have none.
    fn trips(self) -> u64 {
        match self {
            Ops::Hardware => 0,
            Ops::Emulated => u64::from(PER_LANE),
        }
    }

    /// The emulated form's functions (nothing for the hardware form), reading `As` and `Bs`
    /// row-major or column-major as `a` and `b` are staged.
    fn helpers(self, a: &Operand, b: &Operand) -> String {
        if self == Ops::Hardware {
            return String::new();
        }
        let side = TC_SIDE;
        let terms: Vec<String> = (0..side)
            .map(|k| {
                let ea = if a.row_major() {
                    format!("r * SA + {k}u")
                } else {
                    format!("{k}u * SA + r")
                };
                let eb = if b.row_major() {
                    format!("{k}u * SB + c")
                } else {
                    format!("c * SB + {k}u")
                };
                format!("f32(As[a + {ea}]) * f32(Bs[b + {eb}])")
            })
            .collect();
        format!(
            "fn multiply_add(a: u32, b: u32, acc: array<f32, {PER_LANE}>, lane: u32) -> array<f32, {PER_LANE}> {{
    var d = acc;
    for (var q = 0u; q < {PER_LANE}u; q = q + 1u) {{
        let r = (lane + q * {LANES}u) / {side}u;
        let c = (lane + q * {LANES}u) % {side}u;
        d[q] = d[q] + {};
    }}
    return d;
}}
fn store_Cs(m: array<f32, {PER_LANE}>, at: u32, lane: u32) {{
    for (var q = 0u; q < {PER_LANE}u; q = q + 1u) {{ Cs[at + lane + q * {LANES}u] = m[q]; }}
}}
",
            terms.join("\n            + ")
        )
    }
}

/// One operand's staging: `x` is its other axis than k (`m` for `a`, `n` for `b`), of extent
/// `extent` from `origin`. `walks_k`: consecutive invocations take consecutive k (k is its
/// unit stride), else consecutive x; the slab's rows run along the walked axis (`x * S + k`
/// where it walks k, `k * S + x` where it walks x, `S` the padded row). `count` loads
/// (elements, or quads where `quads`) per invocation per step.
struct Operand {
    name: &'static str,
    slab: &'static str,
    x: &'static str,
    extent: &'static str,
    origin: &'static str,
    block: u32,
    walks_k: bool,
    quads: bool,
    count: u32,
    arena: String,
    storage: Storage,
}

impl Operand {
    /// The register array's element type.
    fn register(&self) -> &'static str {
        if self.quads { "vec4<f16>" } else { "f16" }
    }

    /// Whether the staged slab is the operand's matrix row-major: `a` (M × K) staged by k,
    /// `b` (K × N) staged by n.
    fn row_major(&self) -> bool {
        (self.name == "a") == self.walks_k
    }

    /// Opens a loop over the invocation's loads `e` (or, `unrolled`, a block binding `e` to
    /// `copy`) with the coordinates of load `e` within the slab bound: the walked one and the
    /// one across (`kk` and `mm` or `nn`); the caller closes it.
    fn open(&self, s: &mut String, indent: &str, unrolled: Option<u32>, bk: u32) {
        match unrolled {
            Some(copy) => writeln!(s, "{indent}{{ let e = {copy}u;").unwrap(),
            None => writeln!(
                s,
                "{indent}for (var e = 0u; e < {}u; e = e + 1u) {{",
                self.count
            )
            .unwrap(),
        }
        let x = self.x;
        let width = if self.walks_k { bk } else { self.block };
        let (walked, across) = if self.walks_k {
            ("kk".to_string(), format!("{x}{x}"))
        } else {
            (format!("{x}{x}"), "kk".to_string())
        };
        writeln!(s, "{indent}    let i = lid + e * {WORKGROUP}u;").unwrap();
        if self.quads {
            writeln!(
                s,
                "{indent}    let {walked} = (i % {}u) * 4u;\n{indent}    let {across} = i / {}u;",
                width / QUAD,
                width / QUAD
            )
            .unwrap();
        } else {
            writeln!(
                s,
                "{indent}    let {walked} = i % {width}u;\n{indent}    let {across} = i / {width}u;"
            )
            .unwrap();
        }
    }

    /// The copies of the staging code: one loop, or `count` blocks where `unrolled`.
    fn copies(&self, unrolled: bool) -> Vec<Option<u32>> {
        if unrolled {
            (0..self.count).map(Some).collect()
        } else {
            vec![None]
        }
    }

    /// Loads the step whose first k is `k0` into the registers (zeros past the edges).
    fn load(&self, s: &mut String, indent: &str, k0: &str, bk: u32, unrolled: bool) {
        let (x, name, ext) = (self.x, self.name, self.extent);
        for copy in self.copies(unrolled) {
            self.open(s, indent, copy, bk);
            let inner = format!("{indent}    ");
            writeln!(
                s,
                "{inner}let g{x} = {} + {x}{x};\n{inner}let gk = {k0} + kk;",
                self.origin
            )
            .unwrap();
            // the last in-range index of each axis (of the walked one, the last quad's first)
            let last = |walked: bool| if walked && self.quads { 4 } else { 1 };
            let kc = format!("min(gk, K - {}u)", last(self.walks_k));
            let xc = format!("min(g{x}, {ext} - {}u)", last(!self.walks_k));
            let (c0, c1) = if name == "b" { (kc, xc) } else { (xc, kc) };
            let addr = format!("{name}_base + {c0} * {name}_s0 + {c1} * {name}_s1");
            let arena = &self.arena;
            let value = match (self.quads, self.storage) {
                (true, Storage::Half) => format!("{arena}[({addr}) >> 2u]"),
                (true, Storage::Word) => format!("vec4<f16>({arena}[({addr}) >> 2u])"),
                (false, Storage::Half) => format!("{arena}[{addr}]"),
                (false, Storage::Word) => format!("f16({arena}[{addr}])"),
            };
            writeln!(
                s,
                "{inner}r{name}[e] = select({}(), {value}, g{x} < {ext} && gk < K);\n{indent}}}",
                self.register()
            )
            .unwrap();
        }
    }

    /// Stores the registers into the slab of the stage that starts at `stage` (an offset in
    /// halves).
    fn store(&self, s: &mut String, indent: &str, stage: &str, bk: u32, unrolled: bool) {
        let (x, name, slab) = (self.x, self.name, self.slab);
        let stride = if name == "a" { "SA" } else { "SB" };
        // the slab index of the element at (x + dx, k + dk): rows along the walked axis
        let at = |dx: &str, dk: &str| {
            if self.walks_k {
                format!("{stage}({x}{x}{dx}) * {stride} + kk{dk}")
            } else {
                format!("{stage}(kk{dk}) * {stride} + {x}{x}{dx}")
            }
        };
        for copy in self.copies(unrolled) {
            self.open(s, indent, copy, bk);
            let inner = format!("{indent}    ");
            if self.quads {
                for j in 0..4 {
                    let step = format!(" + {j}u");
                    let place = if self.walks_k {
                        at("", &step)
                    } else {
                        at(&step, "")
                    };
                    writeln!(s, "{inner}{slab}[{place}] = r{name}[e][{j}];").unwrap();
                }
            } else {
                writeln!(s, "{inner}{slab}[{}] = r{name}[e];", at("", "")).unwrap();
            }
            writeln!(s, "{indent}}}").unwrap();
        }
    }
}

/// The kernel's WGSL body, its workgroup grid and workgroup bytes (the grid checked by the
/// caller).
pub fn emit(e: &mut Emitter, k: &Matmul, grid: [u32; 3]) -> (String, [u32; 3], u32) {
    let t = k.tile;
    debug_assert_eq!(t.form, Form::TensorCores);
    debug_assert!(Tile::check(t).is_ok(), "{t}");
    let Tile {
        bm, bn, bk, tm, tn, ..
    } = t;
    // every arena read is clamped and every store masked (`Operand::load`, the epilogue);
    // every workgroup and register index is bounded by the tile's constants
    e.indices_in_range();
    let ops = if e.emulated_cooperative() {
        Ops::Emulated
    } else {
        e.cooperative_matrices();
        Ops::Hardware
    };
    let rb = k.batch.len();
    let (frag_rows, frag_cols) = (tm / TC_SIDE, tn / TC_SIDE);
    let accumulators = frag_rows * frag_cols;
    let substeps = bk / TC_SIDE;

    // operands: each walks its unit-stride axis; quads where the view allows
    let (ea, eb) = (bm * bk / WORKGROUP, bk * bn / WORKGROUP);
    let a_walks_k = k.a.strides[rb + 1] == 1;
    let b_walks_k = k.b.strides[rb + 1] != 1;
    let a_quads = quad_loads(e, &k.a, if a_walks_k { rb + 1 } else { rb }, ea);
    let b_quads = quad_loads(e, &k.b, if b_walks_k { rb } else { rb + 1 }, eb);
    let arena_o = e.arena(k.out.buffer);
    let mut operand = |name, view: &crate::layout::View, walks_k, quads: bool, elements: u32| {
        let (slab, x, extent, origin, block) = if name == "a" {
            ("As", "m", "M", "row0", bm)
        } else {
            ("Bs", "n", "N", "col0", bn)
        };
        Operand {
            name,
            slab,
            x,
            extent,
            origin,
            block,
            walks_k,
            quads,
            count: if quads { elements / QUAD } else { elements },
            arena: if quads {
                e.arena_quads(view.buffer)
            } else {
                e.arena(view.buffer)
            },
            storage: e.storage(view.buffer),
        }
    };
    let a = operand("a", &k.a, a_walks_k, a_quads, ea);
    let b = operand("b", &k.b, b_walks_k, b_quads, eb);

    // loop iterations per invocation: the K loop with its staging loops (written out where
    // they would pass the loop budget) and, emulated, its operations; the epilogue's stores
    let steps = (k.k as u64).div_ceil(u64::from(bk));
    let per_step = u64::from(substeps * accumulators) * ops.trips();
    let epilogue = u64::from(accumulators) * (ops.trips() + u64::from(PER_LANE));
    let staging = u64::from(2 * (a.count + b.count));
    let looped = (steps + 1) * staging + steps * (1 + per_step) + epilogue;
    let unrolled = looped > super::LOOP_BUDGET;
    e.loop_trips(if unrolled {
        steps * (1 + per_step) + epilogue
    } else {
        looped
    });

    let mut s = String::new();
    if let Some(epi) = &k.epilogue {
        s.push_str(&super::super::fused::emit_epilogue(e, epi));
    }
    writeln!(
        s,
        "const BM: u32 = {bm}u;\nconst BN: u32 = {bn}u;\nconst BK: u32 = {bk}u;\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;"
    )
    .unwrap();
    // with two stages, step t reads the slabs at `(t % 2) * A_STAGE` and `(t % 2) * B_STAGE`
    let stages = t.stages;
    // each slab's rows along its walked axis: (rows, padded row), in u32 as a checked tile's
    // bytes are
    let [(ra, sa), (rb_, sb)] = [(bm, a.walks_k), (bn, b.walks_k)].map(|(x, walks_k)| {
        let (rows, row) = tc_slab(x, bk, walks_k);
        (rows as u32, row as u32)
    });
    // every array, and so every array's start, on a 16-byte boundary (the H200's driver
    // misplaces cooperative loads from arrays that start off one; see `codegen/flash/coop.rs`)
    debug_assert!(
        [
            ra * sa * 2,
            rb_ * sb * 2,
            TC_SUBGROUPS * TILE * WORD_BYTES as u32
        ]
        .iter()
        .all(|b| b.is_multiple_of(16)),
        "{t}"
    );
    writeln!(s, "const SA: u32 = {sa}u;\nconst SB: u32 = {sb}u;").unwrap();
    if stages > 1 {
        writeln!(
            s,
            "const A_STAGE: u32 = {}u;\nconst B_STAGE: u32 = {}u;",
            ra * sa,
            rb_ * sb
        )
        .unwrap();
    }
    writeln!(s, "var<workgroup> As: array<f16, {}>;", stages * ra * sa).unwrap();
    writeln!(s, "var<workgroup> Bs: array<f16, {}>;", stages * rb_ * sb).unwrap();
    writeln!(s, "var<workgroup> Cs: array<f32, {}>;", TC_SUBGROUPS * TILE).unwrap();
    s.push_str(&ops.helpers(&a, &b));
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    match ops {
        Ops::Hardware => writeln!(
            s,
            "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) sg_lane: u32) {{"
        ),
        Ops::Emulated => writeln!(
            s,
            "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{\n    let sg_id = lid / {LANES}u;\n    let sg_lane = lid % {LANES}u;"
        ),
    }
    .unwrap();
    let (m, n, kk) = (e.param(k.m, "M"), e.param(k.n, "N"), e.param(k.k, "K"));
    writeln!(s, "    let M = {m};\n    let N = {n};\n    let K = {kk};").unwrap();
    let batch_dims = e.params(&k.batch, "batch");
    decompose(&mut s, "    ", "wid.z", "b", &batch_dims);
    bind_views(e, &mut s, k);
    writeln!(s, "    let row0 = wid.y * BM;\n    let col0 = wid.x * BN;").unwrap();
    writeln!(
        s,
        "    // this subgroup's sub-block of the output block\n    let wr = (sg_id / (BN / TN)) * TM;\n    let wc = (sg_id % (BN / TN)) * TN;"
    )
    .unwrap();
    for op in [&a, &b] {
        writeln!(
            s,
            "    var r{}: array<{}, {}>;",
            op.name,
            op.register(),
            op.count
        )
        .unwrap();
    }
    for i in 0..accumulators {
        writeln!(s, "    var acc{i} = {};", ops.zero()).unwrap();
    }
    for op in [&a, &b] {
        op.load(&mut s, "    ", "0u", bk, unrolled);
    }
    for op in [&a, &b] {
        op.store(&mut s, "    ", "", bk, unrolled);
    }
    writeln!(s, "    workgroupBarrier();").unwrap();
    writeln!(s, "    let steps = (K + BK - 1u) / BK;").unwrap();
    writeln!(s, "    for (var t = 0u; t < steps; t = t + 1u) {{").unwrap();
    writeln!(
        s,
        "        let more = t + 1u < steps;\n        if (more) {{"
    )
    .unwrap();
    for op in [&a, &b] {
        op.load(&mut s, "            ", "(t + 1u) * BK", bk, unrolled);
    }
    writeln!(s, "        }}").unwrap();
    // the stage this step reads, and (two stages) the one the next step's slabs go to
    let (read_a, read_b) = if stages > 1 {
        writeln!(
            s,
            "        let ao = (t % 2u) * A_STAGE;\n        let bo = (t % 2u) * B_STAGE;"
        )
        .unwrap();
        ("ao + ", "bo + ")
    } else {
        ("", "")
    };
    for step in 0..substeps {
        let k0 = step * TC_SIDE;
        writeln!(s, "        {{").unwrap();
        for i in 0..frag_rows {
            let at = if a.row_major() {
                format!("{read_a}(wr + {}u) * SA + {k0}u", i * TC_SIDE)
            } else {
                format!("{read_a}{}u + wr + {}u", k0 * sa, i * TC_SIDE)
            };
            let load = ops.load('A', a.row_major(), "As", &at, "SA");
            writeln!(s, "            let fa{i} = {load};").unwrap();
        }
        for j in 0..frag_cols {
            let at = if b.row_major() {
                format!("{read_b}{}u + wc + {}u", k0 * sb, j * TC_SIDE)
            } else {
                format!("{read_b}(wc + {}u) * SB + {k0}u", j * TC_SIDE)
            };
            let load = ops.load('B', b.row_major(), "Bs", &at, "SB");
            writeln!(s, "            let fb{j} = {load};").unwrap();
        }
        for i in 0..frag_rows {
            for j in 0..frag_cols {
                let acc = format!("acc{}", i * frag_cols + j);
                writeln!(
                    s,
                    "            {acc} = {};",
                    ops.multiply_add(&format!("fa{i}"), &format!("fb{j}"), &acc)
                )
                .unwrap();
            }
        }
        writeln!(s, "        }}").unwrap();
    }
    if stages > 1 {
        // the other stage was last read by the previous step, before the barrier that ended it
        writeln!(s, "        if (more) {{").unwrap();
        for (op, stage) in [(&a, "(A_STAGE - ao) + "), (&b, "(B_STAGE - bo) + ")] {
            op.store(&mut s, "            ", stage, bk, unrolled);
        }
        writeln!(s, "        }}\n        workgroupBarrier();\n    }}").unwrap();
    } else {
        writeln!(s, "        workgroupBarrier();\n        if (more) {{").unwrap();
        for op in [&a, &b] {
            op.store(&mut s, "            ", "", bk, unrolled);
        }
        writeln!(s, "        }}\n        workgroupBarrier();\n    }}").unwrap();
    }

    // each accumulator through the subgroup's scratch tile, eight elements per invocation
    let (out_dtype, out_storage) = (k.out_dtype, e.storage(k.out.buffer));
    let value = match &k.epilogue {
        Some(_) => format!("epilogue(c, {})", epilogue_args(rb, "gm", "gn")),
        None => "c".to_string(),
    };
    let put = super::super::store(
        &arena_o,
        "o_base + gm * o_s0 + gn * o_s1",
        &value,
        out_dtype,
        out_storage,
    );
    writeln!(s, "    let scratch = sg_id * {TILE}u;").unwrap();
    for i in 0..frag_rows {
        for j in 0..frag_cols {
            let acc = i * frag_cols + j;
            // a cooperative store only from plain `let`s (naga 30's SPIR-V)
            writeln!(
                s,
                "    {{ let res = acc{acc}; {} }}\n    workgroupBarrier();",
                ops.store("res", "scratch")
            )
            .unwrap();
            writeln!(
                s,
                "    for (var q = 0u; q < {}u; q = q + 1u) {{
        let at = sg_lane + q * {LANES}u;
        let gm = row0 + wr + {}u + at / {TC_SIDE}u;
        let gn = col0 + wc + {}u + at % {TC_SIDE}u;
        let c = Cs[scratch + at];
        if (gm < M && gn < N) {{ {put} }}
    }}
    workgroupBarrier();",
                PER_LANE,
                i * TC_SIDE,
                j * TC_SIDE,
            )
            .unwrap();
        }
    }
    writeln!(s, "}}").unwrap();
    // a checked tile's bytes, in either orientation, are within TC_STAGING_BYTES
    let bytes = tc_workgroup_bytes_of(t, a.walks_k, b.walks_k);
    debug_assert!(bytes <= tc_workgroup_bytes(t), "{t}");
    (s, grid, bytes as u32)
}
