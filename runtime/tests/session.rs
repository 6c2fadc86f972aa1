//! Session tests on a real adapter (Mesa's lavapipe in CI), with artifacts built by hand.
//!
//! Kernels follow the compiler's conventions: binding 0 is the param block
//! `struct Params { w: array<vec4<u32>, N> }` (word i is `params.w[i / 4u][i % 4u]`, offsets in
//! elements), bindings 1.. are `array<f32>` arenas, integers are stored as bit patterns.
//!
//! Without an adapter these tests fail with the no-adapter message.

use sinter_artifact::TensorType;
use sinter_artifact::artifact::{
    ArenaLayout, Artifact, AssignCopy, Dispatch, Kernel, MemoryReport, Requirements, Role,
    TensorSlot,
};
use sinter_runtime::io::{HostTensor, TensorData};
use sinter_runtime::{AdapterChoice, RuntimeError, Session};

// ---------------------------------------------------------------------------------------------
// Building artifacts

/// A kernel over one arena: `body` runs once per invocation `i < n` (n = word `n_word`).
fn elementwise(words: usize, n_word: usize, body: &str) -> String {
    format!(
        "struct Params {{ w: array<vec4<u32>, {} > }}
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> arena0: array<f32>;
fn word(i: u32) -> u32 {{ return params.w[i / 4u][i % 4u]; }}
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i >= word({n_word}u)) {{ return; }}
    {body}
}}
",
        words.div_ceil(4)
    )
}

/// `out[i] = x[i] OP y[i]`; words: x, y, out, n.
fn binary(op: &str) -> String {
    elementwise(
        4,
        3,
        &format!("arena0[word(2u) + i] = arena0[word(0u) + i] {op} arena0[word(1u) + i];"),
    )
}

fn kernel(name: &str, wgsl: String, arena_bindings: u32, loops_bounded: bool) -> Kernel {
    Kernel {
        name: name.into(),
        pattern: "elementwise".into(),
        ops: vec![],
        wgsl,
        subgroup_wgsl: None,
        entry_point: "main".into(),
        workgroup_size: [64, 1, 1],
        arena_bindings,
        loops_bounded,
        indices_in_range: false,
        rules: Vec::new(),
        param_words: 0,
    }
}

fn dispatch(kernel: u32, arenas: Vec<u32>, params: Vec<u32>, groups: u32) -> Dispatch {
    Dispatch {
        kernel,
        arenas,
        params,
        workgroups: [groups, 1, 1],
        loop_iterations: 0,
        address_words: vec![],
    }
}

/// Gives every kernel the param-block size its dispatches ship (the largest, in whole vec4s),
/// padding shorter blocks with zeros, as the compiler does.
fn seal(mut a: Artifact) -> Artifact {
    for (k, kernel) in a.kernels.iter_mut().enumerate() {
        if kernel.param_words != 0 {
            continue;
        }
        let ds = a.dispatches.iter_mut().filter(|d| d.kernel as usize == k);
        let words = ds
            .map(|d| d.params.len())
            .max()
            .unwrap_or(0)
            .div_ceil(4)
            .max(1)
            * 4;
        kernel.param_words = words as u32;
        for d in a.dispatches.iter_mut().filter(|d| d.kernel as usize == k) {
            d.params.resize(words, 0);
        }
    }
    a
}

fn slot(name: &str, role: Role, ty: TensorType, arena: u32, offset: u64) -> TensorSlot {
    TensorSlot {
        name: name.into(),
        role,
        ty,
        arena,
        offset,
        init: None,
        fill: None,
        index_bound: None,
        at_least: None,
    }
}

fn artifact(arena_bytes: &[u64]) -> Artifact {
    Artifact {
        graph: "test".into(),
        requirements: Requirements::default(),
        arenas: arena_bytes
            .iter()
            .map(|&size_bytes| ArenaLayout::words(size_bytes))
            .collect(),
        kernels: vec![],
        dispatches: vec![],
        tensors: vec![],
        assigns: vec![],
        updated_in_place: vec![],
        memory: MemoryReport::default(),
        optimizer: None,
        generation: None,
        blob: vec![],
    }
}

