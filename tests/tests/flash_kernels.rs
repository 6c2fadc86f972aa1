//! The flash attention kernels on the GPU against their semantics in the interpreter
//! (`sinter_compiler::flash::eval`), each built directly as a kernel graph: the forward, the
//! dQ kernel and the dK/dV kernel, with causal, windowed and additive masks, ragged lengths,
//! head dimensions up to 256 and broadcast batch axes. The tests that run the tensor-core forms
//! are ignored unless asked for (see [`tensor_core_kernels_compile_everywhere`]).

use std::collections::HashMap;

use sinter_compiler::flash::variant::Tiling;
use sinter_compiler::flash::{FlashKind, FlashSpec, HalfResults};
use sinter_compiler::fused::{Access, Axis, Inst, Output, Program, Scalar};
use sinter_compiler::kgraph::{KDef, KNode, KValue, KValueId, KernelGraph, KernelOp, evaluate};
use sinter_ir::interp::Tensor;
use sinter_ir::{DType, Op, TensorType};
use sinter_runtime::{AdapterChoice, Session};
use sinter_tests::{Rng, random_tensor, relative_error, run_session};

/// The mask of a score function.
#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    Causal,
    /// |i − j| < w.
    Window(usize),
    /// An additive `[sq, sk]` bias operand.
    Additive,
}

/// `s = mask(scale · x)` over `[batch.., sq, sk]`; operand 0 is `x`.
fn score(batch: &[usize], sq: usize, sk: usize, scale: f32, mask: Mask) -> Program {
    let nb = batch.len();
    let mut domain = batch.to_vec();
    domain.extend([sq, sk]);
    let rank = domain.len();
    let space = |a: usize| Axis::Space(a as u8);
    let mut operands = vec![Access {
        dtype: DType::F32,
        axes: (0..rank).map(space).collect(),
    }];
    let mut insts = vec![
        Inst::Load(0),
        Inst::Const(scale.to_bits()),
        Inst::Map(Scalar::Op(Op::Mul), vec![0, 1]),
    ];
    let neg_inf = f32::NEG_INFINITY.to_bits();
    let push = |insts: &mut Vec<Inst>, i: Inst| {
        insts.push(i);
        (insts.len() - 1) as u32
    };
    let out = match mask {
        Mask::None => 2,
        Mask::Causal => {
            let i = push(&mut insts, Inst::Coord(nb as u8));
            let j = push(&mut insts, Inst::Coord(nb as u8 + 1));
            let keep = push(&mut insts, Inst::Map(Scalar::Op(Op::Le), vec![j, i]));
            let c = push(&mut insts, Inst::Const(neg_inf));
            push(
                &mut insts,
                Inst::Map(Scalar::Op(Op::Where), vec![keep, 2, c]),
            )
        }
        Mask::Window(w) => {
            let i = push(&mut insts, Inst::Coord(nb as u8));
            let j = push(&mut insts, Inst::Coord(nb as u8 + 1));
            let d = push(&mut insts, Inst::Map(Scalar::Op(Op::Sub), vec![i, j]));
            let a = push(&mut insts, Inst::Map(Scalar::Op(Op::Abs), vec![d]));
            let wc = push(&mut insts, Inst::Const((w as f32).to_bits()));
            let keep = push(&mut insts, Inst::Map(Scalar::Op(Op::Lt), vec![a, wc]));
            let c = push(&mut insts, Inst::Const(neg_inf));
            push(
                &mut insts,
                Inst::Map(Scalar::Op(Op::Where), vec![keep, 2, c]),
            )
        }
        Mask::Additive => {
            operands.push(Access {
                dtype: DType::F32,
                axes: vec![space(nb), space(nb + 1)],
            });
            let m = push(&mut insts, Inst::Load(1));
            push(&mut insts, Inst::Map(Scalar::Op(Op::Add), vec![2, m]))
        }
    };
    let p = Program {
        domain,
        reduce: Vec::new(),
        operands,
        insts,
        phases: Vec::new(),
        outputs: vec![Output {
            value: out,
            access: Access {
                dtype: DType::F32,
                axes: (0..rank).map(space).collect(),
            },
        }],
    };
    p.check().expect("a valid score program");
    p
}

/// `g = where(keep, ds, 0) · scale` (the backward of `score` for the masks that hide keys; an
/// additive mask passes `ds` through).
fn dscore(batch: &[usize], sq: usize, sk: usize, scale: f32, mask: Mask) -> Program {
    let mut p = score(batch, sq, sk, scale, mask);
    // the same structure with -inf replaced by 0 and no additive term
    for inst in p.insts.iter_mut() {
        if *inst == Inst::Const(f32::NEG_INFINITY.to_bits()) {
            *inst = Inst::Const(0f32.to_bits());
        }
    }
    if let Mask::Additive = mask {
        p.outputs[0].value = 2;
        p.operands.truncate(1);
        p.insts.truncate(3);
    }
    p.check().expect("a valid dscore program");
    p
}

