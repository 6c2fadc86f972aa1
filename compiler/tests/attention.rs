//! Attention found by rewriting: for attentions written every way a user writes them (the
//! composite with each mask, by hand from matmul and softmax, in `[B, S, H, D]` layout, with
//! broadcast heads, ragged lengths, forward only), the optimizer under `--attention flash` puts
//! the flash kernels the case allows in place of the `[Sq, Sk]` products, and the kernel graph
//! it returns computes what the source computes (flash kernels by their f64 semantics).

mod common;

use common::{Rng, assert_results, inputs, program};
use sinter_compiler::flash::FlashKind;
use sinter_compiler::kgraph::{KernelGraph, KernelOp, evaluate};
use sinter_compiler::optimize::{AttentionPolicy, Config, optimize};
use sinter_compiler::{Target, cost::CostModel, flash::variant::Choices};

/// The optimizer's settings these tests price with: the H200's rates and no binding limit (so
/// that the unfused products stay a choice at every length), `choices` for the flash kernels.
fn config(attention: AttentionPolicy, choices: Choices) -> Config {
    let mut target = Target::h200();
    target.limits.max_binding = u64::MAX;
    Config {
        attention,
        model: CostModel::new(target, choices, Default::default()),
        trace: false,
    }
}
use sinter_ir::Op;
use sinter_ir::interp::evaluate as interp;

struct Case {
    name: &'static str,
    /// The graph's body, between the inputs and the outputs.
    src: String,
    /// The flash kernels the optimizer must use.
    want: &'static [FlashKind],
    /// Those it uses by default, after lowering's merge of the dQ and dK/dV kernels.
    merged: &'static [FlashKind],
    /// Query and key lengths: with all three kernels, no stored value has `[.., Sq, Sk]` shape.
    sq: usize,
    sk: usize,
}

fn flash_kinds(kg: &KernelGraph) -> Vec<FlashKind> {
    let mut kinds: Vec<FlashKind> = kg
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            KernelOp::Flash(spec) => Some(spec.kind),
            _ => None,
        })
        .collect();
    kinds.sort();
    kinds
}

/// Values a kernel stores with shape `[.., sq, sk]` (views excluded).
fn stored_scores(kg: &KernelGraph, sq: usize, sk: usize) -> Vec<String> {
    let view = |op: &KernelOp| {
        matches!(
            op,
            KernelOp::Ir(
                Op::Transpose
                    | Op::Permute
                    | Op::Reshape
                    | Op::BroadcastTo
                    | Op::Unsqueeze
                    | Op::Squeeze
                    | Op::Constant
                    | Op::Iota,
                _
            )
        )
    };
    kg.nodes
        .iter()
        .filter(|n| !view(&n.op))
        .flat_map(|n| &n.outputs)
        .filter(|&&v| kg.ty(v).shape.ends_with(&[sq, sk]))
        .map(|&v| kg.values[v.0 as usize].name.clone())
        .collect()
}

fn check(case: &Case) {
    let g = program(&case.src);
    let mut rng = Rng(0xa77e);
    let (feed, persistent) = inputs(&g, &mut rng);
    let want = interp(&g, &feed, &persistent).expect("the source evaluates");
    // the kernels the rules find, before lowering's merge of the backward pair
    let split = Choices {
        merge_backward: false,
        ..Choices::default()
    };
    let (kg, report) = optimize(&g, &config(AttentionPolicy::Flash, split));
    let mut expected = case.want.to_vec();
    expected.sort();
    assert_eq!(
        flash_kinds(&kg),
        expected,
        "{}: flash kernels\n{report}",
        case.name
    );
    if case.want.len() == 3 {
        // D = rowsum(dO ∘ O), the backward kernels' operand, is the kernel attention-delta built
        assert!(
            kg.nodes
                .iter()
                .any(|n| n.rules.iter().any(|r| r == "attention-delta")),
            "{}: no kernel credited to attention-delta",
            case.name
        );
        let scores = stored_scores(&kg, case.sq, case.sk);
        assert!(
            scores.is_empty(),
            "{}: [Sq, Sk] values stored: {scores:?}",
            case.name
        );
    }
    let got = evaluate(&kg, &feed, &persistent).expect("the optimized graph evaluates");
    assert_results("output", &got.outputs, &want.outputs, case.name);
    if case.merged != case.want {
        // and by default the dQ and dK/dV kernels become one kernel of the whole backward
        let (kg, report) = optimize(&g, &config(AttentionPolicy::Flash, Choices::default()));
        assert_eq!(
            flash_kinds(&kg),
            case.merged,
            "{}: merged flash kernels\n{report}",
            case.name
        );
        assert!(
            kg.nodes
                .iter()
                .any(|n| n.rules.iter().any(|r| r == "merge-flash-backward")),
            "{}: no kernel credited to merge-flash-backward",
            case.name
        );
        let got = evaluate(&kg, &feed, &persistent).expect("the merged graph evaluates");
        let context = format!("{}: merged", case.name);
        assert_results("output", &got.outputs, &want.outputs, &context);
    }
    // the unfused policy keeps values too, with no flash kernel
    let (kg, _) = optimize(&g, &config(AttentionPolicy::Unfused, Choices::default()));
    assert!(flash_kinds(&kg).is_empty(), "{}: unfused", case.name);
    let got = evaluate(&kg, &feed, &persistent).expect("the unfused graph evaluates");
    let context = format!("{}: unfused", case.name);
    assert_results("output", &got.outputs, &want.outputs, &context);
}

