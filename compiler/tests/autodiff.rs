//! The autodiff pass on bad inputs, on points where the derivative is a convention (ties,
//! kinks, `0^b`), and on the shape of what it emits (names kept, no `grad` left, only the
//! needed nodes, text that parses back).

use std::collections::HashMap;

use sinter_compiler::autodiff::{AutodiffError, Differentiated, differentiate};
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{Attrs, Graph, GraphError, Op, TensorType};

fn parse(src: &str) -> Graph {
    sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t.sir", src)))
}

fn diff(src: &str) -> Differentiated {
    differentiate(&sinter_ir::expand::expand_composites(&parse(src))).unwrap()
}

/// Differentiates `src` and evaluates it on `inputs` (all f32, by name); returns the outputs.
fn run(src: &str, inputs: &[(&str, &[f64])]) -> HashMap<String, Vec<f64>> {
    let d = diff(src);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    let feed = inputs
        .iter()
        .map(|&(name, data)| {
            let ty = d.graph.ty(d.graph.lookup(name).unwrap()).clone();
            (name.to_string(), Tensor::new(ty, data.to_vec()))
        })
        .collect();
    let ev = evaluate(&d.graph, &feed, &HashMap::new()).unwrap();
    ev.outputs.into_iter().map(|(n, t)| (n, t.data)).collect()
}

// ---------------------------------------------------------------- bad inputs

#[test]
fn grad_of_a_non_scalar_loss_is_a_type_error() {
    let src = "graph t {\n  input x: f32[3]\n  y = exp(x)\n  dx = grad(y, x)\n  output dx\n}";
    let err = sinter_ir::text::parse(src)
        .unwrap_err()
        .render("t.sir", src);
    assert!(
        err.contains("`grad` needs a scalar f32 loss, got f32[3]"),
        "{err}"
    );
    // the builder says the same
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32(vec![3])).unwrap();
    let y = g.add(Op::Exp, &[x], Attrs::new()).unwrap();
    let err = g
        .add_node(Op::Grad, &[y, x], Attrs::new(), None)
        .unwrap_err();
    assert!(matches!(err, GraphError::Type(_)), "{err}");
}

#[test]
fn grad_of_an_i32_loss_is_a_type_error() {
    let src =
        "graph t {\n  input x: f32[4]\n  i = argmax(x, axis=0)\n  dx = grad(i, x)\n  output dx\n}";
    let err = sinter_ir::text::parse(src)
        .unwrap_err()
        .render("t.sir", src);
    assert!(
        err.contains("`grad` needs a scalar f32 loss, got i32[]"),
        "{err}"
    );
}

#[test]
fn grad_with_respect_to_a_computed_value_is_an_error() {
    let src = "graph t {\n  input x: f32[3]\n  y = exp(x)\n  l = sum(y)\n  dy = grad(l, y)\n  output dy\n}";
    let err = sinter_ir::text::parse(src)
        .unwrap_err()
        .render("t.sir", src);
    assert!(err.contains("computed by a node"), "{err}");
}

#[test]
fn unused_param_gets_zeros_and_a_warning() {
    let src = r#"graph t {
  input x: f32[2, 3]
  param w: f32[3] = ones
  param w3: f32[4, 2] = ones
  param s: f32[] = ones
  loss = sum(mul(x, w))
  dw, dw3, ds = grad(loss, w, w3, s)
  output dw, dw3, ds
}"#;
    let d = diff(src);
    assert_eq!(
        d.warnings,
        [
            "`loss` does not depend on `w3`; its gradient is zero",
            "`loss` does not depend on `s`; its gradient is zero"
        ]
    );
    let x = Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ev = evaluate(&d.graph, &HashMap::from([("x".into(), x)]), &HashMap::new()).unwrap();
    assert_eq!(ev.output("dw").unwrap().data, [5.0, 7.0, 9.0]);
    assert_eq!(
        ev.output("dw3").unwrap(),
        &Tensor::f32(vec![4, 2], vec![0.0; 8])
    );
    assert_eq!(ev.output("ds").unwrap(), &Tensor::scalar(0.0));
}

#[test]
fn dependence_only_through_non_differentiable_operands_warns() {
    // w reaches the loss only as a `where` condition and through argmax: no gradient flows.
    let src = r#"graph t {
  input x: f32[3]
  param w: f32[3] = ones
  c = gt(w, 0)
  i = cast(argmax(w, axis=0), dtype="f32")
  loss = sum(mul(where(c, x, 2.0), i))
  dw = grad(loss, w)
  output dw
}"#;
    let d = diff(src);
    assert_eq!(
        d.warnings,
        ["`loss` does not depend on `w`; its gradient is zero"]
    );
}

/// The verifier rejects these (with a place) before autodiff sees them; autodiff keeps its own
/// check for graphs built another way.
fn second_order_error(src: &str) -> String {
    match sinter_ir::text::parse(src) {
        Ok(_) => panic!("parsed:\n{src}"),
        Err(d) => d.render("t.sir", src),
    }
}