#[derive(Clone)]
struct Case {
    batch: Vec<usize>,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    mask: Mask,
    /// k and v shared by every head (broadcast over batch axis 1).
    shared_kv: bool,
    /// The dtype of `q`, `k`, `v` and `dO` (`f16`: the operands autocast gives attention,
    /// which the kernels read from `f16` storage).
    operands: DType,
    /// Whether the kernel stores every result that may be `f16` in `f16`
    /// ([`FlashSpec::may_be_half`]).
    f16_results: bool,
}

impl Case {
    fn new(
        batch: Vec<usize>,
        sq: usize,
        sk: usize,
        d: usize,
        dv: usize,
        mask: Mask,
        shared_kv: bool,
    ) -> Case {
        Case {
            batch,
            sq,
            sk,
            d,
            dv,
            mask,
            shared_kv,
            operands: DType::F32,
            f16_results: false,
        }
    }

    /// The case storing its results in `f16` where they may be.
    fn with_f16_results(self) -> Case {
        Case {
            f16_results: true,
            ..self
        }
    }

    /// The case with `f16` operands.
    fn in_f16(self) -> Case {
        Case {
            operands: DType::F16,
            ..self
        }
    }
}

/// NaN and ±inf written into `q` and `k` (each `(row, column, value)` of batch entry 0), so
/// that some rows' scores hold a NaN or an infinity.
const SPECIAL: [(&str, usize, usize, f64); 5] = [
    ("q", 5, 0, f64::NAN),
    ("q", 150, 1, f64::INFINITY),
    ("q", 200, 3, f64::NEG_INFINITY),
    ("k", 250, 2, f64::NAN),
    ("k", 90, 0, f64::INFINITY),
];

fn value(kg: &mut KernelGraph, name: &str, ty: TensorType) -> KValueId {
    kg.values.push(KValue {
        name: name.to_string(),
        ty,
        def: KDef::Input,
        source: None,
    });
    KValueId((kg.values.len() - 1) as u32)
}

/// Runs the case's kernel of `kind` on the GPU and in the interpreter and compares.
fn check(case: &Case, kind: FlashKind) {
    check_with(case, kind, &sinter_compiler::Options::default());
}

/// [`check`] compiled with `options`.
fn check_with(case: &Case, kind: FlashKind, options: &sinter_compiler::Options) {
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    check_on(case, kind, options, &choice);
}

/// [`check_with`] on the adapter and with the load settings of `choice`.
fn check_on(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
) {
    check_special(case, kind, options, choice, &[]);
}

/// The kernel graph of the case's flash kernel of `kind`, one node, built directly.
fn flash_graph(case: &Case, kind: FlashKind) -> KernelGraph {
    let scale = 1.0 / (case.d as f32).sqrt();
    let f = |rows: usize, cols: usize, shared: bool| {
        let mut s = case.batch.clone();
        if shared {
            s[1] = 1;
        }
        s.extend([rows, cols]);
        TensorType::f32(s)
    };
    let operand = |rows: usize, cols: usize, shared: bool| TensorType {
        dtype: case.operands,
        ..f(rows, cols, shared)
    };
    let mut kg = KernelGraph {
        name: "flash".into(),
        ..KernelGraph::default()
    };
    let q = value(&mut kg, "q", operand(case.sq, case.d, false));
    let k = value(&mut kg, "k", operand(case.sk, case.d, case.shared_kv));
    let v = value(&mut kg, "v", operand(case.sk, case.dv, case.shared_kv));
    let mut inputs = vec![q, k, v];
    let backward = kind != FlashKind::Forward;
    if backward {
        inputs.push(value(&mut kg, "do", operand(case.sq, case.dv, false)));
        inputs.push(value(&mut kg, "lse", f(case.sq, 1, false)));
        inputs.push(value(&mut kg, "delta", f(case.sq, 1, false)));
    }
    let mut spec = FlashSpec {
        kind,
        score: score(&case.batch, case.sq, case.sk, scale, case.mask),
        dscore: backward.then(|| dscore(&case.batch, case.sq, case.sk, scale, case.mask)),
        half: HalfResults::NONE,
    };
    if case.f16_results {
        spec.half = (0..3)
            .filter(|&i| spec.may_be_half(i))
            .fold(HalfResults::NONE, HalfResults::with);
    }
    if let Mask::Additive = case.mask {
        inputs.push(value(
            &mut kg,
            "bias",
            TensorType::f32(vec![case.sq, case.sk]),
        ));
    }
    let types: Vec<TensorType> = inputs.iter().map(|&i| kg.ty(i).clone()).collect();
    let outs: Vec<KValueId> = spec
        .output_types(&types)
        .into_iter()
        .enumerate()
        .map(|(i, ty)| kg.add_value(format!("out{i}"), ty, 0, i))
        .collect();
    kg.nodes.push(KNode {
        op: KernelOp::Flash(Box::new(spec)),
        inputs,
        outputs: outs.clone(),
        sources: vec![],
        rules: vec![],
    });
    kg.outputs = outs
        .iter()
        .map(|&o| (kg.name_of(o).to_string(), o))
        .collect();

    kg
}

