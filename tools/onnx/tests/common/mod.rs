//! Running one ONNX node test (a folder with `model.onnx` and `test_data_set_*/{input,output}_*.pb`)
//! through the importer and the reference interpreter.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use sinter_ir::interp::{self, Tensor};
use sinter_onnx::{Elem, ImportError, Imported, Literal, Options, Problem};

/// ONNX's node-test tolerances.
pub const RTOL: f64 = 1e-3;
pub const ATOL: f64 = 1e-7;

pub enum Outcome {
    Passed,
    Failed(String),
    Unsupported(String),
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed(_) => "failed",
            Outcome::Unsupported(_) => "unsupported",
        }
    }

    pub fn detail(&self) -> &str {
        match self {
            Outcome::Passed => "",
            Outcome::Failed(d) | Outcome::Unsupported(d) => d,
        }
    }
}

/// One data set: the inputs and expected outputs, in the model's order.
pub struct DataSet {
    pub inputs: Vec<Literal>,
    pub outputs: Vec<Literal>,
}

fn read_pbs(dir: &Path, prefix: &str) -> Result<Vec<Literal>, String> {
    let mut out = Vec::new();
    for i in 0.. {
        let path = dir.join(format!("{prefix}_{i}.pb"));
        if !path.is_file() {
            break;
        }
        let file = format!("{prefix}_{i}.pb");
        let bytes = std::fs::read(&path).map_err(|e| format!("{file}: {e}"))?;
        out.push(sinter_onnx::read_tensor(&bytes).map_err(|e| format!("{file}: {e}"))?);
    }
    Ok(out)
}

pub fn data_sets(dir: &Path) -> Result<Vec<DataSet>, String> {
    let mut sets: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
        })
        .collect();
    sets.sort();
    sets.iter()
        .map(|d| {
            Ok(DataSet {
                inputs: read_pbs(d, "input")?,
                outputs: read_pbs(d, "output")?,
            })
        })
        .collect()
}

/// Whether an import error means "sinter does not cover this" rather than a wrong translation.
fn is_unsupported(e: &ImportError) -> bool {
    match e {
        ImportError::Node { problem, .. } => {
            !matches!(problem.as_ref(), Problem::Graph(_) | Problem::Invalid(_))
        }
        ImportError::Port { .. }
        | ImportError::Initializer { .. }
        | ImportError::OldOpset { .. }
        | ImportError::NoOpset
        | ImportError::OpenDims { .. } => true,
        _ => false,
    }
}

/// The runtime inputs of the ONNX graph (those that are not initializers), in order.
pub fn graph_inputs(model: &[u8]) -> Vec<String> {
    use prost::Message;
    let Ok(m) = sinter_onnx::proto::ModelProto::decode(model) else {
        return Vec::new();
    };
    let Some(g) = m.graph else { return Vec::new() };
    let inits: Vec<&str> = g
        .initializer
        .iter()
        .filter_map(|i| i.name.as_deref())
        .collect();
    g.input
        .iter()
        .filter_map(|i| i.name.clone())
        .filter(|n| !inits.contains(&n.as_str()))
        .collect()
}

/// Imports a node test's model with every input fed at run time; when a node refuses that,
/// again with the integer and boolean inputs given as import-time constants (sinter has no
/// int64 arithmetic at run time and its shapes are static, so a shape, an axis list or an
/// integer operand of arithmetic is computed at import time in a real model).
pub fn import_node_test(
    model: &[u8],
    names: &[String],
    sets: impl FnOnce() -> Result<Vec<DataSet>, String>,
) -> Result<(Imported, Vec<DataSet>), Outcome> {
    let first = sinter_onnx::import(model, &Options::default());
    let retry = matches!(&first, Err(ImportError::Node { .. }));
    if let (Err(e), false) = (&first, retry) {
        return Err(classify(e));
    }
    let sets = match (sets(), &first) {
        (Ok(s), _) if !s.is_empty() => s,
        // Data a run-time import cannot take either (sequences, narrow dtypes): the first
        // import's refusal says why.
        (_, Err(e)) => return Err(classify(e)),
        (Ok(_), Ok(_)) => return Err(Outcome::Failed("no test data set".into())),
        (Err(e), Ok(_)) => return Err(Outcome::Failed(e)),
    };
    let imported = match first {
        Ok(i) => i,
        Err(_) => {
            let constants: BTreeMap<String, Literal> = names
                .iter()
                .zip(&sets[0].inputs)
                .filter(|(_, l)| l.elem != Elem::Float)
                .map(|(n, l)| (n.clone(), l.clone()))
                .collect();
            let options = Options {
                constants,
                ..Options::default()
            };
            sinter_onnx::import(model, &options).map_err(|e| classify(&e))?
        }
    };
    Ok((imported, sets))
}

fn classify(e: &ImportError) -> Outcome {
    if is_unsupported(e) {
        Outcome::Unsupported(e.to_string())
    } else {
        Outcome::Failed(format!("import: {e}"))
    }
}

