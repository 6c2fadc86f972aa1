//! A loaded artifact on a device, and running it.
//!
//! Loading builds everything once: arena buffers (with the initial values of params and states),
//! one uniform buffer holding every dispatch's param block, one pipeline per distinct kernel, and
//! the bind groups. A run then is: validate and upload the inputs, record every dispatch into one
//! compute pass of one command encoder, copy the outputs into one readback buffer, apply the
//! `assign` copies, submit once, map and read the outputs. Params and states stay on the GPU.
//!
//! ## Param blocks: dynamic offsets
//! Binding 0 of every kernel is its param block, bound with a *dynamic offset* into the one
//! uniform buffer. So a bind group is needed per distinct (block size, arenas bound), not per
//! dispatch: a training step of thousands of dispatches over one arena has a handful of bind
//! groups instead of thousands, and `set_bind_group` is issued per dispatch either way. The
//! layout's `min_binding_size` is the kernel's block size, so a shader whose `Params` struct is
//! larger than the words the artifact ships fails when its pipeline is built, naming the kernel,
//! rather than reading the next dispatch's words.
//!
//! ## Outputs before assigns
//! Outputs are copied out before the `assign` copies: an assignment takes effect *after* the run,
//! so an output that is (or aliases) an assigned param reads the value the run computed with.

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU64;

use sinter_artifact::Init;
use sinter_artifact::artifact::COPY_ALIGN;
use sinter_artifact::artifact::{Artifact, Role, TensorSlot, WORD_BYTES};

use crate::device::{AdapterChoice, Gpu, declared_limits};
use crate::error::RuntimeError;
use crate::io::{HostTensor, TensorData};
use crate::plan::{self, MAX_UNIFORM_ALIGN, Packing, Plan, buffer_size};
use crate::profile::{Timer, TimestampMode};
use crate::readback::{read_buffer, wait_idle};

/// The named outputs of a run, in manifest order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs {
    pub(crate) tensors: Vec<(String, HostTensor)>,
}

impl Outputs {
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &HostTensor)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t))
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    pub fn into_vec(self) -> Vec<(String, HostTensor)> {
        self.tensors
    }
}

impl IntoIterator for Outputs {
    type Item = (String, HostTensor);
    type IntoIter = std::vec::IntoIter<(String, HostTensor)>;

    fn into_iter(self) -> Self::IntoIter {
        self.tensors.into_iter()
    }
}

/// What loading built (for `sinter run --verbose`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadReport {
    /// The adapter, as [`crate::describe_adapter`] writes it.
    pub adapter: String,
    pub kernels: usize,
    /// Pipelines built: kernels with identical WGSL share one; kernels never dispatched get none.
    pub pipelines: usize,
    pub bind_group_layouts: usize,
    pub bind_groups: usize,
    /// Dispatches recorded per run (those with zero workgroups are skipped).
    pub dispatches: usize,
    pub arena_bytes: u64,
    pub uniform_bytes: u64,
    /// Kernels built with wgpu's loop bounding off (`loops_bounded`).
    pub unbounded_loop_kernels: usize,
    /// Pipelines built without naga's index clamping (`indices_in_range`).
    pub unchecked_index_kernels: usize,
    /// Kernels that run their subgroup form (`Kernel::subgroup_wgsl`).
    pub subgroup_kernels: usize,
}

/// One recorded dispatch.
#[derive(Debug)]
pub(crate) struct Step {
    /// Index into `Artifact::dispatches` (dispatches with zero workgroups have no step).
    pub(crate) dispatch: usize,
    pub(crate) kernel: usize,
    pipeline: usize,
    bind_group: usize,
    param_offset: u32,
    workgroups: [u32; 3],
}

/// A loaded artifact, ready to run.
#[derive(Debug)]
pub struct Session {
    pub(crate) gpu: Gpu,
    /// The manifest (its blob is dropped once uploaded).
    pub(crate) artifact: Artifact,
    pub(crate) plan: Plan,
    arenas: Vec<wgpu::Buffer>,
    pub(crate) steps: Vec<Step>,
    pipelines: Vec<wgpu::ComputePipeline>,
    bind_groups: Vec<wgpu::BindGroup>,
    /// Inputs are uploaded here and copied into the arena at the start of every step (the
    /// memory planner may reuse an input's bytes once it is dead).
    pub(crate) upload: Option<wgpu::Buffer>,
    pub(crate) readback: Option<wgpu::Buffer>,
    /// For assigns whose sources overlap their targets.
    scratch: Option<wgpu::Buffer>,
    report: LoadReport,
    /// Params and states with no value of their own (`= external`) that no weights have given
    /// yet: a run refuses to start while any is left.
    unloaded: Vec<String>,
}

/// Bind group layout key: (arena bindings, param block bytes).
type LayoutKey = (u32, u64);