/// Gives `slot` an initial value appended to the blob.
fn init(a: &mut Artifact, name: &str, values: &[f32]) {
    let at = a.blob.len() as u64;
    a.blob.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    let slot = a.tensors.iter_mut().find(|t| t.name == name).unwrap();
    slot.init = Some((at, a.blob.len() as u64 - at));
}

fn assign(target: &str, from: u64, to: u64, bytes: u64) -> AssignCopy {
    AssignCopy {
        target: target.into(),
        source_arena: 0,
        source_offset: from,
        target_arena: 0,
        target_offset: to,
        bytes,
    }
}

/// `out = a * p + b` over f32[5]; `p` is a param initialised to 2.5.
/// Arena (elements): a 0..5, b 5..10, p 10, out 11..16.
fn axpy() -> Artifact {
    let mut a = artifact(&[64]);
    a.kernels.push(kernel(
        "axpy",
        elementwise(
            5,
            4,
            "arena0[word(3u) + i] = arena0[word(0u) + i] * arena0[word(2u)] + arena0[word(1u) + i];",
        ),
        1,
        false,
    ));
    a.dispatches
        .push(dispatch(0, vec![0], vec![0, 5, 10, 11, 5, 0, 0, 0], 1));
    let v5 = || TensorType::f32(vec![5]);
    a.tensors = vec![
        slot("a", Role::Input, v5(), 0, 0),
        slot("b", Role::Input, v5(), 0, 20),
        slot("p", Role::Param, TensorType::f32(vec![]), 0, 40),
        slot("out", Role::Output, v5(), 0, 44),
    ];
    init(&mut a, "p", &[2.5]);
    a
}

// ---------------------------------------------------------------------------------------------
// Loading

fn load(a: Artifact) -> Session {
    Session::load(seal(a)).unwrap_or_else(|e| panic!("{e}"))
}

fn load_error(a: Artifact) -> String {
    match Session::load(seal(a)) {
        Ok(_) => panic!("loading should fail"),
        Err(e) => e.to_string(),
    }
}

fn f32s(t: &HostTensor) -> &[f32] {
    match &t.data {
        TensorData::F32(v) => v,
        other => panic!("expected f32 data, got {other:?}"),
    }
}

fn f32_tensor(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::f32(shape.to_vec(), v.to_vec())
}

// ---------------------------------------------------------------------------------------------
// Running

