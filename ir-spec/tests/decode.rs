//! The decode derivation (`sinter_ir::decode`) in the interpreter: the derived prefill and step
//! programs, fed a prompt and then their own greedy choices, give at every position the logits
//! that the forward program gives on that prefix; and programs that cannot generate are refused
//! with the reason.

mod interp_common;

use std::collections::HashMap;

use interp_common::Rng;
use sinter_ir::decode::{DecodeError, DecodeSpec, Decoder, derive, forward_part, reference_logits};
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{Graph, ValueDef};

const BUNDLED: &str = include_str!("../examples/transformer_train.sir");
const LLAMA: &str = include_str!("decode/llama_tiny.sir");

fn parse(src: &str) -> Graph {
    sinter_ir::text::parse(src).expect("a valid program")
}

/// Random values for every param (the initializers' small ones would leave logits nearly tied).
fn weights(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    let mut rng = Rng::new(seed);
    g.params()
        .map(|p| {
            let shape = &g.ty(p).shape;
            let n = shape.iter().product();
            let data = (0..n).map(|_| 0.4 * rng.nonzero()).collect();
            (g.name_of(p).to_string(), Tensor::f32(shape.clone(), data))
        })
        .collect()
}

fn argmax(row: &[f64]) -> i32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as i32
}

fn forward_logits(
    forward: &Graph,
    weights: &HashMap<String, Tensor>,
    rows: &[Vec<i32>],
) -> Vec<Vec<f64>> {
    reference_logits(forward, "ids", weights, rows).expect("the forward program runs")
}

/// The derived programs in the interpreter, their params and caches carried from run to run.
struct Decoding<'a> {
    d: &'a Decoder,
    persistent: HashMap<String, Tensor>,
}

impl Decoding<'_> {
    fn run(&mut self, prefill: bool, tokens: &[i32], width: usize, at: usize) -> Vec<Vec<f64>> {
        let (g, position) = if prefill {
            (&self.d.prefill, &self.d.info.last)
        } else {
            (&self.d.step, &self.d.info.position)
        };
        let b = self.d.info.batch as usize;
        let mut ids = vec![0i64; b * width];
        let per_row = tokens.len() / b;
        for r in 0..b {
            for i in 0..per_row {
                ids[r * width + i] = i64::from(tokens[r * per_row + i]);
            }
        }
        let inputs = HashMap::from([
            ("ids".to_string(), Tensor::i32(vec![b, width], ids)),
            (position.clone(), Tensor::i32(vec![], vec![at as i64])),
        ]);
        let out = evaluate(g, &inputs, &self.persistent).expect("a derived program runs");
        for (name, value) in out.assigned {
            self.persistent.insert(name, value);
        }
        let logits = &out.outputs[0].1;
        let v = self.d.info.vocab as usize;
        (0..b)
            .map(|r| logits.data[r * v..(r + 1) * v].to_vec())
            .collect()
    }
}

fn close(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    for (g, w) in got.iter().zip(want) {
        let scale = w.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let err = g
            .iter()
            .zip(w)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-9 * scale,
            "{what}: logits differ by {err} (scale {scale})\n got {g:?}\nwant {w:?}"
        );
    }
}

/// Feeds `prompts` (one per sequence, of equal length) through the prefill (its first
/// `prefill` tokens) and the step (the rest), then generates greedily up to the context,
/// checking every logits row against the forward program on the same prefix. Returns the
/// sequences.
fn greedy(src: &str, spec: &DecodeSpec, prompts: &[Vec<i32>], seed: u64) -> Vec<Vec<i32>> {
    let g = parse(src);
    let d = derive(&g, spec).unwrap_or_else(|e| panic!("derivation failed: {e}"));
    let forward = forward_part(&g, &spec.ids, &spec.logits).expect("a forward part");
    let w = weights(&forward, seed);
    let context = d.info.context as usize;
    let prefill = d.info.prefill as usize;
    let mut seqs: Vec<Vec<i32>> = prompts.to_vec();
    let mut run = Decoding {
        d: &d,
        persistent: w.clone(),
    };
    let len = prompts[0].len();
    let first = len.min(prefill);
    let heads: Vec<i32> = seqs.iter().flat_map(|s| s[..first].to_vec()).collect();
    let mut logits = run.run(true, &heads, prefill, first - 1);
    let prefixes: Vec<Vec<i32>> = seqs.iter().map(|s| s[..first].to_vec()).collect();
    close(&logits, &forward_logits(&forward, &w, &prefixes), "prefill");
    for at in first..len {
        let toks: Vec<i32> = seqs.iter().map(|s| s[at]).collect();
        logits = run.run(false, &toks, 1, at);
        let prefixes: Vec<Vec<i32>> = seqs.iter().map(|s| s[..=at].to_vec()).collect();
        close(
            &logits,
            &forward_logits(&forward, &w, &prefixes),
            &format!("prompt token {at}"),
        );
    }
    while seqs[0].len() < context {
        for (s, row) in seqs.iter_mut().zip(&logits) {
            s.push(argmax(row));
        }
        let at = seqs[0].len() - 1;
        let toks: Vec<i32> = seqs.iter().map(|s| s[at]).collect();
        logits = run.run(false, &toks, 1, at);
        close(
            &logits,
            &forward_logits(&forward, &w, &seqs),
            &format!("generated token {at}"),
        );
    }
    seqs
}

