//! The optimizer keeps values: every rule, and every fused kernel the rules build, computes what
//! the source graph computes. One harness: a program is decomposed, put in an e-graph, rewritten;
//! then for every alternative node of every e-class, the kernel graph that uses it is evaluated in
//! the reference interpreter (fused kernels by their own evaluator) and compared with the source
//! graph's values on random inputs.

mod common;

use common::{Rng, assert_results, inputs, program};
use sinter_compiler::kgraph::{KernelGraph, KernelOp, evaluate};
use sinter_compiler::optimize::{explore, rules};
use sinter_ir::interp::evaluate as interp;

/// What [`check_alternatives`] checked.
struct Checked {
    /// The alternatives evaluated.
    variants: usize,
    /// Those that differ from the source graph (printed as kernel graphs): rewritten forms.
    rewritten: usize,
}

/// Every alternative of `src`'s e-graph (after the algebra and layout rules, and with `fusion`
/// the fusion rules) agrees with the source graph.
fn check_alternatives(src: &str, fusion: bool, limit: usize) -> Checked {
    let g = program(src);
    let source = KernelGraph::from_graph(&g).to_string();
    let mut rng = Rng(0x5eed);
    let (feed, persistent) = inputs(&g, &mut rng);
    let want = interp(&g, &feed, &persistent).expect("the source evaluates");
    let e = explore(&g, fusion);
    let variants = e.variants(limit);
    for (what, kg) in &variants {
        let got = evaluate(kg, &feed, &persistent).unwrap_or_else(|err| panic!("{what}: {err}"));
        let context = format!("{what}\n{src}");
        assert_results("output", &got.outputs, &want.outputs, &context);
        assert_results("assign", &got.assigned, &want.assigned, &context);
    }
    Checked {
        variants: variants.len(),
        rewritten: (variants.iter())
            .filter(|(_, kg)| kg.to_string() != source)
            .count(),
    }
}

/// A program where each algebra and layout rule applies.
const RULE_CASES: &[(&str, &str)] = &[
    ("mul-one", "y = mul(x, 1)"),
    ("one-mul", "y = mul(1, x)"),
    ("div-one", "y = div(x, 1)"),
    ("add-zero", "y = add(x, 0)"),
    ("zero-add", "y = add(0, x)"),
    ("sub-zero", "y = sub(x, 0)"),
    ("neg-neg", "y = neg(neg(x))"),
    ("sub-neg", "y = sub(x, neg(z))"),
    ("add-neg", "y = add(x, neg(z))"),
    ("mul-minus-one", "y = mul(x, -1)"),
    ("mul-reciprocal", "y = mul(x, reciprocal(z))"),
    ("mul-mul-const", "y = mul(mul(x, 3), 0.5)"),
    ("matmul-scale-left", "y = matmul(mul(x, 0.5), w)"),
    ("matmul-scale-right", "y = matmul(x, mul(w, 2))"),
    ("fold-constants", "c = add(2, 3)\n  y = mul(x, c)"),
    (
        "transpose-transpose",
        "y = transpose(transpose(x, dim0=0, dim1=1), dim0=1, dim1=0)",
    ),
    (
        "transpose-sum",
        "y = transpose(sum(t, axes=[0, 2], keepdim=true), dim0=0, dim1=1)",
    ),
    (
        "permute-permute",
        "y = permute(permute(t, perm=[1, 2, 0]), perm=[2, 0, 1])",
    ),
    (
        "reshape-reshape",
        "y = reshape(reshape(x, shape=[2, 2, 3]), shape=[12])",
    ),
    ("reshape-identity", "y = reshape(x, shape=[4, 3])"),
    ("broadcast-identity", "y = broadcast_to(x, shape=[4, 3])"),
    ("permute-identity", "y = permute(t, perm=[0, 1, 2])"),
    (
        "slice-grad-add",
        "y = add(slice_grad(z, shape=[4, 8], axis=1, start=4, end=7), slice_grad(x, shape=[4, 8], axis=1, start=1, end=4))",
    ),
    (
        "concat-concat",
        "y = add(add(slice_grad(x, shape=[4, 9], axis=1, start=6, end=9), slice_grad(z, shape=[4, 9], axis=1, start=3, end=6)), slice_grad(x, shape=[4, 9], axis=1, start=0, end=3))",
    ),
    (
        "squeeze-unsqueeze",
        "y = squeeze(unsqueeze(x, axis=1), axis=1)",
    ),
    (
        "cast-view",
        "y = cast(permute(cast(t, dtype=\"f16\"), perm=[2, 0, 1]), dtype=\"f32\")",
    ),
];