const ALL: &[FlashKind] = &[
    FlashKind::Forward,
    FlashKind::BackwardDq,
    FlashKind::BackwardDkDv,
];

/// [`ALL`] with the backward pair merged.
const MERGED: &[FlashKind] = &[FlashKind::Forward, FlashKind::Backward];

/// A training-step body: `o` from `attention`, a loss through a weight, gradients of q, k, v.
fn step(inputs: &str, attention: &str) -> String {
    format!(
        "graph t {{\n{inputs}\n  o = {attention}\n  loss = sum(mul(o, w))\n  dq, dk, dv = grad(loss, q, k, v)\n  output loss, o, dq, dk, dv\n}}\n"
    )
}

const QKV: &str = "  input q: f32[2, 2, 7, 4]\n  param k: f32[2, 2, 11, 4] = normal(seed=1)\n  param v: f32[2, 2, 11, 6] = normal(seed=2)\n  input w: f32[2, 2, 7, 6]";

#[test]
fn the_composite_with_every_mask() {
    for (name, attention, extra) in [
        ("no mask", "attention(q, k, v)", ""),
        ("causal", "attention(q, k, v, causal=true)", ""),
        ("scaled", "attention(q, k, v, scale=0.3)", ""),
        ("window", "attention(q, k, v, window=3)", ""),
        (
            "causal window",
            "attention(q, k, v, causal=true, window=4)",
            "",
        ),
        (
            "boolean mask",
            "attention(q, k, v, m)",
            "\n  input m: i32[7, 11]",
        ),
        (
            "additive mask",
            "attention(q, k, v, m, mask_kind=\"additive\")",
            "\n  input m: f32[2, 1, 7, 11]",
        ),
    ] {
        check(&Case {
            name,
            src: step(&format!("{QKV}{extra}"), attention),
            want: ALL,
            merged: MERGED,
            sq: 7,
            sk: 11,
        });
    }
}

#[test]
fn attention_written_by_hand() {
    // scale on the product, softmax, no composite anywhere
    let src = step(
        QKV,
        "matmul(softmax(mul(matmul(q, transpose(k, dim0=2, dim1=3)), 0.5), axis=3), v)",
    );
    check(&Case {
        name: "by hand",
        src,
        want: ALL,
        merged: MERGED,
        sq: 7,
        sk: 11,
    });
    // the scale on q, a causal mask from iota
    let src = format!(
        "graph t {{\n{QKV}\n  row = iota(shape=[7, 11], axis=0)\n  col = iota(shape=[7, 11], axis=1)\n  s = matmul(mul(q, 0.5), transpose(k, dim0=2, dim1=3))\n  p = softmax(where(le(col, row), s, -inf), axis=3)\n  o = matmul(p, v)\n  loss = sum(mul(o, w))\n  dq, dk, dv = grad(loss, q, k, v)\n  output loss, o, dq, dk, dv\n}}\n"
    );
    check(&Case {
        name: "by hand, causal from iota",
        src,
        want: ALL,
        merged: MERGED,
        sq: 7,
        sk: 11,
    });
}

