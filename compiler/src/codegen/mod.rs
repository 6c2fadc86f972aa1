//! WGSL code generation: one compute shader per kernel plan.
//!
//! Every module has the same frame: binding 0 is the dispatch's param block (a uniform array
//! of `vec4<u32>`, read through `p(i)`), bindings 1.. are the arenas the kernel touches
//! (`array<f32>`; i32 values are stored as bit patterns). A kernel that loads quads also binds
//! such an arena a second time as `array<vec4<f32>>` (`arena{i}q`), only for reads at
//! addresses that are multiples of 4 by construction, unless the target's `quad_aliases` is
//! off (artifacts for browsers, where WebGPU forbids binding one buffer twice in a dispatch). The body reads every extent, stride
//! and offset from the param block, so the text depends only on the plan's structure and
//! identical kernels are shared between dispatches.
//!
//! **Invariant:** `workgroupBarrier()` only appears in uniform control flow: loops around
//! barriers have compile-time trip counts, and per-thread conditions never enclose one.
//! Every loop's trip count is bounded by param-block values (`Kernel::loops_bounded`).

mod backward;
mod conv;
pub mod flash;
pub mod fused;
pub mod matmul;
pub mod numerics;
mod scan;

use std::fmt::Write;

use sinter_ir::DType;
use sinter_ir::artifact::Storage;

use crate::kernel::KernelPlan;
use crate::layout::BufferId;
use crate::memory::MemoryPlan;

/// Param words per `vec4<u32>` of the param block (`p(i)` reads `params.w[i / 4u][i % 4u]`).
const PARAM_WORDS_PER_VEC: usize = 4;

pub use crate::kernel::WORKGROUP;
/// Largest workgroup count per dispatch dimension (wgpu's default limit).
pub const MAX_GROUPS: u32 = 65535;

/// A generated kernel for one dispatch.
#[derive(Clone, Debug)]
pub struct KernelSource {
    pub wgsl: String,
    /// The kernel written with subgroup operations, where its plan has such a form
    /// (`Kernel::subgroup_wgsl`).
    pub subgroup_wgsl: Option<String>,
    pub params: Vec<u32>,
    pub workgroups: [u32; 3],
    /// Arena bound at each arena binding.
    pub arenas: Vec<u32>,
    pub workgroup_storage_bytes: u32,
    /// Most loop iterations (back-edges, all loops together) one invocation runs.
    pub loop_iterations: u64,
    /// `[param word, arena binding]` of every param word that holds a base element offset.
    pub address_words: Vec<[u32; 2]>,
    /// See [`Emitter::indices_in_range`].
    pub indices_in_range: bool,
    /// The wgpu features the kernel needs (see [`Emitter::cooperative_matrices`]).
    pub features: &'static [&'static str],
}

/// The wgpu features of a kernel on tensor cores: cooperative matrices of `f16` and the
/// subgroup builtins that divide the tiles among the workgroup's subgroups.
pub const COOPERATIVE_FEATURES: &[&str] =
    &["EXPERIMENTAL_COOPERATIVE_MATRIX", "SHADER_F16", "SUBGROUP"];

/// The wgpu features of a kernel that binds an f16 arena.
pub const HALF_FEATURES: &[&str] = &["SHADER_F16"];

pub use crate::target::LOOP_BUDGET;

