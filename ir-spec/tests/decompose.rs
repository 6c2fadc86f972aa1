//! `decompose` computes what the ops it replaces compute: for every non-primitive op, the
//! interpreter gives the same values (to f64 rounding) for a program and its decomposition, on
//! random inputs and on rows holding NaN and ±inf; and the result holds primitives only.

mod interp_common;

use std::collections::HashMap;

use interp_common::{Rng, assert_close};
use sinter_ir::decompose::{decompose, is_primitive};
use sinter_ir::expand::expand_composites;
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::text::parse;
use sinter_ir::{DType, Graph, Op, ValueDef};

/// Random inputs for every input of `g`; labels-like i32 inputs get values below `classes`;
/// with `special`, about one f32 element in seven is NaN, inf or -inf.
fn inputs(g: &Graph, rng: &mut Rng, classes: usize, special: bool) -> HashMap<String, Tensor> {
    let mut feed = HashMap::new();
    for v in g.inputs() {
        let ty = g.ty(v);
        let n = ty.numel();
        let t = match ty.dtype {
            DType::I32 => Tensor::i32(
                ty.shape.clone(),
                (0..n).map(|_| rng.below(classes) as i64).collect(),
            ),
            DType::F32 | DType::F16 => {
                let mut data: Vec<f64> = (0..n)
                    .map(|_| ty.dtype.round(rng.nonzero() * 2.0))
                    .collect();
                if special {
                    for x in data.iter_mut() {
                        match rng.below(21) {
                            0 => *x = f64::NAN,
                            1 => *x = f64::INFINITY,
                            2 => *x = f64::NEG_INFINITY,
                            _ => {}
                        }
                    }
                }
                Tensor::new(ty.clone(), data)
            }
        };
        feed.insert(g.name_of(v).to_string(), t);
    }
    feed
}

/// Evaluates `src` and its decomposition on the same inputs (and persistent values) and
/// compares every output and assign.
fn check(src: &str, classes: usize) {
    let g = expand_composites(&parse(src).unwrap_or_else(|e| panic!("{e:?}\n{src}")));
    let d = decompose(&g);
    for node in &d.nodes {
        assert!(
            is_primitive(node.op),
            "{} survived in\n{src}",
            node.op.name()
        );
    }
    let mut rng = Rng::new(src.len() as u64);
    for special in [false, true] {
        let feed = inputs(&g, &mut rng, classes, special);
        let mut persistent = HashMap::new();
        for v in g.value_ids() {
            let value = g.value(v);
            if matches!(value.def, ValueDef::State(_)) && value.ty.shape.is_empty() {
                // step counters: a valid step
                persistent.insert(value.name.clone(), Tensor::f32(vec![], vec![3.0]));
            } else if value.is_persistent() {
                let n = value.ty.numel();
                let data = (0..n).map(|_| rng.nonzero()).collect();
                persistent.insert(
                    value.name.clone(),
                    Tensor::f32(value.ty.shape.clone(), data),
                );
            }
        }
        let want = evaluate(&g, &feed, &persistent).unwrap();
        let got = evaluate(&d, &feed, &persistent).unwrap();
        let names = |v: &[(String, Tensor)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got.outputs), names(&want.outputs), "outputs\n{src}");
        assert_eq!(
            names(&got.assigned),
            names(&want.assigned),
            "assigns\n{src}"
        );
        for ((name, w), (_, a)) in want.outputs.iter().zip(&got.outputs) {
            assert_close(
                a,
                w,
                1e-12,
                &format!("output {name} (special={special})\n{src}"),
            );
        }
        for ((name, w), (_, a)) in want.assigned.iter().zip(&got.assigned) {
            assert_close(
                a,
                w,
                1e-12,
                &format!("assign {name} (special={special})\n{src}"),
            );
        }
    }
}

fn one_op(input: &str, call: &str) -> String {
    format!("graph t {{\n  input x: {input}\n  y = {call}\n  output y\n}}\n")
}

#[test]
fn reductions() {
    for call in [
        "mean(x)",
        "mean(x, axes=[1], keepdim=true)",
        "mean(x, axes=[0, 2])",
        "logsumexp(x)",
        "logsumexp(x, axes=[2], keepdim=true)",
        "logsumexp(x, axes=[0, 1])",
    ] {
        check(&one_op("f32[3, 4, 5]", call), 1);
    }
}

