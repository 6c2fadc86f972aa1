//! Reporting a run's outputs, shared by `eval` and `run`: one summary line per output, and each
//! output written to `DIR/NAME.npy` when an output directory is given.

use std::path::Path;

use sinter_ir::artifact::Role;
use sinter_ir::{DType, TensorType};
use sinter_runtime::io::{HostTensor, write_npy};

use crate::console;
use crate::error::CliError;

/// Creates the output directory (and its parents) if needed.
pub fn create_dir(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|source| CliError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })
}

/// Prints a summary line per output, after writing it to `dir/NAME.npy` when `dir` is given.
pub fn report(outputs: &[(String, HostTensor)], dir: Option<&Path>) -> Result<(), CliError> {
    if let Some(dir) = dir {
        create_dir(dir)?;
    }
    for (name, tensor) in outputs {
        let mut line = summary(name, &tensor.ty(), values(tensor));
        if let Some(dir) = dir {
            let path = dir.join(format!("{name}.npy"));
            write_npy(&path, tensor)?;
            line.push_str(&format!("  -> {}", path.display()));
        }
        console::println(&line)?;
    }
    Ok(())
}

fn values(t: &HostTensor) -> Vec<f64> {
    t.data.to_f64()
}

/// `name: type  mean=… min=… max=…`, or `name: f32[] = v` for a scalar.
pub fn summary(name: &str, ty: &TensorType, data: Vec<f64>) -> String {
    let fmt = |v: f64| match ty.dtype {
        DType::I32 => format!("{v}"),
        DType::F32 | DType::F16 => format!("{v:.6}"),
    };
    if data.len() == 1 && ty.is_scalar() {
        return format!("{name}: {ty} = {}", fmt(data[0]));
    }
    let total = data.len();
    let finite: Vec<f64> = data.into_iter().filter(|v| v.is_finite()).collect();
    let mut line = format!("{name}: {ty}");
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
    let nonfinite = total - finite.len();
    if nonfinite > 0 {
        line.push_str(&format!("  non-finite={nonfinite}"));
    }
    line
}

/// Writes every param and state of `session` to `path` (safetensors) and says so.
pub fn save_weights(session: &sinter_runtime::Session, path: &Path) -> Result<(), CliError> {
    session.save_weights(path)?;
    let count = session
        .artifact()
        .tensors
        .iter()
        .filter(|t| matches!(t.role, Role::Param | Role::State))
        .count();
    console::println(&format!(
        "saved {count} params and states -> {}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let line = |name, t: HostTensor| summary(name, &t.ty(), values(&t));
        assert_eq!(
            line("loss", HostTensor::f32(vec![], vec![2.5])),
            "loss: f32[] = 2.500000"
        );
        let t = HostTensor::f32(vec![4], vec![1.0, -3.0, f32::NAN, 5.0]);
        assert_eq!(
            line("y", t),
            "y: f32[4]  mean=1.000000 min=-3.000000 max=5.000000  non-finite=1"
        );
        let i = HostTensor::i32(vec![2], vec![7, -2]);
        assert_eq!(line("k", i), "k: i32[2]  mean=2.500000 min=-2 max=7");
    }
}
