//! WGSL for a fused [`Program`]: the one generic kernel that elementwise chains, reductions and
//! row kernels (softmax, norms, losses, their backward, optimizer updates) compile to.
//!
//! Without reduce axes a program is a map: one thread per domain point. With reduce axes, a
//! *segment* of `SEG` threads (a power of two) works on one domain point (a "row"); a workgroup of
//! 256 threads holds `256 / SEG` rows. Each phase is a strided loop of the segment over the row's
//! reduce points followed by a tree combination in workgroup memory; outputs indexed by the reduce
//! axes are written by a last loop over the row. Rows are assigned to threads row-major (the
//! segment's lanes are consecutive threads, for rows contiguous along the reduce axes) or
//! column-major (consecutive threads take consecutive rows, for reductions along an outer axis),
//! whichever keeps the larger operands' loads coalesced. A column-major reduction over few rows
//! narrows its rows per workgroup and widens its segment (`column_segment`), and adjacent reduce
//! axes that every tensor walks as one run are merged first (`merge_reduce_axes`), so the loop
//! over the row divides once per coordinate fewer.
//!
//! Barriers stay in uniform control flow: rows past the end have a trip count of zero but reach
//! every barrier, and the combination loop's trip count is the compile-time `SEG`. Mesa's software
//! Vulkan ends all loops of an invocation after 65535 iterations in all (`LOOP_BUDGET`): long
//! rows unroll the loop over the row, and every kernel counts its iterations.

use std::fmt::Write;

use sinter_ir::{DType, Op};

use super::{
    ENTRY_ARGS, Emitter, NEG_INF, POS_INF, WORKGROUP, grid, load, store, strided_loop,
    unroll_factor,
};
use crate::fused::{Access, Axis, Combine, Inst, Level, Program, Scalar};
use crate::kernel::{FusedKernel, merge_axes, space_strides};
use crate::layout::View;

/// `k` with two adjacent reduce axes made one (see [`merge_axes`]); `None` when no pair
/// qualifies. The flat reduce index (an argmax's result) is unchanged, and the loop over the row
/// then takes one division per coordinate fewer per point: a bias gradient's sum over
/// `[batch, seq]` becomes one axis.
fn merge_reduce_axes(k: &FusedKernel) -> Option<FusedKernel> {
    let d = k.program.domain.len();
    (0..k.program.reduce.len().saturating_sub(1)).find_map(|i| merge_axes(k, d + i))
}

/// How threads map to rows and lanes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mapping {
    /// Lanes of a segment are consecutive threads.
    RowMajor,
    /// Consecutive threads take consecutive rows.
    ColumnMajor,
}

fn mapping(k: &FusedKernel) -> Mapping {
    let p = &k.program;
    let (d, r) = (p.domain.len(), p.reduce.len());
    if d == 0 {
        return Mapping::RowMajor;
    }
    let (last_d, last_r) = (d - 1, d + r - 1);
    let (mut along_reduce, mut along_domain) = (0usize, 0usize);
    for (access, view) in k.tensors() {
        let s = space_strides(p, access, view);
        let bytes = view.numel();
        if s[last_r] == 1 {
            along_reduce += bytes;
        } else if s[last_d] == 1 {
            along_domain += bytes;
        }
    }
    if along_domain > along_reduce {
        Mapping::ColumnMajor
    } else {
        Mapping::RowMajor
    }
}

/// Row-major segments: a lane takes at least [`ROW_LANE_POINTS`] points of its row once there
/// are [`ROW_MANY`] rows to spread over workgroups, with at least [`ROW_LEAST_LANES`] lanes.
/// Measured on the H200 (BENCHMARKS.md, "Row segments"): a softmax over `[4, 12, 512, 512]`
/// took 85 µs as one row of 512 per workgroup (2 points per lane, 8 barriers per tree) and
/// 46 µs as 8 rows of 32 lanes; 8 points per lane measured 49 µs, 4 points 62 µs.
const ROW_LANE_POINTS: usize = 16;
const ROW_MANY: usize = 1024;
const ROW_LEAST_LANES: u32 = 32;

/// The segment of a row-major kernel of `rows` rows of `len` points (see [`ROW_LANE_POINTS`]).
fn row_segment(rows: usize, len: usize) -> u32 {
    let whole = (len.next_power_of_two() as u32).clamp(1, WORKGROUP);
    if rows < ROW_MANY {
        return whole;
    }
    ((len / ROW_LANE_POINTS).next_power_of_two() as u32).clamp(ROW_LEAST_LANES.min(whole), whole)
}

/// Points of a map kernel over three axes or more per thread, spaced along the outermost axis
/// (see `Cx::emit_map`).
const MAP_POINTS: usize = 4;

/// Workgroups a column-major reduction aims for before it narrows its rows per workgroup.
const COLUMN_GROUPS: usize = 256;
/// Fewest rows a column-major workgroup takes (16-byte runs of f32 rows).
const FEWEST_COLUMN_ROWS: u32 = 4;