#[test]
fn every_rule_keeps_values() {
    let mut names: Vec<String> = rules::algebra()
        .iter()
        .chain(rules::layout().iter())
        .map(|r| r.name.to_string())
        .collect();
    names.sort();
    let mut covered: Vec<String> = RULE_CASES.iter().map(|(r, _)| r.to_string()).collect();
    covered.sort();
    assert_eq!(
        names, covered,
        "every rule has a case here, and every case a rule"
    );
    for (rule, body) in RULE_CASES {
        let src = format!(
            "graph t {{\n  input x: f32[4, 3]\n  input z: f32[4, 3]\n  input w: f32[3, 5]\n  input t: f32[2, 3, 4]\n  {body}\n  output y\n}}\n"
        );
        let g = program(&src);
        let e = explore(&g, false);
        assert!(e.applied(rule) > 0, "`{rule}` did not apply to\n{src}");
        // a rewritten form (the rule applied) is among the alternatives checked; where a rule
        // merged the source's class with an operand's, the source's nodes are that operand
        let checked = check_alternatives(&src, false, 1000);
        assert!(
            checked.rewritten > 0,
            "`{rule}`: no rewritten form checked ({} alternatives) in\n{src}",
            checked.variants
        );
    }
}

#[test]
fn fused_kernels_of_a_training_step_keep_values() {
    // a two-layer MLP with layer norm, softmax cross-entropy and AdamW: forward, backward and
    // optimizer kernels
    let src = "graph t {
  input x: f32[5, 6]
  input labels: i32[5]
  param w1: f32[6, 7] = normal(std=0.3, seed=1)
  param b1: f32[7] = zeros
  param g: f32[7] = ones
  param be: f32[7] = zeros
  param w2: f32[7, 3] = normal(std=0.3, seed=2)
  h = gelu(add(matmul(x, w1), b1), approximate=\"tanh\")
  n = layer_norm(h, g, be)
  logits = matmul(n, w2)
  loss = cross_entropy(logits, labels)
  train loss with adamw(lr=0.01, weight_decay=0.1)
  output loss, logits
}
";
    let n = check_alternatives(src, true, 3000).variants;
    assert!(n > 100, "only {n} alternatives");
}

#[test]
fn fused_attention_and_softmax_backward_keep_values() {
    let src = "graph t {
  input q: f32[1, 2, 5, 4]
  param k: f32[1, 2, 5, 4] = normal(seed=3)
  param v: f32[1, 2, 5, 4] = normal(seed=4)
  a = attention(q, k, v, causal=true)
  loss = sum(mul(a, a))
  dk, dv = grad(loss, k, v)
  output loss, dk, dv
}
";
    let n = check_alternatives(src, true, 3000).variants;
    assert!(n > 50, "only {n} alternatives");
}

#[test]
fn fused_reductions_over_outer_axes_and_argmax_keep_values() {
    let src = "graph t {
  input x: f32[6, 5]
  s = sum(mul(x, x), axes=[0])
  m = max(exp(x), axes=[0], keepdim=true)
  y = sub(x, m)
  i = argmax(add(x, 1), axis=1)
  lse = logsumexp(x, axes=[1])
  output s, y, i, lse
}
";
    check_alternatives(src, true, 3000);
}

/// A convolutional training step: two convolutions sharing a weight, with bias, scale,
/// residual add and activations after them.
const CONV_STEP: &str = "graph t {
  input x: f32[2, 4, 9, 7]
  input res: f32[2, 6, 9, 7]
  input s: f32[6, 1, 1]
  param w: f32[6, 2, 3, 3] = normal(std=0.3, seed=1)
  param b: f32[6] = normal(std=0.1, seed=2)
  c = conv2d(x, w, b, padding=[1, 1], groups=2)
  y = relu(add(mul(c, s), res))
  z = tanh(conv2d(x, w, padding=[1, 1], groups=2))
  loss = add(sum(mul(y, y)), sum(z))
  dw, db = grad(loss, w, b)
  output y, z, loss, dw, db
}
";