/// Writes the WGSL of one kernel for `target` (the plan's variants are chosen already; the
/// target says which bindings and features a kernel may use).
pub fn emit(
    plan: &KernelPlan,
    mem: &MemoryPlan,
    target: &crate::Target,
) -> Result<KernelSource, crate::CompileError> {
    let mut e = Emitter {
        mem,
        quad_aliases: target.features.quad_aliases,
        params: Vec::new(),
        param_names: Vec::new(),
        arenas: Vec::new(),
        too_large: None,
        refused: None,
        loop_iterations: 0,
        address_words: Vec::new(),
        quads: Vec::new(),
        storage: Vec::new(),
        subgroup_body: None,
        indices_in_range: false,
        cooperative: false,
        emulated_cooperative: target.features.cooperative_emulated,
        workgroup_bytes: target.limits.workgroup_bytes,
    };
    let (body, workgroups, shared) = match plan {
        KernelPlan::Fused(k) => fused::emit(&mut e, k),
        KernelPlan::Matmul(k) => matmul::emit(&mut e, k)?,
        KernelPlan::SplitSum(k) => matmul::emit_split_sum(&mut e, k),
        KernelPlan::Conv2d(k) => conv::emit_conv(&mut e, k),
        KernelPlan::Pool2d(k) => conv::emit_pool(&mut e, k),
        KernelPlan::Gather(k) => conv::emit_gather(&mut e, k),
        KernelPlan::Conv2dGrad(k) if k.wrt_weight => backward::emit_conv_grad_weight(&mut e, k),
        KernelPlan::Conv2dGrad(k) => backward::emit_conv_grad_input(&mut e, k),
        KernelPlan::Pool2dGrad(k) => backward::emit_pool_grad(&mut e, k),
        KernelPlan::ScatterAdd(k) => backward::emit_scatter_add(&mut e, k),
        KernelPlan::SliceGrad(k) => backward::emit_slice_grad(&mut e, k),
        KernelPlan::Scan(k) => scan::emit(&mut e, k),
        KernelPlan::Flash(k) => flash::emit(&mut e, k),
        KernelPlan::FlashScale(k) => flash::coop::emit_scale(&mut e, k),
    };
    e.finish(plan.pattern(), &body, workgroups, shared)
}

/// Collects the param block and arena bindings while a kernel body is written.
pub struct Emitter<'m> {
    mem: &'m MemoryPlan,
    params: Vec<u32>,
    /// What each param word holds, for the kernel's header comment.
    param_names: Vec<String>,
    arenas: Vec<u32>,
    /// The first value that did not fit in a 32-bit param word (an error at `finish`).
    too_large: Option<usize>,
    refused: Option<(&'static str, String)>,
    loop_iterations: u64,
    address_words: Vec<[u32; 2]>,
    /// Per arena binding: whether it is a `vec4<f32>` alias.
    quads: Vec<bool>,
    /// Per arena binding: what the arena stores.
    storage: Vec<Storage>,
    /// Whether `vec4<f32>` aliases may be bound ([`crate::target::Features::quad_aliases`]).
    quad_aliases: bool,
    /// The body's form with subgroup operations, when the kernel has one (same params and
    /// bindings as the plain body).
    subgroup_body: Option<String>,
    indices_in_range: bool,
    /// See [`Emitter::cooperative_matrices`].
    cooperative: bool,
    /// Whether cooperative matrices are written out in plain WGSL
    /// ([`crate::target::Features::cooperative_emulated`]).
    emulated_cooperative: bool,
    /// The target's workgroup memory ([`crate::target::Limits::workgroup_bytes`]).
    workgroup_bytes: u32,
}