/// The segment of a column-major reduction (`rows` rows of `len` points). 32 consecutive rows per
/// workgroup (8 lanes each) keep a warp's loads one 128-byte line; when that leaves fewer than
/// [`COLUMN_GROUPS`] workgroups (a bias gradient: 768 rows of 2048 points would be 24 workgroups of
/// 256 serial loads per thread), the rows per workgroup halve down to 4 (16-byte runs, lines half
/// used) and the lanes per row double, so that more workgroups share the row's loads.
fn column_segment(rows: usize, len: usize) -> u32 {
    let most = (len.next_power_of_two() as u32).clamp(1, WORKGROUP / FEWEST_COLUMN_ROWS);
    let mut seg = most.min(8);
    while seg < most && rows.div_ceil((WORKGROUP / seg) as usize) < COLUMN_GROUPS {
        seg *= 2;
    }
    seg
}

/// A matmul epilogue as a WGSL function `epilogue(product, c0, .., c{r-1}) -> f32` of the
/// product and its coordinates in the output (batch axes, row, column); `k`'s operand 0 is the
/// product, its one output the stored value.
pub fn emit_epilogue(e: &mut Emitter, k: &FusedKernel) -> String {
    emit_elementwise_fn(e, k, "epilogue", "product")
}

/// An elementwise program (one output, no reduction) as a WGSL function
/// `NAME(ARG: f32, c0: u32, ..) -> f32` of its operand 0 (passed in) and its space coordinates;
/// its other operands are read through `k`'s views.
pub fn emit_elementwise_fn(e: &mut Emitter, k: &FusedKernel, name: &str, arg: &str) -> String {
    let p = &k.program;
    debug_assert!(p.reduce.is_empty() && p.outputs.len() == 1, "{p:?}");
    let mut cx = Cx::new(e, k);
    cx.product_operand = Some(arg.to_string());
    let need = cx.needed(&[p.outputs[0].value]);
    cx.bind_rows(&need);
    let mut s = String::new();
    let coords: Vec<String> = (0..p.domain.len()).map(|a| format!("c{a}: u32")).collect();
    writeln!(s, "fn {name}({arg}: f32, {}) -> f32 {{", coords.join(", ")).unwrap();
    s.push_str(&cx.body);
    writeln!(s, "    return v{};\n}}", p.outputs[0].value).unwrap();
    s
}

pub fn emit(e: &mut Emitter, k: &FusedKernel) -> (String, [u32; 3], u32) {
    let mut merged = k.clone();
    while let Some(next) = merge_reduce_axes(&merged) {
        merged = next;
    }
    let k = &merged;
    let p = &k.program;
    debug_assert!(p.check().is_ok(), "{:?}", p.check());
    let mut cx = Cx::new(e, k);
    if p.reduce.is_empty() {
        cx.emit_map()
    } else {
        cx.emit_rows()
    }
}

struct Cx<'e, 'm, 'k> {
    e: &'e mut Emitter<'m>,
    k: &'k FusedKernel,
    p: &'k Program,
    levels: Vec<Level>,
    dtypes: Vec<DType>,
    /// Row-level instructions already bound at function scope.
    bound: Vec<bool>,
    /// In an elementwise function (a matmul epilogue, a score function): operand 0 is passed in
    /// as this argument.
    product_operand: Option<String>,
    body: String,
    /// The WGSL reading each f32 constant from the param block, by bit pattern.
    constants: Vec<(u32, String)>,
    /// Where in `body` each phase's segment combines its accumulators: (byte offset, how,
    /// phase). The text there is written per variant (workgroup-memory tree or subgroups).
    combines: Vec<(usize, Combine, usize)>,
}

impl<'e, 'm, 'k> Cx<'e, 'm, 'k> {
    fn new(e: &'e mut Emitter<'m>, k: &'k FusedKernel) -> Self {
        let p = &k.program;
        Cx {
            e,
            k,
            p,
            levels: p.levels(),
            dtypes: p.dtypes(),
            bound: vec![false; p.insts.len()],
            product_operand: None,
            body: String::new(),
            constants: Vec::new(),
            combines: Vec::new(),
        }
    }

    /// The address of a tensor at the current point: base + Σ coordinate · stride; `name`
    /// names its param words.
    /// An axis read through a window ([`Axis::Shifted`]) adds `(c − start) · stride` instead
    /// (`shifted`: that coordinate per tensor axis), in u32 arithmetic that wraps below the
    /// window (such loads are discarded, see [`Cx::operand_load`]).
    fn address(
        &mut self,
        access: &Access,
        view: &View,
        name: &str,
        shifted: &[(usize, String)],
    ) -> (String, String) {
        let arena = self.e.arena(view.buffer);
        let base = self.e.base(view.buffer, view.offset, name);
        let plain = Access {
            dtype: access.dtype,
            axes: (access.axes.iter())
                .map(|a| match a {
                    Axis::Shifted { .. } => Axis::One,
                    other => *other,
                })
                .collect(),
        };
        let strides = space_strides(self.p, &plain, view);
        let mut addr = base;
        for (axis, &st) in strides.iter().enumerate() {
            if st != 0 {
                let sp = self.e.param(st, &format!("{name}.stride[c{axis}]"));
                write!(addr, " + c{axis} * {sp}").unwrap();
            }
        }
        for (j, at) in shifted {
            let sp = self
                .e
                .param(view.strides[*j], &format!("{name}.stride[{j}]"));
            write!(addr, " + {at} * {sp}").unwrap();
        }
        (arena, addr)
    }

