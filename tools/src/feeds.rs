//! Tensors fed to a program from files: `--input NAME=FILE.npy` and `--weights FILE.safetensors`.
//!
//! Each declared tensor is checked against its declaration before anything runs, so that a
//! mistake is reported as "input `x` must be f32[32, 64], but x.npy holds f32[32, 63]" rather
//! than as a failure deep inside an op.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sinter_ir::artifact::{Artifact, Role};
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

/// What a program declares, as far as feeding it goes: its inputs, its params and states, and
/// the names of the values it computes. Built from a graph (`eval`) or from an artifact's
/// manifest (`run`), so both commands check feeds the same way and say the same things.
pub struct Signature<'a> {
    /// The graph's name, for messages.
    graph: &'a str,
    inputs: Vec<(&'a str, &'a TensorType)>,
    persistent: Vec<(&'a str, &'a TensorType)>,
    computed: Vec<&'a str>,
}

impl<'a> Signature<'a> {
    pub fn of_graph(graph: &'a Graph) -> Signature<'a> {
        let of = |want: fn(&ValueDef) -> bool| {
            graph
                .values
                .iter()
                .filter(|v| want(&v.def))
                .map(|v| (v.name.as_str(), &v.ty))
                .collect::<Vec<_>>()
        };
        Signature {
            graph: &graph.name,
            inputs: of(|d| matches!(d, ValueDef::Input)),
            persistent: of(|d| matches!(d, ValueDef::Param(_) | ValueDef::State(_))),
            computed: of(|d| matches!(d, ValueDef::Node { .. }))
                .into_iter()
                .map(|(n, _)| n)
                .collect(),
        }
    }

    /// From the I/O manifest: its input slots, param and state slots, and outputs.
    pub fn of_artifact(artifact: &'a Artifact) -> Signature<'a> {
        let of = |want: fn(Role) -> bool| {
            artifact
                .tensors
                .iter()
                .filter(|t| want(t.role))
                .map(|t| (t.name.as_str(), &t.ty))
                .collect::<Vec<_>>()
        };
        Signature {
            graph: &artifact.graph,
            inputs: of(|r| r == Role::Input),
            persistent: of(|r| matches!(r, Role::Param | Role::State)),
            computed: of(|r| r == Role::Output)
                .into_iter()
                .map(|(n, _)| n)
                .collect(),
        }
    }

    fn input(&self, name: &str) -> Option<&'a TensorType> {
        self.inputs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, ty)| *ty)
    }

    fn persistent(&self, name: &str) -> Option<&'a TensorType> {
        self.persistent
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, ty)| *ty)
    }

    fn unknown_input(&self, name: &str) -> String {
        let list = if self.inputs.is_empty() {
            "it has none".to_string()
        } else {
            let names: Vec<String> = self.inputs.iter().map(|(n, ty)| describe(n, ty)).collect();
            format!("its inputs are {}", names.join(", "))
        };
        let graph = self.graph;
        if self.persistent(name).is_some() {
            format!(
                "`{name}` is a param or state of graph `{graph}`, not an input; load it with --weights FILE.safetensors"
            )
        } else if self.computed.contains(&name) {
            format!("`{name}` is computed by graph `{graph}`, not an input; {list}")
        } else {
            format!("`{name}` is not an input of graph `{graph}`; {list}")
        }
    }
}

/// Reads every input of `sig` from `feeds`: each input exactly once, each of its declared type.
pub fn load_inputs(
    sig: &Signature,
    feeds: &[Feed],
) -> Result<HashMap<String, HostTensor>, CliError> {
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
        if sig.input(&feed.name).is_none() {
            return Err(CliError::Feed(sig.unknown_input(&feed.name)));
        }
    }
    let missing: Vec<String> = sig
        .inputs
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
        let expected = sig
            .input(&feed.name)
            .ok_or_else(|| CliError::Feed(sig.unknown_input(&feed.name)))?;
        let tensor = read_npy(&feed.path)?;
        check_type("input", &feed.name, expected, &tensor, &feed.path)?;
        inputs.insert(feed.name.clone(), tensor);
    }
    Ok(inputs)
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

/// Reads the params and states found in a safetensors file, each of its declared type; those
/// the file lacks keep their values. Tensors the graph does not have (a training run's
/// optimizer moments and step counter, when a forward program loads its params) are ignored
/// and named on stderr; a file with none of the graph's params and states is an error.
pub fn load_weights(sig: &Signature, path: &Path) -> Result<HashMap<String, HostTensor>, CliError> {
    let mut weights = HashMap::new();
    let mut ignored = Vec::new();
    for (name, tensor) in read_safetensors(path)? {
        let Some(expected) = sig.persistent(&name) else {
            ignored.push(name);
            continue;
        };
        check_type("weight", &name, expected, &tensor, path)?;
        weights.insert(name, tensor);
    }
    if let Some(name) = ignored.first().filter(|_| weights.is_empty()) {
        let persistent: Vec<String> = sig
            .persistent
            .iter()
            .map(|(n, ty)| describe(n, ty))
            .collect();
        return Err(CliError::Feed(format!(
            "{}: tensor `{name}` is not a param or state of graph `{}`; {}",
            path.display(),
            sig.graph,
            if persistent.is_empty() {
                "it has none".to_string()
            } else {
                format!("they are {}", persistent.join(", "))
            }
        )));
    }
    if !ignored.is_empty() {
        ignored.sort();
        let shown: Vec<String> = ignored.iter().take(8).map(|n| format!("`{n}`")).collect();
        let more = ignored.len().saturating_sub(shown.len());
        crate::console::eprintln(&format!(
            "note: {}: ignored {} tensor(s) that graph `{}` does not have (optimizer states of a \
             training run, for example): {}{}",
            path.display(),
            ignored.len(),
            sig.graph,
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
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