impl Emitter<'_> {
    /// Appends a word to the param block, named `name` in the kernel's header comment, and
    /// returns the WGSL that reads it. A value past `u32::MAX` (an attribute such as a stride,
    /// which the memory plan does not bound) makes the kernel fail with
    /// [`crate::CompileError::KernelLimit`].
    pub fn param(&mut self, value: usize, name: &str) -> String {
        self.param_names.push(name.to_string());
        let word = u32::try_from(value).unwrap_or_else(|_| {
            self.too_large.get_or_insert(value);
            0
        });
        self.params.push(word);
        let i = self.params.len() - 1;
        if self.cooperative {
            // naga's uniformity analysis takes a function's result for non-uniform
            let lanes = PARAM_WORDS_PER_VEC;
            format!("params.w[{}u][{}u]", i / lanes, i % lanes)
        } else {
            format!("p({i}u)")
        }
    }

    /// Refuses the kernel: `finish` returns [`crate::CompileError::KernelLimit`] with `what`
    /// (the first refusal wins).
    pub fn refuse(&mut self, kernel: &'static str, what: String) {
        self.refused.get_or_insert((kernel, what));
    }

    /// Refuses the kernel unless `extent` (a padded extent that its shader indexes with `i32`
    /// arithmetic) is below 2^31.
    pub fn signed_extent(&mut self, kernel: &'static str, what: &str, extent: u64) {
        if extent > i32::MAX as u64 {
            self.refuse(
                kernel,
                format!(
                    "{what} is {extent}, past the 2^31 - 1 its 32-bit index arithmetic reaches"
                ),
            );
        }
    }

    /// Counts `n` more loop iterations (back-edges) per invocation; see [`LOOP_BUDGET`].
    pub fn loop_trips(&mut self, n: u64) {
        self.loop_iterations = self.loop_iterations.saturating_add(n);
    }

    /// [`Emitter::param`] for each of `values`, named `name[i]`.
    pub fn params(&mut self, values: &[usize], name: &str) -> Vec<String> {
        (values.iter().enumerate())
            .map(|(i, &v)| self.param(v, &format!("{name}[{i}]")))
            .collect()
    }

    /// The WGSL name of the arena binding that holds `buffer`.
    pub fn arena(&mut self, buffer: BufferId) -> String {
        format!("arena{}", self.arena_slot(buffer))
    }

    /// The WGSL name of a binding of the arena that holds `buffer` as an array of quads
    /// (`vec4<f32>`, or `vec4<f16>` for an arena of halves), for loads of quads at element
    /// addresses that are multiples of 4 (index `address >> 2u`).
    pub fn arena_quads(&mut self, buffer: BufferId) -> String {
        debug_assert!(self.quad_aliases, "quads asked for with quad aliases off");
        format!("arena{}q", self.slot(buffer, true))
    }

    /// Whether the kernel may bind `vec4<f32>` aliases of arenas (see [`Emitter::arena_quads`]).
    pub fn quad_aliases(&self) -> bool {
        self.quad_aliases
    }

    /// The element offset in its arena of element `offset` of `buffer` (what [`Emitter::base`]
    /// puts in the param block), for alignment checks at compile time.
    pub fn element_start(&self, buffer: BufferId, offset: usize) -> usize {
        let p = self.mem.placements[buffer.0 as usize];
        p.offset as usize / self.mem.storage[p.arena as usize].bytes() as usize + offset
    }

    /// What the arena holding `buffer` stores.
    pub fn storage(&self, buffer: BufferId) -> Storage {
        self.mem.storage[self.mem.placements[buffer.0 as usize].arena as usize]
    }

    /// The arena binding slot (0-based, after the param block) that holds `buffer`.
    fn arena_slot(&mut self, buffer: BufferId) -> usize {
        self.slot(buffer, false)
    }

    fn slot(&mut self, buffer: BufferId, quads: bool) -> usize {
        let arena = self.mem.placements[buffer.0 as usize].arena;
        let found =
            (0..self.arenas.len()).find(|&i| self.arenas[i] == arena && self.quads[i] == quads);
        match found {
            Some(i) => i,
            None => {
                self.arenas.push(arena);
                self.quads.push(quads);
                self.storage.push(self.mem.storage[arena as usize]);
                self.arenas.len() - 1
            }
        }
    }

    /// Declares that every index the kernel makes into a workgroup or function-local array,
    /// and every storage address, is in range by construction (its global reads clamped, its
    /// writes masked), so that the runtime may drop naga's index clamping
    /// (`Kernel::indices_in_range`). Only emitters whose indexing is checked by tests at ragged
    /// shapes with the clamping off (every runtime test runs that way) declare it.
    pub fn indices_in_range(&mut self) {
        self.indices_in_range = true;
    }

    /// Declares that the body uses cooperative matrices of `f16` (tensor cores) and the subgroup
    /// builtins: the module enables `f16` and `wgpu_cooperative_matrix`, naga validates it with
    /// those capabilities, and the artifact requires [`COOPERATIVE_FEATURES`]. Cooperative
    /// operations must sit in control flow that naga's analysis proves uniform, which takes a
    /// function's result for non-uniform: params asked for after this read the param block
    /// directly instead of through `p(i)`.
    pub fn cooperative_matrices(&mut self) {
        self.cooperative = true;
    }

    /// Whether the target asks for cooperative matrices written out in plain WGSL
    /// ([`crate::target::Features::cooperative_emulated`]); a kernel that writes them so does
    /// not call [`Emitter::cooperative_matrices`].
    pub fn emulated_cooperative(&self) -> bool {
        self.emulated_cooperative
    }

    /// Bytes of workgroup memory the target offers a kernel, for kernels whose staging can use
    /// more where it is offered.
    pub fn workgroup_bytes(&self) -> u32 {
        self.workgroup_bytes
    }

    /// Absolute element offset of `offset` elements into `buffer`, as a param read.
    /// The word is recorded as an address (`Dispatch::address_words`), which the runtime checks
    /// against the size of the arena it indexes.
    pub fn base(&mut self, buffer: BufferId, offset: usize, name: &str) -> String {
        let start = self.element_start(buffer, offset);
        let slot = self.arena_slot(buffer) as u32;
        self.address_words.push([self.params.len() as u32, slot]);
        self.param(start, &format!("{name}.base"))
    }

    fn finish(
        self,
        pattern: crate::kernel::Pattern,
        body: &str,
        workgroups: [u32; 3],
        workgroup_storage_bytes: u32,
    ) -> Result<KernelSource, crate::CompileError> {
        if let Some((kernel, what)) = self.refused {
            return Err(crate::CompileError::KernelLimit { kernel, what });
        }
        if workgroup_storage_bytes > self.workgroup_bytes {
            return Err(crate::CompileError::KernelLimit {
                kernel: "workgroup memory",
                what: format!(
                    "the {pattern} kernel declares {workgroup_storage_bytes} bytes of workgroup \
                     memory, past the target's {} (a smaller block shape fits)",
                    self.workgroup_bytes
                ),
            });
        }
        if let Some(value) = self.too_large {
            return Err(crate::CompileError::KernelLimit {
                kernel: "param block",
                what: format!(
                    "the {pattern} kernel needs the value {value}, past the 2^32 - 1 that a \
                     32-bit param word holds"
                ),
            });
        }
        // The ops a kernel covers are listed in the artifact, not here, so that dispatches of
        // one structure share the text.
        let vec4s = self.params.len().div_ceil(PARAM_WORDS_PER_VEC).max(1);
        let mut head = String::new();
        let half = self.storage.contains(&Storage::Half);
        if self.cooperative || half {
            head.push_str("enable f16;\n");
        }
        if self.cooperative {
            head.push_str("enable wgpu_cooperative_matrix;\n");
        }
        writeln!(head, "// sinter kernel: {pattern}").unwrap();
        // what each param word holds (the values differ per dispatch, the meaning does not)
        let mut line = String::from("// params:");
        for (i, name) in self.param_names.iter().enumerate() {
            let item = format!(
                " {i} {name}{}",
                if i + 1 < self.param_names.len() {
                    ","
                } else {
                    ""
                }
            );
            if line.len() + item.len() > 100 {
                writeln!(head, "{line}").unwrap();
                line = String::from("//        ");
            }
            line.push_str(&item);
        }
        if !self.param_names.is_empty() {
            writeln!(head, "{line}").unwrap();
        }
        writeln!(head, "struct Params {{ w: array<vec4<u32>, {vec4s}> }}").unwrap();
        writeln!(head, "@group(0) @binding(0) var<uniform> params: Params;").unwrap();
        for i in 0..self.arenas.len() {
            let (name, ty) = match (self.quads[i], self.storage[i]) {
                (true, Storage::Word) => (format!("arena{i}q"), "vec4<f32>"),
                (true, Storage::Half) => (format!("arena{i}q"), "vec4<f16>"),
                (false, Storage::Word) => (format!("arena{i}"), "f32"),
                (false, Storage::Half) => (format!("arena{i}"), "f16"),
            };
            writeln!(
                head,
                "@group(0) @binding({}) var<storage, read_write> {name}: array<{ty}>;",
                i + 1
            )
            .unwrap();
        }
        writeln!(
            head,
            "fn p(i: u32) -> u32 {{ return params.w[i / 4u][i % 4u]; }}"
        )
        .unwrap();
        let module = |body: &str| format!("{head}{}", numerics::with_helpers(body));
        let wgsl = module(body);
        let subgroup_wgsl = self.subgroup_body.as_deref().map(module);
        let mut params = self.params;
        params.resize(vec4s * PARAM_WORDS_PER_VEC, 0);
        Ok(KernelSource {
            wgsl,
            subgroup_wgsl,
            params,
            workgroups,
            arenas: self.arenas,
            workgroup_storage_bytes,
            loop_iterations: self.loop_iterations,
            address_words: self.address_words,
            indices_in_range: self.indices_in_range,
            features: if self.cooperative {
                COOPERATIVE_FEATURES
            } else if half {
                HALF_FEATURES
            } else {
                &[]
            },
        })
    }
}

