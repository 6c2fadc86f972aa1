//! `sinter eval FILE.sir --input NAME=F.npy … [--weights W.safetensors] [--out DIR]`: run a
//! program on the reference interpreter, after the front-end passes the interpreter needs
//! (composite expansion, and autodiff for `grad`).

use std::collections::HashMap;
use std::path::PathBuf;

use sinter_ir::interp::{self, Tensor};
use sinter_ir::{DType, Graph, ValueDef};
use sinter_runtime::io::{HostTensor, write_npy};

use crate::error::CliError;
use crate::feeds::{self, Feed};
use crate::program;

#[derive(clap::Args)]
pub struct Args {
    /// The program to run.
    file: PathBuf,
    /// An input tensor: the input's name and a .npy file (f32 or i32, C order). Repeat for each
    /// input.
    #[arg(short, long = "input", value_name = "NAME=FILE", value_parser = feeds::parse_feed)]
    inputs: Vec<Feed>,
    /// Params and states by name; those the file lacks start from their initializers.
    #[arg(short, long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// Directory to write each output to, as NAME.npy (created if needed).
    #[arg(short, long, value_name = "DIR")]
    out: Option<PathBuf>,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let graph = program::load(&args.file)?;
    let graph = sinter_ir::expand::expand_composites(&graph);
    let differentiated = sinter_compiler::autodiff::differentiate(&graph)?;
    for warning in &differentiated.warnings {
        eprintln!("warning: {warning}");
    }
    let graph = differentiated.graph;

    let inputs: HashMap<String, Tensor> = feeds::load_inputs(&graph, &args.inputs)?
        .into_iter()
        .map(|(name, t)| (name, t.to_interp()))
        .collect();
    let mut weights = match &args.weights {
        Some(path) => feeds::load_weights(&graph, path)?,
        None => HashMap::new(),
    };
    let persistent = persistent_values(&graph, &mut weights);

    let evaluation = interp::evaluate(&graph, &inputs, &persistent)?;

    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|source| CliError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    for (name, tensor) in &evaluation.outputs {
        let mut line = summary(name, tensor);
        if let Some(dir) = &args.out {
            let path = dir.join(format!("{name}.npy"));
            write_npy(&path, &HostTensor::from_interp(tensor))?;
            line.push_str(&format!("  -> {}", path.display()));
        }
        println!("{line}");
    }
    Ok(())
}

/// The value of every param and state: from the weights file when it has one, else from the
/// declared initializer.
fn persistent_values(
    graph: &Graph,
    weights: &mut HashMap<String, HostTensor>,
) -> HashMap<String, Tensor> {
    graph
        .values
        .iter()
        .filter_map(|v| {
            let init = match &v.def {
                ValueDef::Param(init) | ValueDef::State(init) => init,
                _ => return None,
            };
            let value = match weights.remove(&v.name) {
                Some(t) => t.to_interp(),
                None => sinter_ir::init::initial_value(&v.ty, init),
            };
            Some((v.name.clone(), value))
        })
        .collect()
}

/// `name: type  mean=… min=… max=…`, or `name: f32[] = v` for a scalar.
fn summary(name: &str, t: &Tensor) -> String {
    let fmt = |v: f64| match t.ty.dtype {
        DType::I32 => format!("{v}"),
        DType::F32 => format!("{v:.6}"),
    };
    if t.data.len() == 1 && t.ty.is_scalar() {
        return format!("{name}: {} = {}", t.ty, fmt(t.data[0]));
    }
    let finite: Vec<f64> = t.data.iter().copied().filter(|v| v.is_finite()).collect();
    let mut line = format!("{name}: {}", t.ty);
    if !finite.is_empty() {
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
        let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        line.push_str(&format!(
            "  mean={:.6} min={} max={}",
            mean,
            fmt(min),
            fmt(max)
        ));
    }
    let nonfinite = t.data.len() - finite.len();
    if nonfinite > 0 {
        line.push_str(&format!("  non-finite={nonfinite}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        assert_eq!(
            summary("loss", &Tensor::scalar(2.5)),
            "loss: f32[] = 2.500000"
        );
        let t = Tensor::f32(vec![4], vec![1.0, -3.0, f64::NAN, 5.0]);
        assert_eq!(
            summary("y", &t),
            "y: f32[4]  mean=1.000000 min=-3.000000 max=5.000000  non-finite=1"
        );
        let i = Tensor::i32(vec![2], vec![7, -2]);
        assert_eq!(summary("k", &i), "k: i32[2]  mean=2.500000 min=-2 max=7");
    }
}