#[test]
fn batch_sequence_heads_layout() {
    // [B, S, H, D] tensors, permuted into heads-first views as a model does
    let src = "graph t {
  input x: f32[2, 7, 2, 4]
  param ky: f32[2, 11, 2, 4] = normal(seed=1)
  param vy: f32[2, 11, 2, 6] = normal(seed=2)
  input w: f32[2, 7, 2, 6]
  q = permute(x, perm=[0, 2, 1, 3])
  k = permute(ky, perm=[0, 2, 1, 3])
  v = permute(vy, perm=[0, 2, 1, 3])
  a = attention(q, k, v, causal=true)
  o = permute(a, perm=[0, 2, 1, 3])
  loss = sum(mul(o, w))
  dx, dk, dv = grad(loss, x, ky, vy)
  output loss, o, dx, dk, dv
}
"
    .to_string();
    check(&Case {
        name: "[B, S, H, D]",
        src,
        want: ALL,
        merged: MERGED,
        sq: 7,
        sk: 11,
    });
}

#[test]
fn broadcast_heads_and_forward_only() {
    // one key/value head shared by every query head (multi-query attention): every kernel
    // reads it broadcast; the dK/dV kernel gives one gradient per query head, which the graph
    // sums (by hand: the composite wants equal heads; matmul broadcasts batch axes)
    let src = step(
        "  input q: f32[2, 3, 7, 4]\n  param k: f32[2, 1, 11, 4] = normal(seed=1)\n  param v: f32[2, 1, 11, 6] = normal(seed=2)\n  input w: f32[2, 3, 7, 6]",
        "matmul(softmax(mul(matmul(q, transpose(k, dim0=2, dim1=3)), 0.5), axis=3), v)",
    );
    check(&Case {
        name: "broadcast heads",
        src,
        want: ALL,
        // the kernels extraction picks take the score's scale at different places (the
        // matmul-scale rules), so their score backwards differ and they stay two
        merged: ALL,
        sq: 7,
        sk: 11,
    });
    // inference: the forward kernel alone
    let src = format!("graph t {{\n{QKV}\n  o = attention(q, k, v, causal=true)\n  output o\n}}\n");
    check(&Case {
        name: "forward only",
        src,
        want: &[FlashKind::Forward],
        merged: &[FlashKind::Forward],
        sq: 7,
        sk: 11,
    });
}

#[test]
fn grouped_and_multi_query_composite() {
    // k and v with fewer heads than q: the composite reads them broadcast over each group of
    // query heads (no copy), and every kernel finds them so; autodiff sums the dK/dV kernel's
    // per-query-head gradients over the group
    for (name, kv, attention, extra) in [
        ("grouped", 2, "attention(q, k, v, causal=true)", ""),
        ("multi-query", 1, "attention(q, k, v)", ""),
        (
            "grouped, per-head additive mask",
            2,
            "attention(q, k, v, m, mask_kind=\"additive\")",
            "\n  input m: f32[1, 4, 7, 11]",
        ),
    ] {
        let decls = format!(
            "  input q: f32[2, 4, 7, 4]\n  param k: f32[2, {kv}, 11, 4] = normal(seed=1)\n  param v: f32[2, {kv}, 11, 6] = normal(seed=2)\n  input w: f32[2, 4, 7, 6]{extra}"
        );
        check(&Case {
            name,
            src: step(&decls, attention),
            want: ALL,
            // as with broadcast heads written by hand: the dK/dV kernel extraction picks takes
            // the score's scale after autodiff's sum over the group (fewer elements), the dQ
            // kernel inside its score backward, so the two score backwards differ and the
            // kernels stay two
            merged: ALL,
            sq: 7,
            sk: 11,
        });
    }
}

/// Forward and backward of an attention at GPT-2's heads (B 4, H 12), sequence length `s`,
/// head dim `d`.
fn gpt2_heads(s: usize, d: usize, causal: bool) -> sinter_ir::Graph {
    program(&format!(
        "graph a {{
  input q: f32[4, 12, {s}, {d}]
  input k: f32[4, 12, {s}, {d}]
  input v: f32[4, 12, {s}, {d}]
  input w: f32[4, 12, {s}, {d}]
  o = attention(q, k, v, causal={causal})
  loss = sum(mul(o, w))
  dq, dk, dv = grad(loss, q, k, v)
  output loss, dq, dk, dv
}}
"
    ))
}

