//! End-to-end tests of the `sinter` binary: `check` and `eval` on the example programs, and a
//! table of bad inputs with the exit code and message each must produce.

use std::path::{Path, PathBuf};

use sinter_runtime::io::{HostTensor, TensorData, read_npy, write_npy, write_safetensors};

mod common;
use common::sinter;

// ---------------------------------------------------------------------------------------------
// harness

fn example(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ir-spec/examples")
        .join(file)
}

/// SplitMix64, for reproducible test data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), never exactly zero in practice.
    fn signed(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn below(&mut self, n: i32) -> i32 {
        (self.next() % n as u64) as i32
    }
}

/// How a test input is filled.
#[derive(Clone, Copy)]
enum Fill {
    /// f32, uniform in [-1, 1).
    Signed,
    /// i32, uniform in 0..n.
    Below(i32),
    /// i32, 0, 1, 2, ... in C order.
    Arange,
}

fn make(shape: &[usize], fill: Fill, rng: &mut Rng) -> HostTensor {
    let n = shape.iter().product::<usize>();
    match fill {
        Fill::Signed => HostTensor::f32(shape.to_vec(), (0..n).map(|_| rng.signed()).collect()),
        Fill::Below(k) => HostTensor::i32(shape.to_vec(), (0..n).map(|_| rng.below(k)).collect()),
        Fill::Arange => HostTensor::i32(shape.to_vec(), (0..n as i32).collect()),
    }
}

fn f32_data(t: &HostTensor) -> &[f32] {
    match &t.data {
        TensorData::F32(v) => v,
        TensorData::I32(_) | TensorData::F16(_) => {
            panic!("expected an f32 tensor, got {}", t.ty())
        }
    }
}

fn i32_data(t: &HostTensor) -> &[i32] {
    match &t.data {
        TensorData::I32(v) => v,
        TensorData::F32(_) | TensorData::F16(_) => {
            panic!("expected an i32 tensor, got {}", t.ty())
        }
    }
}

/// Mean cross-entropy of `logits` [N, C] against `labels` [N], in f64.
fn cross_entropy(logits: &HostTensor, labels: &[i32]) -> f64 {
    let c = logits.shape[1];
    let rows = f32_data(logits).chunks(c);
    let total: f64 = rows
        .zip(labels)
        .map(|(row, &label)| {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let lse = max
                + row
                    .iter()
                    .map(|&v| (v as f64 - max).exp())
                    .sum::<f64>()
                    .ln();
            lse - row[label as usize] as f64
        })
        .sum();
    total / labels.len() as f64
}

// ---------------------------------------------------------------------------------------------
// the examples

struct Example {
    file: &'static str,
    inputs: &'static [(&'static str, &'static [usize], Fill)],
    /// Lines `sinter check` must print.
    check_lines: &'static [&'static str],
    /// The logits output's shape; every example outputs `loss` (f32[]) and `logits`.
    logits: &'static [usize],
    /// The input holding the class labels the loss is computed against.
    labels: &'static str,
}