#[test]
fn axpy_reads_param_and_inputs() {
    let mut s = load(axpy());
    let a = f32_tensor(&[5], &[1.0, 2.0, -3.0, 0.5, 100.0]);
    let b = f32_tensor(&[5], &[0.5, 0.0, 1.0, -1.0, 4.0]);
    let out = s.run(&[("a", &a), ("b", &b)]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(
        f32s(out.get("out").unwrap()),
        &[3.0, 5.0, -6.5, 0.25, 254.0]
    );
    // Inputs are written on every run.
    let out = s.run(&[("b", &a), ("a", &b)]).unwrap();
    assert_eq!(
        f32s(out.get("out").unwrap()),
        &[2.25, 2.0, -0.5, -2.0, 110.0]
    );
    let r = s.report();
    assert_eq!((r.pipelines, r.bind_groups, r.dispatches), (1, 1, 1));
    assert_eq!(r.unbounded_loop_kernels, 0);
}

/// A param with no value of its own (`= external`, as `sinter import` writes a model's
/// weights): a run before weights are loaded is refused, naming it; once loaded, the run
/// reads the loaded value.
#[test]
fn a_run_without_external_weights_is_refused() {
    let mut artifact = axpy();
    let p = artifact.tensors.iter_mut().find(|t| t.name == "p").unwrap();
    (p.init, p.fill) = (None, Some(sinter_artifact::Init::External));
    let mut s = load(artifact);
    let a = f32_tensor(&[5], &[1.0, 2.0, -3.0, 0.5, 100.0]);
    let b = f32_tensor(&[5], &[0.5, 0.0, 1.0, -1.0, 4.0]);
    let err = s.run(&[("a", &a), ("b", &b)]).unwrap_err();
    assert!(
        matches!(err, RuntimeError::WeightsNotLoaded { .. }),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("`p` takes its value from a weights file"),
        "{message}"
    );
    assert!(message.contains("--weights"), "{message}");
    s.load_weights(&[("p".into(), f32_tensor(&[], &[2.0]))])
        .unwrap();
    let out = s.run(&[("a", &a), ("b", &b)]).unwrap();
    assert_eq!(f32s(out.get("out").unwrap()), &[2.5, 4.0, -5.0, 0.0, 204.0]);
}

#[test]
fn chain_of_dispatches_shares_identical_kernels() {
    // t = a + b; u = t * t; out = u + a (kernel 2 has kernel 0's WGSL: one pipeline).
    // Arena (elements): a 0..4, b 4..8, t 8..12, u 12..16, out 16..20.
    let mut art = artifact(&[80]);
    art.kernels = vec![
        kernel("add", binary("+"), 1, false),
        kernel("mul", binary("*"), 1, false),
        kernel("add_again", binary("+"), 1, false),
    ];
    art.dispatches = vec![
        dispatch(0, vec![0], vec![0, 4, 8, 4], 1),
        dispatch(1, vec![0], vec![8, 8, 12, 4], 1),
        dispatch(2, vec![0], vec![12, 0, 16, 4], 1),
    ];
    let v4 = || TensorType::f32(vec![2, 2]);
    art.tensors = vec![
        slot("a", Role::Input, v4(), 0, 0),
        slot("b", Role::Input, v4(), 0, 16),
        slot("out", Role::Output, v4(), 0, 64),
        slot("t", Role::Output, v4(), 0, 32),
    ];
    let mut s = load(art);
    assert_eq!((s.report().kernels, s.report().pipelines), (3, 2));
    let a = f32_tensor(&[2, 2], &[1.0, 2.0, 3.0, -4.0]);
    let b = f32_tensor(&[2, 2], &[1.0, 0.5, -3.0, 1.0]);
    let out = s.run(&[("a", &a), ("b", &b)]).unwrap();
    let names: Vec<&str> = out.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["out", "t"], "manifest order");
    assert_eq!(f32s(out.get("t").unwrap()), &[2.0, 2.5, 0.0, -3.0]);
    assert_eq!(f32s(out.get("out").unwrap()), &[5.0, 8.25, 3.0, 5.0]);
    assert_eq!(out.get("t").unwrap().shape, [2, 2]);
}

#[test]
fn kernel_with_two_arena_bindings() {
    // Binding 1 reads, binding 2 writes (`scale` word, as f32 bits). y (arena 1) = 3 * x
    // (arena 0); then z (arena 0) = 0.5 * y (arena 1), with the arenas bound the other way.
    let wgsl = "struct Params { w: array<vec4<u32>, 1> }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> arena1: array<f32>;
@group(0) @binding(2) var<storage, read_write> arena2: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= params.w[0].w) { return; }
    arena2[params.w[0].y + i] = arena1[params.w[0].x + i] * bitcast<f32>(params.w[0].z);
}";
    let mut art = artifact(&[40, 300]);
    art.kernels = vec![kernel("scale", wgsl.into(), 2, false)];
    let n = 70u32; // more than one workgroup
    art.dispatches = vec![
        dispatch(0, vec![0, 1], vec![0, 5, 3f32.to_bits(), n], 2),
        dispatch(0, vec![1, 0], vec![5, 0, 0.5f32.to_bits(), 10], 1),
    ];
    art.tensors = vec![
        slot("x", Role::Input, TensorType::f32(vec![10]), 0, 0),
        slot("y", Role::Output, TensorType::f32(vec![70]), 1, 20),
        slot("z", Role::Output, TensorType::f32(vec![10]), 0, 0),
    ];
    // The first dispatch reads 70 elements from arena0 (10 of them real): give it the room.
    art.arenas[0].size_bytes = 280;
    let mut s = load(art);
    assert_eq!(s.report().bind_groups, 2);
    let x: Vec<f32> = (0..10).map(|i| i as f32).collect();
    let out = s.run(&[("x", &f32_tensor(&[10], &x))]).unwrap();
    let y = f32s(out.get("y").unwrap());
    assert_eq!(&y[..10], &x.iter().map(|v| v * 3.0).collect::<Vec<_>>()[..]);
    assert!(y[10..].iter().all(|&v| v == 0.0));
    let z = f32s(out.get("z").unwrap());
    assert_eq!(z, &x.iter().map(|v| v * 1.5).collect::<Vec<_>>()[..]);
}

