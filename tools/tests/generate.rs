//! `sinter generate` and `sinter compile --generate` end to end (on lavapipe in CI): text from
//! a program and from its generation artifact, seeded sampling that repeats itself, the dumps
//! of the derivation, and the errors, each with its exit code and message. (The trained
//! model's text is checked after training, in `train.rs`.)

use std::path::{Path, PathBuf};

mod common;
use common::{ok, sinter};

fn s(p: impl AsRef<Path>) -> String {
    p.as_ref().to_string_lossy().into_owned()
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir-spec/examples")
}

fn model() -> String {
    s(examples().join("transformer_train.sir"))
}

fn vocab() -> String {
    s(examples().join("data/text/vocab.txt"))
}

/// `sinter generate` on the bundled model with `extra` arguments.
fn generate(model: &str, extra: &[&str]) -> common::Run {
    let vocab = vocab();
    let mut args = vec![
        "generate",
        model,
        "--vocab",
        &vocab,
        "--prompt",
        "The tower",
        "--max-new-tokens",
        "12",
    ];
    args.extend_from_slice(extra);
    sinter(&args)
}

#[test]
fn writes_the_prompt_and_a_seeded_continuation() {
    let a = generate(&model(), &["--seed", "5"]);
    assert_eq!(a.code, 0, "{}{}", a.stdout, a.stderr);
    assert!(a.stdout.starts_with("The tower"), "{}", a.stdout);
    // 12 characters of the vocabulary after the prompt, then a newline
    assert_eq!(
        a.stdout.chars().count(),
        "The tower".len() + 12 + 1,
        "{}",
        a.stdout
    );
    assert!(a.stderr.contains("tokens/s"), "{}", a.stderr);
    let b = generate(&model(), &["--seed", "5"]);
    assert_eq!(a.stdout, b.stdout, "the same seed writes the same text");
    // without a seed, one from the clock is printed
    let c = generate(&model(), &[]);
    assert!(c.stderr.starts_with("seed "), "{}", c.stderr);
    // greedy needs no seed
    let d = generate(&model(), &["--temperature", "0"]);
    assert!(!d.stderr.contains("seed"), "{}", d.stderr);
}

#[test]
fn a_generation_artifact_writes_what_its_program_writes() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("lm.sart");
    let run = ok(&[
        "compile",
        "--generate",
        &model(),
        "-o",
        &s(&artifact),
        "--batch",
        "2",
        "--prefill",
        "8",
        "--dump-after",
        "decode",
    ]);
    assert!(
        run.stdout.contains("# ==== after decode ===="),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("graph transformer_train_step"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("compiled generation of `transformer_train`")
    );
    let from_artifact = generate(&s(&artifact), &["--seed", "9", "--top-k", "5"]);
    let from_program = generate(
        &model(),
        &[
            "--seed",
            "9",
            "--top-k",
            "5",
            "--batch",
            "2",
            "--prefill",
            "8",
        ],
    );
    assert_eq!(from_artifact.code, 0, "{}", from_artifact.stderr);
    assert_eq!(from_artifact.stdout, from_program.stdout);
    assert!(from_artifact.stdout.contains("--- sample 2 ---"));
    // the step program runs as any artifact
    let inspect = ok(&["inspect", &s(&artifact)]);
    assert!(
        inspect.stdout.contains("transformer_train_step"),
        "{}",
        inspect.stdout
    );
}

#[test]
fn an_onnx_decoder_writes_with_its_mask_buffer_read_by_the_causal_check() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = dir.path().join("vocab.txt");
    let pieces: String = ('a'..='z')
        .chain('A'..='F')
        .map(|c| format!("\"{c}\"\n"))
        .collect();
    std::fs::write(&vocab, pieces).unwrap();
    let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx/models/transformer.onnx");
    let run = ok(&[
        "generate",
        &s(&onnx),
        "--dim",
        "batch=1",
        "--vocab",
        &s(&vocab),
        "--prompt",
        "abc",
        "--max-new-tokens",
        "6",
        "--temperature",
        "0",
    ]);
    assert!(run.stdout.starts_with("abc") && run.stdout.trim_end().chars().count() == 9);
}

#[test]
fn bad_generation_inputs_exit_2_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let not_causal = dir.path().join("not_causal.sir");
    let src = std::fs::read_to_string(model()).unwrap();
    std::fs::write(&not_causal, src.replace("causal=true", "causal=false")).unwrap();
    let plain = dir.path().join("plain.sart");
    ok(&["compile", &model(), "-o", &s(&plain)]);
    let weights = dir.path().join("w.safetensors");
    sinter_runtime::io::write_safetensors(
        &weights,
        &[(
            "tok_emb".to_string(),
            sinter_runtime::io::HostTensor::f32(vec![2], vec![1.0, 2.0]),
        )],
    )
    .unwrap();
    let small_vocab = dir.path().join("vocab.txt");
    std::fs::write(&small_vocab, "\"T\"\n\"h\"\n\"e\"\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--vocab".into(),
                s(&small_vocab),
            ],
            "the vocabulary has 3 tokens, but the model scores 36",
        ),
        (
            vec![model(), "--prompt".into(), "Tha €".into()],
            "'€' (at character 4) is in no token",
        ),
        (
            vec![s(&not_causal), "--prompt".into(), "The".into()],
            "is not causal",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--temperature".into(),
                "-1".into(),
            ],
            "temperature must be finite and at least 0",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--top-p".into(),
                "2".into(),
            ],
            "top-p must be above 0 and at most 1",
        ),
        (
            vec![s(&plain), "--prompt".into(), "The".into()],
            "is not a generation artifact",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--logits".into(),
                "loss".into(),
            ],
            "depend on the input `targets`",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--weights".into(),
                s(&weights),
            ],
            "weight `tok_emb` must be f32[36, 32]",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--keep".into(),
                "17".into(),
            ],
            "from 1 to 16",
        ),
        (
            vec![
                model(),
                "--prompt".into(),
                "The".into(),
                "--prefill".into(),
                "17".into(),
            ],
            "prefill length must be from 1 to the context length 16",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["generate".to_string()];
        all.extend(args.iter().cloned());
        if !args.contains(&"--vocab".to_string()) {
            all.extend(["--vocab".to_string(), vocab()]);
        }
        all.extend(["--max-new-tokens".to_string(), "3".to_string()]);
        let run = sinter(&all);
        assert_eq!(run.code, 2, "{all:?}:\n{}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(expected), "{all:?}:\n{}", run.stderr);
    }
    // raw bytes: the model scores 36 tokens, fewer than the bytes of the prompt
    let run = sinter(&[
        "generate",
        &model(),
        "--prompt",
        "The",
        "--max-new-tokens",
        "3",
    ]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("the prompt holds the byte 84"),
        "{}",
        run.stderr
    );
    // generation flags without --generate
    let run = sinter(&["compile", &model(), "-o", &s(&plain), "--batch", "2"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("add --generate"), "{}", run.stderr);
}
