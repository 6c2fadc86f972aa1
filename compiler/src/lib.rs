//! # sinter-compiler
//!
//! Turns a verified [`Graph`] into an [`Artifact`]: expand composites, lower to a schedule of
//! kernels over strided views, plan arena memory, generate WGSL (validated by naga), pack.
//! [`compile`] orders the passes; each pass lives in its own module.
//!
//! **Architecture Invariant:** only naga-validated WGSL leaves codegen: an invalid module is a
//! compiler bug and fails compilation with naga's diagnostic.

pub mod autodiff;
pub mod bounds;
pub mod codegen;
pub mod error;
pub mod flash;
pub mod fused;
pub mod generation;
pub mod in_place;
pub mod kernel;
pub mod kgraph;
pub mod layout;
pub mod memory;
pub mod optimize;
pub mod schedule;
#[cfg(test)]
mod test_rng;

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use sinter_ir::Graph;
use sinter_ir::artifact::{
    ArenaLayout, Artifact, AssignCopy, BufferPlacement, Dispatch, Kernel, MemoryReport,
    Requirements, Role, TensorSlot, WORD_BYTES,
};

pub use error::CompileError;
use memory::MemoryPlan;
use schedule::{BufferKind, Schedule};

/// The default `max_storage_buffer_binding_size` of wgpu (128 MiB): plans larger than this
/// are split over several arena bindings.
pub const DEFAULT_MAX_BINDING: u64 = 128 << 20;

/// Passes whose result `--dump-after` can print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// The prefill and step programs of a generation artifact ([`generation`]).
    Decode,
    Expand,
    Autodiff,
    Decompose,
    Optimize,
    Schedule,
    Memory,
}

impl Pass {
    pub const ALL: [Pass; 7] = [
        Pass::Decode,
        Pass::Expand,
        Pass::Autodiff,
        Pass::Decompose,
        Pass::Optimize,
        Pass::Schedule,
        Pass::Memory,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Decode => "decode",
            Pass::Expand => "expand",
            Pass::Autodiff => "autodiff",
            Pass::Decompose => "decompose",
            Pass::Optimize => "optimize",
            Pass::Schedule => "schedule",
            Pass::Memory => "memory",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Largest arena binding, in bytes.
    pub max_binding_size: u64,
    /// Passes to dump (see [`Compiled::dumps`]).
    pub dump_after: Vec<Pass>,
    /// Forces one block shape on every matmul (for tuning); by default the shape is chosen
    /// from the product's shape ([`codegen::matmul::choose`]).
    pub matmul_tile: Option<codegen::matmul::Tile>,
    /// Forces the number of K chunks (split-K) of every matmul, 1 for none (for tuning and
    /// tests); a count that does not divide K becomes the largest one below it that does. By
    /// default it is chosen with the block shape.
    pub matmul_split: Option<usize>,
    /// Run the e-graph optimizer (`--no-opt` turns it off).
    pub optimize: bool,
    /// Keep the kernel graphs before and after optimization as Graphviz DOT text
    /// ([`Compiled::dot`]).
    pub dot: bool,
    /// Which attention kernels the optimizer may choose (`--attention`).
    pub attention: optimize::AttentionPolicy,
    /// Let a kernel bind an arena a second time as `array<vec4<f32>>` for 16-byte loads and
    /// stores (faster matmuls). WebGPU in a browser forbids binding one buffer twice in a
    /// dispatch when either binding is writable, so artifacts for browsers turn this off
    /// (`sinter compile --browser`); the runtime refuses such an artifact there with that hint.
    pub quad_aliases: bool,
    /// The blocking of the flash-attention kernels ([`codegen::flash::Tiling::DEFAULT`], B: the
    /// fastest measured, see BENCHMARKS.md "Flash tilings").
    /// For experiments the environment variable `SINTER_FLASH_TILE` (`a`, `b`, `c`, `d`; see
    /// [`codegen::flash::Tiling::NAMED`]) overrides it at compile time.
    pub flash_tile: codegen::flash::Tiling,
    /// Make an attention's dQ and dK/dV flash kernels one kernel of the whole backward where
    /// that pays (see [`flash::FlashKind::Backward`]); `sinter compile --flash-backward split`
    /// keeps the two.
    pub merge_flash_backward: bool,
    /// Run the flash-attention kernels' products on tensor cores where their shapes allow
    /// (`sinter compile --tensor-cores`; see [`codegen::flash`], "Tensor cores"): cooperative
    /// matrices of `f16` operands with `f32` accumulation. Opt-in, like PyTorch's
    /// `set_float32_matmul_precision("medium")`: the products' operands keep 11 significant
    /// bits, and the artifact runs only on adapters with wgpu's experimental cooperative
    /// matrices (native Vulkan; neither Mesa's software Vulkan nor browsers).
    pub tensor_cores: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_binding_size: DEFAULT_MAX_BINDING,
            dump_after: Vec::new(),
            matmul_tile: None,
            matmul_split: None,
            optimize: true,
            dot: false,
            attention: optimize::AttentionPolicy::Auto,
            quad_aliases: true,
            flash_tile: codegen::flash::Tiling::DEFAULT,
            merge_flash_backward: true,
            tensor_cores: false,
        }
    }
}

