//! GPU timestamp profiling on a real adapter (Mesa's lavapipe in CI), with artifacts built by
//! hand: every dispatch timed, in both timestamp modes, across several query sets, and the errors
//! of a session that cannot profile.
//!
//! Without an adapter these tests fail with the no-adapter message, and on an adapter without
//! `TIMESTAMP_QUERY` with the error that names it: every adapter sinter is tested on has
//! timestamps, where a skip could only hide a runtime that stopped asking for them.

use sinter_artifact::TensorType;
use sinter_artifact::artifact::{
    ArenaLayout, Artifact, Dispatch, Kernel, MemoryReport, Requirements, Role, TensorSlot,
};
use sinter_runtime::io::{HostTensor, TensorData};
use sinter_runtime::{
    AdapterChoice, Profile, ProfileOptions, RuntimeError, Session, TimestampMode,
};

const N: u32 = 256;

/// word 0: source, word 1: destination, word 2: n; `dst[i] = src[i] OP`.
fn unary(op: &str) -> String {
    format!(
        "struct Params {{ w: array<vec4<u32>, 1> }}
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> arena0: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i >= params.w[0].z) {{ return; }}
    arena0[params.w[0].y + i] = arena0[params.w[0].x + i] {op};
}}"
    )
}

fn kernel(name: &str, pattern: &str, wgsl: String) -> Kernel {
    Kernel {
        name: name.into(),
        pattern: pattern.into(),
        ops: vec![],
        wgsl,
        subgroup_wgsl: None,
        entry_point: "main".into(),
        workgroup_size: [64, 1, 1],
        arena_bindings: 1,
        loops_bounded: false,
        indices_in_range: false,
        rules: Vec::new(),
        param_words: 4,
    }
}

