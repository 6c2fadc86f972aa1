//! The differential test: random well-typed programs (`sinter_tests::random_program`), with NaN,
//! ±inf, ±0 and extreme values among their inputs, run on the GPU and in the interpreter must
//! agree. The interpreter rounds every f32 result to f32 (as GPU storage does) so that a value
//! overflowing midway is infinite on both sides. NaN must meet NaN and infinities must match
//! exactly; finite values within 1e-3 of the largest finite magnitude among the inputs and the
//! output (1 at least): the point is the special values and the structure, not last-bit
//! rounding. Bounded: `PROGRAMS` programs per run (a few seconds on lavapipe); set
//! `SINTER_RANDOM_PROGRAMS=N` (and `SINTER_RANDOM_SEED=S`) for a longer run.

use std::collections::HashMap;

use sinter_ir::interp::{EvalOptions, evaluate_with};
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;
use sinter_tests::random_program::random_program;

const PROGRAMS: u64 = 40;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[test]
fn random_programs_agree_on_the_gpu_and_in_the_interpreter() {
    let count = env("SINTER_RANDOM_PROGRAMS").unwrap_or(PROGRAMS);
    let first = env("SINTER_RANDOM_SEED").unwrap_or(0);
    let mut failures = Vec::new();
    for seed in first..first + count {
        if let Err(e) = check(seed) {
            failures.push(format!("seed {seed}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn check(seed: u64) -> Result<(), String> {
    let p = random_program(seed);
    let src = &p.source;
    let graph = sinter_ir::text::parse(src).map_err(|d| d.render("random.sir", src))?;
    let graph_ad =
        sinter_compiler::autodiff::differentiate(&sinter_ir::expand::expand_composites(&graph))
            .map_err(|e| e.to_string())?
            .graph;
    let options = EvalOptions {
        round_f32: true,
        ..Default::default()
    };
    let want = evaluate_with(&graph_ad, &p.inputs, &HashMap::new(), &options)
        .map_err(|e| format!("interpreter: {e}\n{src}"))?;
    let compiled = sinter_compiler::compile(&graph, &Default::default())
        .map_err(|e| format!("compile: {e}\n{src}"))?;
    let mut session = Session::load(compiled.artifact).map_err(|e| format!("load: {e}"))?;
    let host: Vec<(String, HostTensor)> = (p.inputs.iter())
        .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
        .collect();
    let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let got = session.run(&feeds).map_err(|e| format!("run: {e}"))?;
    let input_scale = (p.inputs.values())
        .flat_map(|t| t.data.iter())
        .filter(|v| v.is_finite())
        .fold(1.0f64, |m, v| m.max(v.abs()));
    for (name, expected) in &want.outputs {
        let actual = got
            .get(name)
            .ok_or_else(|| format!("the GPU run lacks `{name}`"))?
            .to_interp();
        let scale = (expected.data.iter())
            .filter(|v| v.is_finite())
            .fold(input_scale, |m, v| m.max(v.abs()));
        for (i, (&g, &w)) in actual.data.iter().zip(&expected.data).enumerate() {
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                g.is_finite() && (g - w).abs() <= 1e-3 * scale
            };
            if !ok {
                let inputs: Vec<String> = (p.inputs.iter())
                    .map(|(n, t)| format!("{n} = {:?}", t.data))
                    .collect();
                return Err(format!(
                    "output `{name}` element {i}: GPU {g}, interpreter {w}\n{src}{}",
                    inputs.join("\n")
                ));
            }
        }
    }
    Ok(())
}