impl Session {
    /// Picks an adapter as `choice` says, creates a device with what the artifact needs, and
    /// builds buffers, pipelines and bind groups.
    pub async fn load_async(
        artifact: Artifact,
        choice: &AdapterChoice,
    ) -> Result<Session, RuntimeError> {
        let mut sessions = Session::load_sharing_async(vec![artifact], choice).await?;
        Ok(sessions.remove(0))
    }

    /// Loads several artifacts on one device over one set of arenas, each as its own session:
    /// programs that share their params and states (a generation artifact's prefill and step,
    /// see [`crate::generate`]). Every artifact must hold the params and states of the first at
    /// the same places; the first one's slots give the initial values, the others give none.
    /// The arenas are as large as the largest artifact needs; runs of the sessions must not
    /// overlap (they do not: one queue runs submissions in order).
    pub async fn load_sharing_async(
        mut artifacts: Vec<Artifact>,
        choice: &AdapterChoice,
    ) -> Result<Vec<Session>, RuntimeError> {
        let Some(first) = artifacts.first() else {
            return Ok(Vec::new());
        };
        let places = persistent_places(first);
        for a in &artifacts {
            a.check()?;
            plan::check(a)?;
            if persistent_places(a) != places {
                return Err(RuntimeError::SharedPlaces {
                    graph: a.graph.clone(),
                    with: first.graph.clone(),
                });
            }
        }
        let mut requirements = first.requirements.clone();
        let mut limits = Vec::new();
        for a in &artifacts {
            for f in &a.requirements.features {
                if !requirements.features.contains(f) {
                    requirements.features.push(f.clone());
                }
            }
            limits.extend(declared_limits(&a.requirements));
            limits.extend(Plan::new(a, MAX_UNIFORM_ALIGN).limits(a));
        }
        let wants_subgroups =
            (artifacts.iter().flat_map(|a| &a.kernels)).any(|k| k.subgroup_wgsl.is_some());
        let gpu = Gpu::request(choice, &requirements, &limits, wants_subgroups).await?;
        for a in &artifacts {
            check_on_device(&gpu, a)?;
        }
        let mut sizes: Vec<u64> = Vec::new();
        for a in &artifacts {
            for (i, arena) in a.arenas.iter().enumerate() {
                match sizes.get_mut(i) {
                    Some(s) => *s = (*s).max(arena.size_bytes),
                    None => sizes.push(arena.size_bytes),
                }
            }
        }
        let (arenas, err) = gpu
            .capture(|| {
                let copy = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
                let poison = gpu.poison_arenas;
                let arenas: Vec<_> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &size)| {
                        let arena = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some(&format!("arena{i}")),
                            size: buffer_size(size),
                            usage: wgpu::BufferUsages::STORAGE | copy,
                            mapped_at_creation: false,
                        });
                        if poison {
                            let words = (buffer_size(size) / WORD_BYTES) as usize;
                            let nan = f32::NAN.to_bits().to_le_bytes();
                            gpu.queue.write_buffer(&arena, 0, &nan.repeat(words));
                        }
                        arena
                    })
                    .collect();
                for a in &artifacts {
                    for t in &a.tensors {
                        let arena = &arenas[t.arena as usize];
                        if let Some((off, len)) = t.init.filter(|&(_, len)| len > 0) {
                            let bytes = &a.blob[off as usize..(off + len) as usize];
                            gpu.queue.write_buffer(arena, t.offset, &padded(bytes));
                        }
                        // buffers start zeroed (unless poisoned), so a zeros initializer
                        // costs nothing
                        if let Some(fill) = t.fill.as_ref().filter(|f| poison || **f != Init::Zeros)
                            && t.size_bytes() > 0
                        {
                            let bytes = sinter_artifact::init::initial_bytes(&t.ty, fill);
                            gpu.queue.write_buffer(arena, t.offset, &padded(&bytes));
                        }
                    }
                }
                arenas
            })
            .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "creating buffers",
                message,
            });
        }
        let mut sessions = Vec::with_capacity(artifacts.len());
        for mut a in artifacts.drain(..) {
            a.blob = Vec::new();
            sessions.push(Session::build(gpu.clone(), arenas.clone(), a).await?);
        }
        Ok(sessions)
    }

    /// The rest of loading, over a device and arenas made (and initialized) already: the param
    /// blocks, the input, output and assign buffers, the pipelines and the bind groups.
    async fn build(
        gpu: Gpu,
        arenas: Vec<wgpu::Buffer>,
        artifact: Artifact,
    ) -> Result<Session, RuntimeError> {
        let align = u64::from(gpu.device.limits().min_uniform_buffer_offset_alignment);
        let plan = Plan::new(&artifact, align);
        let device = &gpu.device;
        let (buffers, err) = gpu
            .capture(|| {
                let buffer = |label: &str, bytes: u64, usage| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some(label),
                        size: buffer_size(bytes),
                        usage,
                        mapped_at_creation: false,
                    })
                };
                let copy = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
                let params = buffer(
                    "param blocks",
                    plan.uniform.len() as u64,
                    wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                );
                gpu.queue.write_buffer(&params, 0, &plan.uniform);
                let some = |n: u64| n > 0;
                let upload =
                    some(plan.inputs.bytes).then(|| buffer("inputs", plan.inputs.bytes, copy));
                let readback = some(plan.outputs.bytes).then(|| {
                    buffer(
                        "outputs",
                        plan.outputs.bytes,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    )
                });
                let scratch = (plan.stage_assigns && some(plan.assign_bytes))
                    .then(|| buffer("assign scratch", plan.assign_bytes, copy));
                (params, upload, readback, scratch)
            })
            .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "creating buffers",
                message,
            });
        }
        let (params, upload, readback, scratch) = buffers;

        // Layouts and pipelines, each kernel in its own error scope so failures name it.
        let mut layouts: Vec<(wgpu::BindGroupLayout, wgpu::PipelineLayout)> = Vec::new();
        let mut layout_of: HashMap<LayoutKey, usize> = HashMap::new();
        // (kernel, layout) of each distinct pipeline, created together below
        let mut jobs: Vec<(usize, usize)> = Vec::new();
        // (source, entry, loops bounded, indices unchecked, layout)
        let mut pipeline_of: HashMap<(&str, &str, bool, bool, usize), usize> = HashMap::new();
        let mut kernel_pipeline = vec![usize::MAX; artifact.kernels.len()];
        let (mut unbounded, mut unchecked) = (0, 0);
        for (k, kernel) in artifact.kernels.iter().enumerate() {
            let block = plan.block_bytes[k];
            if block == 0 {
                continue; // never dispatched
            }
            let key = (kernel.arena_bindings, block);
            let layout = *layout_of.entry(key).or_insert_with(|| {
                layouts.push(create_layout(device, key));
                layouts.len() - 1
            });
            let unchecked_here = unchecked_indices(&gpu, kernel);
            let pkey = (
                kernel.source(gpu.subgroups),
                kernel.entry_point.as_str(),
                kernel.loops_bounded,
                unchecked_here,
                layout,
            );
            if let Some(&p) = pipeline_of.get(&pkey) {
                kernel_pipeline[k] = p;
                continue;
            }
            unbounded += usize::from(kernel.loops_bounded);
            unchecked += usize::from(unchecked_here);
            jobs.push((k, layout));
            pipeline_of.insert(pkey, jobs.len() - 1);
            kernel_pipeline[k] = jobs.len() - 1;
        }
        let jobs: Vec<(&sinter_artifact::artifact::Kernel, &wgpu::PipelineLayout)> = jobs
            .iter()
            .map(|&(k, layout)| (&artifact.kernels[k], &layouts[layout].1))
            .collect();
        let mut pipelines = Vec::with_capacity(jobs.len());
        for ((kernel, _), (pipeline, err)) in jobs.iter().zip(create_pipelines(&gpu, &jobs).await) {
            if let Some(message) = err {
                return Err(RuntimeError::Shader {
                    kernel: kernel.name.clone(),
                    message,
                });
            }
            pipelines.push(pipeline);
        }

        let ((bind_groups, steps), err) = gpu
            .capture(|| {
                let mut bind_groups = Vec::new();
                let mut group_of: HashMap<(usize, &[u32]), usize> = HashMap::new();
                let mut steps = Vec::new();
                let dispatches = artifact.dispatches.iter().zip(&plan.param_offsets);
                for (index, (d, &offset)) in dispatches.enumerate() {
                    if d.workgroups.contains(&0) {
                        continue;
                    }
                    let k = d.kernel as usize;
                    let block = plan.block_bytes[k];
                    let layout = layout_of[&(artifact.kernels[k].arena_bindings, block)];
                    let group = *group_of.entry((layout, &d.arenas)).or_insert_with(|| {
                        let mut entries = vec![wgpu::BindGroupEntry {
                            binding: 0,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &params,
                                offset: 0,
                                size: NonZeroU64::new(block),
                            }),
                        }];
                        for (i, &a) in d.arenas.iter().enumerate() {
                            entries.push(wgpu::BindGroupEntry {
                                binding: i as u32 + 1,
                                resource: arenas[a as usize].as_entire_binding(),
                            });
                        }
                        bind_groups.push(device.create_bind_group(&wgpu::BindGroupDescriptor {
                            label: None,
                            layout: &layouts[layout].0,
                            entries: &entries,
                        }));
                        bind_groups.len() - 1
                    });
                    steps.push(Step {
                        dispatch: index,
                        kernel: k,
                        pipeline: kernel_pipeline[k],
                        bind_group: group,
                        param_offset: offset as u32,
                        workgroups: d.workgroups,
                    });
                }
                (bind_groups, steps)
            })
            .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "creating bind groups",
                message,
            });
        }

        let report = LoadReport {
            adapter: gpu.describe(),
            kernels: artifact.kernels.len(),
            pipelines: pipelines.len(),
            bind_group_layouts: layouts.len(),
            bind_groups: bind_groups.len(),
            dispatches: steps.len(),
            arena_bytes: arenas.iter().map(wgpu::Buffer::size).sum(),
            uniform_bytes: params.size(),
            unbounded_loop_kernels: unbounded,
            unchecked_index_kernels: unchecked,
            subgroup_kernels: if gpu.subgroups {
                artifact
                    .kernels
                    .iter()
                    .filter(|k| k.subgroup_wgsl.is_some())
                    .count()
            } else {
                0
            },
        };
        let unloaded = (artifact.tensors.iter())
            .filter(|t| t.fill.as_ref().is_some_and(|f| f.is_external()))
            .map(|t| t.name.clone())
            .collect();
        Ok(Session {
            gpu,
            artifact,
            plan,
            arenas,
            steps,
            pipelines,
            bind_groups,
            upload,
            readback,
            scratch,
            report,
            unloaded,
        })
    }

    /// The manifest: graph name, kernels, dispatches, tensor slots (without the blob).
    pub fn artifact(&self) -> &Artifact {
        &self.artifact
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// Input slots in manifest order.
    pub fn inputs(&self) -> impl Iterator<Item = &TensorSlot> {
        self.artifact.slots(Role::Input)
    }

    /// Output slots in manifest order.
    pub fn outputs(&self) -> impl Iterator<Item = &TensorSlot> {
        self.artifact.slots(Role::Output)
    }

    /// Runs the graph once.
    pub async fn run_async(
        &mut self,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<Outputs, RuntimeError> {
        self.run_steps_async(1, inputs).await
    }

    /// Runs the graph `steps` times with the same inputs (params and states carry over from step
    /// to step); reads the outputs of the last step only.
    pub async fn run_steps_async(
        &mut self,
        steps: u32,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<Outputs, RuntimeError> {
        if steps == 0 {
            return Err(RuntimeError::ZeroSteps);
        }
        let packed = self.pack_inputs(inputs)?;
        let ((), err) =
            self.gpu
                .capture(|| {
                    if let Some(upload) = &self.upload {
                        self.gpu.queue.write_buffer(upload, 0, &packed);
                    }
                    // One submission per step bounds the memory of recorded commands for long
                    // `--steps` runs; nothing waits between them.
                    for step in 1..=steps {
                        let mut encoder = self.gpu.device.create_command_encoder(
                            &wgpu::CommandEncoderDescriptor {
                                label: Some("sinter step"),
                            },
                        );
                        self.record(&mut encoder, step == steps, None);
                        self.gpu.queue.submit([encoder.finish()]);
                    }
                })
                .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "running the graph",
                message,
            });
        }
        let bytes = self.read_outputs().await?;
        Ok(Outputs {
            tensors: self.unpack(&self.plan.outputs, &bytes)?,
        })
    }

    /// Runs the graph once and reads back only the outputs named in `read` (in manifest order),
    /// for training loops: with `read` empty the run is submitted and nothing waits for it, so
    /// steps queue up on the GPU back to back; reading the loss every k steps waits for all of
    /// them. Every name must be an output; the other outputs are computed but not copied out.
    pub async fn run_reading_async(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        read: &[&str],
    ) -> Result<Outputs, RuntimeError> {
        let packing = self.output_packing(read)?;
        let packed = self.pack_inputs(inputs)?;
        let ((), err) = self
            .gpu
            .capture(|| {
                if let Some(upload) = &self.upload {
                    self.gpu.queue.write_buffer(upload, 0, &packed);
                }
                let mut encoder =
                    self.gpu
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("sinter step"),
                        });
                self.record_reading(&mut encoder, Some(&packing), None);
                self.gpu.queue.submit([encoder.finish()]);
            })
            .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "running the graph",
                message,
            });
        }
        let bytes = match &self.readback {
            Some(buffer) if !packing.slots.is_empty() => {
                read_buffer(&self.gpu, buffer, packing.bytes).await?
            }
            _ => Vec::new(),
        };
        Ok(Outputs {
            tensors: self.unpack(&packing, &bytes)?,
        })
    }

    /// The outputs named in `read`, in manifest order, packed back to back.
    fn output_packing(&self, read: &[&str]) -> Result<Packing, RuntimeError> {
        for &name in read {
            if self.slot(name, |r| r == Role::Output).is_none() {
                return Err(RuntimeError::UnknownOutput {
                    name: name.to_string(),
                    role: self.slot(name, |_| true).map(|s| s.role),
                    outputs: self.outputs().map(|s| s.name.clone()).collect(),
                });
            }
        }
        let mut packing = Packing::default();
        for &(i, _) in &self.plan.outputs.slots {
            let t = &self.artifact.tensors[i];
            if t.role == Role::Output && read.contains(&t.name.as_str()) {
                packing.slots.push((i, packing.bytes));
                packing.bytes += t.copy_bytes();
            }
        }
        Ok(packing)
    }

    /// Waits for the submitted work and returns the bytes of every output (read back in the
    /// last submission's readback buffer); nothing when the graph has no outputs.
    pub(crate) async fn read_outputs(&self) -> Result<Vec<u8>, RuntimeError> {
        match &self.readback {
            Some(buffer) => read_buffer(&self.gpu, buffer, self.plan.outputs.bytes).await,
            None => {
                wait_idle(&self.gpu)?;
                Ok(Vec::new())
            }
        }
    }

    /// Checks the inputs against the manifest and packs them as the upload buffer holds them.
    /// Every run starts here, so this is also where a run without its weights is refused.
    pub(crate) fn pack_inputs(
        &self,
        inputs: &[(&str, &HostTensor)],
    ) -> Result<Vec<u8>, RuntimeError> {
        if !self.unloaded.is_empty() {
            return Err(RuntimeError::WeightsNotLoaded {
                names: self.unloaded.clone(),
            });
        }
        let mut given: HashMap<&str, &HostTensor> = HashMap::new();
        for &(name, t) in inputs {
            if self.slot(name, |r| r == Role::Input).is_none() {
                return Err(RuntimeError::UnknownInput {
                    name: name.to_string(),
                    role: self.slot(name, |_| true).map(|s| s.role),
                    inputs: self.inputs().map(|s| s.name.clone()).collect(),
                });
            }
            if given.insert(name, t).is_some() {
                return Err(RuntimeError::DuplicateInput {
                    name: name.to_string(),
                });
            }
        }
        let mut packed = vec![0u8; self.plan.inputs.bytes as usize];
        for &(i, offset) in &self.plan.inputs.slots {
            let slot = &self.artifact.tensors[i];
            let Some(t) = given.get(slot.name.as_str()) else {
                return Err(RuntimeError::MissingInput {
                    name: slot.name.clone(),
                    expected: slot.ty.clone(),
                });
            };
            check_tensor(&slot.name, t)?;
            if t.ty() != slot.ty {
                return Err(RuntimeError::InputType {
                    name: slot.name.clone(),
                    expected: slot.ty.clone(),
                    actual: t.ty(),
                });
            }
            check_contract(slot, t)?;
            let bytes = le_bytes(&t.data);
            packed[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(packed)
    }

    /// Records one step: inputs into the arena, every dispatch, outputs (on the last step), then
    /// the assign copies; with a `timer`, timestamps around every dispatch, resolved at the end.
    pub(crate) fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        read_outputs: bool,
        timer: Option<&Timer>,
    ) {
        let read = read_outputs.then_some(&self.plan.outputs);
        self.record_reading(encoder, read, timer);
    }

    /// [`Session::record`], copying the output slots of `read` (if any) to the readback buffer
    /// at their packed offsets.
    fn record_reading(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        read: Option<&Packing>,
        timer: Option<&Timer>,
    ) {
        let copy = |encoder: &mut wgpu::CommandEncoder, from, from_off, to, to_off, n| {
            if n > 0 {
                encoder.copy_buffer_to_buffer(from, from_off, to, to_off, n);
            }
        };
        if let Some(upload) = &self.upload {
            for &(i, offset) in &self.plan.inputs.slots {
                let t = &self.artifact.tensors[i];
                let arena = &self.arenas[t.arena as usize];
                copy(encoder, upload, offset, arena, t.offset, t.copy_bytes());
            }
        }
        match timer {
            Some(timer) if timer.mode() == TimestampMode::PassBoundaries => {
                // One pass per dispatch, timed at its boundaries.
                for (i, s) in self.steps.iter().enumerate() {
                    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("sinter dispatch (timed)"),
                        timestamp_writes: Some(timer.pass_writes(i)),
                    });
                    let mut unset = usize::MAX;
                    self.dispatch(&mut pass, s, &mut unset);
                }
            }
            _ if self.steps.is_empty() => {}
            _ => {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("sinter dispatches"),
                    timestamp_writes: None,
                });
                let mut current = usize::MAX;
                for (i, s) in self.steps.iter().enumerate() {
                    if let Some(timer) = timer {
                        timer.write_start(&mut pass, i);
                    }
                    self.dispatch(&mut pass, s, &mut current);
                    if let Some(timer) = timer {
                        timer.write_end(&mut pass, i);
                    }
                }
            }
        }
        if let (Some(read), Some(readback)) = (read, &self.readback) {
            for &(i, offset) in &read.slots {
                let t = &self.artifact.tensors[i];
                let arena = &self.arenas[t.arena as usize];
                copy(encoder, arena, t.offset, readback, offset, t.copy_bytes());
            }
        }
        let assigns = &self.artifact.assigns;
        match &self.scratch {
            Some(scratch) => {
                let mut at = 0;
                for a in assigns {
                    let source = &self.arenas[a.source_arena as usize];
                    copy(encoder, source, a.source_offset, scratch, at, a.bytes);
                    at += a.bytes;
                }
                at = 0;
                for a in assigns {
                    let target = &self.arenas[a.target_arena as usize];
                    copy(encoder, scratch, at, target, a.target_offset, a.bytes);
                    at += a.bytes;
                }
            }
            None => {
                for a in assigns {
                    let source = &self.arenas[a.source_arena as usize];
                    let target = &self.arenas[a.target_arena as usize];
                    copy(
                        encoder,
                        source,
                        a.source_offset,
                        target,
                        a.target_offset,
                        a.bytes,
                    );
                }
            }
        }
        if let Some(timer) = timer {
            timer.resolve(encoder);
        }
    }

    /// Records one dispatch; `current` is the pipeline the pass has set (`usize::MAX`: none).
    fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>, s: &Step, current: &mut usize) {
        if s.pipeline != *current {
            pass.set_pipeline(&self.pipelines[s.pipeline]);
            *current = s.pipeline;
        }
        pass.set_bind_group(0, &self.bind_groups[s.bind_group], &[s.param_offset]);
        let [x, y, z] = s.workgroups;
        pass.dispatch_workgroups(x, y, z);
    }

    pub(crate) fn unpack(
        &self,
        packing: &Packing,
        bytes: &[u8],
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        packing
            .slots
            .iter()
            .map(|&(i, offset)| {
                let t = &self.artifact.tensors[i];
                let range = offset as usize..(offset + t.size_bytes()) as usize;
                Ok((
                    t.name.clone(),
                    HostTensor::from_le_bytes(&t.ty, &bytes[range])?,
                ))
            })
            .collect()
    }

    /// Reads tensor slots (packed as `packing` says) straight from the arenas.
    async fn read_slots(
        &self,
        packing: &Packing,
    ) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        let (buffer, err) = self
            .gpu
            .capture(|| {
                let buffer = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("weights readback"),
                    size: buffer_size(packing.bytes),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let mut encoder =
                    self.gpu
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("sinter read weights"),
                        });
                for &(i, offset) in &packing.slots {
                    let t = &self.artifact.tensors[i];
                    let n = t.copy_bytes();
                    if n > 0 {
                        let arena = &self.arenas[t.arena as usize];
                        encoder.copy_buffer_to_buffer(arena, t.offset, &buffer, offset, n);
                    }
                }
                self.gpu.queue.submit([encoder.finish()]);
                buffer
            })
            .await;
        if let Some(message) = err {
            return Err(RuntimeError::Gpu {
                during: "reading weights",
                message,
            });
        }
        let bytes = read_buffer(&self.gpu, &buffer, packing.bytes).await?;
        self.unpack(packing, &bytes)
    }

    /// The current value of one param or state.
    pub async fn read_persistent_async(&self, name: &str) -> Result<HostTensor, RuntimeError> {
        let i = self.persistent_slot(name)?;
        let packing = Packing {
            slots: vec![(i, 0)],
            bytes: self.artifact.tensors[i].copy_bytes(),
        };
        let mut read = self.read_slots(&packing).await?;
        Ok(read.remove(0).1)
    }

    /// Every param and state with its current value, in manifest order.
    pub async fn weights_async(&self) -> Result<Vec<(String, HostTensor)>, RuntimeError> {
        self.read_slots(&self.plan.persistent).await
    }

    /// Overwrites params and states by name. All are checked before any is written: an unknown
    /// name, a wrong dtype or shape is an error and changes nothing. Slots not named keep their
    /// values.
    pub fn load_weights(&mut self, weights: &[(String, HostTensor)]) -> Result<(), RuntimeError> {
        let mut writes = Vec::with_capacity(weights.len());
        for (name, t) in weights {
            let i = self.persistent_slot(name)?;
            let slot = &self.artifact.tensors[i];
            check_tensor(name, t)?;
            if t.ty() != slot.ty {
                return Err(RuntimeError::WeightType {
                    name: name.clone(),
                    expected: slot.ty.clone(),
                    actual: t.ty(),
                });
            }
            check_contract(slot, t)?;
            writes.push((slot, t));
        }
        for (slot, t) in writes {
            let bytes = le_bytes(&t.data);
            if !bytes.is_empty() {
                let arena = &self.arenas[slot.arena as usize];
                self.gpu
                    .queue
                    .write_buffer(arena, slot.offset, &padded(&bytes));
            }
        }
        self.note_loaded(weights.iter().map(|(n, _)| n.as_str()));
        match self.gpu.take_uncaptured() {
            Some(message) => Err(RuntimeError::Gpu {
                during: "loading weights",
                message,
            }),
            None => Ok(()),
        }
    }

    /// Records that the params and states `names` hold given values now (they may share their
    /// arenas with another session, which loaded them: [`Session::load_sharing_async`]).
    pub(crate) fn note_loaded<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            self.unloaded.retain(|n| n != name);
        }
    }

    /// The manifest's tensor `name` whose role `role` accepts (an output may share its name
    /// with an input, param or state).
    fn slot(&self, name: &str, role: impl Fn(Role) -> bool) -> Option<&TensorSlot> {
        self.artifact
            .tensors
            .iter()
            .find(|s| s.name == name && role(s.role))
    }

    fn persistent_slot(&self, name: &str) -> Result<usize, RuntimeError> {
        let found = self
            .artifact
            .tensors
            .iter()
            .position(|s| s.name == name && s.role != Role::Output)
            .or_else(|| self.artifact.tensors.iter().position(|s| s.name == name));
        match found.map(|i| (i, self.artifact.tensors[i].role)) {
            Some((i, Role::Param | Role::State)) => Ok(i),
            other => Err(RuntimeError::UnknownWeight {
                name: name.to_string(),
                role: other.map(|(_, r)| r),
            }),
        }
    }
}

