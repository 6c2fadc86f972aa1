//! Generation on the GPU: a generation artifact (`sinter_compiler::generation`) loaded by
//! `sinter_runtime::Generator` gives, after every token, the logits that the reference
//! interpreter gives for the forward program on the same tokens, so greedy decoding picks the
//! forward program's argmax of every prefix; a generation resumed from its own prefix continues
//! identically; past the context the window slides as `generate.rs` documents.

use std::collections::HashMap;

use sinter_cli::gpt::{GptConfig, program};
use sinter_compiler::Options;
use sinter_compiler::generation::compile_generation;
use sinter_ir::decode::{DecodeSpec, forward_part, reference_logits};
use sinter_ir::interp::Tensor;
use sinter_ir::{Graph, TensorType, ValueDef};
use sinter_runtime::io::HostTensor;
use sinter_runtime::{Generator, Sampling};
use sinter_tests::{Rng, relative_error};

const BUNDLED: &str = include_str!("../../ir-spec/examples/transformer_train.sir");
const LLAMA: &str = include_str!("../../ir-spec/tests/decode/llama_tiny.sir");

fn parse(src: &str) -> Graph {
    sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("test.sir", src)))
}

/// A model's forward program with random weights (larger than its initializers', so that the
/// logits are far from ties), and its generation artifact loaded on the GPU.
struct Model {
    forward: Graph,
    weights: HashMap<String, Tensor>,
    generator: Generator,
}

impl Model {
    /// `src` with random params.
    fn new(src: &str, spec: &DecodeSpec, seed: u64) -> Model {
        let g = parse(src);
        let mut rng = Rng::new(seed);
        let weights: HashMap<String, Tensor> = (g.params())
            .map(|p| {
                let ty: &TensorType = g.ty(p);
                let data = (0..ty.numel())
                    .map(|_| f64::from((0.4 * rng.nonzero(-1.0, 1.0)) as f32))
                    .collect();
                (g.name_of(p).to_string(), Tensor::new(ty.clone(), data))
            })
            .collect();
        Model::with_weights(&g, spec, weights, &HashMap::new())
    }

