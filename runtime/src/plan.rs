//! What a session works out before it touches the GPU: the runtime's own checks of an artifact,
//! where each dispatch's param block lives in the uniform buffer, how inputs and outputs are
//! packed for upload and readback, and which device limits all of this needs.
//!
//! Pure functions of the artifact, so they are tested without a GPU.

use std::collections::HashSet;

use sinter_artifact::artifact::{Artifact, ArtifactError, Role, WORD_BYTES};

use crate::device::LimitNeed;

/// WebGPU caps `min_uniform_buffer_offset_alignment` at 256, so an offset aligned to 256 is
/// valid on every device; limits are derived with it before the device (and its own
/// alignment) exists.
pub(crate) const MAX_UNIFORM_ALIGN: u64 = 256;

/// Size of a buffer holding `bytes`: wgpu copies and bindings want multiples of 4, and a
/// zero-sized binding is invalid.
pub(crate) fn buffer_size(bytes: u64) -> u64 {
    bytes.saturating_add(3).max(4) & !3
}

/// Tensors packed back to back into one buffer (inputs for upload, outputs for readback).
#[derive(Debug, Default)]
pub(crate) struct Packing {
    /// (index into `Artifact::tensors`, byte offset in the packed buffer).
    pub slots: Vec<(usize, u64)>,
    pub bytes: u64,
}

impl Packing {
    fn of(artifact: &Artifact, keep: impl Fn(Role) -> bool) -> Packing {
        let mut p = Packing::default();
        for (i, t) in artifact.tensors.iter().enumerate() {
            if keep(t.role) {
                p.slots.push((i, p.bytes));
                p.bytes = p.bytes.saturating_add(t.copy_bytes());
            }
        }
        p
    }
}

#[derive(Debug)]
pub(crate) struct Plan {
    /// Bytes of the param block each kernel reads: the largest block among its dispatches,
    /// rounded up to 16 (the WGSL struct is an array of `vec4<u32>`); 0 for a kernel that is
    /// never dispatched.
    pub block_bytes: Vec<u64>,
    /// Byte offset of each dispatch's param block in the uniform buffer.
    pub param_offsets: Vec<u64>,
    /// Contents of the uniform buffer, every block at its offset.
    pub uniform: Vec<u8>,
    pub inputs: Packing,
    pub outputs: Packing,
    /// Params and states, for `weights()`.
    pub persistent: Packing,
    /// Assign copies go through a scratch buffer when any copies within one arena (WebGPU
    /// forbids `copy_buffer_to_buffer` from a buffer to itself) or a source overlaps a target
    /// (`a = b`, `b = a` must swap, not copy twice).
    pub stage_assigns: bool,
    pub assign_bytes: u64,
}

/// Checks the runtime needs beyond [`Artifact::check`]: copies and bindings work in 4-byte
/// units, and names address tensors.
pub(crate) fn check(a: &Artifact) -> Result<(), ArtifactError> {
    let bad = |m: String| Err(ArtifactError::Inconsistent(m));
    // An output may carry the name of an input, param or state (`output x` of an input `x`):
    // names are unique among outputs and among the rest.
    let mut names = HashSet::new();
    for t in &a.tensors {
        if !names.insert((t.role == Role::Output, t.name.as_str())) {
            return bad(format!("tensor `{}` appears twice in the manifest", t.name));
        }
        if t.offset % WORD_BYTES != 0 {
            return bad(format!(
                "tensor `{}` starts at byte {}, not a multiple of 4",
                t.name, t.offset
            ));
        }
    }
    for s in &a.assigns {
        if s.source_offset % WORD_BYTES != 0
            || s.target_offset % WORD_BYTES != 0
            || s.bytes % WORD_BYTES != 0
        {
            return bad(format!(
                "assign to `{}` copies {} bytes from byte {} to byte {}: not multiples of 4",
                s.target, s.bytes, s.source_offset, s.target_offset
            ));
        }
    }
    Ok(())
}