/// The cost model's choice is never costlier than the unfused products: extraction's local
/// search cannot leave flash kernels it started with, so the optimizer also extracts without
/// them and keeps the cheaper choice. At GPT-2's heads (B 4, H 12, D 64) the model picks the
/// unfused products up to S = 2048 not causal and flash (with the backward merged) from
/// S = 512 causal, as measured on the H200 since the heaviest blocks start first
/// (BENCHMARKS.md, "Attention": 0.440 against 0.664 ms at S = 512 causal, 1.283 against 2.021
/// at 1024; head dim 128: 0.845 against 0.903 at S = 512 causal, 2.651 against 2.932 at
/// 1024, where the split backward took 3.057).
#[test]
fn auto_is_never_costlier_than_the_unfused_products() {
    for (s, d, causal, flash_expected) in [
        (512, 64, true, true),
        (1024, 64, true, true),
        (1024, 64, false, false),
        (2048, 64, true, true),
        (2048, 64, false, false),
        (512, 128, true, true),
        (1024, 128, true, true),
        (2048, 128, true, true),
    ] {
        let g = gpt2_heads(s, d, causal);
        let with = |attention| optimize(&g, &config(attention, Choices::default()));
        let (kg, auto) = with(AttentionPolicy::Auto);
        let (_, unfused) = with(AttentionPolicy::Unfused);
        assert!(
            auto.cost_after <= unfused.cost_after * (1.0 + 1e-9),
            "S = {s}, D = {d}, causal {causal}: auto {} us against unfused {} us",
            auto.cost_after / 1e3,
            unfused.cost_after / 1e3
        );
        assert_eq!(
            flash_kinds(&kg) == [FlashKind::Forward, FlashKind::Backward],
            flash_expected,
            "S = {s}, D = {d}, causal {causal}: flash kernels {:?}",
            flash_kinds(&kg)
        );
        if (s, d, causal) == (1024, 128, true) {
            // with the backward kept as two kernels (`--flash-backward split`) the dQ kernel
            // costs its own products, and flash loses here
            let split_backward = Choices {
                merge_backward: false,
                ..Choices::default()
            };
            let (kg, split) = optimize(&g, &config(AttentionPolicy::Auto, split_backward));
            assert!(flash_kinds(&kg).is_empty(), "split: {:?}", flash_kinds(&kg));
            assert!(split.cost_after > auto.cost_after);
        }
    }
}

/// With tensor cores (`Choices::tensor_cores`) the cost model prices the kernels that have
/// tensor-core forms at those forms' rate, and the backward split where its kernels have them
/// (the whole backward has none): at head dims 64 and 128 all three kernels (at 128 and S = 512
/// 0.569 ms against the unfused products' 0.886, 0.420 against 0.899 causal). At S = 512 and 1024 not causal, where `auto` keeps the unfused
/// products in `f32`, it takes the tensor-core kernels, as measured on the H200 (BENCHMARKS.md,
/// "Attention": 0.311 against 0.649 ms and 0.987 against 1.955 for the unfused products).
#[test]
fn tensor_cores_price_their_kernels() {
    use FlashKind::*;
    for (s, d, causal, want) in [
        (2048, 64, true, &[Forward, BackwardDq, BackwardDkDv][..]),
        (512, 64, false, &[Forward, BackwardDq, BackwardDkDv][..]),
        (1024, 64, false, &[Forward, BackwardDq, BackwardDkDv][..]),
        (2048, 128, true, &[Forward, BackwardDq, BackwardDkDv][..]),
        (512, 128, false, &[Forward, BackwardDq, BackwardDkDv][..]),
        (512, 128, true, &[Forward, BackwardDq, BackwardDkDv][..]),
    ] {
        let g = gpt2_heads(s, d, causal);
        let (_, plain) = optimize(&g, &config(AttentionPolicy::Auto, Choices::default()));
        let tensor_cores = Choices {
            tensor_cores: true,
            ..Choices::default()
        };
        let (kg, tc) = optimize(&g, &config(AttentionPolicy::Auto, tensor_cores));
        let mut want = want.to_vec();
        want.sort();
        assert_eq!(flash_kinds(&kg), want, "S = {s}, D = {d}, causal {causal}");
        assert!(
            tc.cost_after < plain.cost_after,
            "S = {s}, D = {d}, causal {causal}: {} us with tensor cores against {} us",
            tc.cost_after / 1e3,
            plain.cost_after / 1e3
        );
    }
}