/// The params and states of an artifact with their places, by name.
fn persistent_places(a: &Artifact) -> Vec<(&str, Role, &sinter_artifact::TensorType, u32, u64)> {
    let mut places: Vec<_> = (a.tensors.iter())
        .filter(|t| matches!(t.role, Role::Param | Role::State))
        .map(|t| (t.name.as_str(), t.role, &t.ty, t.arena, t.offset))
        .collect();
    places.sort_by(|x, y| x.0.cmp(y.0));
    places
}

/// What an artifact needs of the device beyond features and limits: no arena bound twice in a
/// browser, and no dispatch past a driver's loop cap.
fn check_on_device(gpu: &Gpu, artifact: &Artifact) -> Result<(), RuntimeError> {
    if gpu.adapter_info().backend == wgpu::Backend::BrowserWebGpu {
        check_no_aliased_arenas(artifact)?;
    }
    if let Some(limit) = gpu.loop_limit() {
        let over = artifact
            .dispatches
            .iter()
            .enumerate()
            .find(|(_, d)| d.loop_iterations > limit && !d.workgroups.contains(&0));
        if let Some((dispatch, d)) = over {
            return Err(RuntimeError::LoopLimit {
                kernel: artifact.kernels[d.kernel as usize].name.clone(),
                dispatch,
                iterations: d.loop_iterations,
                limit,
                adapter: gpu.describe(),
            });
        }
    }
    Ok(())
}