/// [`check_on`] with the `special` values (see [`SPECIAL`]) written into the inputs, those
/// whose row lies within their tensor.
fn check_special(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
    special: &[(&str, usize, usize, f64)],
) {
    let edit = |name: &str, t: &mut Tensor| {
        let shape = t.shape().to_vec();
        let (rows, cols) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        for &(input, row, col, x) in special {
            if input == name && row < rows && col < cols {
                t.data[row * cols + col] = x;
            }
        }
    };
    check_edited(case, kind, options, choice, &edit);
}

/// [`check_on`] with the random inputs changed by `edit` (see [`run_flash`]).
fn check_edited(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
    edit: &dyn Fn(&str, &mut Tensor),
) {
    let (want, got) = run_flash(case, kind, options, choice, edit);
    assert_close(case, kind, options, &want, &got);
}

/// The GPU's results `got` are the semantics' `want`, within what the kernel's form allows.
fn assert_close(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    want: &[(String, Tensor)],
    got: &HashMap<String, Tensor>,
) {
    // products of f16 operands (11 significant bits) on tensor cores, else f32 throughout
    let tolerance: f64 = match (options.flash.tensor_cores, kind) {
        (false, _) => 1e-4,
        (true, FlashKind::Forward) => 4e-3,
        // the score gradient P·(dP − D) subtracts two sums of f16 products
        (true, _) => 1e-2,
    };
    // an f16 result: the semantics' f64 and the kernel's f32 may round to neighbouring f16
    // numbers (one step is at most 2^-10 of the value)
    let tolerance = if case.f16_results {
        tolerance.max(2e-3)
    } else {
        tolerance
    };
    for (name, w) in want {
        let a = &got[name];
        let err = relative_error(&a.data, &w.data);
        if options.flash.tensor_cores {
            eprintln!("  tensor cores: `{name}` within {err:.2e}");
        }
        assert!(
            err < tolerance,
            "{kind:?} {:?} {}x{} d={} dv={} batch {:?} tiling {:?}: `{name}` differs by {err:e}\n got  {:?}\n want {:?}",
            case.mask,
            case.sq,
            case.sk,
            case.d,
            case.dv,
            case.batch,
            options.flash.tiling,
            &a.data[..a.data.len().min(12)],
            &w.data[..w.data.len().min(12)]
        );
    }
}

/// The semantics' outputs and the GPU's for the kernel of `kind` over `case`, compiled with
/// `options`, on random inputs (a plausible log-sum-exp `L`) that `edit` may change by name.
fn run_flash(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
    edit: &dyn Fn(&str, &mut Tensor),
) -> (Vec<(String, Tensor)>, HashMap<String, Tensor>) {
    let kg = flash_graph(case, kind);
    let mut rng = Rng::new(case.sq as u64 * 31 + case.d as u64);
    let mut feed: HashMap<String, Tensor> = HashMap::new();
    for v in &kg.values {
        if v.def == KDef::Input {
            let mut t = random_tensor(&mut rng, &v.ty, 1);
            if v.name == "lse" {
                // a plausible log-sum-exp: large enough that exp(s - L) stays below 1
                for x in t.data.iter_mut() {
                    *x = x.abs() + 2.0;
                }
            }
            edit(&v.name, &mut t);
            feed.insert(v.name.clone(), t);
        }
    }
    let want = evaluate(&kg, &feed, &HashMap::new()).expect("the semantics evaluate");
    let artifact = sinter_compiler::compile_kernel_graph(&kg, options)
        .unwrap_or_else(|e| panic!("compile: {e}"));
    let mut session = Session::load_with(artifact, choice).unwrap_or_else(|e| panic!("load: {e}"));
    let got = run_session(&mut session, &feed);
    (want.outputs.into_iter().collect(), got)
}

fn cases() -> Vec<Case> {
    let c = Case::new;
    vec![
        c(vec![1, 2], 17, 17, 16, 16, Mask::None, false),
        c(vec![2, 1], 100, 100, 64, 64, Mask::Causal, false),
        c(vec![1, 2], 129, 129, 32, 48, Mask::Window(20), false),
        c(vec![1, 1], 1, 1, 8, 8, Mask::Causal, false),
        c(vec![1, 2], 33, 70, 24, 24, Mask::Additive, false),
        c(vec![1, 3], 40, 40, 16, 16, Mask::Causal, true),
        c(vec![1, 1], 65, 65, 128, 128, Mask::Causal, false),
        // the widest head, and head widths that end inside a staged quad and a stage
        c(vec![1, 1], 20, 20, 256, 256, Mask::Causal, false),
        c(vec![1, 1], 70, 23, 200, 136, Mask::None, false),
        // whole blocks whose masks are uniform (below the diagonal, inside the band), which
        // take the score functions at the block's corner, beside blocks that do not
        c(vec![1, 2], 300, 300, 32, 32, Mask::Causal, false),
        c(vec![1, 1], 400, 390, 16, 16, Mask::Window(200), false),
        c(vec![2, 1], 260, 200, 16, 24, Mask::None, false),
    ]
}