#[rustfmt::skip]
const EXAMPLES: &[Example] = &[
    Example {
        file: "mlp.sir",
        inputs: &[("x", &[32, 64], Fill::Signed), ("labels", &[32], Fill::Below(10))],
        check_lines: &[
            "x: f32[32, 64]  (input)",
            "labels: i32[32]  (input)",
            "w1: f32[64, 128]  (param)",
            "b3: f32[10]  (param)",
            "h1: f32[32, 128]  (relu)",
            "h2: f32[32, 64]  (relu)",
            "logits: f32[32, 10]  (add)",
            "loss: f32[]  (cross_entropy)",
        ],
        logits: &[32, 10],
        labels: "labels",
    },
    Example {
        file: "transformer.sir",
        inputs: &[
            ("ids", &[4, 16], Fill::Below(64)),
            ("pos", &[16], Fill::Arange),
            ("targets", &[64], Fill::Below(64)),
        ],
        check_lines: &[
            "ids: i32[4, 16]  (input)",
            "pos: i32[16]  (input)",
            "targets: i32[64]  (input)",
            "tok_emb: f32[64, 32]  (param)",
            "x0: f32[4, 16, 32]  (add)",
            "b1_h: f32[4, 16, 32]  (layer_norm)",
            "b1_q: f32[4, 2, 16, 16]  (permute)",
            "b1_att: f32[4, 2, 16, 16]  (attention)",
            "b1_merged: f32[4, 16, 32]  (reshape)",
            "b1_m: f32[4, 16, 128]  (gelu)",
            "x4: f32[4, 16, 32]  (add)",
            "xf: f32[64, 32]  (reshape)",
            "logits: f32[64, 64]  (matmul)",
            "loss: f32[]  (cross_entropy)",
        ],
        logits: &[64, 64],
        labels: "targets",
    },
    Example {
        file: "cnn.sir",
        inputs: &[("x", &[8, 1, 12, 12], Fill::Signed), ("labels", &[8], Fill::Below(10))],
        check_lines: &[
            "x: f32[8, 1, 12, 12]  (input)",
            "conv2_w: f32[16, 4, 3, 3]  (param)",
            "c1: f32[8, 8, 12, 12]  (conv2d)",
            "n1: f32[8, 8, 12, 12]  (group_norm)",
            "p1: f32[8, 8, 6, 6]  (max_pool2d)",
            "c2: f32[8, 16, 3, 3]  (conv2d)",
            "p2: f32[8, 16, 1, 1]  (avg_pool2d)",
            "features: f32[8, 16]  (reshape)",
            "logits: f32[8, 10]  (add)",
            "loss: f32[]  (cross_entropy)",
        ],
        logits: &[8, 10],
        labels: "labels",
    },
];

/// Writes the example's inputs into `dir`; returns the `--input` arguments and the tensors.
fn write_inputs(ex: &Example, dir: &Path, seed: u64) -> (Vec<String>, Vec<(String, HostTensor)>) {
    let mut rng = Rng(seed);
    let mut args = Vec::new();
    let mut tensors = Vec::new();
    for &(name, shape, fill) in ex.inputs {
        let t = make(shape, fill, &mut rng);
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, &t).unwrap();
        args.push("--input".to_string());
        args.push(format!("{name}={}", path.display()));
        tensors.push((name.to_string(), t));
    }
    (args, tensors)
}

#[test]
fn check_prints_every_named_value_with_its_type() {
    for ex in EXAMPLES {
        let run = sinter(&["check".as_ref(), example(ex.file).as_os_str()]);
        assert_eq!(run.code, 0, "{}: {}", ex.file, run.stderr);
        let lines: Vec<&str> = run.stdout.lines().collect();
        for expected in ex.check_lines {
            assert!(
                lines.contains(expected),
                "{}: missing line {expected:?} in:\n{}",
                ex.file,
                run.stdout
            );
        }
        assert_eq!(lines.last(), Some(&"output loss, logits"), "{}", ex.file);
        // Every value line has the documented form; generated names are hidden.
        for line in &lines[..lines.len() - 1] {
            let (name, rest) = line.split_once(": ").expect("name: type");
            assert!(
                !name.starts_with('_'),
                "{}: generated name shown: {line}",
                ex.file
            );
            assert!(
                (rest.starts_with("f32[") || rest.starts_with("i32[")) && rest.ends_with(')'),
                "{}: malformed line {line:?}",
                ex.file
            );
        }
        // `--all` shows the generated ones too.
        let all = sinter(&[
            "check".as_ref(),
            example(ex.file).as_os_str(),
            "--all".as_ref(),
        ]);
        assert_eq!(all.code, 0);
        assert!(all.stdout.lines().count() > lines.len(), "{}", ex.file);
        assert!(
            all.stdout.lines().any(|l| l.starts_with('_')),
            "{}",
            ex.file
        );
    }
}