/// The contract the compiler found for a tensor (see `TensorSlot::index_bound` and
/// `TensorSlot::at_least`): indices in range, step counts at least their minimum and not NaN.
fn check_contract(slot: &TensorSlot, t: &HostTensor) -> Result<(), RuntimeError> {
    match &t.data {
        TensorData::I32(values) => {
            if let Some(bound) = slot.index_bound
                && let Some((position, &value)) =
                    (values.iter().enumerate()).find(|&(_, &v)| v < 0 || v as u64 >= bound)
            {
                return Err(RuntimeError::IndexOutOfRange {
                    name: slot.name.clone(),
                    position,
                    value,
                    bound,
                });
            }
        }
        TensorData::F32(_) | TensorData::F16(_) => {
            if let Some(minimum) = slot.at_least
                && let Some((position, value)) = (t.data.to_f64().into_iter().enumerate())
                    .find(|&(_, v)| v.is_nan() || v < minimum)
            {
                return Err(RuntimeError::BelowMinimum {
                    name: slot.name.clone(),
                    position,
                    value: value as f32,
                    minimum,
                });
            }
        }
    }
    Ok(())
}

/// A tensor whose data does not fill its shape (the fields of [`HostTensor`] are public).
fn check_tensor(name: &str, t: &HostTensor) -> Result<(), RuntimeError> {
    let expected = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if expected != Some(t.data.len()) {
        return Err(RuntimeError::MalformedTensor {
            name: name.to_string(),
            shape: t.shape.clone(),
            expected: expected.unwrap_or(usize::MAX),
            len: t.data.len(),
        });
    }
    Ok(())
}