    /// An operand's element at the current point; +0.0 outside its windows.
    fn operand_load(&mut self, o: usize) -> String {
        let access = self.p.operands[o].clone();
        let name = format!("in{o}");
        // each window's coordinate relative to its start, and the test that it is inside
        let (mut shifted, mut inside) = (Vec::new(), Vec::new());
        for (j, a) in access.axes.iter().enumerate() {
            if let Axis::Shifted { k, by, len } = *a {
                let start = self
                    .e
                    .param(by as usize, &format!("{name}.window[{j}].start"));
                let len = self
                    .e
                    .param(len as usize, &format!("{name}.window[{j}].len"));
                let at = format!("(c{k} - {start})");
                inside.push(format!("{at} < {len}"));
                shifted.push((j, at));
            }
        }
        let (arena, addr) = self.address(&access, &self.k.operands[o].clone(), &name, &shifted);
        let storage = self.e.storage(self.k.operands[o].buffer);
        let value = load(&arena, &addr, access.dtype, storage);
        if inside.is_empty() {
            value
        } else {
            let zero = if access.dtype == DType::I32 {
                "0i"
            } else {
                "0.0"
            };
            format!("select({zero}, {value}, {})", inside.join(" && "))
        }
    }

    /// The WGSL expression of instruction `i` (its arguments bound as `v{arg}`).
    fn expr(&mut self, i: usize) -> String {
        let v = |a: &u32| format!("v{a}");
        match &self.p.insts[i] {
            Inst::Load(0) if self.product_operand.is_some() => {
                let product = self.product_operand.clone().expect("checked");
                if self.p.operands[0].dtype == DType::F16 {
                    // an f16 product is the f32 sum rounded once (IR.md)
                    format!("round_f16({product})")
                } else {
                    product
                }
            }
            Inst::Load(o) => self.operand_load(*o as usize),
            // From the param block, not a literal: drivers fold arithmetic on literals without
            // IEEE special values (lavapipe turns `x / 0.0`, `x * 0.0` and `0.0 / x` into 0
            // for every x), and kernels that differ only in constants then share one shader.
            Inst::Const(bits) => self.constant(f32::from_bits(*bits)),
            Inst::Coord(k) => format!("f32(c{k})"),
            Inst::Reduced(k) => format!("r{k}"),
            Inst::Map(Scalar::Cast(to), args) => match (self.dtypes[args[0] as usize], to) {
                (from, to) if from == *to => v(&args[0]),
                (_, DType::I32) => format!("f32_to_i32({})", v(&args[0])),
                (_, DType::F32) => format!("f32({})", v(&args[0])),
                // f16 values live in f32 registers, rounded to f16 numbers
                (_, DType::F16) => format!("round_f16(f32({}))", v(&args[0])),
            },
            Inst::Map(Scalar::GeluTanh, args) => gelu_tanh(&v(&args[0])),
            Inst::Map(Scalar::Op(op), args) => {
                let a: Vec<String> = args.iter().map(v).collect();
                if *op == Op::Where {
                    // A NaN condition is not 0, so it selects `a`.
                    let cond = if self.dtypes[args[0] as usize] == DType::I32 {
                        format!("{} != 0i", a[0])
                    } else {
                        format!("({0} != 0.0 || is_nan_f32({0}))", a[0])
                    };
                    return format!("select({}, {}, {cond})", a[2], a[1]);
                }
                if matches!(op, Op::Eq | Op::Lt | Op::Le | Op::Gt | Op::Ge) {
                    // 0 and 1 from the param block too: a driver that decides the comparison
                    // (`x > x` is false) would otherwise see a literal 0 and fold what divides
                    // by it.
                    let (zero, one) = (self.constant(0.0), self.constant(1.0));
                    let mut holds = scalar(*op, &a);
                    let may_be_nan = |i: u32| match self.p.insts[i as usize] {
                        Inst::Coord(_) => false,
                        Inst::Const(bits) => f32::from_bits(bits).is_nan(),
                        _ => self.dtypes[i as usize] != DType::I32,
                    };
                    if may_be_nan(args[0]) || may_be_nan(args[1]) {
                        // A comparison with NaN is false (IR.md) on the bit pattern: drivers
                        // that assume no NaN fold `t == t` to true, which the gradient
                        // scaler's finite check (`loss_scale.rs`) is.
                        holds = format!(
                            "({holds}) && !(is_nan_f32({}) || is_nan_f32({}))",
                            a[0], a[1]
                        );
                    }
                    return format!("select({zero}, {one}, {holds})");
                }
                let mut a = a;
                if matches!(op, Op::Add | Op::Sub) && self.cancels(args[0], args[1], *op) {
                    // Drivers fold `x - x` (and `x + -x`) to 0, which IEEE makes NaN for an
                    // infinite or NaN `x`: hide that the right side is the same value by OR-ing
                    // in a param word that is 0 at run time.
                    let zero = self.e.param(0, "zero");
                    a[1] = format!("bitcast<f32>(bitcast<u32>({}) | {zero})", a[1]);
                }
                scalar(*op, &a)
            }
        }
    }