#[test]
fn differentiating_through_an_optimizer_step_is_an_error() {
    let src = r#"graph t {
  input g: f32[3]
  param w: f32[3] = ones
  w2 = sgd(w, g, lr=0.1)
  loss = sum(w2)
  dw = grad(loss, w)
  output dw
}"#;
    let err = second_order_error(src);
    assert!(
        err.contains("through `w2`, a result of `sgd`") && err.contains("t.sir:4:3"),
        "{err}"
    );
}

#[test]
fn differentiating_a_gradient_is_an_error() {
    let src = r#"graph t {
  input x: f32[3]
  param w: f32[3] = ones
  loss = sum(mul(exp(w), x))
  dw = grad(loss, w)
  loss2 = sum(dw)
  dw2 = grad(loss2, w)
  output dw2
}"#;
    let err = second_order_error(src);
    assert!(
        err.contains("second-order gradients are not supported") && err.contains("t.sir:5:3"),
        "{err}"
    );
    // A loss may use a gradient that does not depend on what it differentiates.
    let ok = r#"graph t {
  input x: f32[3]
  param w: f32[3] = ones
  param v: f32[3] = ones
  dw = grad(sum(mul(w, x)), w)
  dv = grad(sum(mul(dw, v)), v)
  output dv
}"#;
    assert_eq!(run(ok, &[("x", &[1.0, 2.0, 3.0])])["dv"], [1.0, 2.0, 3.0]);
}

#[test]
fn unsupported_ops_are_errors() {
    let src = r#"graph t {
  input x: f32[1, 1, 4, 4]
  input dy: f32[1, 1, 2, 2]
  loss = sum(max_pool2d_grad(x, dy, kernel=2, stride=2))
  d = grad(loss, dy)
  output d
}"#;
    let err = differentiate(&parse(src)).unwrap_err();
    assert!(
        matches!(
            err,
            AutodiffError::Unsupported {
                op: "max_pool2d_grad",
                ..
            }
        ),
        "{err}"
    );
    // attention must be expanded first
    let src = r#"graph t {
  input q: f32[1, 1, 2, 2]
  loss = sum(attention(q, q, q))
  d = grad(loss, q)
  output d
}"#;
    let err = differentiate(&parse(src)).unwrap_err();
    assert!(
        matches!(
            err,
            AutodiffError::Unsupported {
                op: "attention",
                ..
            }
        ),
        "{err}"
    );
    assert!(diff(src).warnings.is_empty());
}

// ---------------------------------------------------------------- conventions (PyTorch)

#[test]
fn ties_and_kinks() {
    let src = r#"graph t {
  input a: f32[4]
  input b: f32[4]
  loss = add(add(sum(maximum(a, b)), sum(mul(minimum(a, b), 10.0))), add(sum(relu(a)), sum(mul(abs(b), 100.0))))
  da, db = grad(loss, a, b)
  output da, db
}"#;
    let out = run(
        src,
        &[("a", &[1.0, 2.0, 0.0, -1.0]), ("b", &[1.0, 0.0, 5.0, -1.0])],
    );
    // maximum: ties half; minimum (×10): ties half; relu'(0) = 0; |x|'(0) = 0
    assert_eq!(
        out["da"],
        [
            0.5 + 5.0 + 1.0,
            1.0 + 0.0 + 1.0,
            0.0 + 10.0 + 0.0,
            0.5 + 5.0
        ]
    );
    assert_eq!(
        out["db"],
        [
            0.5 + 5.0 + 100.0,
            0.0 + 10.0 + 0.0,
            1.0 + 0.0 + 100.0,
            0.5 + 5.0 - 100.0
        ]
    );
}

#[test]
fn max_and_min_reductions_share_ties_evenly() {
    let src = r#"graph t {
  input x: f32[2, 3]
  loss = add(sum(max(x, axes=[1])), mul(min(x), 12.0))
  dx = grad(loss, x)
  output dx
}"#;
    let out = run(src, &[("x", &[3.0, 1.0, 3.0, 1.0, 1.0, 1.0])]);
    // row maxima: 3 twice, 1 three times; global min 1 four times (12 / 4 = 3 each)
    let third = 1.0 / 3.0;
    assert_eq!(
        out["dx"],
        [0.5, 3.0, 0.5, third + 3.0, third + 3.0, third + 3.0]
    );
}

#[test]
fn pow_at_zero_base_and_zero_exponent() {
    let src = r#"graph t {
  input a: f32[4]
  input b: f32[4]
  loss = sum(pow(a, b))
  da, db = grad(loss, a, b)
  output da, db
}"#;
    let out = run(
        src,
        &[("a", &[0.0, 0.0, 3.0, 0.0]), ("b", &[2.0, 0.0, 0.0, 0.5])],
    );
    // d/da: 2·0¹ = 0; b == 0 → 0 (PyTorch masks the 0·0^-1); 0^-0.5 → inf as in PyTorch
    assert_eq!(out["da"], [0.0, 0.0, 0.0, f64::INFINITY]);
    // d/db = a^b·log a, but 0 where a == 0 and b >= 0
    assert_eq!(out["db"], [0.0, 0.0, 3f64.ln(), 0.0]);
}

