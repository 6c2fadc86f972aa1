//! `evaluate` on whole graphs: input validation, params and states, assigns, outputs, and
//! `eval_node` used on its own.

mod interp_common;

use std::collections::HashMap;

use interp_common::*;
use sinter_ir::interp::{EvalError, Evaluation, Tensor, eval_node, evaluate};
use sinter_ir::{Attr, Attrs, Graph, Init, Op, TensorType};

/// `y = sum(embedding(table, ids) * scale, axes=-1)`; `w` a param updated by sgd with `x`.
fn model() -> Graph {
    let mut g = Graph::new("m");
    let ids = g.add_input("ids", TensorType::i32(vec![3])).unwrap();
    let x = g.add_input("x", TensorType::f32(vec![2])).unwrap();
    let table = g
        .add_param("table", TensorType::f32(vec![4, 2]), Init::Full(0.5))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32(vec![2]), Init::Ones)
        .unwrap();
    let rows = g.add(Op::Embedding, &[table, ids], Attrs::new()).unwrap();
    let scaled = g.add(Op::Mul, &[rows, w], Attrs::new()).unwrap();
    let y = g
        .add_node(
            Op::Sum,
            &[scaled],
            Attrs::new().with("axes", Attr::ints(&[-1])),
            Some(&["y".into()]),
        )
        .unwrap()[0];
    let lr = Attrs::new().with("lr", Attr::Float(0.5));
    let w2 = g.add(Op::Sgd, &[w, x], lr).unwrap();
    g.add_assign(w, w2).unwrap();
    g.add_output(y);
    g.add_output(w2);
    g
}

fn feed(pairs: &[(&str, Tensor)]) -> HashMap<String, Tensor> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn check(
    inputs: &[(&str, Tensor)],
    persistent: &[(&str, Tensor)],
) -> Result<Evaluation, EvalError> {
    evaluate(&model(), &feed(inputs), &feed(persistent))
}