/// State `c` counts runs: `next = c + 1; assign c = next`; outputs `next` and `c` itself.
fn counter() -> Artifact {
    let mut art = artifact(&[8]);
    art.kernels = vec![kernel(
        "inc",
        elementwise(4, 2, "arena0[word(1u) + i] = arena0[word(0u) + i] + 1.0;"),
        1,
        false,
    )];
    art.dispatches = vec![dispatch(0, vec![0], vec![0, 1, 1, 0], 1)];
    let one = || TensorType::f32(vec![1]);
    art.tensors = vec![
        slot("c", Role::State, one(), 0, 0),
        slot("next", Role::Output, one(), 0, 4),
        slot("c_seen", Role::Output, one(), 0, 0),
    ];
    art.assigns = vec![assign("c", 4, 0, 4)];
    init(&mut art, "c", &[0.0]);
    art
}

#[test]
fn assign_updates_state_across_runs() {
    let mut s = load(counter());
    for run in 1..=3 {
        let out = s.run(&[]).unwrap();
        assert_eq!(f32s(out.get("next").unwrap()), &[run as f32]);
        // An output aliasing the assigned state shows the value the run used.
        assert_eq!(f32s(out.get("c_seen").unwrap()), &[run as f32 - 1.0]);
    }
    assert_eq!(f32s(&s.read_persistent("c").unwrap()), &[3.0]);
    let out = s.run_steps(3, &[]).unwrap();
    assert_eq!(f32s(out.get("next").unwrap()), &[6.0]);
    assert_eq!(f32s(&s.read_persistent("c").unwrap()), &[6.0]);
    assert!(matches!(s.run_steps(0, &[]), Err(RuntimeError::ZeroSteps)));
}

#[test]
fn run_steps_reuploads_inputs_each_step() {
    // acc += x each step, and x's bytes are overwritten by the kernel (as a memory planner
    // reusing a dead input's space would): every step must still see the caller's x.
    let mut art = artifact(&[16]);
    art.kernels = vec![kernel(
        "acc",
        elementwise(
            4,
            2,
            "arena0[word(1u) + i] = arena0[word(1u) + i] + arena0[word(0u) + i];
    arena0[word(0u) + i] = -1000.0;",
        ),
        1,
        false,
    )];
    art.dispatches = vec![dispatch(0, vec![0], vec![0, 2, 2, 0], 1)];
    let two = || TensorType::f32(vec![2]);
    art.tensors = vec![
        slot("x", Role::Input, two(), 0, 0),
        slot("acc", Role::State, two(), 0, 8),
    ];
    let mut s = load(art);
    let x = f32_tensor(&[2], &[1.5, -2.0]);
    let out = s.run_steps(4, &[("x", &x)]).unwrap();
    assert!(out.is_empty());
    assert_eq!(f32s(&s.read_persistent("acc").unwrap()), &[6.0, -8.0]);
}