fn spec(batch: usize, prefill: usize) -> DecodeSpec {
    DecodeSpec::sized(batch, prefill)
}

#[test]
fn bundled_model_decodes_as_its_forward_program() {
    // the training program's forward part, batch 4 re-batched to 2
    greedy(BUNDLED, &spec(2, 16), &[vec![3, 17, 20], vec![30, 1, 5]], 1);
    // a prefill shorter than the prompt: the rest of the prompt goes through the step
    greedy(BUNDLED, &spec(1, 4), &[vec![7, 0, 25, 13, 13, 2, 9]], 2);
}

#[test]
fn llama_shaped_model_decodes_as_its_forward_program() {
    greedy(
        LLAMA,
        &spec(2, 12),
        &[vec![1, 2, 3, 4], vec![20, 21, 22, 23]],
        3,
    );
    greedy(
        LLAMA,
        &spec(3, 5),
        &[vec![5, 6, 7], vec![8, 9, 10], vec![11, 0, 1]],
        4,
    );
    greedy(LLAMA, &spec(1, 1), &[vec![4]], 5);
}

#[test]
fn a_generation_resumed_from_its_own_prefix_continues_identically() {
    let whole = greedy(LLAMA, &spec(1, 12), &[vec![9, 3]], 6);
    let resumed = greedy(LLAMA, &spec(1, 12), &[whole[0][..7].to_vec()], 6);
    assert_eq!(whole, resumed);
}

#[test]
fn derived_programs_keep_the_weights_and_add_caches() {
    let g = parse(LLAMA);
    let d = derive(&g, &spec(1, 12)).expect("derives");
    let params =
        |g: &Graph| -> Vec<String> { g.params().map(|p| g.name_of(p).to_string()).collect() };
    assert_eq!(params(&d.prefill), params(&g));
    assert_eq!(params(&d.step), params(&g));
    // two layers, each caching keys after the rotary (per key head) and values
    assert_eq!(d.info.caches.len(), 4);
    for c in &d.info.caches {
        let v = d.step.lookup(c).expect("a cache state");
        assert!(matches!(d.step.value(v).def, ValueDef::State(_)));
        let shape = &d.step.ty(v).shape;
        assert!(shape.contains(&12), "{c}: {shape:?}");
        // grouped-query keys are cached per key head: 2 heads of 8, or 16 values per position
        assert_eq!(shape.iter().product::<usize>(), 12 * 16, "{c}: {shape:?}");
    }
    assert_eq!((d.info.context, d.info.vocab), (12, 24));
    // the step reads one position per sequence
    let ids = d.step.lookup("ids").unwrap();
    assert_eq!(d.step.ty(ids).shape, vec![1, 1]);
    assert!(d.describe().contains("# ---- step ----"));
}

fn refused(src: &str, spec: &DecodeSpec) -> DecodeError {
    match derive(&parse(src), spec) {
        Ok(_) => panic!("derivation should fail"),
        Err(e) => e,
    }
}

#[test]
fn attention_without_a_causal_mask_is_refused() {
    let src = BUNDLED.replace("causal=true", "causal=false");
    let e = refused(&src, &DecodeSpec::default());
    assert!(matches!(e, DecodeError::NotCausal { .. }), "{e}");
    assert!(e.to_string().contains("causal=true"), "{e}");
    // the mask the wrong way round lets a query see later keys
    let src = LLAMA.replace("le(b2_col, b2_row)", "ge(b2_col, b2_row)");
    let e = refused(&src, &DecodeSpec::default());
    assert!(matches!(e, DecodeError::NotCausal { .. }), "{e}");
}

#[test]
fn mixing_positions_is_refused() {
    // a mean over the positions makes every position read later tokens
    let src = LLAMA.replace(
        "x0 = embedding(emb, ids)",
        "x0 = add(embedding(emb, ids), mean(embedding(emb, ids), axes=[1], keepdim=true))",
    );
    let e = refused(&src, &DecodeSpec::default());
    assert!(e.to_string().contains("combines the positions"), "{e}");
    // shifting the positions
    let src = LLAMA.replace(
        "x0 = embedding(emb, ids)",
        "x0 = concat(slice(embedding(emb, ids), axis=1, start=1, end=12), slice(embedding(emb, ids), axis=1, start=0, end=1), axis=1)",
    );
    let e = refused(&src, &DecodeSpec::default());
    assert!(e.to_string().contains("slices the positions"), "{e}");
}

#[test]
fn names_and_sizes_are_checked() {
    let e = refused(
        BUNDLED,
        &DecodeSpec {
            ids: "tokens".into(),
            ..DecodeSpec::default()
        },
    );
    assert!(e.to_string().contains("its inputs are ids, targets"), "{e}");
    let e = refused(
        BUNDLED,
        &DecodeSpec {
            logits: "loss".into(),
            ..DecodeSpec::default()
        },
    );
    assert!(matches!(e, DecodeError::OtherInput { .. }), "{e}");
    let e = refused(BUNDLED, &spec(1, 17));
    assert!(e.to_string().contains("prefill length"), "{e}");
    let e = refused(
        BUNDLED,
        &DecodeSpec {
            logits: "nope".into(),
            ..DecodeSpec::default()
        },
    );
    assert!(matches!(e, DecodeError::NoLogits { .. }), "{e}");
}