#[test]
fn forward() {
    for case in cases() {
        check(&case, FlashKind::Forward);
    }
}

#[test]
fn backward_dq() {
    for case in cases() {
        check(&case, FlashKind::BackwardDq);
    }
}

#[test]
fn backward_dkdv() {
    for case in cases() {
        check(&case, FlashKind::BackwardDkDv);
    }
}

#[test]
fn backward_whole() {
    for case in cases() {
        check(&case, FlashKind::Backward);
    }
}

/// Every kernel on `f16` operands (`q`, `k`, `v` and `dO`, as autocast gives attention): the
/// kernels read them from `f16` storage and widen them as they load, exactly, so the results
/// are the semantics' on the same numbers, and no copy to `f32` runs first.
#[test]
fn f16_operands() {
    let options = sinter_compiler::Options::default();
    // no mask, an additive mask, shared keys and values, head widths that end inside a quad
    let cases = cases();
    for case in [0, 4, 5, 8].map(|i| cases[i].clone().in_f16()) {
        for kind in ALL_KINDS {
            let artifact =
                sinter_compiler::compile_kernel_graph(&flash_graph(&case, kind), &options)
                    .unwrap_or_else(|e| panic!("compile: {e}"));
            let patterns: Vec<&str> = artifact
                .kernels
                .iter()
                .map(|k| k.pattern.as_str())
                .collect();
            assert!(
                patterns
                    .iter()
                    .all(|p| p.starts_with("flash") || *p == "flash_dq_sum"),
                "{kind:?}: {patterns:?}"
            );
            let flash = &artifact.kernels[0];
            assert!(
                flash.wgsl.contains("array<f16>"),
                "{kind:?} reads no f16 arena"
            );
            check(&case, kind);
        }
    }
}

/// Every kernel storing its results in `f16` where they may be (`O`, dQ, dK, dV: what
/// `flash-f16-result` makes of a cast after a result), on `f16` operands.
#[test]
fn f16_results() {
    let options = sinter_compiler::Options::default();
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    let cases = cases();
    for case in [0, 4, 5, 8].map(|i| cases[i].clone().in_f16()) {
        for kind in ALL_KINDS {
            check_f16_results(&case, kind, &options, &choice);
        }
    }
}

/// Each `f16` result of the kernel of `kind` over `case` with [`Case::with_f16_results`] is
/// the `f32` kernel's rounded to `f16`, bit for bit (what makes the rule exact), and the other
/// results are the `f32` kernel's; and they are the semantics'.
fn check_f16_results(
    case: &Case,
    kind: FlashKind,
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
) {
    let half = case.clone().with_f16_results();
    let kg = flash_graph(&half, kind);
    let artifact = sinter_compiler::compile_kernel_graph(&kg, options)
        .unwrap_or_else(|e| panic!("compile: {e}"));
    assert!(
        artifact
            .kernels
            .iter()
            .any(|k| k.wgsl.contains("f16(round_f16(")),
        "{kind:?} stores no f16 result"
    );
    let (_, wide) = run_flash(case, kind, options, choice, &|_, _| {});
    let (want, narrow) = run_flash(&half, kind, options, choice, &|_, _| {});
    for (name, _) in &want {
        let (w, n) = (&wide[name], &narrow[name]);
        let is_half = (kg.values.iter())
            .any(|v| v.name == *name && v.def != KDef::Input && v.ty.dtype == DType::F16);
        for (e, (&x, &y)) in w.data.iter().zip(&n.data).enumerate() {
            let expect = if is_half { DType::F16.round(x) } else { x };
            assert!(
                expect.to_bits() == y.to_bits() || (expect.is_nan() && y.is_nan()),
                "{kind:?} `{name}`[{e}]: f32 kernel {x:e}, f16 kernel {y:e}"
            );
        }
    }
    assert_close(&half, kind, options, &want, &narrow);
}

/// The kinds of flash kernel.
const ALL_KINDS: [FlashKind; 4] = [
    FlashKind::Forward,
    FlashKind::BackwardDq,
    FlashKind::BackwardDkDv,
    FlashKind::Backward,
];