/// Attention on `f16` values as autocast writes it: `[B, S, H, D]` products cast to `f32`
/// under heads-first views, and the output rounded to `f16` after its merged view. The flash
/// kernels read `q`, `k`, `v` and `dO` from the `f16` values (views rebuilt over them), not
/// from the casts, and the graph computes what the source computes: within an `f16` rounding
/// step, since the kernels' f64 semantics and the interpreter's f32 arithmetic may round an
/// output element of attention to neighbouring `f16` numbers.
#[test]
fn f16_operands_through_casts() {
    let src = "graph t {
  input x: f16[2, 7, 2, 4]
  param kx: f16[2, 11, 2, 4] = normal(seed=1)
  param vx: f16[2, 11, 2, 6] = normal(seed=2)
  input w: f16[2, 7, 12]
  q = permute(cast(x, dtype=\"f32\"), perm=[0, 2, 1, 3])
  k = permute(cast(kx, dtype=\"f32\"), perm=[0, 2, 1, 3])
  v = permute(cast(vx, dtype=\"f32\"), perm=[0, 2, 1, 3])
  o = attention(q, k, v, causal=true)
  merged = cast(reshape(permute(o, perm=[0, 2, 1, 3]), shape=[2, 7, 12]), dtype=\"f16\")
  loss = sum(cast(mul(merged, w), dtype=\"f32\"))
  dx, dk, dv = grad(loss, x, kx, vx)
  output loss, o, dx, dk, dv
}
";
    let g = program(src);
    let mut rng = Rng(0xa77e);
    let (feed, persistent) = inputs(&g, &mut rng);
    let want = interp(&g, &feed, &persistent).expect("the source evaluates");
    let (kg, report) = optimize(&g, &config(AttentionPolicy::Flash, Choices::default()));
    let mut all = ALL.to_vec();
    all.sort();
    // the backward in one kernel or two (the dQ and dK/dV kernels read the same values)
    let kinds = flash_kinds(&kg);
    assert!(
        kinds == all || kinds == [FlashKind::Forward, FlashKind::Backward],
        "{kinds:?}\n{report}"
    );
    for node in &kg.nodes {
        let KernelOp::Flash(spec) = &node.op else {
            continue;
        };
        let operands = if spec.kind == FlashKind::Forward {
            3
        } else {
            4
        };
        for &v in &node.inputs[..operands] {
            assert_eq!(
                kg.ty(v).dtype,
                sinter_ir::DType::F16,
                "{:?} reads `{}` as {:?}\n{report}",
                spec.kind,
                kg.name_of(v),
                kg.ty(v)
            );
        }
        // the gradients of f16 values are f16: the backward kernels store dQ, dK and dV so
        // (flash-f16-result), the forward keeps `O` in f32 for the output and the delta
        if spec.kind != FlashKind::Forward {
            for &v in &node.outputs {
                assert_eq!(
                    kg.ty(v).dtype,
                    sinter_ir::DType::F16,
                    "{:?}\n{report}",
                    spec.kind
                );
            }
            assert!(
                node.rules.iter().any(|r| r == "flash-f16-result"),
                "{:?}: {:?}",
                spec.kind,
                node.rules
            );
        } else {
            assert_eq!(kg.ty(node.outputs[0]).dtype, sinter_ir::DType::F32);
        }
    }
    let got = evaluate(&kg, &feed, &persistent).expect("the optimized graph evaluates");
    for ((name, a), (_, w)) in got.outputs.iter().zip(&want.outputs) {
        assert_eq!(a.ty, w.ty, "{name}");
        let scale = w.data.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let worst = (a.data.iter().zip(&w.data)).fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-3 * scale,
            "{name}: {worst:e} of {scale:e}\n got {a}\n want {w}"
        );
    }
}