#[test]
fn overlapping_assigns_swap() {
    // assign a = b, b = a: both take effect after the run, so they swap. No kernels at all.
    let mut art = artifact(&[16]);
    let two = || TensorType::f32(vec![2]);
    art.tensors = vec![
        slot("a", Role::State, two(), 0, 0),
        slot("b", Role::State, two(), 0, 8),
    ];
    init(&mut art, "a", &[1.0, 2.0]);
    init(&mut art, "b", &[3.0, 4.0]);
    art.assigns = vec![assign("a", 8, 0, 8), assign("b", 0, 8, 8)];
    let mut s = load(art);
    assert!(s.run(&[]).unwrap().is_empty());
    let w = s.weights().unwrap();
    assert_eq!(w[0].0, "a");
    assert_eq!(f32s(&w[0].1), &[3.0, 4.0]);
    assert_eq!(f32s(&w[1].1), &[1.0, 2.0]);
}

#[test]
fn i32_bit_patterns_survive_the_arena() {
    // y = 2 * x + 1 in i32 (wrapping); z = x copied through f32 loads and stores untouched.
    let mut art = artifact(&[64]);
    art.kernels = vec![kernel(
        "affine_i32",
        elementwise(
            4,
            3,
            "arena0[word(1u) + i] = bitcast<f32>(bitcast<i32>(arena0[word(0u) + i]) * 2i + 1i);
    arena0[word(2u) + i] = arena0[word(0u) + i];",
        ),
        1,
        false,
    )];
    art.dispatches = vec![dispatch(0, vec![0], vec![0, 5, 10, 5], 1)];
    let v = || TensorType::i32(vec![5]);
    art.tensors = vec![
        slot("x", Role::Input, v(), 0, 0),
        slot("y", Role::Output, v(), 0, 20),
        slot("z", Role::Output, v(), 0, 40),
    ];
    let mut s = load(art);
    // -1 and 0x7f800001 are NaN bit patterns as f32.
    let xs = vec![-3, 1 << 30, i32::MIN / 2, -1, 0x7f80_0001];
    let x = HostTensor::i32(vec![5], xs.clone());
    let out = s.run(&[("x", &x)]).unwrap();
    let want: Vec<i32> = xs
        .iter()
        .map(|v| v.wrapping_mul(2).wrapping_add(1))
        .collect();
    assert_eq!(out.get("y").unwrap().data, TensorData::I32(want));
    assert_eq!(
        out.get("z").unwrap().data,
        TensorData::I32(xs),
        "a plain f32 load/store must copy NaN bit patterns unchanged"
    );
}