/// The kernels of every tensor-core test below compile and naga validates them, on any
/// machine; where the adapter lacks cooperative matrices (Mesa's software Vulkan, so CI),
/// loading refuses them by the feature's name.
///
/// The tests that run kernels on tensor cores need cooperative matrices: they are `#[ignore]`d,
/// so `cargo test` reports them as ignored, and `--include-ignored` runs them (each fails where
/// the adapter lacks cooperative matrices). With `SINTER_REQUIRE_TENSOR_CORES=1` (the H200 run
/// sets it) this test fails unless the adapter has cooperative matrices and the ignored tests
/// run too.
#[test]
fn tensor_core_kernels_compile_everywhere() {
    let options = tensor_core_options();
    compile_every(&tensor_core_cases(), &TENSOR_CORE_KINDS, &options);
    compile_every(&random_tensor_core_cases(), &TENSOR_CORE_KINDS, &options);
    compile_every(&rescale_cases(), &[FlashKind::Forward], &options);
    compile_every(&gradient_scale_cases(), &TENSOR_CORE_BACKWARD, &options);
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    let refused = tensor_cores_refused(&choice);
    if std::env::var("SINTER_REQUIRE_TENSOR_CORES").is_ok_and(|v| v == "1") {
        if let Some(e) = refused {
            panic!(
                "SINTER_REQUIRE_TENSOR_CORES=1, but the adapter lacks cooperative matrices: {e}"
            );
        }
        assert!(
            std::env::args().any(|a| a == "--ignored" || a == "--include-ignored"),
            "SINTER_REQUIRE_TENSOR_CORES=1: pass --include-ignored, so that the tensor-core tests run"
        );
    }
}

/// The forward, dQ and dK/dV kernels on tensor cores (`Options::tensor_cores`: f16 operands,
/// f32 accumulation) against the semantics, within what f16 operands allow (see
/// [`tensor_core_cases`]).
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn tensor_cores() {
    let choice = adapter_with_tensor_cores();
    let options = tensor_core_options();
    for case in &tensor_core_cases() {
        for kind in TENSOR_CORE_KINDS {
            eprintln!(
                "tensor cores: {kind:?} {:?} {}x{} d={} dv={}",
                case.mask, case.sq, case.sk, case.d, case.dv
            );
            check_special(case, kind, &options, &choice, &[]);
            let half = case.clone().in_f16();
            check_special(&half, kind, &options, &choice, &[]);
            check_f16_results(&half, kind, &options, &choice);
        }
    }
}

/// The tensor-core kernels' kinds (no whole backward).
const TENSOR_CORE_KINDS: [FlashKind; 3] = [
    FlashKind::Forward,
    FlashKind::BackwardDq,
    FlashKind::BackwardDkDv,
];

/// The cases of [`tensor_cores`]: every mask, ragged lengths, grouped heads, the uniform-mask
/// fast path, the forward at head dims past 64 (key and value blocks in turn, the output's
/// accumulators through `ss` in passes), and head dims the backward's forms do not take (the
/// plain kernels).
fn tensor_core_cases() -> Vec<Case> {
    let c = Case::new;
    vec![
        c(vec![1, 2], 17, 17, 16, 32, Mask::None, false),
        c(vec![2, 1], 100, 100, 64, 64, Mask::Causal, false),
        c(vec![1, 2], 129, 129, 32, 32, Mask::Window(20), false),
        c(vec![1, 1], 1, 1, 16, 32, Mask::Causal, false),
        c(vec![1, 2], 33, 70, 64, 64, Mask::Additive, false),
        c(vec![1, 3], 40, 40, 16, 32, Mask::Causal, true),
        c(vec![1, 2], 300, 300, 64, 64, Mask::Causal, false),
        c(vec![2, 1], 260, 200, 48, 64, Mask::None, false),
        // the forward's key and value blocks in turn in one array, its output through `ss` in
        // two passes; the backward in walked blocks of 32, its results in two or four passes
        // through `ss`
        c(vec![1, 1], 65, 65, 128, 128, Mask::Causal, false),
        c(vec![1, 2], 130, 150, 128, 64, Mask::Window(40), false),
        c(vec![1, 2], 70, 90, 96, 128, Mask::None, true),
        c(vec![2, 1], 100, 33, 32, 128, Mask::Additive, false),
        c(vec![1, 1], 200, 200, 128, 128, Mask::Causal, false),
        // the forward's output through `ss` in two passes with the key and value blocks side
        // by side (the backward keeps its f32 kernels: head dim 16)
        c(vec![2, 1], 50, 130, 16, 128, Mask::Causal, false),
        c(vec![1, 3], 40, 40, 32, 32, Mask::Causal, true),
        c(vec![1, 1], 1, 1, 32, 64, Mask::Causal, false),
    ]
}

/// Shapes drawn at random (seeded, so a failure names a case that comes back): ragged and
/// unequal lengths, every mask, grouped heads, head dims on and off the tensor-core forms'
/// sizes. The `f32` kernels (every kind) run everywhere on short lengths (Mesa's software
/// Vulkan takes minutes on long ones); the tensor-core forms in
/// [`random_shapes_on_tensor_cores`].
#[test]
fn random_shapes() {
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    for case in &random_cases(0x5EED_F1A5, 12, 100) {
        for kind in [
            FlashKind::Forward,
            FlashKind::BackwardDq,
            FlashKind::BackwardDkDv,
            FlashKind::Backward,
        ] {
            check_on(case, kind, &sinter_compiler::Options::default(), &choice);
        }
    }
}

/// [`random_shapes`] on tensor cores, on more and longer cases.
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn random_shapes_on_tensor_cores() {
    let choice = adapter_with_tensor_cores();
    let options = tensor_core_options();
    for case in &random_tensor_core_cases() {
        for kind in TENSOR_CORE_KINDS {
            check_special(case, kind, &options, &choice, &[]);
        }
    }
}

