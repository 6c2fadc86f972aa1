//! `train LOSS with OPT(...)` end to end through autodiff and the reference interpreter: a
//! linear regression trained for 50 steps, one AdamW step against a hand-computed update, and
//! global-norm clipping on a large gradient.

use std::collections::HashMap;

use sinter_compiler::autodiff::differentiate;
use sinter_ir::graph::{Graph, ValueDef};
use sinter_ir::init::initial_value;
use sinter_ir::interp::{Evaluation, Tensor, evaluate};
use sinter_ir::text::parse;

const N: usize = 32;
const TRUE_W: [f64; 3] = [1.5, -2.0, 0.75];
const TRUE_B: f64 = 0.5;

/// `y = x·w + b` regression on `N` samples; `train` is the training statement.
fn regression(train: &str) -> String {
    format!(
        "graph regression {{
  input  x: f32[{N}, 3]
  input  y: f32[{N}, 1]
  param  w: f32[3, 1] = normal(std=0.1, seed=5)
  param  b: f32[1] = zeros
  pred = add(matmul(x, w), b)
  loss = mse_loss(pred, y)
  {train}
  output loss
}}
"
    )
}

/// Parses and differentiates.
fn compile(src: &str) -> Graph {
    let g = match parse(src) {
        Ok(g) => g,
        Err(d) => panic!("{}", d.render("train.sir", src)),
    };
    let d = differentiate(&g).expect("autodiff");
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    d.graph
}

/// A deterministic data set: `x` in [-1, 1), `y = x·TRUE_W + TRUE_B` scaled by `scale`.
fn data(scale: f64) -> HashMap<String, Tensor> {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let x: Vec<f64> = (0..N * 3).map(|_| next()).collect();
    let y: Vec<f64> = (0..N)
        .map(|i| scale * ((0..3).map(|j| x[i * 3 + j] * TRUE_W[j]).sum::<f64>() + TRUE_B))
        .collect();
    HashMap::from([
        ("x".to_string(), Tensor::f32(vec![N, 3], x)),
        ("y".to_string(), Tensor::f32(vec![N, 1], y)),
    ])
}

/// One run; the assigned values become the next run's params and states.
fn step(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    state: &mut HashMap<String, Tensor>,
) -> Evaluation {
    let run = evaluate(g, inputs, state).expect("evaluate");
    state.extend(run.assigned.iter().cloned());
    run
}

fn loss(run: &Evaluation) -> f64 {
    run.output("loss").unwrap().data[0]
}

/// The initial value of a param.
fn initial(g: &Graph, name: &str) -> Vec<f64> {
    let v = g.value(g.lookup(name).unwrap());
    let ValueDef::Param(init) = &v.def else {
        panic!("`{name}` is not a param")
    };
    initial_value(&v.ty, init).data
}

/// d mse_loss / d w and d b for the regression at `w`, `b`, in f64.
fn gradients(inputs: &HashMap<String, Tensor>, w: &[f64], b: f64) -> (Vec<f64>, f64) {
    let (x, y) = (&inputs["x"].data, &inputs["y"].data);
    let mut dw = vec![0.0; 3];
    let mut db = 0.0;
    for i in 0..N {
        let pred = (0..3).map(|j| x[i * 3 + j] * w[j]).sum::<f64>() + b;
        let d = 2.0 * (pred - y[i]) / N as f64;
        for j in 0..3 {
            dw[j] += d * x[i * 3 + j];
        }
        db += d;
    }
    (dw, db)
}

fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= tol * (1.0 + e.abs()),
            "{what}[{i}]: got {a}, expected {e}"
        );
    }
}

#[test]
fn adamw_fits_a_linear_regression() {
    let g = compile(&regression(
        "train loss with adamw(lr=0.1, weight_decay=0.0)",
    ));
    let inputs = data(1.0);
    let mut state = HashMap::new();
    let first = loss(&step(&g, &inputs, &mut state));
    let mut last = first;
    for _ in 1..50 {
        last = loss(&step(&g, &inputs, &mut state));
    }
    assert!(
        last < 0.01 * first,
        "loss went from {first} to {last} in 50 steps"
    );
    assert_eq!(state["train.step"].data, [50.0]);
    assert_close(&state["w"].data, &TRUE_W, 0.1, "w");
}

#[test]
fn sgd_with_momentum_and_clipping_fits_too() {
    let g = compile(&regression(
        "train loss with sgd(lr=0.1, momentum=0.9, clip_norm=1.0)",
    ));
    let inputs = data(1.0);
    let mut state = HashMap::new();
    let first = loss(&step(&g, &inputs, &mut state));
    let mut last = first;
    for _ in 1..50 {
        last = loss(&step(&g, &inputs, &mut state));
    }
    assert!(last < 0.01 * first, "loss went from {first} to {last}");
}

