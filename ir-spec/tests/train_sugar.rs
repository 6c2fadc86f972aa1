//! `train LOSS with OPT(...)`: the structure of its expansion, its round trip through the
//! printer, and the optimizer math of the expanded graph.
//!
//! The interpreter cannot evaluate `grad` (autodiff lives in the compiler), so the math is
//! checked on graphs whose loss is linear in each param, `loss = Σ_p sum(mul(p, g_p))` with
//! `g_p` an input: d loss / d p is exactly `g_p`, and the `grad` node is replaced by copies of
//! the inputs with [`rebuild`]. `compiler/tests/train_sugar.rs` runs real training through
//! autodiff.

use sinter_ir::key;
use std::collections::HashMap;

use sinter_ir::expand::rebuild;
use sinter_ir::graph::{Graph, Init, ValueDef};
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::text::{parse, print};
use sinter_ir::{Attrs, Op, TensorType};

fn parses(src: &str) -> Graph {
    match parse(src) {
        Ok(g) => g,
        Err(d) => panic!("{}", d.render("train.sir", src)),
    }
}

/// The node that computes the value named `name`.
fn producer<'g>(g: &'g Graph, name: &str) -> &'g sinter_ir::Node {
    let v = g
        .lookup(name)
        .unwrap_or_else(|| panic!("no value `{name}`"));
    g.node(
        g.producer(v)
            .unwrap_or_else(|| panic!("`{name}` is not computed")),
    )
}

/// `(target, source)` names of every assign.
fn assigns(g: &Graph) -> Vec<(String, String)> {
    g.assigns
        .iter()
        .map(|a| (g.name_of(a.target).into(), g.name_of(a.source).into()))
        .collect()
}

fn names(g: &Graph, ids: &[sinter_ir::ValueId]) -> Vec<String> {
    ids.iter().map(|&v| g.name_of(v).to_string()).collect()
}

/// A program with params `w: f32[2, 3]` and `b: f32[3]` whose loss has gradients `gw`, `gb`.
fn linear(train: &str) -> String {
    format!(
        "graph lin {{
  input  gw: f32[2, 3]
  input  gb: f32[3]
  param  w: f32[2, 3] = normal(std=0.5, seed=3)
  param  b: f32[3] = full(0.25)
  loss = add(sum(mul(w, gw)), sum(mul(b, gb)))
  {train}
  output loss
}}
"
    )
}