/// The cases of [`random_shapes_on_tensor_cores`].
fn random_tensor_core_cases() -> Vec<Case> {
    random_cases(0x7C0F_F1A5, 24, 300)
}

/// `n` cases drawn from `seed`: lengths 1 to `longest` (the keys' as long as the queries' half
/// the time), head dims that are multiples of 16 up to 128 with the tensor-core backward's 32, 64
/// and 128 drawn more often, values' 32, 64 or 128, any mask, k and v shared by the heads a
/// quarter of the time.
fn random_cases(seed: u64, n: usize, longest: usize) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut pick = |k: usize| (rng.next_u64() % k as u64) as usize;
    (0..n)
        .map(|_| {
            let batch = vec![1 + pick(2), 1 + pick(3)];
            let sq = 1 + pick(longest);
            let sk = if pick(2) == 0 { sq } else { 1 + pick(longest) };
            let d = [16, 32, 48, 64, 80, 96, 112, 128, 32, 64, 128, 64][pick(12)];
            let dv = [32, 64, 128][pick(3)];
            let mask = match pick(4) {
                0 => Mask::None,
                1 => Mask::Causal,
                2 => Mask::Window(1 + pick(60)),
                _ => Mask::Additive,
            };
            let shared_kv = pick(4) == 0;
            eprintln!(
                "random case: batch {batch:?} {sq}x{sk} d={d} dv={dv} {mask:?} shared {shared_kv}"
            );
            Case::new(batch, sq, sk, d, dv, mask, shared_kv)
        })
        .collect()
}

/// The tensor-core forward keeps its output in cooperative accumulators and moves the
/// reference of a row's probabilities only where a block's maximum passes it by a margin,
/// rescaling the accumulators then. An additive bias of ±0.2 per key (rising along the keys in
/// even rows, falling in odd ones) makes the scores of half the rows climb by about 13 from one
/// block to the next, past the margin, so the rescaling runs at every block beside rows that
/// never need it; the results must still meet the semantics. (The bias enters the scores in
/// `f32`, so the products' `f16` operands stay near 1.)
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn tensor_cores_rescale_the_forward() {
    let choice = adapter_with_tensor_cores();
    let options = tensor_core_options();
    let climb = |name: &str, t: &mut Tensor| {
        if name == "bias" {
            let cols = t.shape()[t.shape().len() - 1];
            for (e, x) in t.data.iter_mut().enumerate() {
                let (i, j) = (e / cols, e % cols);
                *x = if i % 2 == 0 { 0.2 } else { -0.2 } * j as f64;
            }
        }
    };
    for case in &rescale_cases() {
        check_edited(case, FlashKind::Forward, &options, &choice, &climb);
    }
}

/// The cases of [`tensor_cores_rescale_the_forward`].
fn rescale_cases() -> Vec<Case> {
    let c = Case::new;
    vec![
        c(vec![1, 2], 300, 300, 64, 64, Mask::Additive, false),
        c(vec![1, 1], 200, 260, 128, 128, Mask::Additive, false),
        c(vec![2, 1], 150, 190, 32, 32, Mask::Additive, true),
    ]
}

/// The tensor-core backward stages `dO` as `f16` scaled by a power of two per batch entry
/// (`FlashScale`): a mean loss's gradients, around 1e-6, would otherwise be subnormal or zero
/// in `f16`, and gradients around 3e4 would overflow it in the score gradient. Each head gets
/// its own magnitude (its `dO` and `D`), and each head's results must come out within the
/// tensor cores' tolerance of its own largest result: in an error over the whole tensor a head
/// at 1e-6 would hide behind one at 3e4.
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn tensor_cores_scale_the_gradients() {
    let choice = adapter_with_tensor_cores();
    let options = tensor_core_options();
    let magnitudes = [1e-6, 1.0, 3e4];
    let edit = |name: &str, t: &mut Tensor| {
        if name == "do" || name == "delta" {
            let per_head = t.data.len() / magnitudes.len();
            for (chunk, m) in t.data.chunks_mut(per_head).zip(magnitudes) {
                chunk.iter_mut().for_each(|x| *x *= m);
            }
        }
    };
    for case in &gradient_scale_cases() {
        for kind in TENSOR_CORE_BACKWARD {
            let (want, got) = run_flash(case, kind, &options, &choice, &edit);
            for (name, w) in &want {
                let per_head = w.data.len() / magnitudes.len();
                let heads = got[name].data.chunks(per_head).zip(w.data.chunks(per_head));
                for ((a, w), m) in heads.zip(magnitudes) {
                    let largest = w.iter().fold(0.0f64, |l, x| l.max(x.abs()));
                    let worst = a
                        .iter()
                        .zip(w)
                        .fold(0.0f64, |e, (a, w)| e.max((a - w).abs()));
                    let err = worst / largest;
                    eprintln!(
                        "  {kind:?} d={} `{name}`, dO around {m:e}: within {err:.2e}",
                        case.d
                    );
                    assert!(
                        err < 1e-2,
                        "{kind:?} d={}: `{name}` with dO around {m:e} differs by {err:e} of its largest magnitude {largest:e}",
                        case.d
                    );
                }
            }
        }
    }
}