    /// The WGSL for an f32 constant: a param word, read once per kernel per value.
    fn constant(&mut self, v: f32) -> String {
        let bits = v.to_bits();
        if let Some((_, wgsl)) = self.constants.iter().find(|(b, _)| *b == bits) {
            return wgsl.clone();
        }
        let wgsl = format!("bitcast<f32>({})", self.e.param(bits as usize, "constant"));
        self.constants.push((bits, wgsl.clone()));
        wgsl
    }

    /// Whether a driver could see `a OP b` as `x - x`: the same instruction, loads of the same
    /// element, or one the negation of the other (for `add`).
    fn cancels(&self, a: u32, b: u32, op: Op) -> bool {
        let same = |x: u32, y: u32| {
            x == y
                || match (&self.p.insts[x as usize], &self.p.insts[y as usize]) {
                    (Inst::Load(i), Inst::Load(j)) => {
                        self.k.operands[*i as usize] == self.k.operands[*j as usize]
                            && self.p.operands[*i as usize] == self.p.operands[*j as usize]
                    }
                    _ => false,
                }
        };
        let negation = |x: u32, y: u32| matches!(&self.p.insts[x as usize], Inst::Map(Scalar::Op(Op::Neg), v) if same(v[0], y));
        match op {
            Op::Sub => same(a, b),
            _ => negation(a, b) || negation(b, a),
        }
    }

    /// Instructions needed to compute `roots`, in order.
    fn needed(&self, roots: &[u32]) -> Vec<bool> {
        let mut need = vec![false; self.p.insts.len()];
        for &r in roots {
            need[r as usize] = true;
        }
        for i in (0..self.p.insts.len()).rev() {
            if need[i]
                && let Inst::Map(_, args) = &self.p.insts[i]
            {
                for &a in args {
                    need[a as usize] = true;
                }
            }
        }
        need
    }

    /// Binds every needed row-level instruction not bound yet, at function scope.
    fn bind_rows(&mut self, need: &[bool]) {
        for (i, &needed) in need.iter().enumerate() {
            if needed && self.levels[i] == Level::Row && !self.bound[i] {
                let expr = self.expr(i);
                writeln!(self.body, "    let v{i} = {expr};").unwrap();
                self.bound[i] = true;
            }
        }
    }

    /// Binds every needed element-level instruction, inside a loop body.
    fn bind_elements(&mut self, need: &[bool], indent: &str) -> String {
        let mut s = String::new();
        for (i, &needed) in need.iter().enumerate() {
            if needed && self.levels[i] == Level::Element {
                let expr = self.expr(i);
                writeln!(s, "{indent}let v{i} = {expr};").unwrap();
            }
        }
        s
    }

    fn store_output(&mut self, o: usize) -> String {
        let out = self.p.outputs[o].clone();
        let (arena, addr) = self.address(
            &out.access,
            &self.k.outputs[o].clone(),
            &format!("out{o}"),
            &[],
        );
        let storage = self.e.storage(self.k.outputs[o].buffer);
        store(
            &arena,
            &addr,
            &format!("v{}", out.value),
            out.access.dtype,
            storage,
        )
    }

    fn emit_map(&mut self) -> (String, [u32; 3], u32) {
        let p = self.p;
        // Over three axes or more, a thread takes `points` points spaced `chunk` apart along
        // the outermost axis, so one decomposition of its index (two divisions or more) serves
        // them all; neighbouring threads still take neighbouring innermost points. Measured on
        // the H200: a head-merging copy `[4, 12, 512, 64]` 13.8 -> 11.7 us; over two axes (one
        // division) AdamW's moments came out 3% slower, so those keep a point per thread.
        let points = if p.domain.len() >= 3 {
            p.domain[0].min(MAP_POINTS)
        } else {
            1
        };
        let chunk = p.domain.first().map_or(1, |&d0| d0.div_ceil(points));
        let threads: usize = chunk * p.domain.iter().skip(1).product::<usize>();
        let n = self.e.param(threads, "threads");
        writeln!(
            self.body,
            "    let gi = (wid.x + wid.y * nwg.x) * {WORKGROUP}u + lid;"
        )
        .unwrap();
        writeln!(self.body, "    if (gi >= {n}) {{ return; }}").unwrap();
        let dims = self.e.params(&p.domain, "domain");
        let roots: Vec<u32> = p.outputs.iter().map(|o| o.value).collect();
        let need = self.needed(&roots);
        if points == 1 {
            decompose_into(&mut self.body, "    ", "gi", 0, &dims);
        } else {
            // the outermost coordinate of the thread's first point; `c0` steps from it
            decompose_named(&mut self.body, "    ", "gi", 0, &dims, "first0");
            let step = self.e.param(chunk, "chunk");
            writeln!(
                self.body,
                "    for (var u = 0u; u < {points}u; u = u + 1u) {{\n        let c0 = first0 + u * {step};"
            )
            .unwrap();
            if !p.domain[0].is_multiple_of(points) {
                let outer = self.e.param(p.domain[0], "domain[0]");
                writeln!(self.body, "        if (c0 >= {outer}) {{ break; }}").unwrap();
            }
            self.e.loop_trips(points as u64);
        }
        let outside = std::mem::take(&mut self.body);
        self.bind_rows(&need);
        for o in 0..p.outputs.len() {
            let st = self.store_output(o);
            writeln!(self.body, "    {st}").unwrap();
        }
        let point = std::mem::replace(&mut self.body, outside);
        if points == 1 {
            self.body.push_str(&point);
        } else {
            for line in point.lines() {
                writeln!(self.body, "    {line}").unwrap();
            }
            writeln!(self.body, "    }}").unwrap();
        }
        let mut s = String::new();
        writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
        writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
        s.push_str(&self.body);
        s.push_str("}\n");
        (s, grid(threads.div_ceil(WORKGROUP as usize)), 0)
    }

