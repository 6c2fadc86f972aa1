//! `attention` against a naive per-row computation, and `expand_composites` against direct
//! evaluation, for every mask kind.

mod interp_common;

use std::collections::HashMap;

use interp_common::*;
use sinter_ir::expand::expand_composites;
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{Attr, Attrs, Graph, Init, Op, TensorType};

#[derive(Clone)]
struct Case {
    name: &'static str,
    b: usize,
    h: usize,
    /// Key/value heads (dividing `h`; query head `i` reads key/value head `i / (h / kv)`).
    kv: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    /// Mask shape and kind ("boolean" f32, "boolean_i32", "additive").
    mask: Option<(&'static [usize], &'static str)>,
    causal: bool,
    window: usize,
    scale: Option<f64>,
}

const BASE: Case = Case {
    name: "",
    b: 2,
    h: 3,
    kv: 3,
    sq: 5,
    sk: 7,
    d: 4,
    dv: 3,
    mask: None,
    causal: false,
    window: 0,
    scale: None,
};

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    vec![
        Case { name: "none", ..BASE },
        Case { name: "none, explicit scale, size-1 dims", b: 1, h: 1, kv: 1, sq: 1, d: 1, scale: Some(0.3), ..BASE },
        Case { name: "boolean", mask: Some((&[2, 1, 5, 7], "boolean")), ..BASE },
        Case { name: "boolean i32, broadcast", mask: Some((&[5, 7], "boolean_i32")), ..BASE },
        Case { name: "additive", mask: Some((&[1, 3, 1, 7], "additive")), ..BASE },
        Case { name: "causal square", sq: 7, causal: true, ..BASE },
        Case { name: "causal Sq < Sk", causal: true, ..BASE },
        Case { name: "causal Sq > Sk", sq: 13, sk: 5, causal: true, ..BASE },
        Case { name: "window", sq: 7, window: 2, ..BASE },
        Case { name: "window Sq != Sk", sq: 13, window: 3, ..BASE },
        Case { name: "causal + window", sq: 7, causal: true, window: 3, ..BASE },
        Case { name: "causal + boolean", sq: 7, causal: true, mask: Some((&[1, 1, 7, 7], "boolean")), ..BASE },
        Case { name: "window + additive", sq: 7, window: 2, mask: Some((&[2, 3, 7, 7], "additive")), ..BASE },
        Case { name: "multi-query", kv: 1, ..BASE },
        Case { name: "grouped, causal", h: 6, kv: 2, sq: 7, causal: true, ..BASE },
        Case { name: "grouped, per-head additive", h: 6, kv: 3, mask: Some((&[1, 6, 5, 7], "additive")), ..BASE },
        Case { name: "grouped, boolean over batch", h: 4, kv: 2, mask: Some((&[2, 1, 5, 7], "boolean")), ..BASE },
        Case { name: "grouped, 2-D mask + window", h: 4, kv: 2, sq: 7, window: 2, mask: Some((&[7, 7], "boolean_i32")), ..BASE },
    ]
}

struct Inputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<Tensor>,
}

fn inputs(c: &Case, rng: &mut Rng) -> Inputs {
    let mask = c.mask.map(|(shape, kind)| {
        let n = shape.iter().product();
        match kind {
            "additive" => rng.tensor(shape),
            "boolean_i32" => Tensor::i32(
                shape.to_vec(),
                (0..n).map(|_| (rng.below(3) != 0) as i64).collect(),
            ),
            _ => {
                // Mostly kept, with one fully masked row to exercise NaN rows.
                let mut data: Vec<f64> = (0..n)
                    .map(|_| (rng.below(3) != 0) as u8 as f64 * 2.0)
                    .collect();
                let sk = shape[shape.len() - 1];
                data[..sk].iter_mut().for_each(|v| *v = 0.0);
                Tensor::f32(shape.to_vec(), data)
            }
        }
    });
    Inputs {
        q: rng.tensor(&[c.b, c.h, c.sq, c.d]),
        k: rng.tensor(&[c.b, c.kv, c.sk, c.d]),
        v: rng.tensor(&[c.b, c.kv, c.sk, c.dv]),
        mask,
    }
}