#[test]
fn eval_writes_every_output_and_the_loss_matches_the_logits() {
    for ex in EXAMPLES {
        let dir = tempfile::tempdir().unwrap();
        let (mut args, inputs) = write_inputs(ex, dir.path(), 7);
        let out = dir.path().join("out/nested");
        let mut cmd = vec!["eval".to_string(), example(ex.file).display().to_string()];
        cmd.append(&mut args);
        cmd.extend(["--out".to_string(), out.display().to_string()]);
        let run = sinter(&cmd);
        assert_eq!(run.code, 0, "{}: {}", ex.file, run.stderr);

        let loss = read_npy(&out.join("loss.npy")).unwrap();
        let logits = read_npy(&out.join("logits.npy")).unwrap();
        assert_eq!(loss.shape, Vec::<usize>::new(), "{}", ex.file);
        assert_eq!(logits.shape, ex.logits, "{}", ex.file);
        let values = f32_data(&logits);
        assert!(values.iter().all(|v| v.is_finite()), "{}", ex.file);
        let spread = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(spread > 1e-3, "{}: logits are all ~0", ex.file);

        // The loss the interpreter computed is the cross-entropy of the logits it wrote.
        let loss = f32_data(&loss)[0] as f64;
        let labels = &inputs.iter().find(|(n, _)| n == ex.labels).unwrap().1;
        let expected = cross_entropy(&logits, i32_data(labels));
        assert!(
            loss.is_finite() && (loss - expected).abs() < 1e-4 * expected.max(1.0),
            "{}: loss {loss} vs cross-entropy of the logits {expected}",
            ex.file
        );

        // One summary line per output, naming its file.
        assert!(
            run.stdout.lines().any(|l| l.starts_with("loss: f32[] = ")),
            "{}",
            run.stdout
        );
        let logits_line = format!(
            "logits: f32[{}]",
            ex.logits
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert!(
            run.stdout.lines().any(|l| l.starts_with(&logits_line)
                && l.contains("mean=")
                && l.ends_with("logits.npy")),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn transformer_loss_at_init_is_near_uniform() {
    let ex = &EXAMPLES[1];
    assert_eq!(ex.file, "transformer.sir");
    let dir = tempfile::tempdir().unwrap();
    let (mut args, _) = write_inputs(ex, dir.path(), 11);
    let mut cmd = vec!["eval".to_string(), example(ex.file).display().to_string()];
    cmd.append(&mut args);
    cmd.extend(["--out".to_string(), dir.path().display().to_string()]);
    let run = sinter(&cmd);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let loss = f32_data(&read_npy(&dir.path().join("loss.npy")).unwrap())[0] as f64;
    let uniform = 64f64.ln();
    assert!(
        (loss - uniform).abs() < 0.05,
        "loss at init {loss}, expected about ln(64) = {uniform}"
    );
}

#[test]
fn weights_replace_initializers() {
    // Zero the last layer: every logit is 0, so the loss is exactly ln(10) whatever the input.
    let ex = &EXAMPLES[0];
    let dir = tempfile::tempdir().unwrap();
    let (mut args, _) = write_inputs(ex, dir.path(), 3);
    let weights = dir.path().join("w.safetensors");
    write_safetensors(
        &weights,
        &[
            ("w3".into(), HostTensor::f32(vec![64, 10], vec![0.0; 640])),
            ("b3".into(), HostTensor::f32(vec![10], vec![0.0; 10])),
        ],
    )
    .unwrap();
    let mut cmd = vec!["eval".to_string(), example(ex.file).display().to_string()];
    cmd.append(&mut args);
    cmd.extend(["--weights".to_string(), weights.display().to_string()]);
    let with = sinter(&cmd);
    assert_eq!(with.code, 0, "{}", with.stderr);
    let expected = format!("loss: f32[] = {:.6}", 10f64.ln());
    assert!(with.stdout.contains(&expected), "{}", with.stdout);
    // Without the weights the initializers give another loss.
    let without = sinter(&cmd[..cmd.len() - 2]);
    assert_eq!(without.code, 0, "{}", without.stderr);
    assert!(!without.stdout.contains(&expected), "{}", without.stdout);
}

/// A training graph: `eval` runs autodiff before the interpreter, so `grad` results come out.
#[test]
fn eval_differentiates_grad_statements() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("fit.sir"),
        "graph fit {
  input x: f32[4, 3]
  input y: f32[4, 2]
  param w: f32[3, 2] = ones
  loss = mse_loss(matmul(x, w), y)
  dw = grad(loss, w)
  output loss, dw
}
",
    )
    .unwrap();
    let mut rng = Rng(9);
    let x = make(&[4, 3], Fill::Signed, &mut rng);
    let y = make(&[4, 2], Fill::Signed, &mut rng);
    write_npy(&d.join("x.npy"), &x).unwrap();
    write_npy(&d.join("y.npy"), &y).unwrap();
    let p = |n: &str| d.join(n).display().to_string();
    let run = sinter(&[
        "eval".to_string(),
        p("fit.sir"),
        "-i".to_string(),
        format!("x={}", p("x.npy")),
        "-i".to_string(),
        format!("y={}", p("y.npy")),
        "-o".to_string(),
        p("out"),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    // d/dw mean((xw - y)^2) = 2/8 * x^T (xw - y), with w all ones.
    let (xv, yv) = (f32_data(&x), f32_data(&y));
    let mut expected = [0f64; 6];
    for r in 0..4 {
        let xw: f64 = (0..3).map(|k| xv[r * 3 + k] as f64).sum();
        for c in 0..2 {
            let e = xw - yv[r * 2 + c] as f64;
            for k in 0..3 {
                expected[k * 2 + c] += 2.0 / 8.0 * xv[r * 3 + k] as f64 * e;
            }
        }
    }
    let dw = read_npy(&d.join("out/dw.npy")).unwrap();
    assert_eq!(dw.shape, vec![3, 2]);
    for (got, want) in f32_data(&dw).iter().zip(expected) {
        assert!((*got as f64 - want).abs() < 1e-5, "dw {got} vs {want}");
    }
}

// ---------------------------------------------------------------------------------------------
// bad inputs

const BAD_PROGRAM: &str = "graph bad {
  input x: f32[2, 3]
  param w: f32[4, 5] = zeros
  y = matmul(x, w)
  output y
}
";

/// Verifies, but autodiff refuses it: gradients do not flow through `grad` results.
const GRAD_OF_GRAD: &str = "graph grad2 {
  input x: f32[3]
  param w: f32[3] = ones
  loss = sum(mul(x, w))
  dw = grad(loss, w)
  again = sum(mul(dw, w))
  ddw = grad(again, w)
  output ddw
}
";

struct Case {
    what: &'static str,
    args: Vec<String>,
    code: i32,
    stderr: &'static [&'static str],
}

