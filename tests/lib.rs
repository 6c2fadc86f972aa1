//! Shared helpers for sinter's integration tests: deterministic random tensors, and the
//! differential check that runs a program through the reference interpreter and through the
//! compiled artifact on the GPU and compares every output.

pub mod fuzz_targets;
pub mod random_program;

use std::collections::HashMap;

use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{DType, Graph, TensorType};
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;

/// SplitMix64: small, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi), never exactly zero (so tests never pass on zeros).
    pub fn nonzero(&mut self, lo: f64, hi: f64) -> f64 {
        loop {
            let v = lo + (hi - lo) * self.uniform();
            if v.abs() > 1e-3 {
                return v;
            }
        }
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A random tensor: float values in [-2, 2) (never zero; rounded to the dtype), i32 values in
/// [0, int_bound).
pub fn random_tensor(rng: &mut Rng, ty: &TensorType, int_bound: u64) -> Tensor {
    let data = (0..ty.numel())
        .map(|_| match ty.dtype {
            DType::F32 | DType::F16 => ty.dtype.round(rng.nonzero(-2.0, 2.0)),
            DType::I32 => rng.below(int_bound) as f64,
        })
        .collect();
    Tensor::new(ty.clone(), data)
}

/// Random values for every input of `g`; `overrides` replaces some by name.
pub fn random_inputs(
    g: &Graph,
    seed: u64,
    int_bound: u64,
    overrides: &[(&str, Tensor)],
) -> HashMap<String, Tensor> {
    let mut rng = Rng::new(seed);
    g.inputs()
        .map(|v| {
            let value = g.value(v);
            let t = match overrides.iter().find(|(n, _)| *n == value.name) {
                Some((_, t)) => t.clone(),
                None => random_tensor(&mut rng, &value.ty, int_bound),
            };
            (value.name.clone(), t)
        })
        .collect()
}

/// Largest difference between `got` and `want`, relative to the largest |want| (or absolute
/// when that is below 1). NaN must match NaN, infinities must match exactly.
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(1.0f64, |m, w| m.max(w.abs()));
    let mut worst = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        let err = if w.is_nan() || g.is_nan() {
            if w.is_nan() && g.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else if w.is_infinite() || g.is_infinite() {
            if g == w { 0.0 } else { f64::INFINITY }
        } else {
            (g - w).abs() / scale
        };
        worst = worst.max(err);
    }
    worst
}

/// Parses `src`, evaluates it with the reference interpreter and on the GPU with the same
/// inputs, and asserts every output agrees within `tol` (see [`relative_error`]). Returns the
/// errors per output.
pub fn check_gpu(
    src: &str,
    tol: f64,
    overrides: &[(&str, Tensor)],
    int_bound: u64,
) -> Vec<(String, f64)> {
    let graph =
        sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("test.sir", src)));
    check_graph_gpu(
        &graph,
        tol,
        overrides,
        int_bound,
        &sinter_compiler::Options::default(),
    )
}

pub fn check_graph_gpu(
    graph: &Graph,
    tol: f64,
    overrides: &[(&str, Tensor)],
    int_bound: u64,
    options: &sinter_compiler::Options,
) -> Vec<(String, f64)> {
    let inputs = random_inputs(graph, 7, int_bound, overrides);
    let mut errors = Vec::new();
    for (name, got, want) in gpu_and_interpreter(graph, &inputs, options) {
        let err = relative_error(&got.data, &want.data);
        assert!(
            err <= tol,
            "output `{name}`: GPU differs from the interpreter by {err:e} (tolerance {tol:e})\n got  {:?}\n want {:?}",
            &got.data[..got.data.len().min(16)],
            &want.data[..want.data.len().min(16)]
        );
        errors.push((name, err));
    }
    errors
}

/// Runs `graph` (autodiff included) on `inputs` in the interpreter and on the GPU; returns
/// every output as `(name, GPU value, interpreter value)`. Panics, naming the stage, when
/// either fails or the types differ.
pub fn gpu_and_interpreter(
    graph: &Graph,
    inputs: &HashMap<String, Tensor>,
    options: &sinter_compiler::Options,
) -> Vec<(String, Tensor, Tensor)> {
    let expanded = sinter_ir::expand::expand_composites(graph);
    let differentiated = sinter_compiler::autodiff::differentiate(&expanded)
        .unwrap_or_else(|e| panic!("autodiff: {e}"));
    let want = evaluate(&differentiated.graph, inputs, &HashMap::new())
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let compiled =
        sinter_compiler::compile(graph, options).unwrap_or_else(|e| panic!("compile: {e}"));
    let mut session = Session::load(compiled.artifact).unwrap_or_else(|e| panic!("load: {e}"));
    let mut got = run_session(&mut session, inputs);
    want.outputs
        .into_iter()
        .map(|(name, expected)| {
            let actual = got
                .remove(&name)
                .unwrap_or_else(|| panic!("GPU run lacks output `{name}`"));
            assert_eq!(actual.ty, expected.ty, "output `{name}` type");
            (name, actual, expected)
        })
        .collect()
}

/// Runs `session` once on `inputs` (panicking on an error); returns every output.
pub fn run_session(
    session: &mut Session,
    inputs: &HashMap<String, Tensor>,
) -> HashMap<String, Tensor> {
    let host: Vec<(String, HostTensor)> = inputs
        .iter()
        .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
        .collect();
    let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let got = session.run(&feeds).unwrap_or_else(|e| panic!("run: {e}"));
    got.iter()
        .map(|(name, t)| (name.to_string(), t.to_interp()))
        .collect()
}

/// `values` rounded to f32, as a GPU stores them: an f64 result past the f32 range becomes
/// ±inf, as the f32 computation overflows.
pub fn round_to_f32(values: &[f64]) -> Vec<f64> {
    values.iter().map(|&v| f64::from(v as f32)).collect()
}

/// The source of a bundled example (`ir-spec/examples/NAME.sir`).
pub fn example_source(name: &str) -> String {
    let path = format!(
        "{}/../ir-spec/examples/{name}.sir",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `src` with one more statement computing the gradient of `loss` with respect to every
/// param (named `d_PARAM`), and those gradients as outputs.
pub fn with_param_grads(src: &str) -> String {
    let graph =
        sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("example", src)));
    let params: Vec<String> = graph
        .params()
        .map(|p| graph.name_of(p).to_string())
        .collect();
    let grads: Vec<String> = params.iter().map(|p| format!("d_{p}")).collect();
    let close = src.rfind('}').expect("closing brace");
    format!(
        "{}  {} = grad(loss, {})\n  output {}\n}}\n",
        &src[..close],
        grads.join(", "),
        params.join(", "),
        grads.join(", ")
    )
}
