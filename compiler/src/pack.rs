//! The last pass: every kernel's WGSL (validated by naga on all cores), the dispatch list, the
//! arena layout and the I/O manifest, packed into an [`Artifact`].

use std::collections::{HashMap, HashSet};

use sinter_ir::artifact::{
    ArenaLayout, Artifact, AssignCopy, BufferPlacement, Dispatch, Kernel, MemoryReport,
    Requirements, Role, TensorSlot,
};

use crate::contracts::Contracts;
use crate::kgraph::{KDef, KValueId, KernelGraph};
use crate::memory::MemoryPlan;
use crate::schedule::{BufferKind, Schedule};
use crate::{CompileError, Options, codegen, optimize};

/// The artifact's record of an optimization: the step before (the decomposed graph, one kernel
/// per primitive) and after, and the rule sets' runs.
pub(crate) fn optimizer_summary(
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
pub(crate) fn loop_warnings(artifact: &Artifact) -> Vec<String> {
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

/// Generates every kernel, validates it, and assembles the artifact; `contracts` are the index
/// and step contracts of the source graph's values, which the slots of the values that stand
/// for them carry ([`crate::kgraph::KValue::source`]).
pub(crate) fn pack(
    graph: &KernelGraph,
    sched: &Schedule,
    mem: &MemoryPlan,
    options: &Options,
    contracts: &Contracts,
) -> Result<Artifact, CompileError> {
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
        let src = codegen::emit(&step.plan, mem, &options.target)?;
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

    let tensors = tensor_slots(graph, sched, mem, contracts);
    let declared: HashMap<KValueId, usize> = sched
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
                source_offset: s.offset
                    + view.offset as u64 * mem.storage[s.arena as usize].bytes(),
                target_arena: t.arena,
                target_offset: t.offset,
                // the target's bytes as its storage holds them
                bytes: sched.buffers[declared[target]]
                    .size_bytes()
                    .next_multiple_of(sinter_ir::artifact::COPY_ALIGN),
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
                size_bytes: b.size_bytes(),
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
            .zip(&mem.storage)
            .map(|(&b, &storage)| ArenaLayout {
                size_bytes: arena_size(b),
                storage,
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

/// The I/O manifest; params and states carry their initializers, inputs, params and states
/// their contracts.
fn tensor_slots(
    graph: &KernelGraph,
    sched: &Schedule,
    mem: &MemoryPlan,
    contracts: &Contracts,
) -> Vec<TensorSlot> {
    let mut slots = Vec::new();
    for (i, b) in sched.buffers.iter().enumerate() {
        let (value, role, init) = match b.kind {
            BufferKind::Temp => continue,
            BufferKind::Input(v) => (v, Role::Input, None),
            BufferKind::Persistent(v) => match &graph.value(v).def {
                KDef::Param(init) => (v, Role::Param, Some(init)),
                KDef::State(init) => (v, Role::State, Some(init)),
                KDef::Input | KDef::Node { .. } => {
                    unreachable!("lowering gives persistent buffers to params and states only")
                }
            },
        };
        let ty = graph.ty(value).clone();
        let p = mem.placements[i];
        let contract = graph.value(value).source.and_then(|v| contracts.get(&v));
        slots.push(TensorSlot {
            name: graph.name_of(value).to_string(),
            role,
            ty,
            arena: p.arena,
            offset: p.offset,
            // the runtime evaluates initializers at load: the file does not grow with weights
            init: None,
            fill: init.cloned(),
            index_bound: contract.and_then(|c| c.index_bound),
            at_least: contract.and_then(|c| c.at_least),
        });
    }
    for o in &sched.outputs {
        let p = mem.placements[o.view.buffer.0 as usize];
        slots.push(TensorSlot {
            name: o.name.clone(),
            role: Role::Output,
            ty: o.ty.clone(),
            arena: p.arena,
            offset: p.offset + o.view.offset as u64 * mem.storage[p.arena as usize].bytes(),
            init: None,
            fill: None,
            index_bound: None,
            at_least: None,
        });
    }
    slots
}
