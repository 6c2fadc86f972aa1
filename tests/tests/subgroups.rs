//! Row kernels with one row per workgroup carry a second form that combines with subgroup
//! operations (`Kernel::subgroup_wgsl`). Both forms must agree with the interpreter: the
//! subgroup one where the adapter has subgroups (lavapipe, which CI runs on, has them), the
//! plain one with `SINTER_SUBGROUPS=off` (`AdapterChoice::no_subgroups`) and on adapters without.

use std::collections::HashMap;

use sinter_ir::DType;
use sinter_ir::interp::{Tensor, evaluate};
use sinter_runtime::{AdapterChoice, Session};
use sinter_tests::{Rng, relative_error, round_to_f32, run_session};

/// Every way a row kernel combines (sum, max, min, argmax) and the row kernels built from them,
/// over rows long enough for one row per workgroup (129: a ragged last pass; 1000; 5000: many
/// elements per lane).
fn program(len: usize, rows: usize) -> String {
    format!(
        "graph t {{
  input x: f32[{rows}, {len}]
  input g: f32[{len}]
  s = sum(x, axes=[1])
  hi = max(x, axes=[1])
  lo = min(x, axes=[1])
  a = argmax(x, axis=1)
  l = logsumexp(x, axes=[1])
  p = softmax(x, axis=1)
  n = layer_norm(x, g, g)
  output s, hi, lo, a, l, p, n
}}
"
    )
}

/// Random rows, with special rows: a NaN, +inf, -inf, a constant row (argmax ties), and a row
/// whose largest value sits at its last element.
fn inputs(len: usize, rows: usize, seed: u64) -> HashMap<String, Tensor> {
    let mut rng = Rng::new(seed);
    let mut x: Vec<f64> = (0..rows * len).map(|_| rng.nonzero(-3.0, 3.0)).collect();
    let row = |r: usize| r % rows * len;
    x[row(1) + len / 3] = f64::NAN;
    x[row(2) + len - 2] = f64::INFINITY;
    x[row(3) + 7] = f64::NEG_INFINITY;
    x[row(4)..row(4) + len].fill(1.5);
    x[row(5) + len - 1] = 10.0;
    let g: Vec<f64> = (0..len).map(|_| rng.nonzero(-2.0, 2.0)).collect();
    HashMap::from([
        ("x".to_string(), Tensor::f32(vec![rows, len], x)),
        ("g".to_string(), Tensor::f32(vec![len], g)),
    ])
}

/// Runs `artifact` on `inputs` as `choice` says; returns its outputs and how many kernels ran
/// their subgroup form.
fn run(
    artifact: sinter_ir::artifact::Artifact,
    inputs: &HashMap<String, Tensor>,
    choice: &AdapterChoice,
) -> (HashMap<String, Tensor>, usize, String) {
    let mut session = Session::load_with(artifact, choice).unwrap_or_else(|e| panic!("load: {e}"));
    let outputs = run_session(&mut session, inputs);
    (
        outputs,
        session.report().subgroup_kernels,
        session.gpu().describe(),
    )
}

#[test]
fn both_forms_of_row_reductions_agree_with_the_interpreter() {
    let base = AdapterChoice::from_env().expect("adapter settings");
    for (len, rows) in [(129, 6), (1000, 7), (5000, 6)] {
        let src = program(len, rows);
        let graph =
            sinter_ir::text::parse(&src).unwrap_or_else(|d| panic!("{}", d.render("t", &src)));
        let inputs = inputs(len, rows, len as u64);
        let want = evaluate(
            &sinter_ir::expand::expand_composites(&graph),
            &inputs,
            &HashMap::new(),
        )
        .unwrap_or_else(|e| panic!("interpreter: {e}"))
        .outputs;
        let artifact = sinter_compiler::compile(&graph, &Default::default())
            .unwrap_or_else(|e| panic!("compile: {e}"))
            .artifact;
        let with_form = artifact
            .kernels
            .iter()
            .filter(|k| k.subgroup_wgsl.is_some())
            .count();
        assert!(
            with_form >= 5,
            "len {len}: {with_form} kernels have a subgroup form"
        );
        let plain = AdapterChoice {
            no_subgroups: true,
            ..base.clone()
        };
        for (choice, subgroups) in [(&base, true), (&plain, false)] {
            let (got, used, adapter) = run(artifact.clone(), &inputs, choice);
            if !subgroups {
                assert_eq!(used, 0, "subgroups were turned off");
            } else if adapter.contains("llvmpipe") {
                // CI's software Vulkan has subgroups: the subgroup forms must be what ran
                assert_eq!(used, with_form, "{adapter}");
            }
            for (name, expected) in &want {
                let want = match expected.ty.dtype {
                    DType::F32 => round_to_f32(&expected.data),
                    DType::I32 | DType::F16 => expected.data.clone(),
                };
                let err = relative_error(&got[name].data, &want);
                let tol = if expected.ty.dtype == DType::I32 {
                    0.0
                } else {
                    2e-5
                };
                assert!(
                    err <= tol,
                    "len {len}, subgroups {subgroups} ({used} kernels) on {adapter}: output `{name}` \
                     differs by {err:e}\n got  {:?}\n want {:?}",
                    &got[name].data[..8.min(got[name].data.len())],
                    &want[..8.min(want.len())]
                );
            }
        }
    }
}