#[test]
fn one_adamw_step_matches_the_formula() {
    let (lr, wd, b1, b2, eps) = (0.01, 0.1, 0.8, 0.99, 1e-6);
    let g = compile(&regression(&format!(
        "train loss with adamw(lr={lr}, weight_decay={wd}, beta1={b1}, beta2={b2}, eps={eps})"
    )));
    let inputs = data(1.0);
    let mut state = HashMap::new();
    let run = step(&g, &inputs, &mut state);
    let (w0, b0) = (initial(&g, "w"), initial(&g, "b"));
    let (dw, db) = gradients(&inputs, &w0, b0[0]);
    // torch.optim.AdamW at t = 1 from zero moments.
    let update = |p: f64, grad: f64| {
        let m = (1.0 - b1) * grad;
        let v = (1.0 - b2) * grad * grad;
        let (m_hat, v_hat) = (m / (1.0 - b1), v / (1.0 - b2));
        p * (1.0 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps)
    };
    let w1: Vec<f64> = (0..3).map(|j| update(w0[j], dw[j])).collect();
    assert_close(&state["w"].data, &w1, 1e-12, "w");
    assert_close(&state["b"].data, &[update(b0[0], db)], 1e-12, "b");
    let m: Vec<f64> = dw.iter().map(|g| (1.0 - b1) * g).collect();
    assert_close(&state["w.m"].data, &m, 1e-12, "w.m");
    let v: Vec<f64> = dw.iter().map(|g| (1.0 - b2) * g * g).collect();
    assert_close(&state["w.v"].data, &v, 1e-12, "w.v");
    assert_eq!(state["train.step"].data, [1.0]);
    assert!(loss(&run) > 0.0);
}

#[test]
fn clip_norm_clips_large_gradients() {
    let lr = 0.01;
    let plain = compile(&regression(&format!("train loss with sgd(lr={lr})")));
    let clipped = compile(&regression(&format!(
        "train loss with sgd(lr={lr}, clip_norm=1.0)\n  output train.grad_norm"
    )));
    let inputs = data(1000.0); // targets ×1000: the gradient's norm is in the thousands
    let (w0, b0) = (initial(&plain, "w"), initial(&plain, "b"));
    let (dw, db) = gradients(&inputs, &w0, b0[0]);
    let norm = (dw.iter().map(|g| g * g).sum::<f64>() + db * db).sqrt();
    assert!(norm > 100.0, "{norm}");

    let mut s_plain = HashMap::new();
    step(&plain, &inputs, &mut s_plain);
    let mut s_clip = HashMap::new();
    let run = step(&clipped, &inputs, &mut s_clip);
    assert_close(
        &run.output("train.grad_norm").unwrap().data,
        &[norm],
        1e-12,
        "norm",
    );

    let delta = |s: &HashMap<String, Tensor>| -> Vec<f64> {
        let mut d: Vec<f64> = (0..3).map(|j| s["w"].data[j] - w0[j]).collect();
        d.push(s["b"].data[0] - b0[0]);
        d
    };
    let (d_plain, d_clip) = (delta(&s_plain), delta(&s_clip));
    let scale = 1.0 / (norm + 1e-6);
    // Without clipping the step is lr·g; with it, lr·g scaled to a global norm of 1.
    let expected_plain: Vec<f64> = dw.iter().chain([&db]).map(|g| -lr * g).collect();
    assert_close(&d_plain, &expected_plain, 1e-10, "unclipped step");
    let expected_clip: Vec<f64> = expected_plain.iter().map(|d| d * scale).collect();
    assert_close(&d_clip, &expected_clip, 1e-10, "clipped step");
    let step_norm = d_clip.iter().map(|d| d * d).sum::<f64>().sqrt();
    assert!(
        (step_norm - lr).abs() < 1e-8,
        "clipped step norm {step_norm}"
    );

    // A gradient already below clip_norm is left alone.
    let small = data(1.0);
    let loose = compile(&regression(&format!(
        "train loss with sgd(lr={lr}, clip_norm=1000.0)"
    )));
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    step(&plain, &small, &mut a);
    step(&loose, &small, &mut b);
    assert_close(&a["w"].data, &b["w"].data, 1e-12, "w below the threshold");
}

#[test]
fn accumulating_two_half_batches_is_one_full_batch_step() {
    // accumulate=2 on the two halves of the data applies the mean of their gradients, which
    // for a mean loss over equal halves is the full batch's gradient: two updates from four
    // runs equal two full-batch updates (AdamW with a warmup, clipping and no_decay too)
    let train = "schedule=\"cosine\", warmup=1, total_steps=4, clip_norm=0.5, no_decay=\"1d\"";
    let full = compile(&regression(&format!(
        "train loss with adamw(lr=0.05, weight_decay=0.1, {train})"
    )));
    let half_src = regression(&format!(
        "train loss with adamw(lr=0.05, weight_decay=0.1, accumulate=2, {train})"
    ))
    .replace(&format!("[{N}, "), &format!("[{}, ", N / 2));
    let halves = compile(&half_src);
    let inputs = data(1.0);
    let half = |part: usize| -> HashMap<String, Tensor> {
        inputs
            .iter()
            .map(|(name, t)| {
                let cols = t.shape()[1];
                let rows = N / 2;
                let data = t.data[part * rows * cols..(part + 1) * rows * cols].to_vec();
                (name.clone(), Tensor::f32(vec![rows, cols], data))
            })
            .collect()
    };
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    for _ in 0..2 {
        step(&full, &inputs, &mut a);
        step(&halves, &half(0), &mut b);
        step(&halves, &half(1), &mut b);
    }
    for name in ["w", "b", "w.m", "w.v", "train.step"] {
        assert_close(&b[name].data, &a[name].data, 1e-12, name);
    }
    // the sums start again from zero and the micro-batch counter from 0
    assert!(b["w.grad.sum"].data.iter().all(|&v| v == 0.0));
    assert_eq!(b["train.micro"].data, [0.0]);
    assert_eq!(b["train.step"].data, [2.0]);
}