/// The cases of [`tensor_cores_scale_the_gradients`]: three heads each.
fn gradient_scale_cases() -> Vec<Case> {
    let c = Case::new;
    vec![
        c(vec![1, 3], 100, 90, 64, 64, Mask::Causal, false),
        c(vec![1, 3], 70, 70, 128, 128, Mask::None, false),
    ]
}

/// The tensor-core backward kernels (no whole backward).
const TENSOR_CORE_BACKWARD: [FlashKind; 2] = [FlashKind::BackwardDq, FlashKind::BackwardDkDv];

/// NaN and ±inf in `q` and `k` come out of every kernel as in the semantics: a score row
/// with a NaN gives NaN (the row's maximum, its sum, its outputs), an infinite score makes its
/// row's probabilities NaN or zero; in blocks that take the fast score path and in blocks that
/// do not.
///
/// The kernels skip the blocks that a mask hides whole, as FlashAttention does, and the
/// semantics' products do not: there a NaN key that a query never sees still reaches that
/// query's `dQ` through `0 · NaN`. So the backward kernels meet the semantics on special
/// values only where no block is skipped (no mask), or where the special values lie where
/// every query sees them (the first key, the last query).
#[test]
fn special_values() {
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    let backward = [
        FlashKind::BackwardDq,
        FlashKind::BackwardDkDv,
        FlashKind::Backward,
    ];
    let options = sinter_compiler::Options::default();
    for operands in [DType::F32, DType::F16] {
        special_values_under(&options, &choice, [16, 16, 8], 16, &backward, operands);
    }
}

/// [`special_values`] on the tensor-core forms (head dims they take; no whole backward): the
/// f16 operands keep NaN and ±inf.
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn special_values_on_tensor_cores() {
    let choice = adapter_with_tensor_cores();
    let options = tensor_core_options();
    for operands in [DType::F32, DType::F16] {
        special_values_under(
            &options,
            &choice,
            [32, 32, 32],
            32,
            &TENSOR_CORE_BACKWARD,
            operands,
        );
        // the forward's key and value blocks in turn, the backward's walked blocks of 32
        special_values_under(
            &options,
            &choice,
            [128, 128, 128],
            128,
            &TENSOR_CORE_BACKWARD,
            operands,
        );
    }
}

/// [`special_values`] compiled with `options`: the forward of three cases (head dims
/// `forward`) and the `backward` kernels (head dim `d`), on operands of `operands`.
fn special_values_under(
    options: &sinter_compiler::Options,
    choice: &AdapterChoice,
    forward: [usize; 3],
    d: usize,
    backward: &[FlashKind],
    operands: DType,
) {
    let c = |sq, sk, d, mask| Case {
        batch: vec![1, 2],
        sq,
        sk,
        d,
        dv: d,
        mask,
        shared_kv: false,
        operands,
        f16_results: false,
    };
    for case in [
        c(300, 300, forward[0], Mask::Causal),
        c(260, 280, forward[1], Mask::None),
        c(300, 270, forward[2], Mask::Window(100)),
    ] {
        check_special(&case, FlashKind::Forward, options, choice, &SPECIAL);
    }
    for &kind in backward {
        check_special(&c(260, 280, d, Mask::None), kind, options, choice, &SPECIAL);
        let seen_by_all = [
            ("q", 299, 0, f64::NAN),
            ("q", 299, 1, f64::INFINITY),
            ("k", 0, 2, f64::NAN),
            ("k", 0, 3, f64::NEG_INFINITY),
        ];
        let causal = c(300, 300, d, Mask::Causal);
        check_special(&causal, kind, options, choice, &seen_by_all);
    }
}

/// Compiles the kernel of every kind in `kinds` over every case with `options`: each passes
/// naga's validation, on any machine.
fn compile_every(cases: &[Case], kinds: &[FlashKind], options: &sinter_compiler::Options) {
    for case in cases {
        for &kind in kinds {
            sinter_compiler::compile_kernel_graph(&flash_graph(case, kind), options)
                .unwrap_or_else(|e| panic!("compile {kind:?} d={} dv={}: {e}", case.d, case.dv));
        }
    }
}

/// Compile options with the flash kernels on tensor cores.
fn tensor_core_options() -> sinter_compiler::Options {
    let mut options = sinter_compiler::Options::default();
    options.target = options.target.with_tensor_cores();
    options.flash.tensor_cores = true;
    options
}

