//! The import pass: ONNX graph → sinter graph, node by node in ONNX's (topological) order.
//!
//! Each ONNX value becomes a [`Val`]: a [`Literal`] when it is known at import time, or a sinter
//! value. A node whose operands are all literals and whose op is cheap to evaluate (the shape
//! arithmetic of `Shape → Gather → Concat → Reshape` chains) is folded
//! ([`crate::fold`]); every other node is translated into sinter ops ([`crate::ops`]), literals
//! becoming sinter values on first use ([`Importer::materialize`]).

use std::collections::{BTreeMap, HashMap};

use sinter_ir::interp::Tensor;
use sinter_ir::types::TensorType;
use sinter_ir::{Attrs, Graph, Init, Op, ValueId};

use crate::attrs::NodeAttrs;
use crate::error::{ImportError, Problem};
use crate::literal::{Elem, Literal, runtime_elem};
use crate::names::sanitize;
use crate::proto::{ModelProto, NodeProto, ValueInfoProto, tensor_shape_proto, type_proto};
use crate::{Imported, Options, Port};

/// An ONNX value during import.
#[derive(Clone, Debug)]
pub enum Val {
    /// Known at import time.
    Static(Literal),
    /// Computed at run time: a sinter value of class `elem`.
    Dynamic { id: ValueId, elem: Elem },
}

impl Val {
    pub fn elem(&self) -> Elem {
        match self {
            Val::Static(l) => l.elem,
            Val::Dynamic { elem, .. } => *elem,
        }
    }
}

/// Where a literal came from, which decides what it becomes at run time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Origin {
    /// An initializer: a trainable `param` when it is f32.
    Initializer,
    /// A `Constant` node or a folded value: a `state` (persistent, never trained).
    Computed,
}

pub struct Importer {
    pub graph: Graph,
    /// ONNX value name → its value.
    env: HashMap<String, Val>,
    /// Literals' origins, by ONNX name.
    origins: HashMap<String, Origin>,
    /// ONNX name → the sinter value a literal became.
    materialized: HashMap<String, ValueId>,
    /// Params and states with their values.
    weights: Vec<(String, Tensor)>,
    /// The opset of the default domain.
    pub opset: i64,
}

/// The opset the model imports for the default ONNX domain.
fn default_opset(model: &ModelProto) -> Result<i64, ImportError> {
    let version = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .ok_or(ImportError::NoOpset)?;
    if version < 13 {
        return Err(ImportError::OldOpset { version });
    }
    Ok(version)
}

pub fn import(model: &ModelProto, options: &Options) -> Result<Imported, ImportError> {
    let opset = default_opset(model)?;
    let g = model.graph.as_ref().ok_or(ImportError::NoGraph)?;
    let name = options
        .name
        .clone()
        .unwrap_or_else(|| sanitize(g.name.as_deref().unwrap_or("model")));
    let mut cx = Importer {
        graph: Graph::new(name),
        env: HashMap::new(),
        origins: HashMap::new(),
        materialized: HashMap::new(),
        weights: Vec::new(),
        opset,
    };

    for init in &g.initializer {
        let name = init.name.clone().unwrap_or_default();
        let lit = Literal::from_proto(init).map_err(|problem| ImportError::Initializer {
            name: name.clone(),
            problem,
        })?;
        cx.origins.insert(name.clone(), Origin::Initializer);
        cx.env.insert(name, Val::Static(lit));
    }

    let mut inputs = Vec::new();
    let runtime_inputs: Vec<&ValueInfoProto> = g
        .input
        .iter()
        .filter(|i| !cx.env.contains_key(i.name.as_deref().unwrap_or("")))
        .collect();
    let dims = fixed_dims(&runtime_inputs, &options.dims)?;
    for info in runtime_inputs {
        let onnx = info.name.clone().unwrap_or_default();
        if let Some(lit) = options.constants.get(&onnx) {
            cx.origins.insert(onnx.clone(), Origin::Computed);
            cx.env.insert(onnx, Val::Static(lit.clone()));
            continue;
        }
        let (elem, shape) = port_type(info, &dims, "graph input")?;
        let sir = cx.fresh_name(&onnx);
        let ty = TensorType::new(elem.dtype(), shape);
        let id = cx
            .graph
            .add_input(sir.clone(), ty)
            .map_err(|e| ImportError::Port {
                what: "graph input",
                name: onnx.clone(),
                problem: e.to_string(),
            })?;
        cx.env.insert(onnx.clone(), Val::Dynamic { id, elem });
        inputs.push(Port { onnx, sir, elem });
    }

    for (index, node) in g.node.iter().enumerate() {
        cx.node(index, node)?;
    }

    let mut outputs = Vec::new();
    for info in &g.output {
        let onnx = info.name.clone().unwrap_or_default();
        let val = cx
            .env
            .get(&onnx)
            .cloned()
            .ok_or_else(|| ImportError::UnknownOutput { name: onnx.clone() })?;
        let elem = val.elem();
        let id = cx
            .materialize(&onnx, &val)
            .map_err(|problem| ImportError::Port {
                what: "graph output",
                name: onnx.clone(),
                problem: problem.to_string(),
            })?;
        cx.graph.add_output(id);
        let sir = cx.graph.name_of(id).to_string();
        outputs.push(Port { onnx, sir, elem });
    }

    Ok(Imported {
        graph: cx.graph,
        weights: cx.weights,
        inputs,
        outputs,
    })
}