/// The interpreter's tensor for a fed literal.
pub fn feed(l: &Literal) -> Result<Tensor, String> {
    l.to_tensor()
}

/// Compares an output with the expected literal: same shape, every element within tolerance
/// (NaN matches NaN, infinities match exactly).
pub fn compare(
    name: &str,
    got: &Tensor,
    want: &Literal,
    rtol: f64,
    atol: f64,
) -> Result<(), String> {
    if got.shape() != want.shape.as_slice() {
        return Err(format!(
            "output `{name}` has shape {:?}, expected {:?}",
            got.shape(),
            want.shape
        ));
    }
    for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        let w = if want.elem == Elem::Float {
            f64::from(w as f32)
        } else {
            w
        };
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs();
        if !ok {
            return Err(format!("output `{name}` element {i} is {g}, expected {w}"));
        }
    }
    Ok(())
}

/// The outcome in the interpreter and, for a test that passes there, on the GPU.
pub fn run_node_test(dir: &Path, gpu: bool) -> (Outcome, Option<Outcome>) {
    let mut imported = None;
    let interp = run_in_interpreter(dir, &mut imported);
    let on_gpu = match (&interp, imported) {
        (Outcome::Passed, Some((i, sets, names))) if gpu => Some(run_on_gpu(&i, &sets, &names)),
        _ => None,
    };
    (interp, on_gpu)
}

type Loaded = Option<(Imported, Vec<DataSet>, Vec<String>)>;

fn run_in_interpreter(dir: &Path, keep: &mut Loaded) -> Outcome {
    let model = match std::fs::read(dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let names = graph_inputs(&model);
    let (imported, sets) = match import_node_test(&model, &names, || data_sets(dir)) {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    let persistent: HashMap<String, Tensor> = imported.weights.iter().cloned().collect();
    for set in &sets {
        let mut inputs = HashMap::new();
        for (onnx, lit) in names.iter().zip(&set.inputs) {
            let Some(port) = imported.inputs.iter().find(|p| &p.onnx == onnx) else {
                continue; // given as a constant
            };
            match feed(lit) {
                Ok(t) => {
                    inputs.insert(port.sir.clone(), t);
                }
                Err(e) => return Outcome::Unsupported(format!("input `{onnx}`: {e}")),
            }
        }
        let evaluation = match interp::evaluate(&imported.graph, &inputs, &persistent) {
            Ok(e) => e,
            Err(e) => return Outcome::Failed(format!("interpreter: {e}")),
        };
        for (port, want) in imported.outputs.iter().zip(&set.outputs) {
            let Some(got) = evaluation.output(&port.sir) else {
                return Outcome::Failed(format!("output `{}` missing", port.sir));
            };
            if let Err(e) = compare(&port.onnx, got, want, RTOL, ATOL) {
                return Outcome::Failed(e);
            }
        }
    }
    *keep = Some((imported, sets, names));
    Outcome::Passed
}

/// Tolerances on the GPU, which computes in f32 (the interpreter in f64).
pub const GPU_RTOL: f64 = 1e-3;
pub const GPU_ATOL: f64 = 1e-5;

/// Compiles an imported node test and runs every data set on the GPU (the adapter wgpu finds;
/// lavapipe in CI), comparing with the suite's expected outputs.
pub fn run_on_gpu(imported: &Imported, sets: &[DataSet], names: &[String]) -> Outcome {
    use sinter_runtime::Session;
    use sinter_runtime::io::HostTensor;
    let compiled =
        match sinter_compiler::compile(&imported.graph, &sinter_compiler::Options::default()) {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(format!("compile: {e}")),
        };
    let mut session = match Session::load(compiled.artifact) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("load: {e}")),
    };
    let weights: Vec<(String, HostTensor)> = imported
        .weights
        .iter()
        .filter(|(n, _)| session.artifact().tensors.iter().any(|t| &t.name == n))
        .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
        .collect();
    if let Err(e) = session.load_weights(&weights) {
        return Outcome::Failed(format!("weights: {e}"));
    }
    for set in sets {
        let mut host = Vec::new();
        for (onnx, lit) in names.iter().zip(&set.inputs) {
            if let Some(port) = imported.inputs.iter().find(|p| &p.onnx == onnx) {
                match feed(lit) {
                    Ok(t) => host.push((port.sir.clone(), HostTensor::from_interp(&t))),
                    Err(e) => return Outcome::Unsupported(format!("input `{onnx}`: {e}")),
                }
            }
        }
        let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let got = match session.run(&feeds) {
            Ok(g) => g,
            Err(e) => return Outcome::Failed(format!("run: {e}")),
        };
        for (port, want) in imported.outputs.iter().zip(&set.outputs) {
            let Some(t) = got.get(&port.sir) else {
                return Outcome::Failed(format!("output `{}` missing", port.sir));
            };
            if let Err(e) = compare(&port.onnx, &t.to_interp(), want, GPU_RTOL, GPU_ATOL) {
                return Outcome::Failed(e);
            }
        }
    }
    Outcome::Passed
}