/// `None` where the adapter of `choice` runs tensor-core artifacts; where it does not (Mesa's
/// software Vulkan, so CI), why loading refused one. Such an artifact compiles, validates and
/// names the feature it needs, and loading refuses it by that name.
fn tensor_cores_refused(choice: &AdapterChoice) -> Option<String> {
    let options = tensor_core_options();
    let case = Case::new(vec![1, 2], 17, 17, 16, 32, Mask::None, false);
    let probe =
        sinter_compiler::compile_kernel_graph(&flash_graph(&case, FlashKind::Forward), &options)
            .unwrap_or_else(|e| panic!("compile: {e}"));
    assert!(
        probe
            .requirements
            .features
            .iter()
            .any(|f| f == "EXPERIMENTAL_COOPERATIVE_MATRIX"),
        "{:?}",
        probe.requirements
    );
    match Session::load_with(probe, choice) {
        Ok(_) => None,
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("EXPERIMENTAL_COOPERATIVE_MATRIX"), "{e}");
            Some(e)
        }
    }
}

/// The adapter for a test that runs kernels on tensor cores; such a test fails where the
/// adapter lacks cooperative matrices.
fn adapter_with_tensor_cores() -> AdapterChoice {
    let choice = AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"));
    if let Some(e) = tensor_cores_refused(&choice) {
        panic!("this test needs cooperative matrices, which the adapter lacks: {e}");
    }
    choice
}

/// The whole backward with its `dQ` partial sums squeezed (through the binding limit) into
/// fewer groups than key blocks: each workgroup walks several key blocks, adding into a partial
/// sum that its first block stored (zeros where a causal or window mask leaves that block
/// dead), and a group may find its last block past the keys. The arenas start as NaN, so a
/// partial sum not stored whole shows.
#[test]
fn backward_whole_walks_key_blocks() {
    let poisoned = AdapterChoice {
        poison_arenas: true,
        ..AdapterChoice::from_env().unwrap_or_else(|e| panic!("{e}"))
    };
    let c = |batch: Vec<usize>, sq, sk, d, mask| Case {
        batch,
        sq,
        sk,
        d,
        dv: d,
        mask,
        shared_kv: false,
        operands: DType::F32,
        f16_results: false,
    };
    for case in [
        c(vec![1, 2], 300, 300, 16, Mask::Causal),
        c(vec![2, 1], 520, 300, 32, Mask::None),
        c(vec![1, 2], 400, 260, 16, Mask::Window(50)),
    ] {
        let dq_bytes = (case.batch.iter().product::<usize>() * case.sq * case.d * 4) as u64;
        for groups in [1, 2] {
            // room for `groups` partial sums (no tensor of these cases is larger than dQ)
            let budget = dq_bytes * groups + dq_bytes / 2;
            let key_blocks = case.sk.div_ceil(Tiling::DEFAULT.rows);
            assert_eq!(
                sinter_compiler::flash::variant::dq_groups(key_blocks, dq_bytes, budget),
                groups as usize
            );
            let options = sinter_compiler::Options {
                target: sinter_compiler::Target::portable().with_max_binding(budget),
                ..Default::default()
            };
            check_on(&case, FlashKind::Backward, &options, &poisoned);
        }
    }
}

/// Every tiling but the default ([`Tiling::NAMED`]) against the interpreter: ragged lengths
/// around the block sizes, each head width class (a kernel whose accumulators would not fit
/// falls back to tiling A), causal and not, different query and key lengths, shared keys.
/// `SINTER_FLASH_TILE` overrides the tiling of every compile, these included.
#[test]
fn other_tilings() {
    let mut cases = Vec::new();
    for (n, &s) in [1, 17, 100, 129].iter().enumerate() {
        for (m, &d) in [16, 64, 128, 256].iter().enumerate() {
            let mask = if (n + m) % 2 == 0 {
                Mask::Causal
            } else {
                Mask::None
            };
            cases.push(Case {
                batch: vec![1, 2],
                sq: s,
                sk: s,
                d,
                dv: d,
                mask,
                shared_kv: false,
                operands: DType::F32,
                f16_results: false,
            });
        }
    }
    let c = |sq, sk, d, dv, mask, shared_kv| Case {
        batch: vec![1, 2],
        sq,
        sk,
        d,
        dv,
        mask,
        shared_kv,
        operands: DType::F32,
        f16_results: false,
    };
    cases.extend([
        c(17, 129, 64, 64, Mask::Causal, false),
        c(129, 17, 64, 64, Mask::None, false),
        c(100, 100, 64, 64, Mask::None, false),
        c(129, 129, 16, 16, Mask::Causal, false),
        c(100, 129, 40, 24, Mask::Window(20), false),
        c(33, 70, 96, 96, Mask::Additive, true),
    ]);
    let default = sinter_compiler::Options::default().flash.tiling;
    for &(name, tiling) in Tiling::NAMED.iter().filter(|(_, t)| *t != default) {
        let mut options = sinter_compiler::Options::default();
        options.flash.tiling = tiling;
        for case in &cases {
            for kind in [
                FlashKind::Forward,
                FlashKind::BackwardDq,
                FlashKind::BackwardDkDv,
                FlashKind::Backward,
            ] {
                eprintln!(
                    "tiling {name}: {kind:?} {}x{} d={}",
                    case.sq, case.sk, case.d
                );
                check_with(case, kind, &options);
            }
        }
    }
}