/// Every dynamic dimension of the runtime inputs, fixed by `--dim`; an error lists the open
/// ones, or a `--dim` that names none.
fn fixed_dims(
    inputs: &[&ValueInfoProto],
    given: &BTreeMap<String, usize>,
) -> Result<BTreeMap<String, usize>, ImportError> {
    let mut params: Vec<String> = Vec::new();
    for info in inputs {
        for dim in shape_dims(info) {
            if let Some(tensor_shape_proto::dimension::Value::DimParam(p)) = &dim.value
                && !params.contains(p)
            {
                params.push(p.clone());
            }
        }
    }
    if let Some(name) = given.keys().find(|k| !params.contains(k)) {
        return Err(ImportError::UnknownDim {
            name: name.clone(),
            known: params,
        });
    }
    let open: Vec<String> = params
        .iter()
        .filter(|p| !given.contains_key(*p))
        .cloned()
        .collect();
    if !open.is_empty() {
        return Err(ImportError::OpenDims { names: open });
    }
    Ok(given.clone())
}

fn shape_dims(info: &ValueInfoProto) -> &[tensor_shape_proto::Dimension] {
    match info.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t.shape.as_ref().map_or(&[], |s| &s.dim),
        _ => &[],
    }
}

/// The class and fixed shape of a graph input.
fn port_type(
    info: &ValueInfoProto,
    dims: &BTreeMap<String, usize>,
    what: &'static str,
) -> Result<(Elem, Vec<usize>), ImportError> {
    let name = info.name.clone().unwrap_or_default();
    let fail = |problem: String| ImportError::Port {
        what,
        name: name.clone(),
        problem,
    };
    let Some(type_proto::Value::TensorType(t)) =
        info.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Err(fail(
            "not a tensor (sequences, maps and optionals are not imported)".into(),
        ));
    };
    let elem = runtime_elem(t.elem_type.unwrap_or(0)).map_err(&fail)?;
    let Some(shape) = &t.shape else {
        return Err(fail(
            "its rank is unknown; sinter needs a fixed shape".into(),
        ));
    };
    let mut out = Vec::new();
    for (axis, d) in shape.dim.iter().enumerate() {
        let extent = match &d.value {
            Some(tensor_shape_proto::dimension::Value::DimValue(v)) => *v,
            Some(tensor_shape_proto::dimension::Value::DimParam(p)) => {
                dims.get(p).map_or(0, |&v| v as i64)
            }
            None => {
                return Err(fail(format!(
                    "axis {axis} has no size and no name; sinter needs a fixed shape"
                )));
            }
        };
        if extent < 1 {
            return Err(fail(format!(
                "axis {axis} has size {extent}; sinter has no empty tensors"
            )));
        }
        out.push(extent as usize);
    }
    Ok((elem, out))
}

impl Importer {
    /// A unique `.sir` name for an ONNX name.
    fn fresh_name(&self, onnx: &str) -> String {
        let base = sanitize(onnx);
        let mut name = base.clone();
        let mut k = 1;
        while self.graph.lookup(&name).is_some() {
            name = format!("{base}.{k}");
            k += 1;
        }
        name
    }

