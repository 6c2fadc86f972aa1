//! Every bundled example compiled with the e-graph optimizer and without it (`--no-opt`) runs on
//! the GPU to the same outputs and the same updated params and states, on the same inputs, over
//! two steps; and the optimized artifact has fewer dispatches. Training steps through attention
//! run to the same values with the flash kernels the optimizer finds and without them.

use sinter_compiler::Options;
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;
use sinter_tests::{random_inputs, relative_error};

fn examples() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../ir-spec/examples");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("examples")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".sir").map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Named tensors, in order.
type Named = Vec<(String, HostTensor)>;

/// Runs two steps; returns the dispatch count, the last outputs and every param and state after.
fn run(
    graph: &sinter_ir::Graph,
    options: &Options,
    feeds: &[(&str, &HostTensor)],
) -> (usize, Named, Named) {
    let artifact = sinter_compiler::compile(graph, options)
        .unwrap_or_else(|e| panic!("compile: {e}"))
        .artifact;
    let dispatches = artifact.dispatches.len();
    let mut session = Session::load(artifact).unwrap_or_else(|e| panic!("load: {e}"));
    let outputs = session
        .run_steps(2, feeds)
        .unwrap_or_else(|e| panic!("run: {e}"));
    let weights = session.weights().expect("weights");
    (dispatches, outputs.into_vec(), weights)
}

#[test]
fn optimized_artifacts_compute_what_unoptimized_ones_do() {
    for name in examples() {
        let src = sinter_tests::example_source(&name);
        let graph = sinter_ir::text::parse(&src).expect("valid example");
        let classes = 10; // a valid label, token and class for every example
        let inputs = random_inputs(&graph, 3, classes, &[]);
        let host: Vec<(String, HostTensor)> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
            .collect();
        let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (fused, out_opt, w_opt) = run(&graph, &Options::default(), &feeds);
        let plain_options = Options {
            optimize: false,
            ..Options::default()
        };
        let (plain, out_plain, w_plain) = run(&graph, &plain_options, &feeds);
        assert!(
            fused < plain,
            "{name}: {fused} dispatches optimized, {plain} without"
        );
        for ((n, a), (_, b)) in out_opt
            .iter()
            .chain(&w_opt)
            .zip(out_plain.iter().chain(&w_plain))
        {
            let err = relative_error(&a.to_interp().data, &b.to_interp().data);
            assert!(err < 2e-4, "{name}: `{n}` differs by {err:e}");
        }
    }
}

#[test]
fn flash_attention_trains_like_the_unfused_products() {
    // a causal self-attention layer with a padding mask, [B, S, H, D] as models store it;
    // ragged lengths (33 queries, 40 keys) cover partial blocks
    let src = "graph t {
  input x: f32[2, 33, 2, 16]
  input pad: i32[2, 1, 1, 40]
  param ky: f32[2, 40, 2, 16] = normal(std=0.5, seed=1)
  param vy: f32[2, 40, 2, 8] = normal(seed=2)
  param wq: f32[16, 16] = normal(std=0.3, seed=3)
  q = permute(matmul(x, wq), perm=[0, 2, 1, 3])
  k = permute(ky, perm=[0, 2, 1, 3])
  v = permute(vy, perm=[0, 2, 1, 3])
  a = attention(q, k, v, pad, causal=true)
  loss = mean(mul(a, a))
  train loss with sgd(lr=0.5)
  output loss, a
}
";
    // the last keys of each sequence are padding
    let pad = sinter_ir::interp::Tensor::i32(
        vec![2, 1, 1, 40],
        (0..80)
            .map(|i| i64::from(i % 40 < 36 - 3 * (i / 40)))
            .collect(),
    );
    flash_trains_like_unfused(src, &[("pad", pad)]);
}

#[test]
fn multi_query_flash_attention_trains_like_the_unfused_products() {
    // one key/value head for three query heads, written by hand (matmul broadcasts the head
    // axis): the dK/dV kernel gives one gradient per query head and the graph sums them
    let by_hand = "matmul(softmax(mul(matmul(q, transpose(k, dim0=2, dim1=3)), 0.25), axis=3), v)";
    flash_trains_like_unfused(&query_heads_layer(3, 1, by_hand), &[]);
}

#[test]
fn grouped_query_flash_attention_trains_like_the_unfused_products() {
    // the composite with two key/value heads for four query heads: k and v read broadcast
    // over each group by every flash kernel
    let src = query_heads_layer(4, 2, "attention(q, k, v, causal=true)");
    flash_trains_like_unfused(&src, &[]);
}

/// A training step through `attention` (an expression of `q`, `k`, `v`) with `heads` query
/// heads projected from the input and `kv_heads` key/value heads as params.
fn query_heads_layer(heads: usize, kv_heads: usize, attention: &str) -> String {
    format!(
        "graph t {{
  input x: f32[2, 33, {heads}, 16]
  param ky: f32[2, 40, {kv_heads}, 16] = normal(std=0.5, seed=1)
  param vy: f32[2, 40, {kv_heads}, 8] = normal(seed=2)
  param wq: f32[16, 16] = normal(std=0.3, seed=3)
  q = permute(matmul(x, wq), perm=[0, 2, 1, 3])
  k = permute(ky, perm=[0, 2, 1, 3])
  v = permute(vy, perm=[0, 2, 1, 3])
  a = {attention}
  loss = mean(mul(a, a))
  train loss with sgd(lr=0.5)
  output loss, a
}}
"
    )
}

/// One training step of `src` under `--attention flash` and `--attention unfused`: the same
/// outputs and updated weights, and all three flash kernels in the first.
fn flash_trains_like_unfused(src: &str, given: &[(&str, sinter_ir::interp::Tensor)]) {
    use sinter_compiler::optimize::AttentionPolicy;
    let graph = sinter_ir::text::parse(src).expect("valid program");
    let inputs = random_inputs(&graph, 5, 2, given);
    let host: Vec<(String, HostTensor)> = inputs
        .iter()
        .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
        .collect();
    let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let with = |attention| Options {
        attention,
        ..Options::default()
    };
    let (_, out_flash, w_flash) = run(&graph, &with(AttentionPolicy::Flash), &feeds);
    let (_, out_plain, w_plain) = run(&graph, &with(AttentionPolicy::Unfused), &feeds);
    for ((n, a), (_, b)) in out_flash
        .iter()
        .chain(&w_flash)
        .zip(out_plain.iter().chain(&w_plain))
    {
        let err = relative_error(&a.to_interp().data, &b.to_interp().data);
        assert!(err < 1e-4, "`{n}` differs by {err:e}");
    }
    let artifact = sinter_compiler::compile(&graph, &with(AttentionPolicy::Flash))
        .expect("compiles")
        .artifact;
    let flash = artifact
        .kernels
        .iter()
        .filter(|k| k.pattern.starts_with("flash_attention"))
        .count();
    assert_eq!(flash, 3, "forward, dQ and dK/dV kernels");
    // only the flash kernels drop naga's index clamping (and ran so above)
    for k in &artifact.kernels {
        assert_eq!(
            k.indices_in_range,
            k.pattern.starts_with("flash_attention"),
            "{}",
            k.name
        );
    }
}