/// `bytes` padded with zeros to a multiple of [`COPY_ALIGN`] (a write's size must be one; the
/// padding lands in the tensor's own last word: `TensorSlot::copy_bytes`).
fn padded(bytes: &[u8]) -> Cow<'_, [u8]> {
    if bytes.len().is_multiple_of(COPY_ALIGN as usize) {
        Cow::Borrowed(bytes)
    } else {
        let mut v = bytes.to_vec();
        v.resize(bytes.len().next_multiple_of(COPY_ALIGN as usize), 0);
        Cow::Owned(v)
    }
}

/// The elements as little-endian bytes, without a copy on little-endian hosts.
fn le_bytes(data: &TensorData) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        match data {
            TensorData::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::I32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            TensorData::F16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
        }
    } else {
        Cow::Owned(match data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    }
}

fn create_layout(
    device: &wgpu::Device,
    (arena_bindings, block): LayoutKey,
) -> (wgpu::BindGroupLayout, wgpu::PipelineLayout) {
    let storage = |binding| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only: false },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let mut entries = vec![wgpu::BindGroupLayoutEntry {
        binding: 0,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Uniform,
            has_dynamic_offset: true,
            min_binding_size: NonZeroU64::new(block),
        },
        count: None,
    }];
    entries.extend((1..=arena_bindings).map(storage));
    let label = format!("{arena_bindings} arenas, {block}-byte params");
    let bind = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(&label),
        entries: &entries,
    });
    let pipeline = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(&label),
        bind_group_layouts: &[Some(&bind)],
        immediate_size: 0,
    });
    (bind, pipeline)
}

