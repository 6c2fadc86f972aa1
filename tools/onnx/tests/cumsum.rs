//! ONNX `CumSum` imported from small models built here: every form (`exclusive`, `reverse`,
//! negative axes) on a run-time `x`, translated to sinter's `cumsum` and evaluated in the
//! interpreter and on the GPU, and on constant operands, folded at import time; the axis as a
//! scalar, a one-element tensor or a `Constant` node; and the refusals (an axis computed at run
//! time, an axis out of range, integers summed at run time, a malformed axis).

use std::collections::{BTreeMap, HashMap};

use prost::Message;
use sinter_ir::Op;
use sinter_ir::interp::{self, Tensor};
use sinter_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};
use sinter_onnx::{Elem, ImportError, Imported, Literal, Options, Problem};

const FLOAT: i32 = 1;
const INT32: i32 = 6;
const INT64: i32 = 7;

/// The `x` of every case: rows `[1, 2, 3]` and `[4, 5, 6]`.
const X: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];

/// `(axis, exclusive, reverse, expected)` for [`X`] of shape `[2, 3]`, worked out by hand.
const FORMS: &[(i64, i64, i64, [f64; 6])] = &[
    (1, 0, 0, [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]),
    (1, 1, 0, [0.0, 1.0, 3.0, 0.0, 4.0, 9.0]),
    (1, 0, 1, [6.0, 5.0, 3.0, 15.0, 11.0, 6.0]),
    (1, 1, 1, [5.0, 3.0, 0.0, 11.0, 6.0, 0.0]),
    (0, 0, 0, [1.0, 2.0, 3.0, 5.0, 7.0, 9.0]),
    (0, 1, 0, [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]),
    (0, 0, 1, [5.0, 7.0, 9.0, 4.0, 5.0, 6.0]),
    (0, 1, 1, [4.0, 5.0, 6.0, 0.0, 0.0, 0.0]),
    (-1, 0, 0, [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]),
    (-1, 1, 1, [5.0, 3.0, 0.0, 11.0, 6.0, 0.0]),
    (-2, 0, 1, [5.0, 7.0, 9.0, 4.0, 5.0, 6.0]),
    (-2, 1, 0, [0.0, 0.0, 0.0, 1.0, 2.0, 3.0]),
];

fn value_info(name: &str, elem_type: i32, dims: &[i64]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn output(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn floats(name: &str, dims: &[i64], data: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(FLOAT),
        float_data: data.to_vec(),
        ..Default::default()
    }
}

fn int64s(name: &str, dims: &[i64], data: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(INT64),
        int64_data: data.to_vec(),
        ..Default::default()
    }
}