fn attrs(c: &Case) -> Attrs {
    let mut a = Attrs::new()
        .with("causal", Attr::Bool(c.causal))
        .with("window", Attr::Int(c.window as i64));
    if let Some(s) = c.scale {
        a = a.with("scale", Attr::Float(s));
    }
    if let Some((_, kind)) = c.mask {
        let kind = if kind == "additive" {
            "additive"
        } else {
            "boolean"
        };
        a = a.with("mask_kind", Attr::Str(kind.into()));
    }
    a
}

/// Per query row: scores over the allowed keys, softmax over them, weighted sum of values.
fn naive(c: &Case, x: &Inputs) -> Tensor {
    let scale = c.scale.unwrap_or(1.0 / (c.d as f64).sqrt());
    let mut out = Vec::new();
    for b in 0..c.b {
        for h in 0..c.h {
            let kv = h / (c.h / c.kv);
            for i in 0..c.sq {
                let mut scores: Vec<(usize, f64)> = Vec::new();
                for j in 0..c.sk {
                    if c.causal && j > i {
                        continue;
                    }
                    if c.window > 0 && (i as i64 - j as i64).abs() >= c.window as i64 {
                        continue;
                    }
                    let mut s = scale
                        * (0..c.d)
                            .map(|l| x.q.at(&[b, h, i, l]) * x.k.at(&[b, kv, j, l]))
                            .sum::<f64>();
                    if let (Some(m), Some((_, kind))) = (&x.mask, c.mask) {
                        let mv = at_broadcast(m, &[b, h, i, j]);
                        if kind == "additive" {
                            s += mv;
                        } else if mv == 0.0 {
                            continue;
                        }
                    }
                    scores.push((j, s));
                }
                for e in 0..c.dv {
                    if scores.is_empty() {
                        out.push(f64::NAN);
                        continue;
                    }
                    let m = scores.iter().map(|s| s.1).fold(f64::MIN, f64::max);
                    let z: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                    out.push(
                        scores
                            .iter()
                            .map(|&(j, s)| (s - m).exp() / z * x.v.at(&[b, kv, j, e]))
                            .sum(),
                    );
                }
            }
        }
    }
    Tensor::f32(vec![c.b, c.h, c.sq, c.dv], out)
}

/// A graph around the attention: a param, an assign, unnamed nodes before and after (their
/// generated names must survive expansion), several outputs.
fn graph(c: &Case, x: &Inputs) -> (Graph, HashMap<String, Tensor>) {
    let mut g = Graph::new("attn");
    let mut feed = HashMap::new();
    let mut add = |g: &mut Graph, name: &str, t: &Tensor| {
        feed.insert(name.to_string(), t.clone());
        g.add_input(name, t.ty.clone()).unwrap()
    };
    let q = add(&mut g, "q", &x.q);
    let k = add(&mut g, "k", &x.k);
    let v = add(&mut g, "v", &x.v);
    let mut ops = vec![q, k, v];
    if let Some(m) = &x.mask {
        ops.push(add(&mut g, "mask", m));
    }
    let vs = g.add(Op::Neg, &[ops[2]], Attrs::new()).unwrap();
    ops[2] = g.add(Op::Neg, &[vs], Attrs::new()).unwrap();
    let out = g
        .add_node(Op::Attention, &ops, attrs(c), Some(&["out".to_string()]))
        .unwrap()[0];
    let after = g.add(Op::Relu, &[out], Attrs::new()).unwrap();
    let total = g.add(Op::Sum, &[after], Attrs::new()).unwrap();
    let acc = g
        .add_state("acc", TensorType::f32(vec![]), Init::Full(1.5))
        .unwrap();
    let new_acc = g.add(Op::Add, &[acc, total], Attrs::new()).unwrap();
    g.add_assign(acc, new_acc).unwrap();
    g.add_output(out);
    g.add_output(after);
    g.add_output(total);
    (g, feed)
}

