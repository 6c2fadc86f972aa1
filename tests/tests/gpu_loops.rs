//! Loops long enough to pass Mesa's software Vulkan limit (lavapipe ends every loop of an
//! invocation once 65535 back-edges have run, all loops counted together), on every kernel whose
//! per-thread work grows with a shape: codegen must unroll or spread the work, and the runtime
//! must refuse what still does not fit instead of returning a short result.

use sinter_compiler::codegen::LOOP_BUDGET;
use sinter_compiler::matmul::{Forced, Tile};
use sinter_tests::{check_gpu, check_graph_gpu};

/// Every dispatch of `src` keeps within the budget, and the GPU agrees with the interpreter.
fn check_long(src: &str, tol: f64, int_bound: u64) {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .unwrap_or_else(|e| panic!("{e}"))
        .artifact;
    for d in &artifact.dispatches {
        let k = &artifact.kernels[d.kernel as usize];
        assert!(
            d.loop_iterations <= LOOP_BUDGET,
            "{}: {} loop iterations in {src}",
            k.name,
            d.loop_iterations
        );
    }
    check_gpu(src, tol, &[], int_bound);
}

#[test]
fn conv2d_with_a_receptive_field_of_65536() {
    // The reproducer: lavapipe returned 38836 instead of 65536 for all ones.
    check_long(
        "graph t {\n  input x: f32[1, 4096, 4, 4]\n  input w: f32[2, 4096, 4, 4]\n  y = conv2d(x, w)\n  output y\n}\n",
        1e-4,
        1,
    );
    check_long(
        "graph t {\n  input x: f32[1, 70000, 1, 1]\n  input w: f32[1, 70000, 1, 1]\n  y = conv2d(x, w)\n  output y\n}\n",
        1e-4,
        1,
    );
}

#[test]
fn conv2d_input_gradient_over_65536_terms() {
    check_long(
        "graph t {\n  input dy: f32[1, 4096, 1, 1]\n  input w: f32[4096, 1, 4, 4]\n  y = conv2d_grad_input(dy, w, input_shape=[1, 1, 4, 4])\n  output y\n}\n",
        1e-4,
        1,
    );
}

#[test]
fn pooling_a_300_by_300_window() {
    for op in ["max_pool2d", "avg_pool2d"] {
        check_long(
            &format!(
                "graph t {{\n  input x: f32[1, 2, 300, 301]\n  y = {op}(x, kernel=[300, 300], stride=1)\n  output y\n}}\n"
            ),
            1e-4,
            1,
        );
    }
}

#[test]
fn rows_of_millions_of_elements() {
    check_long(
        "graph t {\n  input x: f32[16777219]\n  y = sum(x)\n  m = max(x)\n  output y, m\n}\n",
        1e-4,
        1,
    );
    check_long(
        "graph t {\n  input x: f32[1, 6000000]\n  y = softmax(x)\n  a = argmax(x, axis=1)\n  output y, a\n}\n",
        1e-4,
        1,
    );
}

#[test]
fn embedding_gradient_over_70000_positions() {
    check_long(
        "graph t {\n  input dy: f32[70000, 2]\n  input ids: i32[70000]\n  g = embedding_grad(dy, ids, num_embeddings=3)\n  output g\n}\n",
        1e-4,
        3,
    );
}

/// Split-K, chosen for a long K over few blocks, keeps the 600000-long product of the test
/// below within the budget: 8 chunks of 75000.
#[test]
fn split_k_keeps_a_very_long_inner_dimension_within_the_budget() {
    let src = "graph t {\n  input a: f32[1, 600000]\n  input b: f32[600000, 1]\n  c = matmul(a, b)\n  output c\n}\n";
    let graph = sinter_ir::text::parse(src).unwrap();
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .unwrap()
        .artifact;
    let patterns: Vec<&str> = artifact
        .dispatches
        .iter()
        .map(|d| artifact.kernels[d.kernel as usize].pattern.as_str())
        .collect();
    assert_eq!(patterns, ["matmul", "splitk_sum"]);
    check_long(src, 1e-4, 1);
}

#[test]
fn matmul_with_a_long_inner_dimension() {
    let src = "graph t {\n  input a: f32[2, 200000]\n  input b: f32[200000, 3]\n  c = matmul(a, b)\n  output c\n}\n";
    check_long(src, 1e-4, 1);
    // By default K is split into chunks (split-K: few blocks, a long K). Unsplit, the largest
    // block shape stages 8 of K per step: written out, 25000 steps fit.
    let graph = sinter_ir::text::parse(src).unwrap();
    let options = sinter_compiler::Options {
        matmul: Forced {
            tile: Some(Tile::LARGE),
            splits: Some(1),
        },
        ..Default::default()
    };
    let artifact = sinter_compiler::compile(&graph, &options).unwrap().artifact;
    assert!(artifact.dispatches[0].loop_iterations <= LOOP_BUDGET);
    check_graph_gpu(&graph, 1e-4, &[], 1, &options);
}

/// A kernel that needs more than the budget even unrolled: refused on lavapipe with a message
/// naming the kernel, computed right elsewhere.
#[test]
fn past_the_budget_lavapipe_refuses_and_says_why() {
    let src = "graph t {\n  input a: f32[1, 600000]\n  input b: f32[600000, 1]\n  c = matmul(a, b)\n  output c\n}\n";
    let graph = sinter_ir::text::parse(src).unwrap();
    // unsplit (split-K, the default here, keeps each chunk within the budget)
    let options = sinter_compiler::Options {
        matmul: Forced {
            tile: Some(Tile::LARGE),
            splits: Some(1),
        },
        ..Default::default()
    };
    let compiled = sinter_compiler::compile(&graph, &options).unwrap();
    let iterations = compiled.artifact.dispatches[0].loop_iterations;
    assert!(iterations > LOOP_BUDGET, "{iterations}");
    assert!(
        compiled.warnings.iter().any(|w| w.contains("65535")),
        "{:?}",
        compiled.warnings
    );
    match sinter_runtime::Session::load(compiled.artifact) {
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("loop iterations") && message.contains("k0_matmul"),
                "{message}"
            );
        }
        Ok(session) => {
            assert_eq!(
                session.gpu().loop_limit(),
                None,
                "loaded on a capped adapter"
            );
            check_graph_gpu(&graph, 1e-4, &[], 1, &options);
        }
    }
}