#[test]
fn bad_inputs_fail_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| d.join(name).display().to_string();
    let mut rng = Rng(5);
    let files: &[(&str, HostTensor)] = &[
        ("x.npy", make(&[32, 64], Fill::Signed, &mut rng)),
        ("labels.npy", make(&[32], Fill::Below(10), &mut rng)),
        ("x_short.npy", make(&[32, 63], Fill::Signed, &mut rng)),
        ("x_int.npy", make(&[32, 64], Fill::Below(3), &mut rng)),
        ("labels_f32.npy", make(&[32], Fill::Signed, &mut rng)),
        ("labels_big.npy", HostTensor::i32(vec![32], vec![10; 32])),
    ];
    for (name, t) in files {
        write_npy(&d.join(name), t).unwrap();
    }
    std::fs::write(d.join("notes.txt"), "not a tensor\n").unwrap();
    let good = std::fs::read(d.join("x.npy")).unwrap();
    std::fs::write(d.join("x_cut.npy"), &good[..good.len() - 10]).unwrap();
    std::fs::write(d.join("bad.sir"), BAD_PROGRAM).unwrap();
    std::fs::write(d.join("grad2.sir"), GRAD_OF_GRAD).unwrap();
    std::fs::write(d.join("a_file"), "").unwrap();
    write_safetensors(
        &d.join("w_bogus.safetensors"),
        &[("bogus".into(), HostTensor::f32(vec![2], vec![1.0, 2.0]))],
    )
    .unwrap();
    write_safetensors(
        &d.join("w_escape.safetensors"),
        &[(
            "\u{1b}[2J\u{1b}[31mred".into(),
            HostTensor::f32(vec![2], vec![1.0, 2.0]),
        )],
    )
    .unwrap();
    std::fs::write(d.join("latin1.sir"), b"graph g {\n  # caf\xe9\n}\n").unwrap();
    std::fs::write(
        d.join("huge.sir"),
        "graph huge {\n  y = iota(shape=[100000, 100000], axis=0)\n  output y\n}\n",
    )
    .unwrap();
    // the scores of an attention, a value the front end generates, pass the budget: refused
    // before anything is computed, naming the line of the attention
    std::fs::write(
        d.join("huge_scores.sir"),
        "graph scores {\n  input q: f32[1, 1, 30000, 2]\n  # all pairs\n  o = attention(q, q, q)\n  output o\n}\n",
    )
    .unwrap();
    write_npy(
        &d.join("q_long.npy"),
        &HostTensor::f32(vec![1, 1, 30000, 2], vec![0.5; 60000]),
    )
    .unwrap();
    write_safetensors(
        &d.join("w_shape.safetensors"),
        &[(
            "w1".into(),
            HostTensor::f32(vec![128, 64], vec![0.0; 128 * 64]),
        )],
    )
    .unwrap();

    let mlp = example("mlp.sir").display().to_string();
    let eval = |extra: &[String]| -> Vec<String> {
        let mut args = vec!["eval".to_string(), mlp.clone()];
        args.extend_from_slice(extra);
        args
    };
    let i = |spec: String| ["--input".to_string(), spec];
    let x = i(format!("x={}", p("x.npy")));
    let labels = i(format!("labels={}", p("labels.npy")));
    let both = [x.clone(), labels.clone()].concat();
    let with = |more: &[&[String]]| {
        let mut args = both.clone();
        for m in more {
            args.extend_from_slice(m);
        }
        eval(&args)
    };
    let s = |v: &str| v.to_string();

    #[rustfmt::skip]
    let cases = vec![
        Case { what: "missing input", args: eval(&x), code: 2,
               stderr: &["error: missing input `labels`: i32[32]", "--input"] },
        Case { what: "no inputs at all", args: eval(&[]), code: 2,
               stderr: &["missing inputs `x`: f32[32, 64], `labels`: i32[32]"] },
        Case { what: "extra input", args: with(&[&i(format!("extra={}", p("x.npy")))]), code: 2,
               stderr: &["`extra` is not an input of graph `mlp`", "`x`: f32[32, 64]"] },
        Case { what: "param given as input", args: with(&[&i(format!("w1={}", p("x.npy")))]), code: 2,
               stderr: &["`w1` is a param or state of graph `mlp`, not an input", "--weights"] },
        Case { what: "computed value given as input", args: with(&[&i(format!("h1={}", p("x.npy")))]), code: 2,
               stderr: &["`h1` is computed by graph `mlp`, not an input"] },
        Case { what: "duplicate input", args: with(&[&x]), code: 2,
               stderr: &["input `x` is given twice"] },
        Case { what: "mis-shaped", args: eval(&[i(format!("x={}", p("x_short.npy"))), labels.clone()].concat()), code: 2,
               stderr: &["input `x` must be f32[32, 64], but", "x_short.npy holds f32[32, 63]"] },
        Case { what: "i32 given for f32", args: eval(&[i(format!("x={}", p("x_int.npy"))), labels.clone()].concat()), code: 2,
               stderr: &["input `x` must be f32[32, 64], but", "x_int.npy holds i32[32, 64]"] },
        Case { what: "f32 given for i32", args: eval(&[x.clone(), i(format!("labels={}", p("labels_f32.npy")))].concat()), code: 2,
               stderr: &["input `labels` must be i32[32], but", "labels_f32.npy holds f32[32]"] },
        Case { what: "unreadable file", args: eval(&[i(s("x=/nonexistent/dir/x.npy")), labels.clone()].concat()), code: 2,
               stderr: &["error: cannot read /nonexistent/dir/x.npy"] },
        Case { what: "not an npy file", args: eval(&[i(format!("x={}", p("notes.txt"))), labels.clone()].concat()), code: 2,
               stderr: &["notes.txt is not a .npy file"] },
        Case { what: "truncated npy file", args: eval(&[i(format!("x={}", p("x_cut.npy"))), labels.clone()].concat()), code: 2,
               stderr: &["x_cut.npy is truncated or corrupt", "8192 bytes of data, but 8182"] },
        Case { what: "--input without =", args: eval(&i(p("x.npy"))), code: 2,
               stderr: &["expected NAME=FILE"] },
        Case { what: "--input with empty name", args: eval(&i(s("=x.npy"))), code: 2,
               stderr: &["name before `=` is empty"] },
        Case { what: "label out of range", args: eval(&[x.clone(), i(format!("labels={}", p("labels_big.npy")))].concat()), code: 2,
               stderr: &["error: evaluation failed", "labels", "10"] },
        Case { what: "weights: unknown tensor", args: with(&[&[s("--weights"), p("w_bogus.safetensors")]]), code: 2,
               stderr: &["tensor `bogus` is not a param or state of graph `mlp`", "`w1`: f32[64, 128]"] },
        Case { what: "weights: a name that drives the terminal", args: with(&[&[s("--weights"), p("w_escape.safetensors")]]), code: 2,
               stderr: &["tensor `␛[2J␛[31mred` is not a param"] },
        Case { what: "program not UTF-8", args: vec![s("check"), p("latin1.sir")], code: 1,
               stderr: &["the file is not UTF-8: byte 17 is 0xe9", "latin1.sir:2:8"] },
        Case { what: "80 GB for the interpreter", args: vec![s("eval"), p("huge.sir")], code: 2,
               stderr: &["`y` (f32[100000, 100000]) would bring the interpreter's memory to", "budget of 4294967296 bytes"] },
        Case { what: "generated value past the budget", args: [vec![s("eval"), p("huge_scores.sir")], i(format!("q={}", p("q_long.npy"))).to_vec()].concat(), code: 2,
               stderr: &["f32[1, 1, 30000, 30000]) would bring the interpreter's memory to", "(generated from `o`, defined at", "huge_scores.sir:4)"] },
        Case { what: "--max-memory not a size", args: vec![s("eval"), p("huge.sir"), s("--max-memory=0")], code: 2,
               stderr: &["expected a positive number of GiB"] },
        Case { what: "weights: mis-shaped", args: with(&[&[s("--weights"), p("w_shape.safetensors")]]), code: 2,
               stderr: &["weight `w1` must be f32[64, 128], but", "holds f32[128, 64]"] },
        Case { what: "weights: not safetensors", args: with(&[&[s("--weights"), p("x.npy")]]), code: 2,
               stderr: &["x.npy is not a safetensors file"] },
        Case { what: "weights: missing file", args: with(&[&[s("--weights"), p("nope.safetensors")]]), code: 2,
               stderr: &["cannot read", "nope.safetensors"] },
        Case { what: "output dir is a file", args: with(&[&[s("--out"), p("a_file")]]), code: 2,
               stderr: &["cannot create the output directory", "a_file"] },
        Case { what: "unreadable program", args: vec![s("eval"), p("missing.sir")], code: 2,
               stderr: &["error: cannot read", "missing.sir"] },
        Case { what: "IR error (eval)", args: vec![s("eval"), p("bad.sir"), s("--input"), format!("x={}", p("x.npy"))], code: 1,
               stderr: &["bad.sir", "inner dimensions differ", "3 vs 4"] },
        Case { what: "second-order grad", args: vec![s("eval"), p("grad2.sir"), s("--input"), format!("x={}", p("x.npy"))], code: 1,
               stderr: &["second-order gradients are not supported", "grad2.sir:5:3", "`dw` is computed by this `grad`"] },
        Case { what: "IR error (check)", args: vec![s("check"), p("bad.sir")], code: 1,
               stderr: &["bad.sir", "inner dimensions differ", "3 vs 4"] },
        Case { what: "unreadable program (check)", args: vec![s("check"), p("missing.sir")], code: 2,
               stderr: &["error: cannot read", "missing.sir"] },
        Case { what: "unknown subcommand", args: vec![s("frobnicate")], code: 2,
               stderr: &["frobnicate"] },
    ];

    let mut failures = Vec::new();
    for case in &cases {
        let run = sinter(&case.args);
        let missing: Vec<&&str> = case
            .stderr
            .iter()
            .filter(|s| !run.stderr.contains(**s))
            .collect();
        if run.code != case.code || !missing.is_empty() {
            failures.push(format!(
                "{}: exit {} (want {}), missing {:?}\n  args: {:?}\n  stderr: {}",
                case.what, run.code, case.code, missing, case.args, run.stderr
            ));
        }
        if let Some(c) = run.stderr.chars().find(|&c| c.is_control() && c != '\n') {
            failures.push(format!(
                "{}: printed the control character {:?} to the terminal",
                case.what, c
            ));
        }
        if !run.stdout.is_empty() {
            failures.push(format!(
                "{}: printed to stdout on failure: {}",
                case.what, run.stdout
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