    fn emit_rows(&mut self) -> (String, [u32; 3], u32) {
        let p = self.p;
        let d = p.domain.len();
        let rows: usize = p.domain.iter().product();
        let len: usize = p.reduce.iter().product();
        let map = mapping(self.k);
        let seg = match map {
            Mapping::RowMajor => row_segment(rows, len),
            Mapping::ColumnMajor => column_segment(rows, len),
        };
        let per_group = WORKGROUP / seg;
        let argmax = p
            .phases
            .iter()
            .any(|ph| matches!(ph.combine, Combine::ArgMax { .. }));
        let b = &mut self.body;
        match map {
            Mapping::RowMajor => {
                writeln!(b, "    let lane = lid % SEG;").unwrap();
                writeln!(b, "    let slot = lid / SEG;").unwrap();
            }
            Mapping::ColumnMajor => {
                writeln!(b, "    let lane = lid / {per_group}u;").unwrap();
                writeln!(b, "    let slot = lid % {per_group}u;").unwrap();
            }
        }
        writeln!(b, "    let cell = slot * SEG + lane;").unwrap();
        writeln!(
            b,
            "    let row = (wid.x + wid.y * nwg.x) * {per_group}u + slot;"
        )
        .unwrap();
        let rows_p = self.e.param(rows, "rows");
        let len_p = self.e.param(len, "row_len");
        let b = &mut self.body;
        writeln!(b, "    let live = row < {rows_p};").unwrap();
        writeln!(b, "    let len = select(0u, {len_p}, live);").unwrap();
        let ddims = self.e.params(&p.domain, "domain");
        decompose_into(&mut self.body, "    ", "select(0u, row, live)", 0, &ddims);
        let rdims = self.e.params(&p.reduce, "reduce");
        // Loop iterations per invocation: one loop over the row per phase (and one for the
        // per-element outputs), one combination per phase; long rows unroll the row loops.
        let writes_elements = p.outputs.iter().any(|o| {
            o.access
                .axes
                .iter()
                .any(|a| matches!(a, Axis::Space(k) if (*k as usize) >= d))
        });
        let loops = p.phases.len() as u64 + u64::from(writes_elements);
        let per_loop = (len as u64).div_ceil(u64::from(seg));
        // One row per workgroup: its reductions also have a subgroup form (see
        // `combine_subgroups`), whose combination loops count more (the larger of the two).
        let subgroups = seg == WORKGROUP;
        let per_combine = if subgroups {
            u64::from(seg.trailing_zeros()).max(SUBGROUP_COMBINE_TRIPS)
        } else {
            u64::from(seg.trailing_zeros())
        };
        let combines = p.phases.len() as u64 * per_combine;
        let unroll = unroll_factor(per_loop, loops, combines);
        self.e
            .loop_trips(per_loop.div_ceil(u64::from(unroll)) * loops + combines);
        for (k, phase) in p.phases.iter().enumerate() {
            let need = self.needed(&[phase.value]);
            self.bind_rows(&need);
            let (init, step) = combine_step(phase.combine, k);
            let mut inner = self.bind_elements(&need, "        ");
            writeln!(
                inner,
                "        {}",
                step.replace("VALUE", &format!("v{}", phase.value))
            )
            .unwrap();
            writeln!(self.body, "    {init}").unwrap();
            each(&mut self.body, unroll, &rdims, d, &inner);
            self.combines.push((self.body.len(), phase.combine, k));
        }
        // A kernel that writes an output over a tensor it reads (an update in place,
        // `in_place.rs`) reads it at the element it writes, but the lanes of a row all load
        // its per-row values: every load happens before the first store.
        if self
            .k
            .outputs
            .iter()
            .any(|o| self.k.operands.iter().any(|i| i.buffer == o.buffer))
        {
            let roots: Vec<u32> = p.outputs.iter().map(|o| o.value).collect();
            let need = self.needed(&roots);
            self.bind_rows(&need);
            writeln!(self.body, "    storageBarrier();").unwrap();
        }
        // Per-row outputs: once per row, by lane 0.
        let rows_only: Vec<usize> = (0..p.outputs.len())
            .filter(|&o| {
                !p.outputs[o]
                    .access
                    .axes
                    .iter()
                    .any(|a| matches!(a, Axis::Space(k) if (*k as usize) >= d))
            })
            .collect();
        let per_element: Vec<usize> = (0..p.outputs.len())
            .filter(|o| !rows_only.contains(o))
            .collect();
        if !rows_only.is_empty() {
            let roots: Vec<u32> = rows_only.iter().map(|&o| p.outputs[o].value).collect();
            let need = self.needed(&roots);
            self.bind_rows(&need);
            // reduce coordinates are 0 for per-row stores (their strides are 0 anyway)
            let mut stores = String::new();
            for &o in &rows_only {
                writeln!(stores, "        {}", self.store_output(o)).unwrap();
            }
            writeln!(self.body, "    if (live && lane == 0u) {{").unwrap();
            self.body.push_str(&stores);
            writeln!(self.body, "    }}").unwrap();
        }
        if !per_element.is_empty() {
            let roots: Vec<u32> = per_element.iter().map(|&o| p.outputs[o].value).collect();
            let need = self.needed(&roots);
            self.bind_rows(&need);
            let mut inner = self.bind_elements(&need, "        ");
            for &o in &per_element {
                writeln!(inner, "        {}", self.store_output(o)).unwrap();
            }
            each(&mut self.body, unroll, &rdims, d, &inner);
        }
        let shared = WORKGROUP * if argmax { 8 } else { 4 };
        let tree = self.module(seg, argmax, Variant::Tree);
        if subgroups {
            self.e.subgroup_body = Some(self.module(seg, argmax, Variant::Subgroups));
        }
        (tree, grid(rows.div_ceil(per_group as usize)), shared)
    }