/// Convolutions with an elementwise consumer (bias, activation, scale, residual add) become
/// `conv2d_epilogue` kernels; every extraction, forward and backward, computes the same values.
#[test]
fn fused_convolution_epilogues_keep_values() {
    let src = CONV_STEP;
    let g = program(src);
    let e = explore(&g, true);
    assert!(
        e.applied("fuse-conv2d-epilogue") >= 2,
        "conv epilogues not fused"
    );
    let n = check_alternatives(src, true, 3000).variants;
    assert!(n > 10, "only {n} alternatives");
}

/// Each kernel's list of source ops (what `sinter inspect` shows) is closed: every listed op's
/// operands are listed too, or are what the kernel reads, or are leaves. A kernel that
/// recomputes a value another kernel stores (here a convolution and its `tanh`, inside the
/// `tanh` backward's epilogue) lists the recomputed ops.
#[test]
fn kernels_list_every_source_op_they_compute() {
    let conv = CONV_STEP;
    let mlp = "graph t {
  input x: f32[5, 6]
  input labels: i32[5]
  param w1: f32[6, 7] = normal(std=0.3, seed=1)
  param b1: f32[7] = zeros
  h = gelu(add(matmul(x, w1), b1), approximate=\"tanh\")
  loss = cross_entropy(h, labels)
  train loss with adamw(lr=0.01)
  output loss
}
";
    // (Programs where no two source values compute the same thing: a kernel reading a value
    // that another name also computes lists neither, and names cannot tell them apart here.)
    for src in [conv, mlp] {
        let g = program(src);
        let (kg, _) = sinter_compiler::optimize::optimize(&g, &Default::default());
        for node in &kg.nodes {
            let listed: Vec<&str> = node
                .sources
                .iter()
                .filter_map(|s| s.split(" = ").next())
                .collect();
            let reads: Vec<&str> = node.inputs.iter().map(|&v| kg.name_of(v)).collect();
            for &name in &listed {
                let Some(v) = g.lookup(name) else { continue };
                let Some(n) = g.producer(v) else { continue };
                for &input in &g.node(n).inputs {
                    let operand = g.name_of(input);
                    assert!(
                        listed.contains(&operand)
                            || reads.contains(&operand)
                            || g.producer(input).is_none(),
                        "kernel {:?} lists `{name}` but neither lists nor reads its operand \
                         `{operand}` (reads {reads:?})",
                        node.sources
                    );
                }
            }
        }
    }
}

/// A weight gradient that both AdamW moments read is one product, stored once and read by both
/// updates, not recomputed inside each moment's epilogue (which every single-class move of the
/// extraction prefers: only switching both readers at once pays). The batch is long enough for
/// the product to cost more than the launches storing it adds.
#[test]
fn a_weight_gradient_is_computed_once_for_both_moments() {
    let src = "graph t {
  input x: f32[4096, 256]
  input labels: i32[4096]
  param w1: f32[256, 512] = normal(std=0.05, seed=1)
  param w2: f32[512, 64] = normal(std=0.05, seed=2)
  h = relu(matmul(x, w1))
  loss = cross_entropy(matmul(h, w2), labels)
  train loss with adamw(lr=0.01, weight_decay=0.1)
  output loss
}
";
    let g = program(src);
    let (kg, _) = sinter_compiler::optimize::optimize(&g, &Default::default());
    let mut products: Vec<Vec<&str>> = Vec::new();
    for node in &kg.nodes {
        let anchor = match &node.op {
            KernelOp::Ir(sinter_ir::Op::Matmul, _) => true,
            KernelOp::Epilogue(op, ..) => *op == sinter_ir::Op::Matmul,
            _ => false,
        };
        if anchor {
            let operands: Vec<&str> = node.inputs[..node.anchor_operands()]
                .iter()
                .map(|&v| kg.name_of(v))
                .collect();
            assert!(
                !products.contains(&operands),
                "the product of {operands:?} is computed twice:\n{}",
                kg
            );
            products.push(operands);
        }
    }
}