impl Plan {
    /// `align`: the device's `min_uniform_buffer_offset_alignment`.
    pub(crate) fn new(a: &Artifact, align: u64) -> Plan {
        let align = align.max(16);
        let mut block_bytes = vec![0u64; a.kernels.len()];
        for d in &a.dispatches {
            let bytes = (d.params.len() as u64 * size_of::<u32>() as u64)
                .div_ceil(16)
                .max(1)
                * 16;
            let b = &mut block_bytes[d.kernel as usize];
            *b = (*b).max(bytes);
        }
        let mut param_offsets = Vec::with_capacity(a.dispatches.len());
        let mut end = 0u64;
        for d in &a.dispatches {
            let offset = end.div_ceil(align) * align;
            param_offsets.push(offset);
            end = offset + block_bytes[d.kernel as usize];
        }
        let mut uniform = vec![0u8; buffer_size(end.max(16)) as usize];
        for (d, &offset) in a.dispatches.iter().zip(&param_offsets) {
            let words: &[u8] = bytemuck::cast_slice(&d.params);
            // Little-endian on every target wgpu supports, as WGSL reads it.
            uniform[offset as usize..offset as usize + words.len()].copy_from_slice(words);
        }
        let overlaps = |a0: u32, o0: u64, b0: u64, a1: u32, o1: u64, b1: u64| {
            a0 == a1 && o0 < o1.saturating_add(b1) && o1 < o0.saturating_add(b0)
        };
        let stage_assigns = a.assigns.iter().any(|s| {
            s.source_arena == s.target_arena
                || a.assigns.iter().any(|t| {
                    overlaps(
                        s.source_arena,
                        s.source_offset,
                        s.bytes,
                        t.target_arena,
                        t.target_offset,
                        t.bytes,
                    )
                })
        });
        Plan {
            block_bytes,
            param_offsets,
            uniform,
            inputs: Packing::of(a, |r| r == Role::Input),
            outputs: Packing::of(a, |r| r == Role::Output),
            persistent: Packing::of(a, |r| matches!(r, Role::Param | Role::State)),
            stage_assigns,
            assign_bytes: a
                .assigns
                .iter()
                .fold(0u64, |n, s| n.saturating_add(s.bytes)),
        }
    }