/// The smallest unroll factor (1, 2, 4, 8 or 16) that keeps `loops` loops of `trips` iterations
/// each, plus `fixed` iterations elsewhere, within [`LOOP_BUDGET`] (16 when none does: the
/// dispatch then records its count and lavapipe refuses it). Kernels use 1, the plain form,
/// whenever it fits, so common shapes keep their code.
pub fn unroll_factor(trips: u64, loops: u64, fixed: u64) -> u32 {
    [1u32, 2, 4, 8, 16]
        .into_iter()
        .find(|&u| {
            trips
                .div_ceil(u64::from(u))
                .saturating_mul(loops)
                .saturating_add(fixed)
                <= LOOP_BUDGET
        })
        .unwrap_or(16)
}

/// A loop `for (var VAR = START; VAR < END; VAR = VAR + STEP)` whose body is written `unroll`
/// times per iteration, copy `u` for `VAR = base + u * STEP` and guarded by `VAR < END`, so it
/// runs `ceil(count / unroll)` iterations. With `unroll == 1` it is the plain loop. `body`
/// writes one copy at the indent it is given, with `VAR` bound.
#[allow(clippy::too_many_arguments)]
pub fn strided_loop(
    s: &mut String,
    indent: &str,
    var: &str,
    start: &str,
    end: &str,
    step: &str,
    unroll: u32,
    body: &dyn Fn(&mut String, &str),
) {
    if unroll <= 1 {
        writeln!(
            s,
            "{indent}for (var {var} = {start}; {var} < {end}; {var} = {var} + {step}) {{"
        )
        .unwrap();
        body(s, &format!("{indent}    "));
        writeln!(s, "{indent}}}").unwrap();
        return;
    }
    writeln!(
        s,
        "{indent}for (var {var}_u = {start}; {var}_u < {end}; {var}_u = {var}_u + {step} * {unroll}u) {{"
    )
    .unwrap();
    for u in 0..unroll {
        writeln!(s, "{indent}    {{").unwrap();
        writeln!(s, "{indent}        let {var} = {var}_u + {u}u * {step};").unwrap();
        writeln!(s, "{indent}        if ({var} < {end}) {{").unwrap();
        body(s, &format!("{indent}            "));
        writeln!(s, "{indent}        }}").unwrap();
        writeln!(s, "{indent}    }}").unwrap();
    }
    writeln!(s, "{indent}}}").unwrap();
}