/// WebGPU in a browser refuses a dispatch that binds one buffer twice when either binding is
/// writable (native wgpu allows it): artifacts whose matmuls read an arena through a second
/// `vec4` binding need `sinter compile --browser` there.
fn check_no_aliased_arenas(artifact: &Artifact) -> Result<(), RuntimeError> {
    for d in &artifact.dispatches {
        let twice = d
            .arenas
            .iter()
            .enumerate()
            .find(|&(i, a)| d.arenas[..i].contains(a));
        if let Some((_, &arena)) = twice {
            let kernel = artifact.kernels.get(d.kernel as usize);
            return Err(RuntimeError::AliasedArena {
                kernel: kernel.map_or_else(|| format!("#{}", d.kernel), |k| k.name.clone()),
                arena,
            });
        }
    }
    Ok(())
}

/// Creates the pipelines of `jobs`, each with the error it raised. Natively on several threads
/// (drivers compile shaders in parallel, and wgpu's error scopes are per thread); in a browser
/// one after the other.
async fn create_pipelines(
    gpu: &Gpu,
    jobs: &[(&sinter_artifact::artifact::Kernel, &wgpu::PipelineLayout)],
) -> Vec<(wgpu::ComputePipeline, Option<String>)> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
        if threads > 1 && jobs.len() > 1 {
            let per = jobs.len().div_ceil(threads);
            return std::thread::scope(|scope| {
                let handles: Vec<_> = jobs
                    .chunks(per)
                    .map(|part| {
                        scope.spawn(move || {
                            part.iter()
                                .map(|&(kernel, layout)| {
                                    pollster::block_on(create_one(gpu, kernel, layout))
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| match h.join() {
                        Ok(done) => done,
                        Err(panic) => std::panic::resume_unwind(panic),
                    })
                    .collect()
            });
        }
    }
    let mut out = Vec::with_capacity(jobs.len());
    for &(kernel, layout) in jobs {
        out.push(create_one(gpu, kernel, layout).await);
    }
    out
}

async fn create_one(
    gpu: &Gpu,
    kernel: &sinter_artifact::artifact::Kernel,
    layout: &wgpu::PipelineLayout,
) -> (wgpu::ComputePipeline, Option<String>) {
    let unchecked = unchecked_indices(gpu, kernel);
    gpu.capture(|| {
        create_pipeline(
            &gpu.device,
            kernel.source(gpu.subgroups),
            kernel,
            layout,
            unchecked,
        )
    })
    .await
}

/// Whether `kernel`'s shader is built without naga's index clamping: the artifact says its
/// indices are in range (`Kernel::indices_in_range`, which needs `loops_bounded`'s trusted
/// module too) and the device was not asked to check every index (`SINTER_INDEX_CHECKS=on`).
fn unchecked_indices(gpu: &Gpu, kernel: &sinter_artifact::artifact::Kernel) -> bool {
    kernel.loops_bounded && kernel.indices_in_range && !gpu.check_all_indices
}

fn create_pipeline(
    device: &wgpu::Device,
    wgsl: &str,
    kernel: &sinter_artifact::artifact::Kernel,
    layout: &wgpu::PipelineLayout,
    unchecked_indices: bool,
) -> wgpu::ComputePipeline {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(&kernel.name),
        source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(wgsl)),
    };
    let module = if kernel.loops_bounded {
        let checks = wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            bounds_checks: !unchecked_indices,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        // SAFETY: the compiler sets `loops_bounded` only for kernels whose every loop has a trip
        // count bounded by param-block values, so no loop runs forever; and `indices_in_range`
        // (which turns naga's bounds checks off) only for kernels whose every array index and
        // storage address is in range by construction; other kernels keep the checks, so no
        // access leaves its binding. (Loading an artifact means trusting its producer, as
        // running a binary does.)
        unsafe { device.create_shader_module_trusted(desc, checks) }
    } else {
        device.create_shader_module(desc)
    };
    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(&kernel.name),
        layout: Some(layout),
        module: &module,
        entry_point: Some(&kernel.entry_point),
        compilation_options: wgpu::PipelineCompilationOptions::default(),
        cache: None,
    })
}