/// A `concat` and `slice_grad`s are fused into their consumers, their operands read through
/// windows and an elementwise producer of a part (the `neg`) computed inside its window:
/// rotate-half RoPE leaves no concat or slice_grad node, and every alternative the fusion rules
/// build keeps values.
#[test]
fn concat_and_slice_grad_fuse_through_windows() {
    let src = include_str!("../../tests/programs/rotate_half.sir");
    let checked = check_alternatives(src, true, 2000);
    assert!(checked.rewritten > 0, "{} alternatives", checked.variants);
    let g = program(src);
    let (kg, report) = sinter_compiler::optimize::optimize(&g, &Default::default());
    let copies = kg
        .nodes
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                KernelOp::Ir(
                    sinter_ir::Op::Concat | sinter_ir::Op::SliceGrad | sinter_ir::Op::Neg,
                    _
                )
            )
        })
        .count();
    assert_eq!(copies, 0, "{kg}\n{report}");
    assert_keeps_values(&g, &kg, 0x20be);
}

/// The optimized kernel graph `kg` of `g` computes `g`'s outputs on random inputs (`seed`).
fn assert_keeps_values(g: &sinter_ir::Graph, kg: &sinter_compiler::kgraph::KernelGraph, seed: u64) {
    let mut rng = Rng(seed);
    let (feed, persistent) = inputs(g, &mut rng);
    let want = interp(g, &feed, &persistent).expect("the source evaluates");
    let got = evaluate(kg, &feed, &persistent).expect("the optimized graph evaluates");
    let context = kg.to_string();
    assert_results("output", &got.outputs, &want.outputs, &context);
    assert_results("assign", &got.assigned, &want.assigned, &context);
}

/// A layer norm whose statistics its backward keeps is one kernel over each row: the 1/std
/// kernel joins the mean kernel it reads, and the normalizing elementwise kernel joins both
/// (`merge-reader`; the elementwise reader takes their loop over the row, lining up past the
/// kept axis of extent 1). `u` reads a row mean at another point (transposed) and must not
/// be given the value of its own row. Values are checked against the interpreter.
#[test]
fn a_layer_norms_statistics_and_rows_are_one_kernel() {
    let src = "graph t {
  input x: f32[3, 7, 37]
  input r: f32[3, 7, 37]
  input s: f32[7, 7]
  param g: f32[37] = normal(std=0.5, seed=1)
  param b: f32[37] = normal(std=0.5, seed=2)
  y = layer_norm(add(x, r), g, b)
  m = mean(s, axes=[1], keepdim=true)
  u = add(mul(s, m), transpose(m, dim0=0, dim1=1))
  loss = add(sum(mul(y, y)), sum(mul(u, u)))
  dg, db, dx, ds = grad(loss, g, b, x, s)
  output loss, y, u, dg, db, dx, ds
}
";
    let g = program(src);
    let (kg, report) = sinter_compiler::optimize::optimize(&g, &Default::default());
    let writes_y = kg
        .nodes
        .iter()
        .find(|n| n.outputs.iter().any(|&o| kg.name_of(o) == "y"))
        .expect("a node writes y");
    assert!(
        matches!(&writes_y.op, KernelOp::Fused(p) if !p.reduce.is_empty())
            && writes_y.outputs.len() == 3
            && writes_y.rules.iter().any(|r| r == "merge-reader"),
        "y's kernel should also write the mean and 1/std over the same rows:\n{}\n{report}",
        kg
    );
    assert_keeps_values(&g, &kg, 0x1a7);
}

/// A reader of a whole-tensor reduction (gradient clipping by the global norm) does not join
/// the reduction's one long row, which would run it on one workgroup; a reader of short rows
/// does. Values are checked against the interpreter.
#[test]
fn readers_join_short_rows_only() {
    let src = "graph t {
  input g: f32[96, 80]
  input c: f32[]
  n = sum(mul(g, g))
  u = mul(g, div(c, sqrt(n)))
  r = sum(mul(g, c), axes=[1], keepdim=true)
  v = add(mul(g, r), c)
  output n, u, r, v
}
";
    let g = program(src);
    let (kg, report) = sinter_compiler::optimize::optimize(&g, &Default::default());
    let kernel_of = |name: &str| {
        kg.nodes
            .iter()
            .find(|n| n.outputs.iter().any(|&o| kg.name_of(o) == name))
            .expect("a node writes it")
    };
    let joined = |name: &str| kernel_of(name).rules.iter().any(|r| r == "merge-reader");
    assert!(
        !joined("u") && joined("v"),
        "u should not join n's row of 7680 points; v should join r's rows of 80:\n{}\n{report}",
        kg
    );
    assert_keeps_values(&g, &kg, 0xc11);
}