    /// Limits this plan needs from the device, on top of what the artifact declares.
    pub(crate) fn limits(&self, a: &Artifact) -> Vec<LimitNeed> {
        let dispatched = |k: usize| self.block_bytes[k] > 0;
        let kernels = || {
            a.kernels
                .iter()
                .enumerate()
                .filter(move |(i, _)| dispatched(*i))
                .map(|(_, k)| k)
        };
        let max = |it: &mut dyn Iterator<Item = u64>| it.max().unwrap_or(0);
        let arena_bytes = max(&mut a.arenas.iter().map(|x| buffer_size(x.size_bytes)));
        let buffers = [
            arena_bytes,
            self.uniform.len() as u64,
            buffer_size(self.inputs.bytes),
            buffer_size(self.outputs.bytes),
            buffer_size(self.persistent.bytes),
            buffer_size(self.assign_bytes),
        ];
        let bindings = max(&mut kernels().map(|k| u64::from(k.arena_bindings)));
        let any = u64::from(!a.dispatches.is_empty());
        let wg = |axis: usize| max(&mut kernels().map(|k| u64::from(k.workgroup_size[axis])));
        vec![
            ("max_buffer_size", buffers.into_iter().max().unwrap_or(4)),
            ("max_storage_buffer_binding_size", arena_bytes),
            ("max_storage_buffers_per_shader_stage", bindings),
            ("max_bindings_per_bind_group", bindings + any),
            ("max_uniform_buffers_per_shader_stage", any),
            ("max_dynamic_uniform_buffers_per_pipeline_layout", any),
            (
                "max_uniform_buffer_binding_size",
                max(&mut self.block_bytes.iter().copied()),
            ),
            (
                "max_compute_workgroups_per_dimension",
                max(&mut a
                    .dispatches
                    .iter()
                    .flat_map(|d| d.workgroups)
                    .map(u64::from)),
            ),
            ("max_compute_workgroup_size_x", wg(0)),
            ("max_compute_workgroup_size_y", wg(1)),
            ("max_compute_workgroup_size_z", wg(2)),
            (
                "max_compute_invocations_per_workgroup",
                max(&mut kernels().map(|k| {
                    k.workgroup_size
                        .iter()
                        .fold(1u64, |n, &s| n.saturating_mul(s.into()))
                })),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_artifact::TensorType;
    use sinter_artifact::artifact::{
        ArenaLayout, AssignCopy, Dispatch, Kernel, MemoryReport, Requirements, TensorSlot,
    };

    fn kernel(name: &str) -> Kernel {
        Kernel {
            name: name.into(),
            pattern: "elementwise".into(),
            ops: vec![],
            wgsl: String::new(),
            subgroup_wgsl: None,
            entry_point: "main".into(),
            workgroup_size: [64, 1, 1],
            arena_bindings: 1,
            loops_bounded: false,
            indices_in_range: false,
            rules: Vec::new(),
            param_words: 0,
        }
    }

    fn slot(name: &str, role: Role, offset: u64, n: usize) -> TensorSlot {
        TensorSlot {
            name: name.into(),
            role,
            ty: TensorType::f32(vec![n]),
            arena: 0,
            offset,
            init: None,
            fill: None,
            index_bound: None,
            at_least: None,
        }
    }

    fn artifact() -> Artifact {
        let dispatch = |kernel, words: usize| Dispatch {
            kernel,
            arenas: vec![0],
            params: (1..=words as u32).collect(),
            workgroups: [3, 1, 1],
            loop_iterations: 0,
            address_words: vec![],
        };
        Artifact {
            graph: "g".into(),
            requirements: Requirements::default(),
            arenas: vec![ArenaLayout::words(62)],
            kernels: vec![kernel("a"), kernel("b"), kernel("unused")],
            dispatches: vec![dispatch(0, 4), dispatch(1, 12), dispatch(0, 5)],
            tensors: vec![
                slot("x", Role::Input, 0, 2),
                slot("w", Role::Param, 8, 2),
                slot("y", Role::Output, 16, 3),
            ],
            assigns: vec![],
            updated_in_place: vec![],
            memory: MemoryReport::default(),
            optimizer: None,
            generation: None,
            blob: vec![],
        }
    }

    #[test]
    fn param_blocks_are_aligned_and_sized_per_kernel() {
        let p = Plan::new(&artifact(), 256);
        // Kernel 0 is dispatched with 4 and 5 words: its block is 8 words = 32 bytes.
        assert_eq!(p.block_bytes, vec![32, 48, 0]);
        assert_eq!(p.param_offsets, vec![0, 256, 512]);
        assert_eq!(p.uniform.len(), 512 + 32);
        assert_eq!(&p.uniform[256..260], &1u32.to_le_bytes());
        assert_eq!(&p.uniform[512 + 16..512 + 20], &5u32.to_le_bytes());
        assert_eq!(&p.uniform[512 + 20..512 + 32], &[0; 12]);
    }

    #[test]
    fn packs_inputs_outputs_and_weights() {
        let p = Plan::new(&artifact(), 256);
        assert_eq!((p.inputs.slots.clone(), p.inputs.bytes), (vec![(0, 0)], 8));
        assert_eq!(
            (p.outputs.slots.clone(), p.outputs.bytes),
            (vec![(2, 0)], 12)
        );
        assert_eq!(p.persistent.slots, vec![(1, 0)]);
    }

    #[test]
    fn derives_limits() {
        let a = artifact();
        let limits = Plan::new(&a, 256).limits(&a);
        let get = |n: &str| limits.iter().find(|(l, _)| *l == n).unwrap().1;
        assert_eq!(get("max_storage_buffer_binding_size"), 64);
        assert_eq!(get("max_uniform_buffer_binding_size"), 48);
        assert_eq!(get("max_compute_workgroups_per_dimension"), 3);
        assert_eq!(get("max_bindings_per_bind_group"), 2);
        assert_eq!(get("max_compute_invocations_per_workgroup"), 64);
        assert_eq!(get("max_buffer_size"), 544);
    }

    #[test]
    fn stages_overlapping_assigns() {
        let copy = |from, to| AssignCopy {
            target: "t".into(),
            source_arena: 0,
            source_offset: from,
            target_arena: 0,
            target_offset: to,
            bytes: 8,
        };
        let mut a = artifact();
        a.arenas.push(ArenaLayout::words(64));
        let across = |mut c: AssignCopy| {
            c.target_arena = 1;
            c
        };
        a.assigns = vec![across(copy(0, 8)), across(copy(16, 24))];
        assert!(!Plan::new(&a, 256).stage_assigns);
        a.assigns = vec![across(copy(0, 8)), copy(16, 24)];
        assert!(Plan::new(&a, 256).stage_assigns, "within one arena");
        a.assigns = vec![across(copy(0, 8)), across(copy(8, 0))];
        a.assigns[1].source_arena = 1;
        a.assigns[1].target_arena = 0;
        assert!(Plan::new(&a, 256).stage_assigns, "a swap");
    }

    #[test]
    fn rejects_unaligned_and_duplicate_slots() {
        let mut a = artifact();
        a.tensors[1].offset = 6;
        assert!(
            check(&a)
                .unwrap_err()
                .to_string()
                .contains("`w` starts at byte 6")
        );
        let mut a = artifact();
        a.tensors[1].name = "x".into();
        assert!(
            check(&a)
                .unwrap_err()
                .to_string()
                .contains("`x` appears twice")
        );
    }

    #[test]
    fn buffer_sizes_are_multiples_of_four() {
        assert_eq!(buffer_size(0), 4);
        assert_eq!(buffer_size(5), 8);
        assert_eq!(buffer_size(u64::MAX - 1), !3);
    }
}
