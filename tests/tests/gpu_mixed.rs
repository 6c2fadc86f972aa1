//! Mixed precision on the GPU (`--precision mixed`): a training step as the precision pass and
//! the gradient scaler write it, against the interpreter; and a step whose gradients overflow,
//! which must leave every param and optimizer state bit for bit as it was.
//!
//! Each runs for the default target (f16 storage; Mesa's software Vulkan has `SHADER_F16`), for
//! one without f16 storage (the browsers' fallback form: f16 numbers in f32 words), and for one
//! whose f16 products take the tensor-core matmul in its emulated form.

use sinter_compiler::loss_scale::{GOOD_STEPS, LossScale, SCALE, SKIPPED, add_loss_scaling};
use sinter_compiler::precision::{Precision, autocast};
use sinter_compiler::{Options, Target};
use sinter_ir::Graph;
use sinter_runtime::Session;
use sinter_runtime::io::{HostTensor, TensorData};
use sinter_tests::{check_graph_gpu, example_source, random_inputs, run_session};

/// A two-layer classifier's AdamW step with gradient clipping.
const STEP: &str = "graph t {
  input x: f32[16, 24]
  input labels: i32[16]
  param w1: f32[24, 32] = normal(std=0.2, seed=1)
  param b1: f32[32] = normal(std=0.1, seed=2)
  param w2: f32[32, 5] = normal(std=0.2, seed=3)
  h = gelu(add(matmul(x, w1), b1))
  logits = matmul(h, w2)
  loss = cross_entropy(logits, labels)
  train loss with adamw(lr=0.01, clip_norm=1.0)
  output loss
}
";

fn parse(src: &str) -> Graph {
    sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)))
}

/// The default target, one without f16 storage, and one whose f16 products take the
/// tensor-core matmul in its emulated form (`Features::cooperative_emulated`).
fn targets() -> [Target; 3] {
    let mut words = Target::portable();
    words.features.f16 = false;
    [Target::portable(), words, emulated_tensor_cores()]
}

fn emulated_tensor_cores() -> Target {
    let mut target = Target::portable();
    target.features.cooperative_matrix = true;
    target.features.cooperative_emulated = true;
    target
}

#[test]
fn a_mixed_step_matches_the_interpreter() {
    let g = autocast(&parse(STEP)).expect("autocasts");
    let mut g = add_loss_scaling(&g, &LossScale::default()).expect("scales");
    // every update as an output too, so the comparison covers the optimizer
    for i in 0..g.assigns.len() {
        let source = g.assigns[i].source;
        g.add_output(source);
    }
    for target in targets() {
        let options = Options {
            target,
            ..Options::default()
        };
        let errors = check_graph_gpu(&g, 2e-3, &[], 5, &options);
        assert!(errors.len() > 10, "{errors:?}");
    }
}

/// The bundled examples (a CNN, transformers, the Llama step, with its gradient scaler) as the
/// precision pass writes them, on the GPU against the interpreter: convolutions, pooling,
/// attention, norms and rotary embeddings between f16 products.
#[test]
fn bundled_examples_in_mixed_precision_match_the_interpreter() {
    for name in [
        "cnn",
        "mlp",
        "transformer",
        "transformer_train",
        "llama_train",
    ] {
        let g = parse(&example_source(name));
        let g = autocast(&g).expect("autocasts");
        let g = add_loss_scaling(&g, &LossScale::default()).expect("scales");
        // measured: the losses within 7e-7, the logits within 2.5e-4 (an f16 rounding step)
        for target in [Target::portable(), emulated_tensor_cores()] {
            let options = Options {
                target,
                ..Options::default()
            };
            // every product but the CNN's has at least 16 rows (its classifier's, a batch of
            // 8, keeps the FMA kernel; its convolutions have their own kernels)
            let with_tensor_cores = name != "cnn";
            if options.target.features.cooperative_emulated && with_tensor_cores {
                let artifact = sinter_compiler::compile(&g, &options)
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                    .artifact;
                let products = (artifact.kernels.iter())
                    .filter(|k| k.wgsl.contains("multiply_add("))
                    .count();
                assert!(products > 0, "{name}: no product on tensor cores");
            }
            let errors = check_graph_gpu(&g, 2e-3, &[], 10, &options);
            assert!(!errors.is_empty(), "{name}: no outputs compared");
        }
    }
}

/// Every element's bits (f16 widened to f32 first).
fn bits(t: &HostTensor) -> Vec<u32> {
    match &t.data {
        TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        TensorData::F16(v) => v.iter().map(|x| x.to_f32().to_bits()).collect(),
        TensorData::I32(v) => v.iter().map(|&x| x as u32).collect(),
    }
}

fn scalar(weights: &[(String, HostTensor)], name: &str) -> f32 {
    let (_, t) = weights
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no `{name}`"));
    match &t.data {
        TensorData::F32(v) => v[0],
        other => panic!("`{name}` is {other:?}"),
    }
}