/// A residual stream that extraction leaves recomputed inside every layer norm (each re-adds
/// every earlier layer's output) is stored by the first kernel that computes it at every point,
/// and later layer norms load it (`store-recomputed`): the kernel of the last norm of six reads
/// the stored stream, not its first terms.
/// Values are checked against the interpreter.
#[test]
fn a_recomputed_residual_stream_is_stored_once() {
    let mut src = String::from("graph t {\n  input x0: f32[2, 5, 24]\n");
    for l in 1..=6 {
        src.push_str(&format!(
            "  input h{l}: f32[2, 5, 24]\n  param g{l}: f32[24] = normal(std=0.5, seed={l})\n  x{l} = add(x{}, mul(h{l}, 0.5))\n  n{l} = layer_norm(x{l}, g{l}, g{l})\n  s{l} = sum(mul(n{l}, n{l}))\n",
            l - 1
        ));
    }
    src.push_str("  loss = add(add(add(s1, s2), add(s3, s4)), add(s5, s6))\n  dx0, dg6 = grad(loss, x0, g6)\n  output loss, n6, dx0, dg6\n}\n");
    let g = program(&src);
    let (kg, report) = sinter_compiler::optimize::optimize(&g, &Default::default());
    let describe = || format!("{}\n{report}", kg);
    let writes_n6 = kg
        .nodes
        .iter()
        .find(|n| n.outputs.iter().any(|&o| kg.name_of(o) == "n6"))
        .expect("a node writes n6");
    let reads = |name: &str| writes_n6.inputs.iter().any(|&v| kg.name_of(v) == name);
    assert!(
        writes_n6.rules.iter().any(|r| r == "store-recomputed")
            && !reads("x0")
            && !reads("h1")
            && !reads("h2"),
        "n6's kernel should load the stored stream, not re-add its first terms:\n{}",
        describe()
    );
    assert_keeps_values(&g, &kg, 0x5e7);
}

/// A later kernel (`w`'s, which needs `t`, so it cannot join `z`'s) that recomputes the sum
/// `z`'s kernel computes, but read another way (not transposed), is not given the stored one:
/// values are shared only where every operand is read alike.
#[test]
fn recomputed_values_are_shared_only_where_read_alike() {
    let src = "graph t {
  input x: f32[9, 9]
  input h: f32[9, 9]
  input k: f32[9, 9]
  input g: f32[9]
  z = layer_norm(add(add(transpose(x, dim0=0, dim1=1), transpose(h, dim0=0, dim1=1)), transpose(k, dim0=0, dim1=1)), g, g)
  t = sum(mul(z, z))
  w = layer_norm(mul(add(add(x, h), k), t), g, g)
  loss = add(t, sum(mul(w, w)))
  dx, dg = grad(loss, x, g)
  output loss, z, w, dx, dg
}
";
    let g = program(src);
    let (kg, _) = sinter_compiler::optimize::optimize(&g, &Default::default());
    assert_keeps_values(&g, &kg, 0x7a5);
}

/// The whole pass (both fusion rounds, extraction, sibling merging) on every bundled example:
/// the optimized kernel graph computes the outputs and updates of the source graph.
#[test]
fn optimized_examples_keep_values() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../ir-spec/examples");
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .expect("examples")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".sir"))
        .collect();
    names.sort();
    assert!(names.len() >= 5);
    for name in names {
        let src = std::fs::read_to_string(format!("{dir}/{name}")).expect("readable");
        let g = program(&src);
        let mut rng = Rng(0xe4a);
        let (feed, persistent) = inputs(&g, &mut rng);
        let want = interp(&g, &feed, &persistent).expect("the source evaluates");
        let (kg, report) = sinter_compiler::optimize::optimize(&g, &Default::default());
        assert!(
            kg.nodes.len() < g.nodes.len(),
            "{name}: nothing fused\n{report}"
        );
        let got = evaluate(&kg, &feed, &persistent).expect("the optimized graph evaluates");
        assert_results("output", &got.outputs, &want.outputs, &name);
        assert_results("assign", &got.assigned, &want.assigned, &name);
    }
}