    /// The kernel's text with each phase's combination written as `variant` says.
    fn module(&self, seg: u32, argmax: bool, variant: Variant) -> String {
        let mut s = String::new();
        writeln!(s, "const SEG: u32 = {seg}u;").unwrap();
        let slots = match variant {
            Variant::Tree => WORKGROUP,
            Variant::Subgroups => MAX_SUBGROUPS,
        };
        writeln!(s, "var<workgroup> red: array<f32, {slots}>;").unwrap();
        if argmax {
            writeln!(s, "var<workgroup> redi: array<u32, {slots}>;").unwrap();
        }
        writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
        match variant {
            Variant::Tree => writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap(),
            Variant::Subgroups => writeln!(s, "fn main({ENTRY_ARGS}, {SUBGROUP_ARGS}) {{").unwrap(),
        }
        let mut at = 0;
        for &(pos, c, k) in &self.combines {
            s.push_str(&self.body[at..pos]);
            match variant {
                Variant::Tree => combine_segment(&mut s, c, k),
                Variant::Subgroups => combine_subgroups(&mut s, c, k),
            }
            at = pos;
        }
        s.push_str(&self.body[at..]);
        s.push_str("}\n");
        s
    }
}

/// How a row kernel's segment combines its lanes' accumulators.
#[derive(Clone, Copy)]
enum Variant {
    /// A tree in workgroup memory, a barrier per level: any adapter.
    Tree,
    /// Subgroup operations within each subgroup, then one partial per subgroup through
    /// workgroup memory: two barriers. Only where the segment is the whole workgroup, since
    /// WGSL does not say which invocations form a subgroup.
    Subgroups,
}

/// The builtins the subgroup form of a kernel reads.
const SUBGROUP_ARGS: &str = "@builtin(subgroup_invocation_id) sg_lane: u32, @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_id) sg_id: u32, @builtin(num_subgroups) sg_count: u32";
/// The fewest invocations a subgroup has (WebGPU's lower bound for `subgroup_size`).
const MIN_SUBGROUP_SIZE: u32 = 4;
/// The most subgroups a workgroup has.
const MAX_SUBGROUPS: u32 = WORKGROUP / MIN_SUBGROUP_SIZE;
/// Loop iterations of one subgroup combination: a butterfly over at most 128 lanes (7 steps),
/// then a pass over at most [`MAX_SUBGROUPS`] partials.
const SUBGROUP_COMBINE_TRIPS: u64 = 7 + MAX_SUBGROUPS as u64;

/// The initialization of phase `k`'s accumulator and its per-element step (`VALUE` stands for
/// the element's value; `j` is the flat reduce index).
fn combine_step(c: Combine, k: usize) -> (String, String) {
    let init = match c {
        Combine::Sum => format!("var a{k} = 0.0;"),
        Combine::Max => format!("var a{k} = {NEG_INF};"),
        Combine::Min => format!("var a{k} = {POS_INF};"),
        Combine::ArgMax { .. } => format!("var a{k} = {NEG_INF};\n    var ai{k} = 0xffffffffu;"),
    };
    (
        init,
        fold(c, &format!("a{k}"), &format!("ai{k}"), "VALUE", "j"),
    )
}

/// The statement folding value `y` (at index `yi`, for argmax) into the accumulator `acc` (its
/// index in `acc_i`), with the NaN and tie rules of IR.md.
fn fold(c: Combine, acc: &str, acc_i: &str, y: &str, yi: &str) -> String {
    match c {
        Combine::Sum => format!("{acc} = {acc} + {y};"),
        Combine::Max => format!("{acc} = max_nan({acc}, {y});"),
        Combine::Min => format!("{acc} = min_nan({acc}, {y});"),
        Combine::ArgMax { last } => {
            let takes = argmax_helper(last);
            format!("if ({takes}({acc}, {acc_i}, {y}, {yi})) {{ {acc} = {y}; {acc_i} = {yi}; }}")
        }
    }
}