/// Workgroup counts for `groups` workgroups, split over x and y past the per-dimension limit.
/// Kernels recover the linear workgroup index as `wid.x + wid.y * nwg.x`.
pub fn grid(groups: usize) -> [u32; 3] {
    let groups = groups.max(1) as u64;
    if groups <= MAX_GROUPS as u64 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(MAX_GROUPS as u64);
        [MAX_GROUPS, y as u32, 1]
    }
}

/// WGSL that decomposes the linear index `index` over `dims` (outermost first) into
/// `let {prefix}{axis} = ...;` coordinates.
pub fn decompose(out: &mut String, indent: &str, index: &str, prefix: &str, dims: &[String]) {
    if dims.is_empty() {
        return;
    }
    if dims.len() == 1 {
        writeln!(out, "{indent}let {prefix}0 = {index};").unwrap();
        return;
    }
    writeln!(out, "{indent}var {prefix}rem = {index};").unwrap();
    for axis in (1..dims.len()).rev() {
        let d = &dims[axis];
        writeln!(out, "{indent}let {prefix}{axis} = {prefix}rem % {d};").unwrap();
        writeln!(out, "{indent}{prefix}rem = {prefix}rem / {d};").unwrap();
    }
    writeln!(out, "{indent}let {prefix}0 = {prefix}rem;").unwrap();
}