    fn node(&mut self, index: usize, node: &NodeProto) -> Result<(), ImportError> {
        let op = node.op_type.clone().unwrap_or_default();
        let label = match node.name.as_deref() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => format!("#{index}"),
        };
        let fail = |problem: Problem| ImportError::Node {
            node: label.clone(),
            op: op.clone(),
            problem: Box::new(problem),
        };
        if let Some(domain) = node.domain.as_deref()
            && !domain.is_empty()
            && domain != "ai.onnx"
        {
            return Err(fail(Problem::UnsupportedOp {
                why: format!("domain `{domain}` (sinter imports the default ONNX domain)"),
            }));
        }
        let mut operands = Vec::with_capacity(node.input.len());
        for name in &node.input {
            if name.is_empty() {
                operands.push(None);
                continue;
            }
            let val = self.env.get(name).cloned().ok_or_else(|| {
                fail(Problem::invalid(format!(
                    "operand `{name}` is not defined before this node"
                )))
            })?;
            operands.push(Some(val));
        }
        let attrs = NodeAttrs::new(node);
        let named: Vec<Option<(String, Val)>> = node
            .input
            .iter()
            .zip(operands)
            .map(|(n, v)| v.map(|v| (n.clone(), v)))
            .collect();
        let args = crate::ops::Args {
            attrs: &attrs,
            operands: &named,
            outputs: node.output.len(),
        };
        let results = crate::ops::translate(self, &op, &args).map_err(&fail)?;
        let listed = |names: &[String]| {
            let s = if names.len() > 1 { "s" } else { "" };
            format!("attribute{s} {}", names.join(", "))
        };
        let mismatched = attrs.mismatched();
        if !mismatched.is_empty() {
            let message = format!("{} of the wrong kind", listed(&mismatched));
            return Err(fail(Problem::invalid(message)));
        }
        let unread = attrs.unread();
        if !unread.is_empty() {
            let message = format!("{} (not read by sinter's translation)", listed(&unread));
            return Err(fail(Problem::unsupported(message)));
        }
        for (i, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            let Some(val) = results.get(i).cloned().flatten() else {
                return Err(fail(Problem::unsupported(format!(
                    "output {i} (`{name}`) is not produced by sinter's translation"
                ))));
            };
            if let Val::Dynamic { id, .. } = &val {
                self.name_value(*id, name);
            } else {
                // An `Identity` of an initializer is one too: exporters write one initializer
                // for several equal params (a LayerNorm's ones) and Identity nodes for the rest.
                let origin = match (op.as_str(), node.input.first()) {
                    ("Identity", Some(source)) => self.origins.get(source).copied(),
                    _ => None,
                };
                self.origins
                    .insert(name.clone(), origin.unwrap_or(Origin::Computed));
            }
            self.env.insert(name.clone(), val);
        }
        Ok(())
    }

    /// Gives a value computed by a translation the ONNX name of what it computes, unless it
    /// already has a name of its own (an input, or a value an earlier node named).
    fn name_value(&mut self, id: ValueId, onnx: &str) {
        if !Graph::is_generated_name(self.graph.name_of(id)) {
            return;
        }
        let name = self.fresh_name(onnx);
        // A fresh name is never taken, so renaming cannot fail.
        let _ = self.graph.rename(id, name);
    }

    /// The sinter value of `val`: a literal becomes a scalar `constant` (with a reshape for a
    /// one-element tensor) or, when larger, a param (f32 initializers) or state (everything
    /// else) whose value goes into the weights. `onnx` names it.
    pub fn materialize(&mut self, onnx: &str, val: &Val) -> Result<ValueId, Problem> {
        let lit = match val {
            Val::Dynamic { id, .. } => return Ok(*id),
            Val::Static(lit) => lit,
        };
        if let Some(&id) = self.materialized.get(onnx)
            && !onnx.is_empty()
        {
            return Ok(id);
        }
        let tensor = lit.to_tensor().map_err(Problem::Unsupported)?;
        let origin = self.origins.get(onnx).copied().unwrap_or(Origin::Computed);
        // Scalars (and one-element literals folded or given by `Constant`) become constants; a
        // one-element initializer stays a param, since a model may train it (a bias of size 1).
        let one = lit.data.len() == 1 && lit.elem != Elem::Int;
        let id = if one && (lit.rank() == 0 || origin == Origin::Computed) {
            let c = self.graph.constant(tensor.data[0])?;
            if lit.rank() == 0 {
                c
            } else {
                self.op(
                    Op::Reshape,
                    &[c],
                    Attrs::new().and(sinter_ir::key::SHAPE, lit.shape.clone()),
                )?
            }
        } else {
            let name = self.fresh_name(if onnx.is_empty() { "const" } else { onnx });
            let ty = tensor.ty.clone();
            // the values are in the weights file written beside the program: a run without it
            // is refused, not computed from zeros
            let id = if origin == Origin::Initializer && lit.elem == Elem::Float {
                self.graph.add_param(name.clone(), ty, Init::External)?
            } else {
                self.graph.add_state(name.clone(), ty, Init::External)?
            };
            self.weights.push((name, tensor));
            id
        };
        if !onnx.is_empty() {
            self.materialized.insert(onnx.to_string(), id);
        }
        Ok(id)
    }

    /// The sinter value of an operand (a literal becomes one on first use).
    pub fn value(&mut self, operand: &(String, Val)) -> Result<ValueId, Problem> {
        self.materialize(&operand.0, &operand.1)
    }

    /// Makes an initializer that has not become a sinter value yet a `state` rather than a
    /// trainable `param` (running statistics of a batch norm).
    pub fn freeze(&mut self, onnx: &str) {
        if !self.materialized.contains_key(onnx) && self.origins.contains_key(onnx) {
            self.origins.insert(onnx.to_string(), Origin::Computed);
        }
    }

    /// The sinter value of a literal computed by a translation (it has no ONNX name).
    pub fn literal(&mut self, lit: Literal) -> Result<ValueId, Problem> {
        self.materialize("", &Val::Static(lit))
    }

    /// Adds one single-result sinter node.
    pub fn op(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Result<ValueId, Problem> {
        Ok(self.graph.add(op, inputs, attrs)?)
    }

    /// A scalar f32 constant.
    pub fn scalar(&mut self, v: f64) -> Result<ValueId, Problem> {
        Ok(self.graph.constant(v)?)
    }

    pub fn shape_of(&self, id: ValueId) -> Vec<usize> {
        self.graph.ty(id).shape.to_vec()
    }
}