/// `y = x` then, for each `(kernel, groups)`, `y = y + 1` (kernel 0) or `y = y * 2` (kernel 1);
/// the first reads `x`.
fn chain(steps: &[(u32, u32)]) -> Artifact {
    let slot = |name: &str, role, offset| TensorSlot {
        name: name.into(),
        role,
        ty: TensorType::f32(vec![N as usize]),
        arena: 0,
        offset,
        init: None,
        fill: None,
        index_bound: None,
        at_least: None,
    };
    let mut first = true;
    Artifact {
        graph: "chain".into(),
        requirements: Requirements::default(),
        arenas: vec![ArenaLayout::words(8 * u64::from(N))],
        kernels: vec![
            kernel("inc", "elementwise", unary("+ 1.0")),
            kernel("double", "scale", unary("* 2.0")),
        ],
        dispatches: steps
            .iter()
            .map(|&(kernel, groups)| {
                let source = if first && groups > 0 { 0 } else { N };
                first &= groups == 0;
                Dispatch {
                    kernel,
                    arenas: vec![0],
                    params: vec![source, N, N, 0],
                    workgroups: [groups, 1, 1],
                    loop_iterations: 0,
                    address_words: vec![],
                }
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

/// Loads `a` with or without profiling.
fn load(a: Artifact, profiling: bool) -> Session {
    let choice = AdapterChoice {
        profiling,
        ..AdapterChoice::from_env().unwrap()
    };
    Session::load_with(a, &choice).unwrap_or_else(|e| panic!("{e}"))
}

/// Profiles `s` on `x`.
fn profile(
    s: &mut Session,
    x: &HostTensor,
    options: &ProfileOptions,
    each_run: impl FnMut(u32, &sinter_runtime::Outputs),
) -> Profile {
    s.profile_each(&[("x", x)], options, each_run)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn input() -> HostTensor {
    HostTensor::f32(vec![N as usize], (0..N).map(|i| i as f32).collect())
}

fn y(outputs: &sinter_runtime::Outputs) -> &[f32] {
    match &outputs.get("y").expect("output y").data {
        TensorData::F32(v) => v,
        other => panic!("expected f32, got {other:?}"),
    }
}

#[test]
fn times_every_dispatch_in_both_modes() {
    // y = ((x + 1) * 2) + 1.
    let mut s = load(chain(&[(0, 4), (1, 4), (0, 4)]), true);
    let x = input();
    let want: Vec<f32> = (0..N).map(|i| (i as f32 + 1.0) * 2.0 + 1.0).collect();
    for mode in [None, Some(TimestampMode::PassBoundaries)] {
        let options = ProfileOptions {
            mode,
            ..ProfileOptions::new(5)
        };
        let mut seen = Vec::new();
        let p = profile(&mut s, &x, &options, |run, out| {
            assert_eq!(y(out), want, "run {run}");
            seen.push(run);
        });
        assert_eq!(
            seen,
            vec![0, 1, 2, 3, 4],
            "each measured run is reported once"
        );
        assert_eq!(p.repeats, 5);
        assert_eq!(y(&p.outputs), want);
        if let Some(m) = mode {
            assert_eq!(p.mode, m);
        }
        let shape: Vec<(usize, usize)> = p
            .dispatches
            .iter()
            .map(|d| (d.dispatch, d.kernel))
            .collect();
        assert_eq!(shape, vec![(0, 0), (1, 1), (2, 0)]);
        let mut kernels: Vec<(&str, &str, usize)> = p
            .kernels
            .iter()
            .map(|k| (k.name.as_str(), k.pattern.as_str(), k.dispatches))
            .collect();
        kernels.sort();
        assert_eq!(
            kernels,
            vec![("double", "scale", 1), ("inc", "elementwise", 2)]
        );
        assert!(
            p.kernels
                .windows(2)
                .all(|w| w[0].median_ns >= w[1].median_ns),
            "most expensive first: {:?}",
            p.kernels
        );
        assert!(p.gpu_ns > 0.0, "{p:?}");
        for d in &p.dispatches {
            assert!(d.median_ns.is_finite() && d.median_ns >= 0.0, "{d:?}");
            assert!(d.median_ns <= p.gpu_ns, "a dispatch within the run: {p:?}");
        }
        assert!(p.busy_ns <= p.gpu_ns, "{p:?}");
        assert!(p.wall_ns.is_some_and(|w| w > 0.0), "{p:?}");
        let table = p.to_string();
        assert!(table.contains("inc") && table.contains("% run"), "{table}");
        eprintln!("{table}");
    }
}

#[test]
fn spans_several_query_sets() {
    // 2500 dispatches need 5000 timestamps; a query set holds at most 4096.
    let d = 2500u32;
    let mut s = load(chain(&vec![(0, 4); d as usize]), true);
    let x = input();
    let p = profile(&mut s, &x, &ProfileOptions::new(2), |_, _| {});
    let want: Vec<f32> = (0..N).map(|i| (i + d) as f32).collect();
    assert_eq!(y(&p.outputs), want);
    assert_eq!(p.dispatches.len(), d as usize);
    assert_eq!(p.kernels.len(), 1);
    assert_eq!(p.kernels[0].dispatches, d as usize);
    assert!(
        p.dispatches.iter().all(|t| t.median_ns <= p.gpu_ns),
        "{p:?}"
    );
    assert!(p.gpu_ns > 0.0);
}

#[test]
fn refuses_without_timestamps_asked_for_at_load() {
    let mut s = load(chain(&[(0, 4)]), false);
    let err = s.profile(&[("x", &input())], 3).unwrap_err().to_string();
    assert!(err.starts_with("cannot profile on adapter"), "{err}");
    assert!(err.contains("profiling: true"), "{err}");
    // The session still runs.
    let out = s.run(&[("x", &input())]).unwrap();
    assert_eq!(y(&out)[3], 4.0);
}

#[test]
fn refuses_zero_repeats_and_bad_inputs() {
    let mut s = load(chain(&[(0, 4)]), true);
    let err = s.profile(&[("x", &input())], 0).unwrap_err().to_string();
    assert!(err.contains("at least one repeat"), "{err}");
    let err = s.profile(&[], 3).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::MissingInput { .. } | RuntimeError::Profiling { .. }
        ),
        "{err}"
    );
}