/// `base + c0 * s0 + c1 * s1 + ...` for coordinates named `{prefix}{axis}`; zero strides
/// (broadcast axes) are left out of the text only when `skip_zero` is known at compile time,
/// which it never is here: strides live in the param block.
pub fn address(base: &str, prefix: &str, strides: &[String]) -> String {
    let mut s = base.to_string();
    for (axis, stride) in strides.iter().enumerate() {
        write!(s, " + {prefix}{axis} * {stride}").unwrap();
    }
    s
}

/// WGSL that loads one element of `dtype` from `arena[addr]`, an arena of `storage`: an f32
/// (an i32 as such; an f16 number as an f32).
pub fn load(arena: &str, addr: &str, dtype: DType, storage: Storage) -> String {
    match (dtype, storage) {
        (DType::F32, _) | (DType::F16, Storage::Word) => format!("{arena}[{addr}]"),
        (DType::I32, _) => format!("bitcast<i32>({arena}[{addr}])"),
        (DType::F16, Storage::Half) => format!("f32({arena}[{addr}])"),
    }
}

/// WGSL statement that stores `value` (an f32, or an i32) of `dtype` to `arena[addr]`, an arena
/// of `storage`: an f16 value is rounded to f16 first ([`numerics`]' `round_f16`), so that the
/// stored number is the same whatever the arena and the driver's conversion.
pub fn store(arena: &str, addr: &str, value: &str, dtype: DType, storage: Storage) -> String {
    match (dtype, storage) {
        (DType::F32, _) => format!("{arena}[{addr}] = {value};"),
        (DType::I32, _) => format!("{arena}[{addr}] = bitcast<f32>({value});"),
        (DType::F16, Storage::Word) => format!("{arena}[{addr}] = round_f16({value});"),
        (DType::F16, Storage::Half) => format!("{arena}[{addr}] = f16(round_f16({value}));"),
    }
}

/// An exact WGSL f32 literal (non-finite values as bit patterns).
pub fn f32_literal(v: f32) -> String {
    if v.is_finite() {
        let s = format!("{v:?}");
        if v < 0.0 {
            format!("({s}f)")
        } else {
            format!("{s}f")
        }
    } else {
        format!("f32_bits({:#010x}u)", v.to_bits())
    }
}

pub const NAN: &str = "f32_bits(0x7fc00000u)";
pub const NEG_INF: &str = "f32_bits(0xff800000u)";
pub const POS_INF: &str = "f32_bits(0x7f800000u)";

/// The linear workgroup index and global thread index lines shared by one-thread-per-element
/// kernels; returns nothing, defines `gi` (global thread index).
pub fn thread_index(out: &mut String) {
    writeln!(
        out,
        "    let gi = (wid.x + wid.y * nwg.x) * {WORKGROUP}u + lid;"
    )
    .unwrap();
}

pub const ENTRY_ARGS: &str = "@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>";

/// Validates a module with naga (with subgroup operations allowed where `subgroups`, and
/// cooperative matrices of `f16` where `cooperative`); an invalid module is a compiler bug.
pub fn validate(
    name: &str,
    wgsl: &str,
    subgroups: bool,
    cooperative: bool,
) -> Result<(), crate::CompileError> {
    use naga::valid::Capabilities;
    let module =
        naga::front::wgsl::parse_str(wgsl).map_err(|e| crate::CompileError::InvalidWgsl {
            kernel: name.to_string(),
            diagnostic: e.emit_to_string(wgsl),
        })?;
    let mut capabilities = Capabilities::default();
    if subgroups || cooperative {
        capabilities |= Capabilities::SUBGROUP;
    }
    if cooperative {
        capabilities |= Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16;
    }
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities)
        .validate(&module)
        .map_err(|e| crate::CompileError::InvalidWgsl {
            kernel: name.to_string(),
            diagnostic: e.emit_to_string(wgsl),
        })?;
    Ok(())
}