#[derive(Debug)]
pub struct Compiled {
    pub artifact: Artifact,
    /// `(pass, text)` for every pass asked for in [`Options::dump_after`].
    pub dumps: Vec<(Pass, String)>,
    /// Things worth telling the user that do not stop compilation (e.g. a gradient that is
    /// zero because the loss does not depend on its operand).
    pub warnings: Vec<String>,
    /// What the optimizer did (`None` with `--no-opt`).
    pub optimize: Option<optimize::Report>,
    /// With [`Options::dot`]: `(name, DOT text)` of the kernel graph before optimization (the
    /// decomposed graph, one kernel per primitive) and after.
    pub dot: Vec<(&'static str, String)>,
}

/// The whole pipeline, pass by pass.
pub fn compile(graph: &Graph, options: &Options) -> Result<Compiled, CompileError> {
    let mut dumps = Vec::new();
    let mut compiled = run_passes(graph, options, &mut dumps)?;
    compiled.dumps = dumps;
    Ok(compiled)
}

/// [`compile`], keeping the dumps of the passes that ran when a later one fails (that is when
/// `--dump-after` helps most).
pub fn compile_keeping_dumps(
    graph: &Graph,
    options: &Options,
) -> (Vec<(Pass, String)>, Result<Compiled, CompileError>) {
    let mut dumps = Vec::new();
    match run_passes(graph, options, &mut dumps) {
        Ok(mut compiled) => {
            compiled.dumps = dumps;
            (Vec::new(), Ok(compiled))
        }
        Err(e) => (dumps, Err(e)),
    }
}

/// Every pass in order; the dumps go to `dumps` as they are made.
fn run_passes(
    graph: &Graph,
    options: &Options,
    dumps: &mut Vec<(Pass, String)>,
) -> Result<Compiled, CompileError> {
    let mut dump = |pass: Pass, text: &dyn Fn() -> String| {
        if options.dump_after.contains(&pass) {
            dumps.push((pass, text()));
        }
    };
    let graph = sinter_ir::expand::expand_composites(graph);
    dump(Pass::Expand, &|| sinter_ir::text::print(&graph));
    let differentiated = autodiff::differentiate(&graph)?;
    let (graph, warnings) = (differentiated.graph, differentiated.warnings);
    dump(Pass::Autodiff, &|| sinter_ir::text::print(&graph));
    let contracts = bounds::analyze(&graph)?;
    let bounds: HashMap<String, usize> = (contracts.iter())
        .filter_map(|(name, c)| Some((name.clone(), c.index_bound? as usize)))
        .collect();
    let graph = sinter_ir::decompose::decompose(&graph);
    dump(Pass::Decompose, &|| sinter_ir::text::print(&graph));
    let unoptimized = kgraph::KernelGraph::from_graph(&graph);
    let (kgraph, report) = if options.optimize {
        let (kg, report) = optimize::optimize(
            &graph,
            &optimize::Config {
                attention: options.attention,
                max_binding: options.max_binding_size,
                merge_flash_backward: options.merge_flash_backward,
                tensor_cores: options.tensor_cores,
            },
        );
        dump(Pass::Optimize, &|| {
            format!("{report}\n{}", describe_kernel_graph(&kg))
        });
        (kg, Some(report))
    } else {
        (unoptimized.clone(), None)
    };
    let sched = schedule::lower(&kgraph, bounds.clone(), options)?;
    let summary = match &report {
        Some(r) => Some(optimizer_summary(
            r,
            &schedule::lower(&unoptimized, bounds, options)?,
            &sched,
        )),
        None => None,
    };
    dump(Pass::Schedule, &|| describe_schedule(&sched));
    let mem = memory::plan(&sched, options.max_binding_size)?;
    dump(Pass::Memory, &|| describe_memory(&sched, &mem));
    let mut artifact = pack(&kgraph, &sched, &mem, options)?;
    for slot in &mut artifact.tensors {
        if let (Some(c), Role::Input | Role::Param | Role::State) =
            (contracts.get(&slot.name), slot.role)
        {
            slot.index_bound = c.index_bound;
            slot.at_least = c.at_least;
        }
    }
    artifact.optimizer = summary;
    let mut warnings = warnings;
    warnings.extend(loop_warnings(&artifact));
    let dot = if options.dot {
        vec![("before", unoptimized.to_dot()), ("after", kgraph.to_dot())]
    } else {
        Vec::new()
    };
    Ok(Compiled {
        artifact,
        dumps: Vec::new(),
        warnings,
        optimize: report,
        dot,
    })
}

/// The back half of [`compile`] for a kernel graph built directly (tests of kernels that only
/// the optimizer makes): lowering, memory plan, codegen, artifact.
pub fn compile_kernel_graph(
    kgraph: &kgraph::KernelGraph,
    options: &Options,
) -> Result<Artifact, CompileError> {
    let sched = schedule::lower(kgraph, HashMap::new(), options)?;
    let mem = memory::plan(&sched, options.max_binding_size)?;
    pack(kgraph, &sched, &mem, options)
}

/// The artifact's record of an optimization: the step before (the decomposed graph, one kernel
/// per primitive) and after, and the rule sets' runs.
fn optimizer_summary(
    report: &optimize::Report,
    before: &Schedule,
    after: &Schedule,
) -> sinter_ir::artifact::OptimizerSummary {
    use sinter_ir::artifact::{OptimizerSummary, RuleSetSummary, StepSummary};
    let step = |s: &Schedule, estimate: f64| StepSummary {
        dispatches: s.steps.len() as u64,
        bytes_moved: s.steps.iter().map(|st| st.plan.bytes_moved()).sum(),
        estimated_us: estimate / 1e3,
    };
    OptimizerSummary {
        before: step(before, report.cost_before),
        after: step(after, report.cost_after),
        rule_sets: report
            .sets
            .iter()
            .map(|s| RuleSetSummary {
                name: s.name.to_string(),
                iterations: s.iterations as u64,
                stop: s.stop.clone(),
                e_nodes: s.nodes as u64,
                e_classes: s.classes as u64,
                ms: s.time.as_secs_f64() * 1e3,
                applied: s
                    .applied
                    .iter()
                    .map(|(r, n)| (r.clone(), *n as u64))
                    .collect(),
            })
            .collect(),
        ms: report.total_time.as_secs_f64() * 1e3,
    }
}

/// A warning per kernel whose invocations loop more often than Mesa's software Vulkan allows
/// (the runtime refuses to run those dispatches there).
fn loop_warnings(artifact: &Artifact) -> Vec<String> {
    let mut worst: Vec<Option<(usize, u64)>> = vec![None; artifact.kernels.len()];
    for (i, d) in artifact.dispatches.iter().enumerate() {
        let w = &mut worst[d.kernel as usize];
        if d.loop_iterations > codegen::LOOP_BUDGET && w.is_none_or(|(_, n)| d.loop_iterations > n)
        {
            *w = Some((i, d.loop_iterations));
        }
    }
    worst
        .iter()
        .zip(&artifact.kernels)
        .filter_map(|(w, k)| {
            let (dispatch, n) = (*w)?;
            Some(format!(
                "kernel `{}` (dispatch {dispatch}) runs {n} loop iterations per invocation; \
                 Mesa's software Vulkan (lavapipe) ends loops after {} and will refuse to run it",
                k.name,
                codegen::LOOP_BUDGET
            ))
        })
        .collect()
}

/// Validates every kernel's WGSL (and its subgroup form) with naga, on all cores: the first
/// invalid module in kernel order is the error. `cooperative[i]`: kernel `i` runs on tensor
/// cores.
fn validate_all(kernels: &[Kernel], cooperative: &[bool]) -> Result<(), CompileError> {
    let check = |(k, &coop): (&Kernel, &bool)| -> Result<(), CompileError> {
        codegen::validate(&k.name, &k.wgsl, false, coop)?;
        match &k.subgroup_wgsl {
            Some(wgsl) => codegen::validate(&k.name, wgsl, true, coop),
            None => Ok(()),
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    if threads < 2 || kernels.len() < 2 {
        return kernels.iter().zip(cooperative).try_for_each(check);
    }
    let per = kernels.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = kernels
            .chunks(per)
            .zip(cooperative.chunks(per))
            .map(|(part, coop)| scope.spawn(move || part.iter().zip(coop).try_for_each(check)))
            .collect();
        parts.into_iter().try_for_each(|h| match h.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    })
}

/// The flash kernels' tiling: [`Options::flash_tile`], or the one `SINTER_FLASH_TILE` names.
fn flash_tile(options: &Options) -> Result<codegen::flash::Tiling, CompileError> {
    match std::env::var("SINTER_FLASH_TILE") {
        Ok(name) if !name.trim().is_empty() => {
            codegen::flash::Tiling::named(&name).ok_or_else(|| {
                let names: Vec<&str> = codegen::flash::Tiling::NAMED
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                CompileError::Setting {
                    what: format!("SINTER_FLASH_TILE={name}"),
                    expected: names.join(", "),
                }
            })
        }
        _ => Ok(options.flash_tile),
    }
}

/// Generates every kernel, validates it, and assembles the artifact.
fn pack(
    graph: &kgraph::KernelGraph,
    sched: &Schedule,
    mem: &MemoryPlan,
    options: &Options,
) -> Result<Artifact, CompileError> {
    let flash_tile = flash_tile(options)?;
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut by_text: HashMap<String, u32> = HashMap::new();
    // The ops each kernel covers, as a set beside the ordered list, so that a kernel shared by
    // many dispatches is not scanned per dispatch.
    let mut ops_seen: Vec<HashSet<String>> = Vec::new();
    // per kernel: whether it runs on tensor cores (validated with those capabilities)
    let mut cooperative: Vec<bool> = Vec::new();
    let mut dispatches = Vec::new();
    let mut req = Requirements {
        max_compute_invocations_per_workgroup: codegen::WORKGROUP,
        max_compute_workgroup_size_x: codegen::WORKGROUP,
        ..Requirements::default()
    };
    for step in &sched.steps {
        let src = codegen::emit(
            &step.plan,
            mem,
            options.quad_aliases,
            flash_tile,
            options.tensor_cores,
        )?;
        for f in src.features {
            if !req.features.iter().any(|have| have == f) {
                req.features.push(f.to_string());
            }
        }
        let index = match by_text.get(&src.wgsl) {
            Some(&i) => {
                let k = &mut kernels[i as usize];
                for op in &step.ops {
                    if ops_seen[i as usize].insert(op.clone()) {
                        k.ops.push(op.clone());
                    }
                }
                for r in &step.rules {
                    if !k.rules.contains(r) {
                        k.rules.push(r.clone());
                    }
                }
                i
            }
            None => {
                let name = format!("k{}_{}", kernels.len(), step.plan.pattern());
                let i = kernels.len() as u32;
                kernels.push(Kernel {
                    name,
                    pattern: step.plan.pattern().to_string(),
                    ops: step.ops.clone(),
                    wgsl: src.wgsl.clone(),
                    subgroup_wgsl: src.subgroup_wgsl.clone(),
                    entry_point: "main".into(),
                    workgroup_size: [codegen::WORKGROUP, 1, 1],
                    arena_bindings: src.arenas.len() as u32,
                    loops_bounded: true,
                    indices_in_range: src.indices_in_range,
                    rules: step.rules.clone(),
                    param_words: src.params.len() as u32,
                });
                by_text.insert(src.wgsl.clone(), i);
                ops_seen.push(step.ops.iter().cloned().collect());
                cooperative.push(!src.features.is_empty());
                i
            }
        };
        req.max_storage_buffers_per_shader_stage = req
            .max_storage_buffers_per_shader_stage
            .max(src.arenas.len() as u32);
        req.max_compute_workgroup_storage_size = req
            .max_compute_workgroup_storage_size
            .max(src.workgroup_storage_bytes);
        req.max_compute_workgroups_per_dimension = req
            .max_compute_workgroups_per_dimension
            .max(*src.workgroups.iter().max().expect("3 dims"));
        req.max_uniform_buffer_binding_size = req
            .max_uniform_buffer_binding_size
            .max(src.params.len() as u64 * size_of::<u32>() as u64);
        dispatches.push(Dispatch {
            kernel: index,
            arenas: src.arenas,
            params: src.params,
            workgroups: src.workgroups,
            loop_iterations: src.loop_iterations,
            address_words: src.address_words,
        });
    }
    validate_all(&kernels, &cooperative)?;
    let arena_size = |bytes: u64| bytes.max(4);
    let largest = mem
        .arenas
        .iter()
        .copied()
        .map(arena_size)
        .max()
        .unwrap_or(4);
    req.max_storage_buffer_binding_size = largest;
    req.max_buffer_size = largest;

    let tensors = tensor_slots(graph, sched, mem);
    let declared: HashMap<sinter_ir::ValueId, usize> = sched
        .buffers
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match b.kind {
            BufferKind::Persistent(v) | BufferKind::Input(v) => Some((v, i)),
            BufferKind::Temp => None,
        })
        .collect();
    let assigns = sched
        .assigns
        .iter()
        .map(|(target, view)| {
            let t = mem.placements[declared[target]];
            let s = mem.placements[view.buffer.0 as usize];
            AssignCopy {
                target: graph.name_of(*target).to_string(),
                source_arena: s.arena,
                source_offset: s.offset + view.offset as u64 * WORD_BYTES,
                target_arena: t.arena,
                target_offset: t.offset,
                bytes: graph.ty(*target).size_bytes() as u64,
            }
        })
        .collect();
    let memory = MemoryReport {
        peak_bytes: mem.peak_bytes,
        lower_bound_bytes: mem.lower_bound_bytes,
        buffers: sched
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| BufferPlacement {
                label: b.label.clone(),
                arena: mem.placements[i].arena,
                offset: mem.placements[i].offset,
                size_bytes: b.ty.size_bytes() as u64,
                live: mem.live[i],
            })
            .collect(),
    };
    let artifact = Artifact {
        graph: graph.name.clone(),
        requirements: req,
        arenas: mem
            .arenas
            .iter()
            .map(|&b| ArenaLayout {
                size_bytes: arena_size(b),
            })
            .collect(),
        kernels,
        dispatches,
        tensors,
        assigns,
        updated_in_place: sched
            .updated_in_place
            .iter()
            .map(|&v| graph.name_of(v).to_string())
            .collect(),
        memory,
        optimizer: None,
        generation: None,
        blob: Vec::new(),
    };
    artifact
        .check()
        .map_err(|e| CompileError::Internal(e.to_string()))?;
    Ok(artifact)
}

