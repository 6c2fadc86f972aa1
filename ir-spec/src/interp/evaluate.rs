//! [`evaluate`]: runs a whole graph.

use std::collections::HashMap;

use crate::graph::{Graph, ValueDef};
use crate::init::initial_value;
use crate::interp::node::eval_named;
use crate::interp::{EvalError, Tensor};
use crate::types::{DType, TensorType};

/// The results of one run of a graph.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Output name and value, in the order of `graph.outputs`.
    pub outputs: Vec<(String, Tensor)>,
    /// For each `assign target = source`, in order: the target's name and its new value.
    pub assigned: Vec<(String, Tensor)>,
    /// Every value of the graph, by `ValueId` index (`None` only if never computed).
    pub values: Vec<Option<Tensor>>,
}

impl Evaluation {
    /// The output of this name.
    pub fn output(&self, name: &str) -> Option<&Tensor> {
        self.outputs.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

/// Limits of one evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvalOptions {
    /// Bytes the interpreter may hold: every value it keeps (8 bytes per element), plus room
    /// for an op's temporaries (counted as twice its results). A graph that needs more fails
    /// with [`EvalError::MemoryBudget`] before allocating, instead of aborting the process.
    pub memory_budget: u64,
    /// Round every f32 result of a node to f32 (off by default: the interpreter's semantics are
    /// exact). A GPU stores each value in f32, so with this a value that overflows f32 midway
    /// is infinite in both, and differential tests compare like with like.
    pub round_f32: bool,
}

/// 4 GiB.
pub const DEFAULT_MEMORY_BUDGET: u64 = 4 << 30;

impl Default for EvalOptions {
    fn default() -> EvalOptions {
        EvalOptions {
            memory_budget: DEFAULT_MEMORY_BUDGET,
            round_f32: false,
        }
    }
}

/// Runs `g` once on `inputs` (one tensor per graph input, by name), within the default
/// [`EvalOptions`].
///
/// `persistent` gives values for params and states by name; any not given starts from its
/// initializer ([`initial_value`]). Every given tensor is validated (unknown names, missing
/// inputs, dtype, shape, data length, integral i32 data) before anything is computed.
pub fn evaluate(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    persistent: &HashMap<String, Tensor>,
) -> Result<Evaluation, EvalError> {
    evaluate_with(g, inputs, persistent, &EvalOptions::default())
}

/// Bytes the interpreter holds, checked against the budget before each allocation.
struct Memory {
    used: u64,
    budget: u64,
}

impl Memory {
    /// Accounts for `ty` (kept) plus `transient` bytes of temporaries, or fails naming `name`.
    fn reserve(&mut self, name: &str, ty: &TensorType, transient: u64) -> Result<(), EvalError> {
        let bytes = (ty.checked_numel().map(|n| n as u64))
            .and_then(|n| n.checked_mul(8))
            .unwrap_or(u64::MAX);
        let needed = self.used.saturating_add(bytes).saturating_add(transient);
        if needed > self.budget {
            return Err(EvalError::MemoryBudget {
                name: name.to_string(),
                ty: ty.clone(),
                needed,
                budget: self.budget,
            });
        }
        self.used += bytes;
        Ok(())
    }
}

/// Bytes an op's temporaries may take besides its results: twice the results.
fn transient_bytes(g: &Graph, node: &crate::graph::Node) -> u64 {
    node.outputs.iter().fold(0u64, |sum, &v| {
        let bytes = (g.ty(v).checked_numel().map(|n| n as u64))
            .and_then(|n| n.checked_mul(16))
            .unwrap_or(u64::MAX);
        sum.saturating_add(bytes)
    })
}

/// The memory an evaluation of `g` reserves, value by value as [`evaluate_with`] does, without
/// computing anything: the first value past `budget` is the error.
fn plan_memory(g: &Graph, budget: u64) -> Result<(), EvalError> {
    let mut memory = Memory { used: 0, budget };
    for id in g.value_ids() {
        let value = g.value(id);
        if !matches!(value.def, ValueDef::Node { .. }) {
            memory.reserve(&value.name, &value.ty, 0)?;
        }
    }
    for node in &g.nodes {
        let transient = transient_bytes(g, node);
        for &v in &node.outputs {
            memory.reserve(g.name_of(v), g.ty(v), transient)?;
        }
    }
    Ok(())
}

/// [`evaluate`] with explicit limits.
pub fn evaluate_with(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    persistent: &HashMap<String, Tensor>,
    options: &EvalOptions,
) -> Result<Evaluation, EvalError> {
    validate(g, inputs, persistent)?;
    // Every value is kept and its type is known, so the whole run's memory is known before
    // anything is computed: a graph past the budget is refused at once.
    plan_memory(g, options.memory_budget)?;
    let mut memory = Memory {
        used: 0,
        budget: options.memory_budget,
    };
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for id in g.value_ids() {
        let value = g.value(id);
        if !matches!(value.def, ValueDef::Node { .. }) {
            memory.reserve(&value.name, &value.ty, 0)?;
        }
        let init = match &value.def {
            ValueDef::Input => Some(inputs[&value.name].clone()),
            ValueDef::Param(init) | ValueDef::State(init) => Some(
                persistent
                    .get(&value.name)
                    .cloned()
                    .unwrap_or_else(|| initial_value(&value.ty, init)),
            ),
            ValueDef::Node { .. } => None,
        };
        values[id.index()] = init;
    }
    for node in &g.nodes {
        let transient = transient_bytes(g, node);
        for &v in &node.outputs {
            memory.reserve(g.name_of(v), g.ty(v), transient)?;
        }
        let args: Vec<&Tensor> = node
            .inputs
            .iter()
            .map(|v| {
                values[v.index()]
                    .as_ref()
                    .expect("operands precede their users")
            })
            .collect();
        let names: Vec<String> = node.inputs.iter().map(|&v| g.name_of(v).into()).collect();
        let out_types: Vec<_> = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
        let results = eval_named(node.op, &node.attrs, &args, &out_types, &names)?;
        for (&v, mut t) in node.outputs.iter().zip(results) {
            if options.round_f32 && t.ty.dtype == DType::F32 {
                for x in &mut t.data {
                    *x = f64::from(*x as f32);
                }
            }
            values[v.index()] = Some(t);
        }
    }
    let get = |v: crate::graph::ValueId| values[v.index()].clone().expect("every value computed");
    let outputs = g
        .outputs
        .iter()
        .map(|&v| (g.name_of(v).to_string(), get(v)))
        .collect();
    let assigned = g
        .assigns
        .iter()
        .map(|a| (g.name_of(a.target).to_string(), get(a.source)))
        .collect();
    Ok(Evaluation {
        outputs,
        assigned,
        values,
    })
}

/// Checks names, types and data of everything the caller gives.
fn validate(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    persistent: &HashMap<String, Tensor>,
) -> Result<(), EvalError> {
    let mut given: Vec<&String> = inputs.keys().collect();
    given.sort();
    for name in given {
        let is_input = g
            .lookup(name)
            .is_some_and(|v| g.value(v).def == ValueDef::Input);
        if !is_input {
            return Err(EvalError::UnknownInput { name: name.clone() });
        }
    }
    let mut given: Vec<&String> = persistent.keys().collect();
    given.sort();
    for name in given {
        if !g.lookup(name).is_some_and(|v| g.value(v).is_persistent()) {
            return Err(EvalError::UnknownPersistent { name: name.clone() });
        }
    }
    for id in g.value_ids() {
        let value = g.value(id);
        let (tensor, is_input) = match value.def {
            ValueDef::Input => match inputs.get(&value.name) {
                Some(t) => (t, true),
                None => {
                    return Err(EvalError::MissingInput {
                        name: value.name.clone(),
                        expected: value.ty.clone(),
                    });
                }
            },
            ValueDef::Param(ref init) | ValueDef::State(ref init) => {
                match persistent.get(&value.name) {
                    Some(t) => (t, false),
                    None if init.is_external() => {
                        return Err(EvalError::MissingWeight {
                            name: value.name.clone(),
                            ty: value.ty.clone(),
                        });
                    }
                    None => continue,
                }
            }
            ValueDef::Node { .. } => continue,
        };
        if tensor.ty != value.ty {
            let (name, expected, actual) =
                (value.name.clone(), value.ty.clone(), tensor.ty.clone());
            return Err(if is_input {
                EvalError::InputType {
                    name,
                    expected,
                    actual,
                }
            } else {
                EvalError::PersistentType {
                    name,
                    expected,
                    actual,
                }
            });
        }
        check_data(&value.name, tensor)?;
    }
    Ok(())
}

/// The data length matches the type, and i32 data holds i32 values.
fn check_data(name: &str, t: &Tensor) -> Result<(), EvalError> {
    if t.data.len() != t.ty.numel() {
        return Err(EvalError::DataLength {
            name: name.to_string(),
            ty: t.ty.clone(),
            expected: t.ty.numel(),
            actual: t.data.len(),
        });
    }
    if t.ty.dtype == DType::I32 {
        let bad = t
            .data
            .iter()
            .position(|&v| v.fract() != 0.0 || !(i32::MIN as f64..=i32::MAX as f64).contains(&v));
        if let Some(index) = bad {
            return Err(EvalError::NotAnInteger {
                name: name.to_string(),
                index,
                value: t.data[index],
            });
        }
    }
    Ok(())
}