#[test]
fn loops_bounded_kernel_sums() {
    // One invocation sums n elements in a loop whose trip count comes from the param block.
    let wgsl = "struct Params { w: array<vec4<u32>, 1> }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> arena0: array<f32>;
@compute @workgroup_size(1)
fn main() {
    var acc = 0.0;
    for (var k = 0u; k < params.w[0].z; k++) {
        acc += arena0[params.w[0].x + k];
    }
    arena0[params.w[0].y] = acc;
}";
    // the same with naga's index clamping off too (`indices_in_range`)
    for in_range in [false, true] {
        let mut art = artifact(&[44]);
        art.kernels = vec![kernel("sum", wgsl.into(), 1, true)];
        art.kernels[0].workgroup_size = [1, 1, 1];
        art.kernels[0].indices_in_range = in_range;
        art.dispatches = vec![dispatch(0, vec![0], vec![0, 10, 10, 0], 1)];
        art.tensors = vec![
            slot("x", Role::Input, TensorType::f32(vec![10]), 0, 0),
            slot("sum", Role::Output, TensorType::f32(vec![]), 0, 40),
        ];
        let mut s = load(art);
        let report = s.report();
        assert_eq!(report.unbounded_loop_kernels, 1);
        assert_eq!(report.unchecked_index_kernels, usize::from(in_range));
        let x: Vec<f32> = (1..=10).map(|i| i as f32).collect();
        let out = s.run(&[("x", &f32_tensor(&[10], &x))]).unwrap();
        let sum = out.get("sum").unwrap();
        assert_eq!((sum.shape.as_slice(), f32s(sum)), (&[][..], &[55.0][..]));
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

#[test]
fn input_validation_names_the_tensor() {
    let mut s = load(axpy());
    let five = f32_tensor(&[5], &[1.0; 5]);
    let four = f32_tensor(&[4], &[1.0; 4]);
    let ints = HostTensor::i32(vec![5], vec![1; 5]);
    let malformed = HostTensor {
        shape: vec![5],
        data: TensorData::F32(vec![1.0; 4]),
    };
    #[rustfmt::skip]
    let cases: Vec<(Vec<(&str, &HostTensor)>, &str)> = vec![
        (vec![("a", &five)],                            "input `b` is missing: the graph expects f32[5]"),
        (vec![("a", &five), ("b", &five), ("zz", &five)], "`zz` is not an input of this graph; its inputs are: a, b"),
        (vec![("a", &five), ("p", &five)],              "`p` is not an input of this graph (it is a param); its inputs are: a, b"),
        (vec![("a", &ints), ("b", &five)],              "input `a` has type i32[5], but the graph expects f32[5]"),
        (vec![("a", &five), ("b", &four)],              "input `b` has type f32[4], but the graph expects f32[5]"),
        (vec![("a", &five), ("a", &five)],              "input `a` is given twice"),
        (vec![("a", &malformed), ("b", &five)],         "tensor `a` is malformed: shape [5] has 5 elements, data has 4"),
    ];
    for (inputs, want) in cases {
        let err = s.run(&inputs).unwrap_err().to_string();
        assert_eq!(err, want);
    }
    // A failed run changes nothing; the session still works.
    let out = s.run(&[("a", &five), ("b", &five)]).unwrap();
    assert_eq!(f32s(out.get("out").unwrap()), &[3.5; 5]);
}

#[test]
fn weights_round_trip_through_safetensors() {
    let mut s = load(axpy());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.safetensors");
    assert_eq!(
        s.weights().unwrap(),
        vec![("p".into(), f32_tensor(&[], &[2.5]))]
    );
    s.save_weights(&path).unwrap();

    s.load_weights(&[("p".into(), f32_tensor(&[], &[-4.0]))])
        .unwrap();
    let ones = f32_tensor(&[5], &[1.0; 5]);
    let out = s.run(&[("a", &ones), ("b", &ones)]).unwrap();
    assert_eq!(f32s(out.get("out").unwrap()), &[-3.0; 5]);

    s.load_weights_file(&path).unwrap();
    assert_eq!(f32s(&s.read_persistent("p").unwrap()), &[2.5]);
    let out = s.run(&[("a", &ones), ("b", &ones)]).unwrap();
    assert_eq!(f32s(out.get("out").unwrap()), &[3.5; 5]);

    #[rustfmt::skip]
    let cases: Vec<(Vec<(String, HostTensor)>, &str)> = vec![
        (vec![("q".into(), f32_tensor(&[], &[1.0]))],  "`q` is not a param or state of this graph"),
        (vec![("a".into(), ones.clone())],             "`a` is not a param or state of this graph (it is an input)"),
        (vec![("p".into(), f32_tensor(&[1], &[1.0]))], "weight `p` has type f32[1], but the graph expects f32[]"),
    ];
    for (weights, want) in cases {
        assert_eq!(s.load_weights(&weights).unwrap_err().to_string(), want);
    }
    assert!(matches!(
        s.read_persistent("out"),
        Err(RuntimeError::UnknownWeight {
            role: Some(Role::Output),
            ..
        })
    ));
    assert_eq!(
        f32s(&s.read_persistent("p").unwrap()),
        &[2.5],
        "failed loads change nothing"
    );
}

#[test]
fn damaged_artifact_files_are_errors() {
    // No GPU needed: these fail before an adapter is requested.
    let dir = tempfile::tempdir().unwrap();
    let bytes = seal(axpy()).to_bytes();
    let write = |name: &str, b: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, b).unwrap();
        p
    };
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let cases = [
        (
            write("short.sart", &bytes[..bytes.len() - 3]),
            "artifact is truncated",
        ),
        (
            write("tiny.sart", &bytes[..7]),
            "shorter than the 32-byte header",
        ),
        (
            write("flipped.sart", &flipped),
            "artifact is corrupted: checksum",
        ),
        (
            write("text.sart", b"graph g { }\n this is not an artifact at all"),
            "bad magic",
        ),
        (dir.path().join("missing.sart"), "cannot read artifact"),
    ];
    for (path, want) in cases {
        let err = Session::from_file(&path).unwrap_err().to_string();
        assert!(err.contains(want), "{}: {err}", path.display());
    }
}