/// The I/O manifest; params and states carry their initializers.
fn tensor_slots(
    graph: &kgraph::KernelGraph,
    sched: &Schedule,
    mem: &MemoryPlan,
) -> Vec<TensorSlot> {
    let mut slots = Vec::new();
    for (i, b) in sched.buffers.iter().enumerate() {
        let (value, role, init) = match b.kind {
            BufferKind::Temp => continue,
            BufferKind::Input(v) => (v, Role::Input, None),
            BufferKind::Persistent(v) => match &graph.value(v).def {
                kgraph::KDef::Param(init) => (v, Role::Param, Some(init)),
                kgraph::KDef::State(init) => (v, Role::State, Some(init)),
                _ => unreachable!("persistent buffers hold params and states"),
            },
        };
        let ty = graph.ty(value).clone();
        let p = mem.placements[i];
        slots.push(TensorSlot {
            name: graph.name_of(value).to_string(),
            role,
            ty,
            arena: p.arena,
            offset: p.offset,
            // the runtime evaluates initializers at load: the file does not grow with weights
            init: None,
            fill: init.cloned(),
            index_bound: sched.index_bounds.get(&value).map(|&b| b as u64),
            at_least: None,
        });
    }
    for o in &sched.outputs {
        let p = mem.placements[o.view.buffer.0 as usize];
        slots.push(TensorSlot {
            name: o.name.clone(),
            role: Role::Output,
            ty: o.ty.clone(),
            arena: p.arena,
            offset: p.offset + o.view.offset as u64 * WORD_BYTES,
            init: None,
            fill: None,
            index_bound: None,
            at_least: None,
        });
    }
    slots
}