/// The WGSL helper that says whether an argmax accumulator takes a value (`numerics.rs`): ties
/// and NaNs go to the lower index, or with `last` to the higher.
fn argmax_helper(last: bool) -> &'static str {
    if last {
        "argmax_last_takes"
    } else {
        "argmax_takes"
    }
}

/// Combines the segment's accumulators of phase `k` in workgroup memory and binds the row's
/// result to `r{k}` in every thread of the segment.
fn combine_segment(s: &mut String, c: Combine, k: usize) {
    writeln!(s, "    red[cell] = a{k};").unwrap();
    if matches!(c, Combine::ArgMax { .. }) {
        writeln!(s, "    redi[cell] = ai{k};").unwrap();
    }
    writeln!(s, "    workgroupBarrier();").unwrap();
    writeln!(s, "    for (var w = SEG / 2u; w > 0u; w = w >> 1u) {{").unwrap();
    writeln!(s, "        if (lane < w) {{").unwrap();
    writeln!(s, "            let x = red[cell];").unwrap();
    writeln!(s, "            let y = red[cell + w];").unwrap();
    match c {
        Combine::Sum => writeln!(s, "            red[cell] = x + y;").unwrap(),
        Combine::Max => writeln!(s, "            red[cell] = max_nan(x, y);").unwrap(),
        Combine::Min => writeln!(s, "            red[cell] = min_nan(x, y);").unwrap(),
        Combine::ArgMax { last } => {
            writeln!(s, "            let yi = redi[cell + w];").unwrap();
            writeln!(
                s,
                "            if ({}(x, redi[cell], y, yi)) {{ red[cell] = y; redi[cell] = yi; }}",
                argmax_helper(last)
            )
            .unwrap();
        }
    }
    writeln!(s, "        }}").unwrap();
    writeln!(s, "        workgroupBarrier();").unwrap();
    writeln!(s, "    }}").unwrap();
    match c {
        Combine::ArgMax { .. } => writeln!(s, "    let r{k} = i32(redi[cell - lane]);").unwrap(),
        _ => writeln!(s, "    let r{k} = red[cell - lane];").unwrap(),
    }
    // every thread has read the result before the next phase reuses `red`
    writeln!(s, "    workgroupBarrier();").unwrap();
}

/// [`combine_segment`]'s subgroup form, for a segment that is the whole workgroup: each
/// subgroup combines its lanes (`subgroupAdd`; a butterfly of shuffles for max, min and argmax,
/// whose NaN and tie rules `subgroupMax` does not keep), its first lane stores the partial by
/// subgroup id, and every thread combines the partials in subgroup order.
fn combine_subgroups(s: &mut String, c: Combine, k: usize) {
    let merge = |s: &mut String, indent: &str, y: &str, yi: &str| {
        let line = fold(c, &format!("s{k}"), &format!("si{k}"), y, yi);
        writeln!(s, "{indent}{line}").unwrap();
    };
    if c == Combine::Sum {
        writeln!(s, "    var s{k} = subgroupAdd(a{k});").unwrap();
    } else {
        writeln!(s, "    var s{k} = a{k};").unwrap();
        if matches!(c, Combine::ArgMax { .. }) {
            writeln!(s, "    var si{k} = ai{k};").unwrap();
        }
        writeln!(s, "    for (var m = sg_size >> 1u; m > 0u; m = m >> 1u) {{").unwrap();
        writeln!(s, "        let y = subgroupShuffleXor(s{k}, m);").unwrap();
        if matches!(c, Combine::ArgMax { .. }) {
            writeln!(s, "        let yi = subgroupShuffleXor(si{k}, m);").unwrap();
        }
        merge(s, "        ", "y", "yi");
        writeln!(s, "    }}").unwrap();
    }
    writeln!(s, "    if (sg_lane == 0u) {{").unwrap();
    writeln!(s, "        red[sg_id] = s{k};").unwrap();
    if matches!(c, Combine::ArgMax { .. }) {
        writeln!(s, "        redi[sg_id] = si{k};").unwrap();
    }
    writeln!(s, "    }}").unwrap();
    writeln!(s, "    workgroupBarrier();").unwrap();
    writeln!(s, "    s{k} = red[0];").unwrap();
    if matches!(c, Combine::ArgMax { .. }) {
        writeln!(s, "    si{k} = redi[0];").unwrap();
    }
    writeln!(s, "    for (var g = 1u; g < sg_count; g = g + 1u) {{").unwrap();
    merge(s, "        ", "red[g]", "redi[g]");
    writeln!(s, "    }}").unwrap();
    match c {
        Combine::ArgMax { .. } => writeln!(s, "    let r{k} = i32(si{k});").unwrap(),
        _ => writeln!(s, "    let r{k} = s{k};").unwrap(),
    }
    // every thread has read the partials before the next phase reuses `red`
    writeln!(s, "    workgroupBarrier();").unwrap();
}