fn check(c: &Case, rng: &mut Rng) {
    let x = inputs(c, rng);
    let mut args = vec![x.q.clone(), x.k.clone(), x.v.clone()];
    args.extend(x.mask.clone());
    let got = run1(Op::Attention, attrs(c), &args);
    assert_close(&got, &naive(c, &x), 1e-13, c.name);

    let (g, feed) = graph(c, &x);
    let e = expand_composites(&g);
    assert!(
        e.nodes.iter().all(|n| n.op != Op::Attention),
        "{}: attention left",
        c.name
    );
    let uses_iota = e.nodes.iter().any(|n| n.op == Op::Iota);
    assert_eq!(uses_iota, c.causal || c.window > 0, "{}", c.name);
    let names = |g: &Graph| {
        g.outputs
            .iter()
            .map(|&v| g.name_of(v).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&e), names(&g), "{}", c.name);
    let none = HashMap::new();
    let (direct, expanded) = (
        evaluate(&g, &feed, &none).unwrap(),
        evaluate(&e, &feed, &none).unwrap(),
    );
    for ((n1, t1), (n2, t2)) in direct.outputs.iter().zip(&expanded.outputs) {
        assert_eq!(n1, n2);
        let diff = t1.max_abs_diff(t2);
        assert!(diff < 1e-12, "{}: output {n1} differs by {diff}", c.name);
    }
    assert_eq!(direct.assigned.len(), 1);
    assert_eq!(direct.assigned[0].0, expanded.assigned[0].0);
    assert!(direct.assigned[0].1.max_abs_diff(&expanded.assigned[0].1) < 1e-12);
}

#[test]
fn attention_and_its_expansion() {
    let mut rng = Rng::new(13);
    for c in cases() {
        check(&c, &mut rng);
    }
}

#[test]
fn fully_masked_rows_are_nan() {
    // Causal with a boolean mask that hides key 0: query 0 has no key left.
    let c = Case {
        name: "nan row",
        b: 1,
        h: 1,
        kv: 1,
        sq: 3,
        sk: 3,
        d: 2,
        dv: 2,
        causal: true,
        ..BASE
    };
    let mut rng = Rng::new(14);
    let x = inputs(&c, &mut rng);
    let mask = f(&[3], &[0.0, 1.0, 1.0]);
    let a = attrs(&c).with("mask_kind", Attr::Str("boolean".into()));
    let got = run1(Op::Attention, a, &[x.q, x.k, x.v, mask]);
    assert!(got.data[..2].iter().all(|v| v.is_nan()), "{got}");
    assert!(got.data[2..].iter().all(|v| v.is_finite()), "{got}");
}

#[test]
fn expansion_keeps_graphs_without_composites() {
    let mut g = Graph::new("plain");
    let x = g.add_input("x", TensorType::f32(vec![2, 3])).unwrap();
    let w = g
        .add_param(
            "w",
            TensorType::f32(vec![3]),
            Init::Normal {
                mean: 0.0,
                std: 1.0,
                seed: 3,
            },
        )
        .unwrap();
    let y = g.add(Op::Mul, &[x, w], Attrs::new()).unwrap();
    let s = g
        .add(Op::Sum, &[y], Attrs::new().with("axes", Attr::ints(&[-1])))
        .unwrap();
    g.add_output(s);
    assert_eq!(expand_composites(&g), g);
}

#[test]
fn rebuild_replaces_nodes_and_keeps_names() {
    use sinter_ir::expand::rebuild;
    let mut g = Graph::new("r");
    let x = g.add_input("x", TensorType::f32(vec![4])).unwrap();
    let r = g.add(Op::Relu, &[x], Attrs::new()).unwrap(); // generated name `_1`
    let n = g.add(Op::Neg, &[r], Attrs::new()).unwrap(); // `_2`
    g.add_output(r);
    g.add_output(n);
    let lowered = rebuild(&g, |rb, node, inputs| {
        if node.op != Op::Relu {
            return Ok(None);
        }
        let zero = rb.constant(0.0)?;
        Ok(Some(vec![rb.add(
            Op::Maximum,
            &[inputs[0], zero],
            Attrs::new(),
        )?]))
    })
    .unwrap();
    assert!(lowered.nodes.iter().all(|n| n.op != Op::Relu));
    let names = |g: &Graph| {
        g.outputs
            .iter()
            .map(|&v| g.name_of(v).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&lowered), ["_1", "_2"]);
    let feed = HashMap::from([("x".to_string(), f(&[4], &[-1.0, 2.0, -3.0, 4.0]))]);
    let a = evaluate(&g, &feed, &HashMap::new()).unwrap();
    let b = evaluate(&lowered, &feed, &HashMap::new()).unwrap();
    for (x, y) in a.outputs.iter().zip(&b.outputs) {
        assert_eq!(x, y);
    }
}
