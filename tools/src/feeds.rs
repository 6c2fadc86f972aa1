//! Tensors fed to a program from files: `--input NAME=FILE.npy` and `--weights FILE.safetensors`.
//!
//! Each declared tensor is checked against its declaration before anything runs, so that a
//! mistake is reported as "input `x` must be f32[32, 64], but x.npy holds f32[32, 63]" rather
//! than as a failure deep inside an op.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sinter_ir::{Graph, TensorType, ValueDef};
use sinter_runtime::io::{HostTensor, read_npy, read_safetensors};

use crate::error::CliError;

/// One `--input NAME=FILE` argument.
#[derive(Clone, Debug)]
pub struct Feed {
    pub name: String,
    pub path: PathBuf,
}

/// clap's value parser for `NAME=FILE`.
pub fn parse_feed(spec: &str) -> Result<Feed, String> {
    let Some((name, path)) = spec.split_once('=') else {
        return Err(format!(
            "expected NAME=FILE (for example x=x.npy), got `{spec}`"
        ));
    };
    if name.is_empty() {
        return Err(format!("the tensor name before `=` is empty in `{spec}`"));
    }
    if path.is_empty() {
        return Err(format!("the file after `=` is empty in `{spec}`"));
    }
    Ok(Feed {
        name: name.to_string(),
        path: PathBuf::from(path),
    })
}

fn describe(name: &str, ty: &TensorType) -> String {
    format!("`{name}`: {ty}")
}

/// Reads every input of `graph` from `feeds`: each input exactly once, each of its declared type.
pub fn load_inputs(graph: &Graph, feeds: &[Feed]) -> Result<HashMap<String, HostTensor>, CliError> {
    let declared: Vec<(&str, &TensorType)> = graph
        .inputs()
        .map(|v| (graph.name_of(v), graph.ty(v)))
        .collect();
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for feed in feeds {
        if let Some(first) = seen.insert(&feed.name, &feed.path) {
            return Err(CliError::Feed(format!(
                "input `{}` is given twice ({} and {})",
                feed.name,
                first.display(),
                feed.path.display()
            )));
        }
        if !declared.iter().any(|(n, _)| *n == feed.name) {
            return Err(CliError::Feed(unknown_input(graph, &feed.name, &declared)));
        }
    }
    let missing: Vec<String> = declared
        .iter()
        .filter(|(n, _)| !seen.contains_key(n))
        .map(|(n, ty)| describe(n, ty))
        .collect();
    if !missing.is_empty() {
        return Err(CliError::Feed(format!(
            "missing input{} {} (give each with --input NAME=FILE.npy)",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", ")
        )));
    }
    let mut inputs = HashMap::new();
    for feed in feeds {
        let expected = declared
            .iter()
            .find(|(n, _)| *n == feed.name)
            .map(|(_, ty)| *ty)
            .ok_or_else(|| CliError::Feed(unknown_input(graph, &feed.name, &declared)))?;
        let tensor = read_npy(&feed.path)?;
        check_type("input", &feed.name, expected, &tensor, &feed.path)?;
        inputs.insert(feed.name.clone(), tensor);
    }
    Ok(inputs)
}

fn unknown_input(graph: &Graph, name: &str, declared: &[(&str, &TensorType)]) -> String {
    let kind = graph.lookup(name).map(|v| &graph.value(v).def);
    let list = if declared.is_empty() {
        "it has none".to_string()
    } else {
        let names: Vec<String> = declared.iter().map(|(n, ty)| describe(n, ty)).collect();
        format!("its inputs are {}", names.join(", "))
    };
    match kind {
        Some(ValueDef::Param(_) | ValueDef::State(_)) => format!(
            "`{name}` is a param or state of graph `{}`, not an input; load it with --weights FILE.safetensors",
            graph.name
        ),
        Some(ValueDef::Node { .. }) => format!(
            "`{name}` is computed by graph `{}`, not an input; {list}",
            graph.name
        ),
        _ => format!("`{name}` is not an input of graph `{}`; {list}", graph.name),
    }
}

fn check_type(
    what: &str,
    name: &str,
    expected: &TensorType,
    tensor: &HostTensor,
    path: &Path,
) -> Result<(), CliError> {
    let actual = tensor.ty();
    if &actual == expected {
        return Ok(());
    }
    let mut message = format!(
        "{what} `{name}` must be {expected}, but {} holds {actual}",
        path.display()
    );
    if actual.dtype != expected.dtype {
        message.push_str(&format!(
            " (save it as {} with numpy: a.astype('<{}4'))",
            expected.dtype,
            if expected.dtype.is_float() { 'f' } else { 'i' }
        ));
    }
    Err(CliError::Feed(message))
}

/// Reads the params and states found in a safetensors file. Every tensor in the file must be a
/// param or state of `graph`, of its declared type; those the file lacks keep their initializers.
pub fn load_weights(graph: &Graph, path: &Path) -> Result<HashMap<String, HostTensor>, CliError> {
    let mut weights = HashMap::new();
    for (name, tensor) in read_safetensors(path)? {
        let value = graph
            .lookup(&name)
            .map(|v| graph.value(v))
            .filter(|v| v.is_persistent());
        let Some(value) = value else {
            let persistent: Vec<String> = graph
                .values
                .iter()
                .filter(|v| v.is_persistent())
                .map(|v| describe(&v.name, &v.ty))
                .collect();
            return Err(CliError::Feed(format!(
                "{}: tensor `{name}` is not a param or state of graph `{}`; {}",
                path.display(),
                graph.name,
                if persistent.is_empty() {
                    "it has none".to_string()
                } else {
                    format!("they are {}", persistent.join(", "))
                }
            )));
        };
        check_type("weight", &name, &value.ty, &tensor, path)?;
        weights.insert(name, tensor);
    }
    Ok(weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feed_specs() {
        let ok = parse_feed("x=data/x=1.npy").unwrap();
        assert_eq!(
            (ok.name.as_str(), ok.path),
            ("x", PathBuf::from("data/x=1.npy"))
        );
        for (spec, expected) in [
            ("x.npy", "expected NAME=FILE"),
            ("=x.npy", "name before `=` is empty"),
            ("x=", "file after `=` is empty"),
        ] {
            let err = parse_feed(spec).unwrap_err();
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }
}