fn int32s(name: &str, dims: &[i64], data: &[i32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(INT32),
        int32_data: data.to_vec(),
        ..Default::default()
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(2),
        i: Some(v),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// The `CumSum` node of every model: `y = CumSum(x, axis)`, named `cs`, with the attributes
/// given (a negative value leaves the attribute out, so ONNX's default applies).
fn cumsum_node(exclusive: i64, reverse: i64) -> NodeProto {
    let mut n = node("cs", "CumSum", &["x", "axis"], &["y"]);
    for (name, v) in [("exclusive", exclusive), ("reverse", reverse)] {
        if v >= 0 {
            n.attribute.push(int_attr(name, v));
        }
    }
    n
}

/// A serialized opset-14 model of `nodes`, with graph inputs and initializers.
fn model(nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, inits: Vec<TensorProto>) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(14),
        }],
        graph: Some(GraphProto {
            name: Some("cumsum".into()),
            node: nodes,
            input: inputs,
            initializer: inits,
            output: vec![output("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A model with a run-time f32 `x` of shape `[2, 3]` and the axis as an int64 scalar initializer.
fn runtime_x(axis: i64, exclusive: i64, reverse: i64) -> Vec<u8> {
    model(
        vec![cumsum_node(exclusive, reverse)],
        vec![value_info("x", FLOAT, &[2, 3])],
        vec![int64s("axis", &[], &[axis])],
    )
}

fn import(bytes: &[u8]) -> Result<Imported, ImportError> {
    sinter_onnx::import(bytes, &Options::default())
}

/// How many nodes of the imported graph run `op`.
fn count(imported: &Imported, op: Op) -> usize {
    let g = &imported.graph;
    g.node_ids().filter(|&n| g.node(n).op == op).count()
}

/// `y` in the interpreter, with `x` fed when it is an input of the imported graph.
fn evaluate(imported: &Imported, x: Option<Tensor>) -> Tensor {
    let mut inputs = HashMap::new();
    if let Some(x) = x {
        inputs.insert(imported.inputs[0].sir.clone(), x);
    }
    let persistent: HashMap<String, Tensor> = imported.weights.iter().cloned().collect();
    let run = interp::evaluate(&imported.graph, &inputs, &persistent).expect("evaluates");
    run.output(&imported.outputs[0].sir)
        .expect("the output")
        .clone()
}

fn x_tensor() -> Tensor {
    Tensor::f32(vec![2, 3], X.iter().map(|&v| f64::from(v)).collect())
}

/// The node error of a failed import: the node's name, its op and the problem.
fn node_error(bytes: &[u8], options: &Options) -> (String, String, Problem, String) {
    let e = sinter_onnx::import(bytes, options).expect_err("the import must fail");
    let message = e.to_string();
    match e {
        ImportError::Node { node, op, problem } => (node, op, *problem, message),
        other => panic!("expected a node error, got {other}"),
    }
}

#[test]
fn runtime_x_every_form_matches_hand_values() {
    for &(axis, exclusive, reverse, want) in FORMS {
        let imported = import(&runtime_x(axis, exclusive, reverse)).expect("imports");
        let case = format!("axis={axis} exclusive={exclusive} reverse={reverse}");
        assert_eq!(imported.inputs.len(), 1, "{case}: x is a run-time input");
        assert_eq!(count(&imported, Op::Cumsum), 1, "{case}: one cumsum node");
        let y = evaluate(&imported, Some(x_tensor()));
        assert_eq!(y.shape(), &[2, 3], "{case}");
        assert_eq!(y.data, want, "{case}");
        assert_eq!(imported.outputs[0].elem, Elem::Float, "{case}");
    }
}

#[test]
fn attributes_left_out_take_onnx_defaults() {
    let bytes = model(
        vec![cumsum_node(-1, -1)],
        vec![value_info("x", FLOAT, &[2, 3])],
        vec![int64s("axis", &[], &[1])],
    );
    let y = evaluate(&import(&bytes).expect("imports"), Some(x_tensor()));
    assert_eq!(y.data, [1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
}

/// The axis as a one-element int32 tensor, as a `Constant` node (folded before `CumSum` reads
/// it) and as a graph input given as an import-time constant.
#[test]
fn axis_forms_known_at_import_time() {
    let want = [6.0, 5.0, 3.0, 15.0, 11.0, 6.0];
    let int32_tensor = model(
        vec![cumsum_node(0, 1)],
        vec![value_info("x", FLOAT, &[2, 3])],
        vec![int32s("axis", &[1], &[-1])],
    );
    let mut constant = node("k", "Constant", &[], &["axis"]);
    constant.attribute.push(AttributeProto {
        name: Some("value".into()),
        r#type: Some(4),
        t: Some(int64s("", &[], &[1])),
        ..Default::default()
    });
    let constant_node = model(
        vec![constant, cumsum_node(0, 1)],
        vec![value_info("x", FLOAT, &[2, 3])],
        vec![],
    );
    for (what, bytes) in [("int32", int32_tensor), ("Constant", constant_node)] {
        let imported = import(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(evaluate(&imported, Some(x_tensor())).data, want, "{what}");
    }
    let fed = model(
        vec![cumsum_node(0, 1)],
        vec![
            value_info("x", FLOAT, &[2, 3]),
            value_info("axis", INT64, &[]),
        ],
        vec![],
    );
    let options = Options {
        constants: BTreeMap::from([("axis".to_string(), Literal::scalar(Elem::Int, 1.0))]),
        ..Options::default()
    };
    let imported = sinter_onnx::import(&fed, &options).expect("imports");
    assert_eq!(evaluate(&imported, Some(x_tensor())).data, want);
}

/// Constant operands fold at import time (no `cumsum` node, no input) to the same values, and
/// integers stay integers.
#[test]
fn constant_x_folds_to_hand_values_floats_and_ints() {
    for &(axis, exclusive, reverse, want) in FORMS {
        let case = format!("axis={axis} exclusive={exclusive} reverse={reverse}");
        let ints: Vec<i64> = X.iter().map(|&v| v as i64).collect();
        for (elem, x) in [
            (Elem::Float, floats("x", &[2, 3], &X)),
            (Elem::Int, int64s("x", &[2, 3], &ints)),
        ] {
            let bytes = model(
                vec![cumsum_node(exclusive, reverse)],
                vec![],
                vec![x, int64s("axis", &[], &[axis])],
            );
            let imported = import(&bytes).unwrap_or_else(|e| panic!("{case}: {e}"));
            assert!(imported.inputs.is_empty(), "{case}");
            assert_eq!(count(&imported, Op::Cumsum), 0, "{case}: folded");
            assert_eq!(imported.outputs[0].elem, elem, "{case}");
            let y = evaluate(&imported, None);
            assert_eq!(y.shape(), &[2, 3], "{case}");
            assert_eq!(y.data, want, "{case} ({elem:?})");
        }
    }
}

/// The folder and the translation agree on values that round (f32 at run time, f64 when
/// folded, so within f32 rounding), and the first inclusive sum is the element itself in both,
/// so a leading `-0` stays `-0`.
#[test]
fn folded_and_runtime_cumsum_agree() {
    let x: Vec<f32> = vec![-0.0, 0.1, -2.5, 1e-3, 3.75, -0.2, 7.0, 0.3];
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        for axis in [0, 1, -1] {
            let case = format!("axis={axis} exclusive={exclusive} reverse={reverse}");
            let folded = model(
                vec![cumsum_node(exclusive, reverse)],
                vec![],
                vec![floats("x", &[2, 4], &x), int64s("axis", &[], &[axis])],
            );
            let runtime = model(
                vec![cumsum_node(exclusive, reverse)],
                vec![value_info("x", FLOAT, &[2, 4])],
                vec![int64s("axis", &[], &[axis])],
            );
            let a = evaluate(&import(&folded).expect("imports"), None);
            let feed = Tensor::f32(vec![2, 4], x.iter().map(|&v| f64::from(v)).collect());
            let b = evaluate(&import(&runtime).expect("imports"), Some(feed));
            for (i, (&p, &q)) in a.data.iter().zip(&b.data).enumerate() {
                assert!(
                    (p - q).abs() <= 1e-6 * q.abs().max(1.0),
                    "{case}: element {i}: folded {p}, run time {q}"
                );
                assert_eq!(
                    p.is_sign_negative(),
                    q.is_sign_negative(),
                    "{case}: element {i}: folded {p}, run time {q}"
                );
            }
        }
    }
    // along axis 1 forward, the first sum of row 0 is x[0] = -0 itself
    let folded = model(
        vec![cumsum_node(0, 0)],
        vec![],
        vec![floats("x", &[2, 4], &x), int64s("axis", &[], &[1])],
    );
    let y = evaluate(&import(&folded).expect("imports"), None);
    assert!(y.data[0] == 0.0 && y.data[0].is_sign_negative());
}

#[test]
fn runtime_cumsum_runs_on_the_gpu() {
    use sinter_runtime::Session;
    use sinter_runtime::io::HostTensor;
    for &(axis, exclusive, reverse, want) in FORMS {
        let case = format!("axis={axis} exclusive={exclusive} reverse={reverse}");
        let imported = import(&runtime_x(axis, exclusive, reverse)).expect("imports");
        let compiled =
            sinter_compiler::compile(&imported.graph, &sinter_compiler::Options::default())
                .unwrap_or_else(|e| panic!("{case}: compile: {e}"));
        let mut session = Session::load(compiled.artifact).expect("a GPU session");
        let x = HostTensor::from_interp(&x_tensor());
        let got = session
            .run(&[(imported.inputs[0].sir.as_str(), &x)])
            .unwrap_or_else(|e| panic!("{case}: run: {e}"));
        let y = got
            .get(&imported.outputs[0].sir)
            .expect("the output")
            .to_interp();
        assert_eq!(y.data, want, "{case}");
    }
}

#[test]
fn an_axis_computed_at_run_time_is_refused() {
    let bytes = model(
        vec![cumsum_node(0, 0)],
        vec![
            value_info("x", FLOAT, &[2, 3]),
            value_info("axis", INT64, &[]),
        ],
        vec![],
    );
    let (node, op, problem, message) = node_error(&bytes, &Options::default());
    assert_eq!((node.as_str(), op.as_str()), ("cs", "CumSum"));
    assert!(matches!(problem, Problem::NotStatic(_)), "{message}");
    assert!(
        message.contains("axis (`axis`)")
            && message.contains("run time")
            && message.contains("known at import time"),
        "{message}"
    );
    // with a constant `x` too: the axis alone decides
    let bytes = model(
        vec![cumsum_node(0, 0)],
        vec![value_info("axis", INT64, &[])],
        vec![floats("x", &[2, 3], &X)],
    );
    let (node, _, problem, message) = node_error(&bytes, &Options::default());
    assert_eq!(node, "cs");
    assert!(
        matches!(problem, Problem::NotStatic(_)) && message.contains("run time"),
        "{message}"
    );
}

#[test]
fn an_axis_out_of_range_names_the_node() {
    for axis in [2, -3, 100] {
        let runtime = runtime_x(axis, 0, 0);
        let constant = model(
            vec![cumsum_node(0, 0)],
            vec![],
            vec![floats("x", &[2, 3], &X), int64s("axis", &[], &[axis])],
        );
        for bytes in [runtime, constant] {
            let (node, op, problem, message) = node_error(&bytes, &Options::default());
            assert_eq!((node.as_str(), op.as_str()), ("cs", "CumSum"), "{message}");
            assert!(matches!(problem, Problem::Invalid(_)), "{message}");
            assert!(
                message.starts_with("node `cs` (CumSum)")
                    && message.contains(&format!("axis {axis} is out of range for rank 2")),
                "{message}"
            );
        }
    }
}

/// An axis of two values, a float axis and a scalar `x` are invalid models, whether folded or
/// translated.
#[test]
fn malformed_operands_are_invalid() {
    let two = int64s("axis", &[2], &[0, 1]);
    let float_axis = floats("axis", &[], &[1.0]);
    for (what, axis) in [("two values", two), ("float", float_axis)] {
        for constant_x in [false, true] {
            let bytes = if constant_x {
                model(
                    vec![cumsum_node(0, 0)],
                    vec![],
                    vec![floats("x", &[2, 3], &X), axis.clone()],
                )
            } else {
                model(
                    vec![cumsum_node(0, 0)],
                    vec![value_info("x", FLOAT, &[2, 3])],
                    vec![axis.clone()],
                )
            };
            let (node, _, problem, message) = node_error(&bytes, &Options::default());
            assert_eq!(node, "cs", "{what}");
            assert!(
                matches!(problem, Problem::Invalid(_))
                    && message.contains("must be one int32 or int64 value"),
                "{what}: {message}"
            );
        }
    }
    let scalar = model(
        vec![cumsum_node(0, 0)],
        vec![value_info("x", FLOAT, &[])],
        vec![int64s("axis", &[], &[0])],
    );
    let (_, _, problem, message) = node_error(&scalar, &Options::default());
    assert!(
        matches!(problem, Problem::Invalid(_)) && message.contains("CumSum of a scalar"),
        "{message}"
    );
}

/// Integers computed at run time (a position-id count over a mask, as RoBERTa's export has)
/// are refused, since sinter's `cumsum` is f32 only; the same integers given as import-time
/// constants fold.
#[test]
fn integers_are_summed_at_import_time_only() {
    let bytes = model(
        vec![cumsum_node(0, 0)],
        vec![value_info("x", INT64, &[2, 3])],
        vec![int64s("axis", &[], &[1])],
    );
    let (node, _, problem, message) = node_error(&bytes, &Options::default());
    assert_eq!(node, "cs");
    assert!(matches!(problem, Problem::Unsupported(_)), "{message}");
    assert!(
        message.contains("integers computed at run time (`x`)")
            && message.contains("f32 only")
            && message.contains("no integer arithmetic at run time"),
        "{message}"
    );
    let mask = Literal::new(Elem::Int, vec![2, 3], vec![1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
    let options = Options {
        constants: BTreeMap::from([("x".to_string(), mask)]),
        ..Options::default()
    };
    let imported = sinter_onnx::import(&bytes, &options).expect("imports");
    assert_eq!(count(&imported, Op::Cumsum), 0);
    assert_eq!(imported.outputs[0].elem, Elem::Int);
    assert_eq!(
        evaluate(&imported, None).data,
        [1.0, 2.0, 2.0, 0.0, 1.0, 2.0]
    );
}

/// `CumSum` is no longer listed as needing a new sinter op: an unknown attribute is reported as
/// not read by the translation instead.
#[test]
fn unknown_attributes_are_reported() {
    let mut n = cumsum_node(0, 0);
    n.attribute.push(int_attr("bogus", 1));
    let bytes = model(
        vec![n],
        vec![value_info("x", FLOAT, &[2, 3])],
        vec![int64s("axis", &[], &[1])],
    );
    let (_, _, problem, message) = node_error(&bytes, &Options::default());
    assert!(
        matches!(problem, Problem::Unsupported(_))
            && message.contains("bogus")
            && !message.contains("needs a new sinter op"),
        "{message}"
    );
}