#[test]
fn adamw_expansion() {
    let g = parses(&linear("train loss with adamw(lr=0.01, weight_decay=0.1)"));
    // States: zeros, the param's shape; one scalar step counter.
    for (name, shape) in [
        ("w.m", vec![2, 3]),
        ("w.v", vec![2, 3]),
        ("b.m", vec![3]),
        ("b.v", vec![3]),
        ("train.step", vec![]),
    ] {
        let v = g.value(g.lookup(name).unwrap());
        assert_eq!(v.ty, TensorType::f32(shape), "{name}");
        assert_eq!(v.def, ValueDef::State(Init::Zeros), "{name}");
    }
    // One grad node over every param, in declaration order.
    let grads: Vec<_> = g.nodes.iter().filter(|n| n.op == Op::Grad).collect();
    assert_eq!(grads.len(), 1);
    assert_eq!(names(&g, &grads[0].inputs), ["loss", "w", "b"]);
    assert_eq!(names(&g, &grads[0].outputs), ["w.grad", "b.grad"]);
    // The step counter: t = step + 1.
    let t = producer(&g, "train.step.next");
    assert_eq!(t.op, Op::Add);
    assert_eq!(g.name_of(t.inputs[0]), "train.step");
    assert_eq!(g.node(g.producer(t.inputs[1]).unwrap()).op, Op::Constant);
    // One update per param with the given attributes and the defaults filled in.
    let upd = producer(&g, "w.next");
    assert_eq!(upd.op, Op::AdamW);
    assert_eq!(
        names(&g, &upd.inputs),
        [
            "w",
            "w.grad",
            "w.m",
            "w.v",
            "train.step.next",
            "train.lr",
            "train.bias_corrections"
        ]
    );
    assert_eq!(names(&g, &upd.outputs), ["w.next", "w.m.next", "w.v.next"]);
    // the rate is an operand (a constant without a schedule), the corrections a table's row
    let lr = producer(&g, "train.lr");
    assert_eq!((lr.op, lr.attrs.of(key::VALUE)), (Op::Constant, 0.01));
    let table = g.value(g.lookup("train.bias_table").unwrap());
    assert_eq!(
        table.def,
        ValueDef::State(Init::BiasCorrections {
            beta1: 0.9,
            beta2: 0.999
        })
    );
    assert_eq!(producer(&g, "train.bias_corrections").op, Op::Embedding);
    assert_eq!(upd.attrs.of(key::WEIGHT_DECAY), 0.1);
    assert_eq!(upd.attrs.of(key::BETA2), 0.999);
    assert_eq!(
        assigns(&g),
        [
            ("w", "w.next"),
            ("w.m", "w.m.next"),
            ("w.v", "w.v.next"),
            ("b", "b.next"),
            ("b.m", "b.m.next"),
            ("b.v", "b.v.next"),
            ("train.step", "train.step.next"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

#[test]
fn sgd_expansions() {
    let plain = parses(&linear("train loss with sgd(lr=0.1)"));
    assert_eq!(plain.states().count(), 0);
    assert_eq!(producer(&plain, "w.next").outputs.len(), 1);
    assert_eq!(
        assigns(&plain),
        [("w", "w.next"), ("b", "b.next")].map(|(a, b)| (a.to_string(), b.to_string()))
    );

    let momentum = parses(&linear(
        "train loss with sgd(lr=0.1, momentum=0.9, nesterov=true)",
    ));
    let buf = momentum.value(momentum.lookup("w.momentum_buf").unwrap());
    assert_eq!(buf.ty, TensorType::f32(vec![2, 3]));
    assert_eq!(buf.def, ValueDef::State(Init::Zeros));
    assert!(momentum.lookup("train.step").is_none());
    let upd = producer(&momentum, "b.next");
    assert_eq!(
        names(&momentum, &upd.inputs),
        ["b", "b.grad", "b.momentum_buf"]
    );
    assert!(upd.attrs.of(key::NESTEROV));
    assert!(assigns(&momentum).contains(&("b.momentum_buf".into(), "b.momentum_buf.next".into())));
}

#[test]
fn params_restricts_and_orders() {
    let g = parses(&linear("train loss with adam(params=[b])"));
    assert!(g.lookup("w.m").is_none() && g.lookup("w.next").is_none());
    let grad = g.nodes.iter().find(|n| n.op == Op::Grad).unwrap();
    assert_eq!(names(&g, &grad.inputs), ["loss", "b"]);
    assert_eq!(assigns(&g).len(), 4);
    // Later params are not trained by default; listed ones go in the listed order.
    let g = parses(
        "graph g {
  param a: f32[2] = ones
  loss = sum(square(a))
  param later: f32[2] = ones
  train loss with sgd(lr=1, params=[later, a])
}",
    );
    let grad = g.nodes.iter().find(|n| n.op == Op::Grad).unwrap();
    assert_eq!(names(&g, &grad.inputs), ["loss", "later", "a"]);
    let g = parses(
        "graph g {\n  param a: f32[2] = ones\n  loss = sum(a)\n  train loss with sgd(lr=1)\n  param later: f32[2] = ones\n}",
    );
    assert!(g.lookup("later.next").is_none());
}

#[test]
fn clipping_expansion() {
    let g = parses(&linear("train loss with sgd(lr=0.1, clip_norm=0.5)"));
    assert_eq!(producer(&g, "train.grad_norm").op, Op::Sqrt);
    assert_eq!(producer(&g, "train.clip_scale").op, Op::Minimum);
    let clipped = producer(&g, "w.grad.clipped");
    assert_eq!(names(&g, &clipped.inputs), ["w.grad", "train.clip_scale"]);
    assert_eq!(
        g.name_of(producer(&g, "w.next").inputs[1]),
        "w.grad.clipped"
    );
}

#[test]
fn generated_values_can_be_used_later() {
    let g = parses(&linear(
        "train loss with adamw(clip_norm=1)\n  output train.grad_norm, w.grad, train.step",
    ));
    assert_eq!(
        names(&g, &g.outputs),
        ["train.grad_norm", "w.grad", "train.step", "loss"]
    );
}

#[test]
fn printed_form_is_explicit_and_round_trips() {
    let cases = [
        linear("train loss with adamw(lr=0.01, weight_decay=0.1)"),
        linear("train loss with adam(lr=3e-4, beta2=0.95, clip_norm=1.0, params=[w])"),
        linear("train loss with sgd(lr=0.1)"),
        linear("train loss with sgd(lr=0.1, momentum=0.9, dampening=0.1, clip_norm=2)"),
        "graph s {\n  param x: f32[] = full(3)\n  train x with sgd(lr=0.5, clip_norm=1)\n}\n"
            .to_string(),
    ];
    for src in cases {
        let g = parses(&src);
        let text = print(&g);
        assert!(!text.contains("train loss"), "{text}");
        assert!(text.contains(" = grad("), "{text}");
        assert_eq!(parse(&text).as_ref(), Ok(&g), "{text}");
        assert_eq!(print(&parse(&text).unwrap()), text);
    }
    // The exact printed form of one expansion.
    let text = print(&parses(&linear(
        "train loss with adamw(lr=0.01, clip_norm=1.0)",
    )));
    let expected = "\
  state  w.m: f32[2, 3] = zeros
  state  w.v: f32[2, 3] = zeros
  state  b.m: f32[3] = zeros
  state  b.v: f32[3] = zeros
  state  train.step: f32[] = zeros
  state  train.bias_table: f32[17322, 2] = bias_corrections(beta1=0.9, beta2=0.999)
  w.grad, b.grad = grad(loss, w, b)
  train.grad_norm = sqrt(add(sum(square(w.grad), axes=[0, 1]), sum(square(b.grad), axes=[0])))
  train.clip_scale = minimum(div(1.0, add(train.grad_norm, 1e-6)), 1.0)
  w.grad.clipped = mul(w.grad, train.clip_scale)
  b.grad.clipped = mul(b.grad, train.clip_scale)
  train.step.next = add(train.step, 1.0)
  train.lr = constant(value=0.01)
  train.bias_corrections = embedding(train.bias_table, cast(maximum(minimum(train.step.next, 17321.0), 0.0), dtype=\"i32\"))
  w.next, w.m.next, w.v.next = adamw(w, w.grad.clipped, w.m, w.v, train.step.next, train.lr, train.bias_corrections)
  b.next, b.m.next, b.v.next = adamw(b, b.grad.clipped, b.m, b.v, train.step.next, train.lr, train.bias_corrections)
  assign w = w.next
  assign w.m = w.m.next
  assign w.v = w.v.next
  assign b = b.next
  assign b.m = b.m.next
  assign b.v = b.v.next
  assign train.step = train.step.next
";
    assert!(text.contains(expected), "{text}");
}

// The optimizer math, with the gradients supplied by hand.

/// `g` with its `grad` node replaced by copies of the inputs `g{param}` (the exact gradients of
/// [`linear`]'s loss), so that the interpreter can run it.
fn with_hand_gradients(g: &Graph) -> Graph {
    rebuild(g, |rb, node, inputs| {
        if node.op != Op::Grad {
            return Ok(None);
        }
        let mut grads = Vec::new();
        for &p in &inputs[1..] {
            let source = rb
                .old
                .lookup(&format!("g{}", rb.graph().name_of(p)))
                .unwrap();
            let source = rb.mapped(source);
            let one = rb.constant(1.0)?;
            grads.push(rb.add(Op::Mul, &[source, one], Attrs::new())?);
        }
        Ok(Some(grads))
    })
    .unwrap()
}

/// Runs `steps` steps of the expanded program, feeding the assigned values back, with the
/// gradient inputs `gw`, `gb` fixed; returns the params and states after the last step.
fn train(src: &str, gw: &Tensor, gb: &Tensor, steps: usize) -> HashMap<String, Tensor> {
    let g = with_hand_gradients(&parses(src));
    let inputs = HashMap::from([
        ("gw".to_string(), gw.clone()),
        ("gb".to_string(), gb.clone()),
    ]);
    let mut persistent = HashMap::new();
    for _ in 0..steps {
        let run = evaluate(&g, &inputs, &persistent).unwrap();
        persistent.extend(run.assigned);
    }
    persistent
}

fn initial(name: &str) -> Vec<f64> {
    let g = parses(&linear(""));
    let v = g.value(g.lookup(name).unwrap());
    let ValueDef::Param(init) = &v.def else {
        unreachable!()
    };
    sinter_ir::init::initial_value(&v.ty, init).data
}

fn gradients() -> (Tensor, Tensor) {
    let gw = Tensor::f32(vec![2, 3], vec![0.5, -1.0, 2.0, 0.0, 3.0, -0.25]);
    let gb = Tensor::f32(vec![3], vec![1.5, -0.5, 0.125]);
    (gw, gb)
}

fn assert_close(actual: &[f64], expected: &[f64], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= 1e-12 * (1.0 + e.abs()),
            "{what}[{i}]: got {a}, expected {e}"
        );
    }
}

/// torch.optim.AdamW, step by step, on one param with a constant gradient.
fn adamw_reference(p: &[f64], g: &[f64], lr: f64, wd: f64, steps: usize) -> (Vec<f64>, Vec<f64>) {
    let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
    let mut p = p.to_vec();
    let mut m = vec![0.0; p.len()];
    let mut v = vec![0.0; p.len()];
    for t in 1..=steps {
        for i in 0..p.len() {
            p[i] *= 1.0 - lr * wd;
            m[i] = b1 * m[i] + (1.0 - b1) * g[i];
            v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
            let m_hat = m[i] / (1.0 - b1.powi(t as i32));
            let v_hat = v[i] / (1.0 - b2.powi(t as i32));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
    }
    (p, m)
}

#[test]
fn adamw_steps_match_torch() {
    let (gw, gb) = gradients();
    let src = linear("train loss with adamw(lr=0.01, weight_decay=0.1)");
    let after = train(&src, &gw, &gb, 3);
    let (w, wm) = adamw_reference(&initial("w"), &gw.data, 0.01, 0.1, 3);
    let (b, _) = adamw_reference(&initial("b"), &gb.data, 0.01, 0.1, 3);
    assert_close(&after["w"].data, &w, "w");
    assert_close(&after["w.m"].data, &wm, "w.m");
    assert_close(&after["b"].data, &b, "b");
    assert_eq!(after["train.step"].data, [3.0]);
}

#[test]
fn sgd_momentum_steps_match_torch() {
    let (gw, gb) = gradients();
    let src = linear("train loss with sgd(lr=0.1, momentum=0.9)");
    let after = train(&src, &gw, &gb, 2);
    // torch: buf = g on the first step, then buf = 0.9·buf + g; p -= lr·buf.
    let w0 = initial("w");
    let expected: Vec<f64> = (0..6)
        .map(|i| w0[i] - 0.1 * gw.data[i] - 0.1 * (0.9 * gw.data[i] + gw.data[i]))
        .collect();
    assert_close(&after["w"].data, &expected, "w");
    let buf: Vec<f64> = gw.data.iter().map(|g| 1.9 * g).collect();
    assert_close(&after["w.momentum_buf"].data, &buf, "w.momentum_buf");
}

#[test]
fn clipping_scales_by_the_global_norm() {
    let (gw, gb) = gradients();
    let norm = gw
        .data
        .iter()
        .chain(&gb.data)
        .map(|g| g * g)
        .sum::<f64>()
        .sqrt();
    assert!(norm > 3.0);
    for clip in [1.0, 2.5, 100.0] {
        let src = linear(&format!(
            "train loss with sgd(lr=0.5, clip_norm={clip})\n  output train.grad_norm, train.clip_scale"
        ));
        let g = with_hand_gradients(&parses(&src));
        let inputs = HashMap::from([
            ("gw".to_string(), gw.clone()),
            ("gb".to_string(), gb.clone()),
        ]);
        let run = evaluate(&g, &inputs, &HashMap::new()).unwrap();
        let scale = (clip / (norm + 1e-6)).min(1.0);
        assert_close(
            &run.output("train.grad_norm").unwrap().data,
            &[norm],
            "norm",
        );
        assert_close(
            &run.output("train.clip_scale").unwrap().data,
            &[scale],
            "scale",
        );
        let w0 = initial("w");
        let expected: Vec<f64> = (0..6).map(|i| w0[i] - 0.5 * scale * gw.data[i]).collect();
        let new_w = &run.assigned.iter().find(|(n, _)| n == "w").unwrap().1;
        assert_close(&new_w.data, &expected, &format!("w with clip_norm={clip}"));
        // The clipped gradients' global norm is min(norm, clip) (up to the 1e-6).
        let clipped_norm = norm * scale;
        assert!(
            (clipped_norm - norm.min(clip)).abs() < 1e-5,
            "{clipped_norm}"
        );
    }
}

#[test]
fn builder_api() {
    use sinter_ir::train::{Optimizer, TrainError, TrainSpec, add_training};
    let mut g = Graph::new("api");
    let w = g
        .add_param("w", TensorType::f32(vec![4]), Init::Ones)
        .unwrap();
    let x = g.add_input("x", TensorType::f32(vec![4])).unwrap();
    let prod = g.add(Op::Mul, &[w, x], Attrs::new()).unwrap();
    let loss = g.add(Op::Sum, &[prod], Attrs::new()).unwrap();
    let mut spec = TrainSpec::new(Optimizer::Adam, Attrs::new());
    spec.params = Some(vec![x]);
    assert_eq!(
        add_training(&mut g, loss, &spec),
        Err(TrainError::NotAParam {
            index: 0,
            name: "x".into()
        })
    );
    assert!(matches!(
        add_training(&mut g, prod, &TrainSpec::new(Optimizer::Adam, Attrs::new())),
        Err(TrainError::LossType { .. })
    ));
    spec.params = None;
    spec.clip_norm = Some(0.0);
    assert_eq!(
        add_training(&mut g, loss, &spec),
        Err(TrainError::ClipNorm { value: 0.0 })
    );
    spec.clip_norm = Some(1.0);
    let step = add_training(&mut g, loss, &spec).unwrap();
    assert_eq!(names(&g, &step.params), ["w"]);
    assert_eq!(names(&g, &step.applied), ["w.grad.clipped"]);
    assert_eq!(
        names(&g, &step.states),
        ["w.m", "w.v", "train.step", "train.bias_table"]
    );
    assert_eq!(step.step, g.lookup("train.step"));
    // A second step over the same params would redefine its names and reassign its params.
    assert!(add_training(&mut g, loss, &spec).is_err());
}

#[test]
fn schedules_read_a_table_by_the_step() {
    // sgd with a linear decay after a warmup: the table holds the rate of every step, the
    // update takes it as its lr operand, the step counter counts
    let g = parses(&linear(
        "train loss with sgd(lr=0.1, schedule=\"linear\", warmup=2, total_steps=6, min_lr=0.02)",
    ));
    let table = g.value(g.lookup("train.lr_table").unwrap());
    assert_eq!(table.ty, TensorType::f32(vec![7, 1]));
    let ValueDef::State(init) = &table.def else {
        panic!("a state")
    };
    let rates = sinter_ir::init::initial_value(&table.ty, init).data;
    let want = [0.0, 0.05, 0.1, 0.08, 0.06, 0.04, 0.02];
    for (s, (got, want)) in rates.iter().zip(want).enumerate() {
        assert!((got - want).abs() < 1e-15, "step {s}: {got} against {want}");
    }
    let upd = producer(&g, "w.next");
    assert_eq!(names(&g, &upd.inputs), ["w", "w.grad", "train.lr"]);
    assert!(upd.attrs.get("lr").is_none());
    assert!(assigns(&g).contains(&("train.step".to_string(), "train.step.next".to_string())));
    // a cosine without its length, a floor above the rate
    for (train, message) in [
        ("schedule=\"cosine\"", "needs total_steps="),
        (
            "schedule=\"cosine\", total_steps=10, min_lr=0.5",
            "min_lr=0.5 must lie between",
        ),
        (
            "schedule=\"linear\", warmup=10, total_steps=5",
            "must pass warmup",
        ),
        (
            "schedule=\"cosinus\"",
            "\"constant\", \"linear\" or \"cosine\"",
        ),
    ] {
        let src = linear(&format!("train loss with adamw(lr=0.1, {train})"));
        let err = sinter_ir::text::parse(&src).expect_err(train);
        let text = err.render("t.sir", &src);
        assert!(text.contains(message), "{train}: {text}");
    }
}

#[test]
fn no_decay_groups() {
    // PyTorch's convention in one word: params of rank 0 or 1 do not decay
    let g = parses(&linear(
        "train loss with adamw(lr=0.01, weight_decay=0.1, no_decay=\"1d\")",
    ));
    assert_eq!(producer(&g, "w.next").attrs.of(key::WEIGHT_DECAY), 0.1);
    assert_eq!(producer(&g, "b.next").attrs.of(key::WEIGHT_DECAY), 0.0);
    // or a list of params
    let g = parses(&linear(
        "train loss with adamw(lr=0.01, weight_decay=0.1, no_decay=[w])",
    ));
    assert_eq!(producer(&g, "w.next").attrs.of(key::WEIGHT_DECAY), 0.0);
    assert_eq!(producer(&g, "b.next").attrs.of(key::WEIGHT_DECAY), 0.1);
    for (train, message) in [
        ("no_decay=\"2d\"", "`no_decay` is \"1d\""),
        ("params=[w], no_decay=[b]", "`b` in no_decay is not a param"),
    ] {
        let src = linear(&format!("train loss with adamw(lr=0.1, {train})"));
        let text = sinter_ir::text::parse(&src)
            .expect_err(train)
            .render("t.sir", &src);
        assert!(text.contains(message), "{train}: {text}");
    }
}

#[test]
fn lr_scaled_groups() {
    // the group's update is the update at the scaled rate, bit for bit: adam (whose rate is
    // a value), with and without a schedule, and sgd (whose rate is an attribute)
    let (gw, gb) = gradients();
    for (optimizer, scheduled) in [
        ("adamw(lr=0.01", ""),
        (
            "adamw(lr=0.01",
            ", schedule=\"cosine\", warmup=2, total_steps=10",
        ),
        ("sgd(lr=0.01, momentum=0.9", ""),
    ] {
        let halved = optimizer.replace("lr=0.01", "lr=0.005");
        let scaled = train(
            &linear(&format!(
                "train loss with {optimizer}{scheduled}, lr_scaled=[w], lr_scale=0.5)"
            )),
            &gw,
            &gb,
            3,
        );
        let plain = train(
            &linear(&format!("train loss with {optimizer}{scheduled})")),
            &gw,
            &gb,
            3,
        );
        let slow = train(
            &linear(&format!("train loss with {halved}{scheduled})")),
            &gw,
            &gb,
            3,
        );
        assert_eq!(scaled["w"].data, slow["w"].data, "{optimizer}{scheduled}");
        assert_eq!(scaled["b"].data, plain["b"].data, "{optimizer}{scheduled}");
        assert_ne!(scaled["w"].data, plain["w"].data, "{optimizer}{scheduled}");
    }
    for (train, message) in [
        (
            "lr_scaled=[w]",
            "`lr_scaled` names a group without its factor",
        ),
        ("lr_scale=0.5", "`lr_scale` without the params it scales"),
        (
            "lr_scaled=[w], lr_scale=0",
            "lr_scale=0 must be positive and finite",
        ),
        (
            "params=[w], lr_scaled=[b], lr_scale=0.5",
            "`b` in lr_scaled is not a param",
        ),
    ] {
        let src = linear(&format!("train loss with adamw(lr=0.1, {train})"));
        let text = sinter_ir::text::parse(&src)
            .expect_err(train)
            .render("t.sir", &src);
        assert!(text.contains(message), "{train}: {text}");
    }
}