/// A loop of the segment's lane over the row's reduce points, with reduce coordinates
/// `c{first}..` and the flat reduce index `j`; its body written `unroll` times per iteration.
fn each(s: &mut String, unroll: u32, rdims: &[String], first: usize, body: &str) {
    strided_loop(
        s,
        "    ",
        "j",
        "lane",
        "len",
        "SEG",
        unroll,
        &|s, indent| {
            decompose_into(s, indent, "j", first, rdims);
            for line in body.lines() {
                // `body` is indented for the plain loop (8 spaces).
                writeln!(s, "{indent}{}", line.trim_start_matches("        ")).unwrap();
            }
        },
    );
}

/// `let c{first + axis} = ...;` for the coordinates of the linear index `index` over `dims`.
fn decompose_into(out: &mut String, indent: &str, index: &str, first: usize, dims: &[String]) {
    decompose_named(out, indent, index, first, dims, &format!("c{first}"));
}

/// [`decompose_into`], naming the outermost coordinate `outer` instead of `c{first}`.
fn decompose_named(
    out: &mut String,
    indent: &str,
    index: &str,
    first: usize,
    dims: &[String],
    outer: &str,
) {
    match dims.len() {
        0 => {}
        1 => writeln!(out, "{indent}let {outer} = {index};").unwrap(),
        n => {
            let rem = format!("rem{first}");
            writeln!(out, "{indent}var {rem} = {index};").unwrap();
            for axis in (1..n).rev() {
                let d = &dims[axis];
                writeln!(out, "{indent}let c{} = {rem} % {d};", first + axis).unwrap();
                writeln!(out, "{indent}{rem} = {rem} / {d};").unwrap();
            }
            writeln!(out, "{indent}let {outer} = {rem};").unwrap();
        }
    }
}

fn gelu_tanh(x: &str) -> String {
    format!("0.5 * {x} * (1.0 + tanh_f32(0.7978846 * ({x} + 0.044715 * {x} * {x} * {x})))")
}

/// WGSL for an elementwise op of the IR at arguments `a`.
fn scalar(op: Op, a: &[String]) -> String {
    let x = &a[0];
    // A bool; `expr` turns it into 0.0 or 1.0.
    let cmp = |o: &str| format!("{x} {o} {}", a[1]);
    match op {
        Op::Neg => format!("-{x}"),
        Op::Abs => format!("abs({x})"),
        Op::Exp => format!("exp({x})"),
        Op::Log => format!("log_f32({x})"),
        Op::Sqrt => format!("sqrt_f32({x})"),
        Op::Rsqrt => format!("rsqrt_f32({x})"),
        Op::Reciprocal => format!("1.0 / {x}"),
        Op::Square => format!("{x} * {x}"),
        Op::Relu => format!("relu_nan({x})"),
        Op::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        Op::Tanh => format!("tanh_f32({x})"),
        Op::Silu => format!("{x} / (1.0 + exp(-{x}))"),
        Op::Sin => format!("sin_f32({x})"),
        Op::Cos => format!("cos_f32({x})"),
        Op::Gelu => format!("0.5 * {x} * (1.0 + erf_f32({x} * 0.70710677))"),
        Op::Add => format!("{x} + {}", a[1]),
        Op::Sub => format!("{x} - {}", a[1]),
        Op::Mul => format!("{x} * {}", a[1]),
        Op::Div => format!("{x} / {}", a[1]),
        Op::Pow => format!("pow_f32({x}, {})", a[1]),
        Op::Maximum => format!("max_nan({x}, {})", a[1]),
        Op::Minimum => format!("min_nan({x}, {})", a[1]),
        Op::Eq => cmp("=="),
        Op::Lt => cmp("<"),
        Op::Le => cmp("<="),
        Op::Gt => cmp(">"),
        Op::Ge => cmp(">="),
        // `where` is emitted as a `select` by the caller; the rest are not scalar functions
        // (`Scalar::of` gives none for them), listed so that a new op must be placed
        Op::Where
        | Op::Sum
        | Op::Mean
        | Op::Max
        | Op::Min
        | Op::Logsumexp
        | Op::Argmax
        | Op::Cumsum
        | Op::Reshape
        | Op::Permute
        | Op::Transpose
        | Op::BroadcastTo
        | Op::Unsqueeze
        | Op::Squeeze
        | Op::Slice
        | Op::Concat
        | Op::Cast
        | Op::Matmul
        | Op::Softmax
        | Op::LogSoftmax
        | Op::LayerNorm
        | Op::RmsNorm
        | Op::GroupNorm
        | Op::Conv2d
        | Op::MaxPool2d
        | Op::AvgPool2d
        | Op::Embedding
        | Op::CrossEntropy
        | Op::MseLoss
        | Op::Conv2dGradInput
        | Op::Conv2dGradWeight
        | Op::MaxPool2dGrad
        | Op::AvgPool2dGrad
        | Op::EmbeddingGrad
        | Op::SliceGrad
        | Op::Attention
        | Op::Constant
        | Op::Iota
        | Op::Grad
        | Op::Sgd
        | Op::Adam
        | Op::AdamW => unreachable!("`{}` is not a scalar function", op.name()),
    }
}