#[test]
fn softmax_and_log_softmax() {
    for call in [
        "softmax(x)",
        "softmax(x, axis=0)",
        "softmax(x, axis=1)",
        "log_softmax(x)",
        "log_softmax(x, axis=0)",
    ] {
        check(&one_op("f32[3, 4, 5]", call), 1);
    }
    // a row of only -inf gives NaN in both
    let src = "graph t {\n  input x: f32[2, 3]\n  m = where(lt(x, 100), -inf, x)\n  y = softmax(m)\n  z = log_softmax(m)\n  output y, z\n}\n";
    check(src, 1);
}

#[test]
fn norms() {
    let ln = "graph t {\n  input x: f32[4, 6]\n  input g: f32[6]\n  input b: f32[6]\n  y = layer_norm(x, g, b, eps=0.001)\n  output y\n}\n";
    check(ln, 1);
    let rms = "graph t {\n  input x: f32[2, 3, 5]\n  input g: f32[5]\n  y = rms_norm(x, g)\n  output y\n}\n";
    check(rms, 1);
    for shape in ["2, 6, 3, 2", "2, 6", "1, 4, 5"] {
        let gn = format!(
            "graph t {{\n  input x: f32[{shape}]\n  input g: f32[{c}]\n  input b: f32[{c}]\n  y = group_norm(x, g, b, groups=2)\n  output y\n}}\n",
            c = shape.split(", ").nth(1).unwrap()
        );
        check(&gn, 1);
    }
}

#[test]
fn losses() {
    for reduction in ["mean", "sum", "none"] {
        let ce = format!(
            "graph t {{\n  input x: f32[5, 7]\n  input y: i32[5]\n  l = cross_entropy(x, y, reduction=\"{reduction}\")\n  output l\n}}\n"
        );
        check(&ce, 7);
        // labels below 7 include the ignored 3
        let ignoring = format!(
            "graph t {{\n  input x: f32[9, 7]\n  input y: i32[9]\n  l = cross_entropy(x, y, reduction=\"{reduction}\", ignore_index=3)\n  output l\n}}\n"
        );
        check(&ignoring, 7);
        let mse = format!(
            "graph t {{\n  input a: f32[3, 4]\n  input b: f32[3, 4]\n  l = mse_loss(a, b, reduction=\"{reduction}\")\n  output l\n}}\n"
        );
        check(&mse, 1);
    }
}

#[test]
fn optimizers() {
    let programs = [
        "p2 = sgd(p, g, lr=0.1)\n  assign p = p2",
        "p2 = sgd(p, g, lr=0.1, weight_decay=0.01)\n  assign p = p2",
        "p2, b2 = sgd(p, g, buf, lr=0.1, momentum=0.9, dampening=0.1)\n  assign p = p2\n  assign buf = b2",
        "p2, b2 = sgd(p, g, buf, lr=0.1, momentum=0.9, nesterov=true)\n  assign p = p2\n  assign buf = b2",
        "p2, m2, v2 = adam(p, g, m, v, t, lr=0.01, weight_decay=0.1)\n  assign p = p2\n  assign m = m2\n  assign v = v2",
        "p2, m2, v2 = adam(p, g, m, v, t)\n  assign p = p2",
        "p2, m2, v2 = adamw(p, g, m, v, t, lr=0.01)\n  assign p = p2\n  assign m = m2\n  assign v = v2",
    ];
    for body in programs {
        let src = format!(
            "graph t {{\n  input g: f32[3, 4]\n  param p: f32[3, 4] = zeros\n  state buf: f32[3, 4] = zeros\n  state m: f32[3, 4] = zeros\n  state v: f32[3, 4] = zeros\n  state t: f32[] = zeros\n  {body}\n  output p\n}}\n"
        );
        check(&src, 1);
    }
}

#[test]
fn matmul_promotion_is_explicit_and_exact() {
    for (sa, sb) in [
        ("5", "5"),
        ("5", "5, 3"),
        ("4, 5", "5"),
        ("5", "2, 5, 3"),
        ("2, 4, 5", "5"),
    ] {
        let src = format!(
            "graph t {{\n  input a: f32[{sa}]\n  input b: f32[{sb}]\n  y = matmul(a, b)\n  output y\n}}\n"
        );
        let g = parse(&src).unwrap();
        let e = expand_composites(&g);
        for node in &e.nodes {
            if node.op == Op::Matmul {
                for &x in &node.inputs {
                    assert!(e.ty(x).rank() >= 2, "{src}");
                }
            }
        }
        let mut rng = Rng::new(7);
        let feed = inputs(&g, &mut rng, 1, false);
        let want = evaluate(&g, &feed, &HashMap::new()).unwrap();
        let got = evaluate(&e, &feed, &HashMap::new()).unwrap();
        assert_close(&got.outputs[0].1, &want.outputs[0].1, 1e-12, &src);
    }
}