/// Text of a kernel graph for `--dump-after optimize`: one line per kernel with the source ops
/// it covers.
pub fn describe_kernel_graph(kg: &kgraph::KernelGraph) -> String {
    let mut s = String::new();
    for (i, n) in kg.nodes.iter().enumerate() {
        let outs: Vec<&str> = n.outputs.iter().map(|&o| kg.name_of(o)).collect();
        let ins: Vec<&str> = n.inputs.iter().map(|&o| kg.name_of(o)).collect();
        let what = match &n.op {
            kgraph::KernelOp::Ir(op, _) => op.name().to_string(),
            kgraph::KernelOp::Fused(p) => format!("fused {}", p.pattern()),
            kgraph::KernelOp::Epilogue(anchor, ..) => format!("{}_epilogue", anchor.name()),
            kgraph::KernelOp::Flash(spec) => spec.pattern().to_string(),
        };
        writeln!(
            s,
            "{i}: {} = {what}({}) [{}]",
            outs.join(", "),
            ins.join(", "),
            n.sources.join("; ")
        )
        .unwrap();
    }
    s
}

/// Text of a schedule for `--dump-after schedule`.
pub fn describe_schedule(sched: &Schedule) -> String {
    let mut s = String::new();
    for (i, step) in sched.steps.iter().enumerate() {
        writeln!(
            s,
            "step {i}: {} [{}]",
            step.plan.pattern(),
            step.ops.join("; ")
        )
        .unwrap();
    }
    for o in &sched.outputs {
        writeln!(
            s,
            "output {}: {} in buffer {}",
            o.name, o.ty, o.view.buffer.0
        )
        .unwrap();
    }
    s
}

/// Text of a memory plan for `--dump-after memory`.
pub fn describe_memory(sched: &Schedule, mem: &MemoryPlan) -> String {
    let mut s = String::new();
    writeln!(
        s,
        "peak {} bytes, lower bound {} bytes ({:.3}x), {} arena(s)",
        mem.peak_bytes,
        mem.lower_bound_bytes,
        mem.peak_bytes as f64 / mem.lower_bound_bytes.max(1) as f64,
        mem.arenas.len()
    )
    .unwrap();
    for (i, b) in sched.buffers.iter().enumerate() {
        let p = mem.placements[i];
        let (first, last) = mem.live[i];
        writeln!(
            s,
            "  arena {} @ {:>10}  {:>10} B  live {first}..={last}  {}",
            p.arena,
            p.offset,
            b.ty.size_bytes(),
            b.label
        )
        .unwrap();
    }
    s
}