#[test]
fn inconsistent_artifacts_are_errors() {
    let mut a = axpy();
    a.dispatches[0].kernel = 7;
    let err = Session::load(seal(a)).unwrap_err().to_string();
    assert!(err.contains("dispatch 0 names kernel 7 of 1"), "{err}");
    let mut a = axpy();
    a.tensors[1].offset = 22;
    let err = Session::load(seal(a)).unwrap_err().to_string();
    assert!(err.contains("`b` starts at byte 22"), "{err}");
}

#[test]
fn kernels_that_fail_to_build_are_named() {
    let mut broken = axpy();
    broken.kernels[0].name = "broken".into();
    broken.kernels[0].wgsl = broken.kernels[0].wgsl.replace("fn main", "fn main(");
    let err = load_error(broken);
    assert!(err.starts_with("kernel `broken` failed to build"), "{err}");

    // The shader reads 3 vec4s of params, the artifact ships 2 per dispatch.
    let mut short = axpy();
    short.kernels[0].wgsl = short.kernels[0]
        .wgsl
        .replace("array<vec4<u32>, 2 >", "array<vec4<u32>, 3>");
    let err = load_error(short);
    assert!(err.starts_with("kernel `axpy` failed to build"), "{err}");
    assert!(err.contains("min_binding_size"), "{err}");

    let mut entry = axpy();
    entry.kernels[0].entry_point = "nope".into();
    let err = load_error(entry);
    assert!(err.starts_with("kernel `axpy` failed to build"), "{err}");
}

#[test]
fn unmet_requirements_name_feature_and_limit() {
    let mut a = axpy();
    a.requirements.features = vec!["NOT_A_FEATURE".into()];
    let err = load_error(a);
    assert!(
        err.contains("NOT_A_FEATURE, which wgpu does not know"),
        "{err}"
    );

    let mut a = axpy();
    a.requirements.max_buffer_size = u64::MAX;
    let err = load_error(a);
    assert!(
        err.starts_with(&format!(
            "the artifact needs max_buffer_size >= {}",
            u64::MAX
        )),
        "{err}"
    );

    // A feature the adapter may lack (lavapipe has no cooperative matrices): refused by name
    // where it does, requested from the device where it does not.
    let mut a = axpy();
    a.requirements.features = vec!["EXPERIMENTAL_COOPERATIVE_MATRIX".into()];
    match Session::load(seal(a)) {
        Err(e) => {
            let err = e.to_string();
            assert!(
                err.contains("EXPERIMENTAL_COOPERATIVE_MATRIX, which adapter"),
                "{err}"
            );
        }
        Ok(s) => assert!(
            s.gpu()
                .device()
                .features()
                .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        ),
    }
}

#[test]
fn adapter_choice_errors() {
    let choice = AdapterChoice {
        backends: None,
        name_contains: Some("no such adapter".into()),
        ..AdapterChoice::default()
    };
    match Session::load_with(seal(axpy()), &choice) {
        Err(e @ RuntimeError::NoMatchingAdapter { .. }) => {
            assert!(e.to_string().contains("SINTER_ADAPTER=\"no such adapter\""))
        }
        other => panic!("expected NoMatchingAdapter, got {other:?}"),
    }
}

#[cfg(target_os = "linux")]
#[test]
fn no_adapter_says_how_to_get_one() {
    // Metal is never available on Linux.
    let choice = AdapterChoice {
        backends: Some(wgpu::Backends::METAL),
        name_contains: None,
        ..AdapterChoice::default()
    };
    let err = Session::load_with(seal(axpy()), &choice)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("no GPU adapter found"), "{err}");
    assert!(
        err.contains("apt-get install mesa-vulkan-drivers libvulkan1"),
        "{err}"
    );
}
