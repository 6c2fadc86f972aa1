//! The scalars a training step uses — the scheduled learning rate and Adam's bias corrections
//! `1 − β1ᵗ`, `1 − β2ᵗ` — are exact on the GPU: over 10,000 steps of a `train` program with a
//! warmup and a cosine decay, every value read back is the f64 value (computed here, as PyTorch
//! and Hugging Face compute it in Python floats) rounded once to f32, bit for bit. An f32 `pow`
//! on the GPU misses this (lavapipe's `pow(0.999, 1)` is 2 ulp low, `1 − β2` then 5e-5 off).

use sinter_runtime::Session;
use sinter_runtime::io::{HostTensor, TensorData};

const STEPS: u64 = 10_000;
const WARMUP: u64 = 100;
const LR: f64 = 3e-4;
const MIN_LR: f64 = 1e-5;
const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;

/// Hugging Face's `get_cosine_with_min_lr_schedule_with_warmup` at the 0-based step `s`, in
/// Python's float arithmetic.
fn cosine(s: u64) -> f64 {
    if s < WARMUP {
        return LR * s as f64 / WARMUP as f64;
    }
    let progress = (s - WARMUP) as f64 / (STEPS - WARMUP) as f64;
    let factor = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    let rate = MIN_LR / LR;
    LR * (factor * (1.0 - rate) + rate)
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    match &t.data {
        TensorData::F32(v) => v.clone(),
        TensorData::I32(_) | TensorData::F16(_) => panic!("expected f32"),
    }
}

#[test]
fn scheduled_rates_and_bias_corrections_are_exact_for_10000_steps() {
    let src = format!(
        "graph t {{
  input  x: f32[4]
  param  w: f32[4] = ones
  loss = sum(mul(w, x))
  train loss with adamw(lr={LR:?}, beta1={BETA1:?}, beta2={BETA2:?}, schedule=\"cosine\", warmup={WARMUP}, total_steps={STEPS}, min_lr={MIN_LR:?})
  output loss, train.lr, train.bias_corrections
}}
"
    );
    let graph = sinter_ir::text::parse(&src).expect("valid program");
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .expect("compiles")
        .artifact;
    let mut session = Session::load(artifact).expect("loads");
    let x = HostTensor::f32(vec![4], vec![0.5, -1.0, 2.0, 0.25]);
    let feeds = [("x", &x)];
    let mut checked = 0;
    for s in 0..STEPS {
        // every step of the warmup and of the first few hundred (where the corrections move
        // most), then a spread over the rest, and the last
        let read = s < 400 || s % 97 == 0 || s == STEPS - 1;
        let names: &[&str] = if read {
            &["train.lr", "train.bias_corrections"]
        } else {
            &[]
        };
        let out = session.run_reading(&feeds, names).expect("runs");
        if !read {
            continue;
        }
        let t = (s + 1) as f64;
        let want_lr = cosine(s) as f32;
        let want_bias = [(1.0 - BETA1.powf(t)) as f32, (1.0 - BETA2.powf(t)) as f32];
        let lr = f32s(out.get("train.lr").expect("read"))[0];
        let bias = f32s(out.get("train.bias_corrections").expect("read"));
        assert_eq!(
            lr.to_bits(),
            want_lr.to_bits(),
            "step {s}: lr {lr:e}, want {want_lr:e}"
        );
        for c in 0..2 {
            assert_eq!(
                bias[c].to_bits(),
                want_bias[c].to_bits(),
                "step {s}: 1 - beta{}^{t} = {:e}, want {:e}",
                c + 1,
                bias[c],
                want_bias[c]
            );
        }
        checked += 1;
    }
    assert!(checked > 490, "{checked} steps checked");
}
