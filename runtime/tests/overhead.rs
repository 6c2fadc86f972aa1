//! Runtime overhead measurements, ignored by default (they print, they do not check speed):
//!
//! ```text
//! cargo test --release -p sinter-runtime --test overhead -- --ignored --nocapture
//! ```
//!
//! 1. Wall time per `Session::run` for a chain of D tiny dispatches (D = 1, 100, 1000): the
//!    submit + wait round trip, and the cost of each extra dispatch.
//! 2. The param-block binding choice, in raw wgpu on the same device: one bind group with a
//!    dynamic offset per dispatch (what the runtime does) against one bind group per dispatch.

use std::num::NonZeroU64;
use std::time::{Duration, Instant};

use sinter_artifact::TensorType;
use sinter_artifact::artifact::{
    ArenaLayout, Artifact, Dispatch, Kernel, MemoryReport, Requirements, Role, TensorSlot,
};
use sinter_runtime::io::{HostTensor, TensorData};
use sinter_runtime::{AdapterChoice, Session};

const N: u32 = 64;

/// word 0: source, word 1: destination, word 2: n; `dst[i] = src[i] + 1`.
const INC: &str = "struct Params { w: array<vec4<u32>, 1> }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> arena0: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= params.w[0].z) { return; }
    arena0[params.w[0].y + i] = arena0[params.w[0].x + i] + 1.0;
}";

/// y = x + D through D dispatches (the first reads x, the rest update y in place).
fn chain(d: u32) -> Artifact {
    let ty = || TensorType::f32(vec![N as usize]);
    let slot = |name: &str, role, offset| TensorSlot {
        name: name.into(),
        role,
        ty: ty(),
        arena: 0,
        offset,
        init: None,
        fill: None,
        index_bound: None,
        at_least: None,
    };
    Artifact {
        graph: format!("chain{d}"),
        requirements: Requirements::default(),
        arenas: vec![ArenaLayout::words(8 * u64::from(N))],
        kernels: vec![Kernel {
            name: "inc".into(),
            pattern: "elementwise".into(),
            ops: vec![],
            wgsl: INC.into(),
            subgroup_wgsl: None,
            entry_point: "main".into(),
            workgroup_size: [64, 1, 1],
            arena_bindings: 1,
            loops_bounded: false,
            indices_in_range: false,
            rules: Vec::new(),
            param_words: 4,
        }],
        dispatches: (0..d)
            .map(|k| Dispatch {
                kernel: 0,
                arenas: vec![0],
                params: vec![if k == 0 { 0 } else { N }, N, N, 0],
                workgroups: [1, 1, 1],
                loop_iterations: 0,
                address_words: vec![],
            })
            .collect(),
        tensors: vec![
            slot("x", Role::Input, 0),
            slot("y", Role::Output, 4 * u64::from(N)),
        ],
        assigns: vec![],
        updated_in_place: vec![],
        memory: MemoryReport::default(),
        optimizer: None,
        generation: None,
        blob: vec![],
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..3 {
        f();
    }
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

#[test]
#[ignore]
fn run_overhead() {
    let x = HostTensor::f32(vec![N as usize], (0..N).map(|i| i as f32).collect());
    let mut per_run = Vec::new();
    for d in [1u32, 100, 1000] {
        let t = Instant::now();
        let mut s = Session::load_with(chain(d), &AdapterChoice::default()).unwrap();
        let load = t.elapsed();
        let out = s.run(&[("x", &x)]).unwrap();
        let want: Vec<f32> = (0..N).map(|i| (i + d) as f32).collect();
        assert_eq!(out.get("y").unwrap().data, TensorData::F32(want));
        let run = time(30, || {
            s.run(&[("x", &x)]).unwrap();
        });
        println!(
            "{d:>5} dispatches: load {load:>10.2?}, run {run:>10.2?} (median of 30) on {}",
            s.report().adapter
        );
        per_run.push((d, run));
    }
    let (d0, t0) = per_run[0];
    let (d1, t1) = per_run[2];
    println!(
        "per extra dispatch: {:.2} µs",
        (t1.as_secs_f64() - t0.as_secs_f64()) * 1e6 / f64::from(d1 - d0)
    );
}

#[test]
#[ignore]
fn dynamic_offsets_against_bind_group_per_dispatch() {
    let d = 1000u32;
    let s = Session::load_with(chain(1), &AdapterChoice::default()).unwrap();
    let device = s.gpu().device();
    let queue = s.gpu().queue();
    let align = u64::from(device.limits().min_uniform_buffer_offset_alignment);
    let arena = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 8 * u64::from(N),
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let uniform = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: align * u64::from(d),
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut blocks = vec![0u32; (align / 4 * u64::from(d)) as usize];
    for k in 0..d as usize {
        let at = k * (align / 4) as usize;
        blocks[at..at + 3].copy_from_slice(&[N, N, N]);
    }
    queue.write_buffer(&uniform, 0, bytemuck::cast_slice(&blocks));
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: None,
        source: wgpu::ShaderSource::Wgsl(INC.into()),
    });
    let setup = |dynamic: bool| {
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: None,
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: dynamic,
                        min_binding_size: NonZeroU64::new(16),
                    },
                    count: None,
                },
                wgpu::BindGroupLayoutEntry {
                    binding: 1,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
            ],
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: None,
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: Some(&pl),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        (layout, pipeline)
    };
    let group = |layout: &wgpu::BindGroupLayout, offset: u64| {
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &uniform,
                        offset,
                        size: NonZeroU64::new(16),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: arena.as_entire_binding(),
                },
            ],
        })
    };
    let record = |pipeline: &wgpu::ComputePipeline, bind: &dyn Fn(&mut wgpu::ComputePass, u32)| {
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            for k in 0..d {
                bind(&mut pass, k);
                pass.dispatch_workgroups(1, 1, 1);
            }
        }
        encoder.finish()
    };
    let run = |pipeline: &wgpu::ComputePipeline, bind: &dyn Fn(&mut wgpu::ComputePass, u32)| {
        queue.submit([record(pipeline, bind)]);
        device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    };

    let (layout, pipeline) = setup(true);
    let one = group(&layout, 0);
    let dynamic = time(30, || {
        run(&pipeline, &|pass, k| {
            pass.set_bind_group(0, &one, &[k * align as u32]);
        })
    });

    let recording = time(30, || {
        drop(record(&pipeline, &|pass, k| {
            pass.set_bind_group(0, &one, &[k * align as u32]);
        }))
    });

    let (layout, pipeline) = setup(false);
    let t = Instant::now();
    let groups: Vec<_> = (0..d)
        .map(|k| group(&layout, u64::from(k) * align))
        .collect();
    let create = t.elapsed();
    let per_dispatch = time(30, || {
        run(&pipeline, &|pass, k| {
            pass.set_bind_group(0, &groups[k as usize], &[]);
        })
    });
    println!(
        "{d} dispatches on {}: dynamic offsets {dynamic:.2?} per run; bind group per dispatch \
         {per_dispatch:.2?} per run (+ {create:.2?} to create the groups); recording alone \
         (dynamic offsets) {recording:.2?}",
        s.report().adapter
    );
}