/// Named tensors, as given to `evaluate`.
type Named = Vec<(&'static str, Tensor)>;

fn good_inputs() -> Named {
    vec![("ids", i(&[3], &[3, 0, 3])), ("x", f(&[2], &[1.0, -2.0]))]
}

#[test]
fn runs_with_initializers_and_assigns() {
    let ev = check(&good_inputs(), &[]).unwrap();
    assert_eq!(ev.outputs[0].0, "y");
    assert_close(&ev.outputs[0].1, &f(&[3], &[1.0, 1.0, 1.0]), 0.0, "y");
    assert_close(
        ev.output(&ev.outputs[1].0).unwrap(),
        &f(&[2], &[0.5, 2.0]),
        0.0,
        "w'",
    );
    assert_eq!(ev.assigned.len(), 1);
    assert_eq!(ev.assigned[0].0, "w");
    assert_close(&ev.assigned[0].1, &f(&[2], &[0.5, 2.0]), 0.0, "assigned w");
    assert_eq!(ev.values.len(), model().values.len());
    assert!(ev.values.iter().all(Option::is_some));
    // A second run from the assigned value.
    let w = ev.assigned[0].1.clone();
    let table = f(&[4, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let ev = check(&good_inputs(), &[("w", w), ("table", table)]).unwrap();
    assert_close(
        &ev.outputs[0].1,
        &f(&[3], &[17.0, 2.0, 17.0]),
        0.0,
        "y, run 2",
    );
    assert_close(&ev.assigned[0].1, &f(&[2], &[0.0, 3.0]), 0.0, "w, run 2");
}

#[test]
fn input_validation() {
    let ids_ty = TensorType::i32(vec![3]);
    let mut wrong_len = f(&[2], &[1.0, 2.0]);
    wrong_len.data.push(3.0);
    let cases: Vec<(Named, Named, EvalError)> = vec![
        (
            vec![("x", f(&[2], &[1.0, 2.0]))],
            vec![],
            EvalError::MissingInput {
                name: "ids".into(),
                expected: ids_ty.clone(),
            },
        ),
        (
            [good_inputs(), vec![("z", f(&[], &[1.0]))]].concat(),
            vec![],
            EvalError::UnknownInput { name: "z".into() },
        ),
        (
            [good_inputs(), vec![("w", f(&[2], &[1.0, 1.0]))]].concat(),
            vec![],
            EvalError::UnknownInput { name: "w".into() },
        ),
        (
            vec![("ids", i(&[2], &[0, 1])), ("x", f(&[2], &[1.0, 2.0]))],
            vec![],
            EvalError::InputType {
                name: "ids".into(),
                expected: ids_ty.clone(),
                actual: TensorType::i32(vec![2]),
            },
        ),
        (
            vec![
                ("ids", f(&[3], &[0.0, 1.0, 2.0])),
                ("x", f(&[2], &[1.0, 2.0])),
            ],
            vec![],
            EvalError::InputType {
                name: "ids".into(),
                expected: ids_ty,
                actual: TensorType::f32(vec![3]),
            },
        ),
        (
            vec![("ids", i(&[3], &[0, 1, 2])), ("x", wrong_len)],
            vec![],
            EvalError::DataLength {
                name: "x".into(),
                ty: TensorType::f32(vec![2]),
                expected: 2,
                actual: 3,
            },
        ),
        (
            vec![
                (
                    "ids",
                    Tensor::new(TensorType::i32(vec![3]), vec![0.0, 1.5, 2.0]),
                ),
                ("x", f(&[2], &[1.0, 2.0])),
            ],
            vec![],
            EvalError::NotAnInteger {
                name: "ids".into(),
                index: 1,
                value: 1.5,
            },
        ),
        (
            good_inputs(),
            vec![("x", f(&[2], &[1.0, 2.0]))],
            EvalError::UnknownPersistent { name: "x".into() },
        ),
        (
            good_inputs(),
            vec![("w", f(&[3], &[1.0, 2.0, 3.0]))],
            EvalError::PersistentType {
                name: "w".into(),
                expected: TensorType::f32(vec![2]),
                actual: TensorType::f32(vec![3]),
            },
        ),
    ];
    for (inputs, persistent, want) in cases {
        let got = check(&inputs, &persistent).unwrap_err();
        assert_eq!(got, want);
        let msg = got.to_string();
        let name = match &want {
            EvalError::MissingInput { name, .. }
            | EvalError::UnknownInput { name }
            | EvalError::InputType { name, .. }
            | EvalError::DataLength { name, .. }
            | EvalError::NotAnInteger { name, .. }
            | EvalError::UnknownPersistent { name }
            | EvalError::PersistentType { name, .. } => name,
            _ => unreachable!(),
        };
        assert!(msg.contains(&format!("`{name}`")), "{msg}");
    }
}

#[test]
fn validation_precedes_computation() {
    // Out-of-range ids would fail at `embedding`, but the missing `x` is reported first.
    let err = check(&[("ids", i(&[3], &[9, 9, 9]))], &[]).unwrap_err();
    assert!(
        matches!(err, EvalError::MissingInput { ref name, .. } if name == "x"),
        "{err}"
    );
    let mut inputs = good_inputs();
    inputs[0].1 = i(&[3], &[0, 4, 1]);
    let err = check(&inputs, &[]).unwrap_err();
    assert_eq!(
        err,
        EvalError::IndexOutOfRange {
            op: "embedding",
            value_name: "ids".into(),
            index: 4,
            bound: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "`embedding`: `ids` holds the index 4, outside 0..4"
    );
}

#[test]
fn grad_needs_autodiff() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::f32(vec![3])).unwrap();
    let l = g.add(Op::Sum, &[x], Attrs::new()).unwrap();
    let d = g.add(Op::Grad, &[l, x], Attrs::new()).unwrap();
    g.add_output(d);
    let err = evaluate(
        &g,
        &feed(&[("x", f(&[3], &[1.0, 2.0, 3.0]))]),
        &HashMap::new(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        EvalError::NeedsPass {
            op: "grad",
            pass: "autodiff"
        }
    );
}

#[test]
fn eval_node_alone() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // Raw attributes: the negative axis is normalized by eval_node itself.
    let attrs = Attrs::new().with("axes", Attr::ints(&[-1]));
    let out = eval_node(Op::Sum, &attrs, &[&x], &[TensorType::f32(vec![2])]).unwrap();
    assert_close(&out[0], &f(&[2], &[6.0, 15.0]), 0.0, "sum");
    let err = eval_node(Op::Sum, &attrs, &[&x], &[TensorType::f32(vec![3])]).unwrap_err();
    assert!(
        matches!(err, EvalError::ResultTypes { op: "sum", .. }),
        "{err}"
    );
    let err = eval_node(Op::Matmul, &Attrs::new(), &[&x, &x], &[]).unwrap_err();
    assert!(matches!(err, EvalError::Type { op: "matmul", .. }), "{err}");
    let table = f(&[2, 1], &[1.0, 2.0]);
    let ids = i(&[1], &[2]);
    let err = eval_node(
        Op::Embedding,
        &Attrs::new(),
        &[&table, &ids],
        &[TensorType::f32(vec![1, 1])],
    );
    assert_eq!(
        err.unwrap_err(),
        EvalError::IndexOutOfRange {
            op: "embedding",
            value_name: "ids".into(),
            index: 2,
            bound: 2
        }
    );
    let sgd = Attrs::new().with("lr", Attr::Float(0.1));
    let p = f(&[1], &[1.0]);
    let out = eval_node(Op::Sgd, &sgd, &[&p, &p], std::slice::from_ref(&p.ty)).unwrap();
    assert_close(&out[0], &f(&[1], &[0.9]), 1e-15, "sgd");
}