#[test]
fn an_overflowing_step_is_skipped_bit_for_bit() {
    let g = parse(STEP);
    let inputs = random_inputs(&g, 3, 5, &[]);
    for target in targets() {
        // the first scale overflows the f16 gradients
        let options = Options {
            target,
            precision: Precision::Mixed,
            loss_scale: LossScale {
                init: 1e38,
                growth_interval: 2000,
            },
            ..Options::default()
        };
        let compiled = sinter_compiler::compile(&g, &options).expect("compiles");
        let mut session = Session::load(compiled.artifact).expect("loads");
        let before = session.weights().expect("reads");
        run_session(&mut session, &inputs);
        let after = session.weights().expect("reads");
        assert_eq!(scalar(&after, SCALE), 5e37);
        assert_eq!(scalar(&after, SKIPPED), 1.0);
        assert_eq!(scalar(&after, GOOD_STEPS), 0.0);
        let mut checked = 0;
        for ((name, b), (_, a)) in before.iter().zip(&after) {
            if name.starts_with("amp.") {
                continue;
            }
            assert_eq!(bits(a), bits(b), "`{name}` changed on a skipped step");
            checked += 1;
        }
        // w1, b1, w2, their moments, the step counter
        assert!(checked >= 10, "{checked}");

        // at a finite scale the next step trains
        let scale = HostTensor::f32(vec![], vec![1024.0]);
        session
            .load_weights(&[(SCALE.to_string(), scale)])
            .expect("loads the scale");
        run_session(&mut session, &inputs);
        let trained = session.weights().expect("reads");
        assert_eq!(scalar(&trained, SCALE), 1024.0);
        assert_eq!(scalar(&trained, SKIPPED), 1.0);
        assert_eq!(scalar(&trained, GOOD_STEPS), 1.0);
        assert_eq!(scalar(&trained, "train.step"), 1.0);
        let w1 =
            |w: &[(String, HostTensor)]| bits(&w.iter().find(|(n, _)| n == "w1").expect("w1").1);
        assert_ne!(
            w1(&trained),
            w1(&before),
            "w1 did not move on a finite step"
        );
    }
}

/// Under autocast a transformer's residual stream adds `f16` products in `f32`, and extraction
/// leaves it recomputed from its terms (two per layer) inside every layer norm and every norm
/// weight's gradient (a column sum over the tokens). The optimized step of a small GPT stores it
/// instead: no fused reduction or row kernel reads more tensors of the stream's shape than one
/// per layer and two (sibling reductions merged across layers, the bias gradients, read one per
/// layer). Compiled only; the values of such steps are checked on the GPU above.
#[test]
fn the_mixed_gpt_step_reads_its_residual_stream_stored() {
    use sinter_cli::gpt::{GptConfig, program};
    use sinter_compiler::kernel::Pattern;
    use sinter_compiler::kgraph::KernelOp;
    let c = GptConfig {
        layers: 6,
        width: 64,
        heads: 2,
        context: 32,
        batch: 2,
        vocab: 128,
    };
    let step = autocast(&parse(&program(&c))).expect("autocasts");
    let step = add_loss_scaling(&step, &LossScale::default()).expect("scales");
    let step = sinter_ir::expand::expand_composites(&step);
    let step = sinter_compiler::autodiff::differentiate(&step)
        .expect("differentiates")
        .graph;
    let step = sinter_ir::decompose::decompose(&step);
    let (kg, _) = sinter_compiler::optimize::optimize(&step, &Default::default());
    let stream = [c.batch, c.context, c.width];
    for node in &kg.nodes {
        let KernelOp::Fused(p) = &node.op else {
            continue;
        };
        if !matches!(p.pattern(), Pattern::Reduce | Pattern::RowMap) {
            continue;
        }
        let reads = node
            .inputs
            .iter()
            .filter(|&&v| kg.ty(v).shape == stream)
            .count();
        assert!(
            reads <= c.layers + 2,
            "a kernel reads {reads} tensors of the stream's shape: {}\n{kg}",
            kg.name_of(node.outputs[0])
        );
    }
}

/// Autocast gives attention its operands as casts of `f16` products to `f32`; the flash
/// kernels the attention rules find read those products from `f16` storage instead (a
/// cast to `f32` is exact, and the kernels widen as they load), so no kernel copies them to
/// `f32` first. Compiled only; `flash_kernels::f16_operands` checks such kernels' values.
#[test]
fn the_mixed_gpt_step_feeds_attention_f16_operands() {
    use sinter_cli::gpt::{GptConfig, program};
    use sinter_compiler::flash::FlashKind;
    use sinter_compiler::kgraph::KernelOp;
    use sinter_ir::DType;
    let c = GptConfig {
        layers: 2,
        width: 64,
        heads: 2,
        context: 32,
        batch: 2,
        vocab: 128,
    };
    let step = autocast(&parse(&program(&c))).expect("autocasts");
    let step = add_loss_scaling(&step, &LossScale::default()).expect("scales");
    let prepared = sinter_ir::expand::expand_composites(&step);
    let prepared = sinter_compiler::autodiff::differentiate(&prepared)
        .expect("differentiates")
        .graph;
    let prepared = sinter_ir::decompose::decompose(&prepared);
    let (kg, _) = sinter_compiler::optimize::optimize(&prepared, &Default::default());
    let mut kinds = Vec::new();
    for node in &kg.nodes {
        let KernelOp::Flash(spec) = &node.op else {
            continue;
        };
        // q, k, v, and the backward's dO
        let operands = if spec.kind == FlashKind::Forward {
            3
        } else {
            4
        };
        for &v in &node.inputs[..operands] {
            assert_eq!(
                kg.ty(v).dtype,
                DType::F16,
                "{:?} reads {}",
                spec.kind,
                kg.name_of(v)
            );
        }
        kinds.push(spec.kind);
    }
    assert!(kinds.contains(&FlashKind::Forward), "{kinds:?}");
    assert!(kinds.len() > c.layers, "no backward kernels: {kinds:?}");
    let artifact = sinter_compiler::compile(&step, &Default::default())
        .expect("compiles")
        .artifact;
    let widened: Vec<&String> = (artifact.kernels.iter())
        .flat_map(|k| &k.ops)
        .filter(|op| op.ends_with("(f16 operand to f32)"))
        .collect();
    assert!(widened.is_empty(), "{widened:?}");
}