#[test]
fn max_pool_routes_to_the_first_maximum() {
    let src = r#"graph t {
  input x: f32[1, 1, 2, 2]
  loss = sum(max_pool2d(x, kernel=2))
  dx = grad(loss, x)
  output dx
}"#;
    let out = run(src, &[("x", &[1.0, 4.0, 4.0, 2.0])]);
    assert_eq!(out["dx"], [0.0, 1.0, 0.0, 0.0]);
}

// ---------------------------------------------------------------- what is emitted

#[test]
fn names_are_kept_and_the_text_parses_back() {
    let src = r#"graph t {
  input x: f32[4, 3]
  input labels: i32[4]
  param w: f32[3, 5] = normal(std=0.1, seed=1)
  param b: f32[5] = zeros
  logits = add(matmul(x, w), b)
  loss = cross_entropy(logits, labels)
  dw, db = grad(loss, w, b)
  assign w = sub(w, mul(dw, 0.1))
  output loss, dw, db
}"#;
    let d = diff(src);
    let g = &d.graph;
    assert!(g.nodes.iter().all(|n| n.op != Op::Grad));
    for name in ["x", "labels", "w", "b", "logits", "loss", "dw", "db"] {
        assert!(g.lookup(name).is_some(), "`{name}` is kept");
    }
    let outputs: Vec<&str> = g.outputs.iter().map(|&v| g.name_of(v)).collect();
    assert_eq!(outputs, ["loss", "dw", "db"]);
    assert_eq!(g.assigns.len(), 1);
    let text = sinter_ir::text::print(g);
    assert_eq!(&parse(&text), g, "{text}");
}

#[test]
fn only_nodes_between_the_leaves_and_the_loss_are_differentiated() {
    let src = r#"graph t {
  input x: f32[3]
  input z: f32[3]
  param w: f32[3] = zeros
  u = exp(z)
  v = exp(x)
  loss = add(sum(mul(v, w)), sum(u))
  dw = grad(loss, w)
  output dw
}"#;
    let before = parse(src);
    let d = diff(src);
    let new = &d.graph.nodes[before.nodes.len() - 1..];
    let text = sinter_ir::text::print(&d.graph);
    // dw = dloss/dw = v: the seed's broadcast folds away and v is copied to take the name
    assert!(new.len() <= 2, "{text}");
    assert!(
        new.iter().all(|n| n.op != Op::Exp && n.op != Op::Mul),
        "{text}"
    );
}

#[test]
fn no_backward_for_operands_without_gradient() {
    // Only dB is asked for: no dA matmul is emitted.
    let src = r#"graph t {
  input a: f32[2, 3]
  param b: f32[3, 4] = zeros
  loss = sum(square(matmul(a, b)))
  db = grad(loss, b)
  output db
}"#;
    let d = diff(src);
    let matmuls = d.graph.nodes.iter().filter(|n| n.op == Op::Matmul).count();
    assert_eq!(matmuls, 2, "{}", sinter_ir::text::print(&d.graph));
}

#[test]
fn backward_of_softmax_reuses_the_forward_result() {
    let src = r#"graph t {
  input x: f32[2, 3]
  input r: f32[2, 3]
  p = softmax(x, axis=1)
  loss = sum(mul(p, r))
  dx = grad(loss, x)
  output dx
}"#;
    let d = diff(src);
    let softmaxes = d.graph.nodes.iter().filter(|n| n.op == Op::Softmax).count();
    assert_eq!(softmaxes, 1);
}

#[test]
fn graphs_without_grad_are_unchanged() {
    let src = "graph t {\n  input x: f32[3]\n  y = exp(x)\n  output y\n}";
    let g = parse(src);
    let d = differentiate(&g).unwrap();
    assert_eq!(d.graph, g);
    assert!(d.warnings.is_empty());
}

#[test]
fn compile_runs_autodiff_after_expansion() {
    let src = r#"graph t {
  input x: f32[4, 3]
  input labels: i32[4]
  param w: f32[3, 5] = normal(std=0.1, seed=1)
  loss = cross_entropy(relu(matmul(x, w)), labels)
  dw = grad(loss, w)
  output loss, dw
}"#;
    let options = sinter_compiler::Options {
        dump_after: vec![sinter_compiler::Pass::Autodiff],
        ..Default::default()
    };
    let compiled = sinter_compiler::compile(&parse(src), &options).unwrap();
    let (pass, text) = &compiled.dumps[0];
    assert_eq!(*pass, sinter_compiler::Pass::Autodiff);
    assert!(text.contains("dw = ") && !text.contains("grad("), "{text}");
}