    /// `g` with `weights` for its params and states; the causal check reads `states`.
    fn with_weights(
        g: &Graph,
        spec: &DecodeSpec,
        weights: HashMap<String, Tensor>,
        states: &HashMap<String, Tensor>,
    ) -> Model {
        let forward = forward_part(g, &spec.ids, &spec.logits).expect("a forward part");
        let compiled = compile_generation(g, spec, states, &Options::default(), &mut Vec::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut generator = Generator::load(compiled.artifact).expect("loads");
        let host: Vec<(String, HostTensor)> = (weights.iter())
            .filter(|(n, _)| forward.lookup(n).is_some())
            .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
            .collect();
        generator.load_weights(&host).expect("weights fit");
        Model {
            forward,
            weights,
            generator,
        }
    }

    /// The forward program's logits after each of `windows` (in the interpreter).
    fn reference(&self, windows: &[Vec<i32>]) -> Vec<Vec<f64>> {
        reference_logits(&self.forward, "ids", &self.weights, windows).expect("runs")
    }
}

fn argmax(row: &[f64]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// The GPU's logits against the interpreter's: close, and the same argmax wherever the
/// interpreter's best token leads by more than the error allows.
fn check(got: &[Vec<f32>], want: &[Vec<f64>], what: &str) {
    for (g, w) in got.iter().zip(want) {
        let g: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
        let err = relative_error(&g, w);
        assert!(err < 1e-3, "{what}: logits differ by {err}");
        let best = argmax(w);
        let second = (0..w.len())
            .filter(|&i| i != best)
            .map(|i| w[i])
            .fold(f64::NEG_INFINITY, f64::max);
        if w[best] - second > 1e-2 {
            assert_eq!(argmax(&g), best, "{what}: the greedy choice differs");
        }
    }
}

/// Feeds `prompts`, then the GPU's own greedy choices until `total` tokens per sequence, the
/// window sliding past the context by `keep` tokens; checks every step against the forward
/// program over the window the generator holds. Returns the sequences.
fn greedy(m: &mut Model, prompts: &[Vec<i32>], total: usize, keep: usize) -> Vec<Vec<i32>> {
    let context = m.generator.info().context as usize;
    m.generator.set_keep(keep).expect("keep in range");
    let mut seqs = prompts.to_vec();
    let len = seqs[0].len();
    let mut start = len.saturating_sub(context);
    let mut cached = len - start;
    let mut logits = m.generator.start(prompts).expect("prompt runs");
    loop {
        let len = seqs[0].len();
        let windows: Vec<Vec<i32>> = seqs.iter().map(|s| s[start..].to_vec()).collect();
        check(
            &logits,
            &m.reference(&windows),
            &format!("after {len} tokens"),
        );
        if len == total {
            return seqs;
        }
        let next: Vec<i32> = logits
            .iter()
            .map(|row| {
                let row: Vec<f64> = row.iter().map(|&x| f64::from(x)).collect();
                argmax(&row) as i32
            })
            .collect();
        for (s, &t) in seqs.iter_mut().zip(&next) {
            s.push(t);
        }
        if cached < context {
            cached += 1;
        } else {
            start = len + 1 - keep;
            cached = keep;
        }
        logits = m.generator.push(&next).expect("step runs");
    }
}

fn spec(batch: usize, prefill: usize) -> DecodeSpec {
    DecodeSpec::sized(batch, prefill)
}

#[test]
fn bundled_model_generates_its_forward_programs_argmax() {
    let mut m = Model::new(BUNDLED, &spec(2, 16), 1);
    greedy(&mut m, &[vec![3, 17, 20], vec![30, 1, 5]], 16, 8);
    // a prefill shorter than the prompt: the step takes the rest of it
    let mut m = Model::new(BUNDLED, &spec(1, 4), 2);
    greedy(&mut m, &[vec![7, 0, 25, 13, 13, 2, 9]], 16, 8);
}

#[test]
fn llama_shaped_model_generates_its_forward_programs_argmax() {
    let mut m = Model::new(LLAMA, &spec(2, 5), 3);
    greedy(&mut m, &[vec![1, 2, 3], vec![20, 21, 22]], 12, 6);
}

#[test]
fn gpt_generator_model_generates_its_forward_programs_argmax() {
    let c = GptConfig {
        layers: 2,
        width: 32,
        heads: 4,
        context: 10,
        batch: 2,
        vocab: 40,
    };
    let mut m = Model::new(&program(&c), &spec(1, 10), 4);
    greedy(&mut m, &[vec![5, 6, 7, 8]], 10, 5);
}

#[test]
fn an_imported_onnx_decoder_generates_its_forward_programs_argmax() {
    // PyTorch's TransformerEncoderLayer with a causal mask buffer, exported to ONNX: the mask is
    // a state whose value the import gives, which the causal check reads
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tools/onnx/models/transformer.onnx"
    );
    let bytes = std::fs::read(path).expect("the bundled ONNX model");
    // a batch of 2, and a batch of 1, whose sequences the derivation cannot follow through the
    // layers' merged axes (so it derives for one sequence only)
    for batch in [2, 1] {
        let options = sinter_onnx::Options {
            dims: [("batch".to_string(), batch)].into(),
            ..Default::default()
        };
        let imported = sinter_onnx::import(&bytes, &options).expect("imports");
        let g = &imported.graph;
        let weights: HashMap<String, Tensor> = imported.weights.into_iter().collect();
        let is_state = |n: &str| {
            g.lookup(n)
                .is_some_and(|v| matches!(g.value(v).def, ValueDef::State(_)))
        };
        let states: HashMap<String, Tensor> = (weights.iter())
            .filter(|(n, _)| is_state(n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        assert!(!states.is_empty(), "the mask buffer is a state");
        let mut m = Model::with_weights(g, &spec(batch, 6), weights.clone(), &states);
        let prompts = [vec![1, 2, 3], vec![30, 0, 7]];
        greedy(&mut m, &prompts[..batch], 16, 8);
        // without the mask's value the program cannot be proven causal
        let compile = |spec: &DecodeSpec, states: &HashMap<String, Tensor>| {
            compile_generation(g, spec, states, &Options::default(), &mut Vec::new())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = compile(&spec(batch, 6), &HashMap::new());
        assert!(e.contains("not causal"), "{e}");
        if batch == 1 {
            let e = compile(&spec(2, 6), &states);
            assert!(e.contains("1 for a program of batch 1"), "{e}");
        }
    }
}

#[test]
fn past_the_context_the_window_slides() {
    let mut m = Model::new(BUNDLED, &spec(1, 16), 5);
    // keeping the whole context re-reads it for every token: the forward program over the last
    // 16 tokens
    greedy(&mut m, &[vec![1, 2, 3, 4, 5]], 21, 16);
    // keeping half: the next tokens see between 8 and 16 tokens
    greedy(&mut m, &[vec![1, 2, 3, 4, 5]], 30, 8);
    // a prompt longer than the context keeps its last 16 tokens
    let long: Vec<i32> = (0..20).map(|i| i % 36).collect();
    greedy(&mut m, &[long], 22, 8);
}

#[test]
fn a_generation_resumed_from_its_own_prefix_continues_identically() {
    let mut m = Model::new(LLAMA, &spec(2, 12), 6);
    let sampling = Sampling {
        temperature: 0.8,
        top_k: Some(10),
        top_p: Some(0.95),
        seed: 11,
    };
    let prompts = vec![vec![4, 5], vec![6, 7]];
    let whole = m
        .generator
        .generate(&prompts, 9, &Sampling::greedy(), |_| true)
        .expect("generates");
    let prefix: Vec<Vec<i32>> = (prompts.iter().zip(&whole))
        .map(|(p, w)| [p.as_slice(), &w[..4]].concat())
        .collect();
    let rest = m
        .generator
        .generate(&prefix, 5, &Sampling::greedy(), |_| true)
        .expect("generates");
    for (w, r) in whole.iter().zip(&rest) {
        assert_eq!(&w[4..], r.as_slice());
    }
    // seeded sampling repeats itself, and the callback streams every token in order
    let mut streamed = Vec::new();
    let a = m
        .generator
        .generate(&prompts, 8, &sampling, |t| {
            streamed.push((t.sequence, t.index, t.id));
            true
        })
        .expect("generates");
    let b = m
        .generator
        .generate(&prompts, 8, &sampling, |_| true)
        .expect("generates");
    assert_eq!(a, b);
    let expected: Vec<(usize, usize, i32)> = (0..8)
        .flat_map(|i| (0..2).map(move |s| (s, i)))
        .map(|(s, i)| (s, i, a[s][i]))
        .collect();
    assert_eq!(streamed, expected);
    // a callback that returns false stops the generation
    let stopped = m
        .generator
        .generate(&prompts, 8, &sampling, |t| t.index < 2)
        .expect("generates");
    assert_eq!(stopped[0].len(), 3);
}

#[test]
fn prompts_outside_the_vocabulary_or_of_unequal_length_are_refused() {
    let mut m = Model::new(LLAMA, &spec(2, 12), 7);
    let e = m.generator.start(&[vec![1, 24], vec![1, 2]]).unwrap_err();
    assert!(
        e.to_string().contains("outside the vocabulary 0..24"),
        "{e}"
    );
    let e = m.generator.start(&[vec![1], vec![1, 2]]).unwrap_err();
    assert!(e.to_string().contains("one length"), "{e}");
    let e = m.generator.start(&[vec![1]]).unwrap_err();
    assert!(e.to_string().contains("2 sequence(s)"), "{e}");
    let e = m.generator.set_keep(13).unwrap_err();
    assert!(e.to_string().contains("from 1 to 12"), "{e}");
}
