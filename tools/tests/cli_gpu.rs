//! End-to-end tests of `sinter compile`, `run` and `inspect`: every example compiled and run on
//! the GPU (lavapipe in CI) against `sinter eval` on the same inputs, training steps and a
//! weights round trip, the artifact listing, and a table of bad inputs with the exit code and
//! message each must produce.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sinter_ir::DType;
use sinter_runtime::io::{HostTensor, read_npy, write_npy, write_safetensors};

mod common;
use common::{ok, sinter, sinter_env};

// ---------------------------------------------------------------------------------------------
// harness

fn s(v: impl AsRef<std::ffi::OsStr>) -> String {
    v.as_ref().to_string_lossy().into_owned()
}

/// Every program in `ir-spec/examples/`, sorted: new examples are tested without editing this
/// file.
fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir-spec/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ir-spec/examples exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sir"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "expected the example programs in {dir:?}");
    files
}

fn stem(path: &Path) -> String {
    s(path.file_stem().expect("a file name"))
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

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn below(&mut self, n: i32) -> i32 {
        (self.next() % n as u64) as i32
    }
}

/// Integer inputs (class labels, token ids, positions) are drawn from `0..INT_BOUND`, valid for
/// every example's classes, vocabulary and sequence length.
const INT_BOUND: i32 = 10;

/// Random values for every input of the program at `sir`, written to `dir/NAME.npy`; returns
/// the `--input` arguments.
fn write_inputs(sir: &Path, dir: &Path, seed: u64) -> Vec<String> {
    let src = std::fs::read_to_string(sir).unwrap();
    let graph = sinter_ir::text::parse(&src)
        .unwrap_or_else(|d| panic!("{}", d.render(&sir.display().to_string(), &src)));
    let mut rng = Rng(seed);
    let mut args = Vec::new();
    for v in graph.inputs() {
        let (name, ty) = (graph.name_of(v), graph.ty(v));
        let n = ty.numel();
        let t = match ty.dtype {
            DType::F32 => {
                HostTensor::f32(ty.shape.to_vec(), (0..n).map(|_| rng.signed()).collect())
            }
            DType::I32 => HostTensor::i32(
                ty.shape.to_vec(),
                (0..n).map(|_| rng.below(INT_BOUND)).collect(),
            ),
            DType::F16 => HostTensor::f16(
                ty.shape.to_vec(),
                (0..n).map(|_| half::f16::from_f32(rng.signed())).collect(),
            ),
        };
        let path = dir.join(format!("{name}.npy"));
        write_npy(&path, &t).unwrap();
        args.extend(["--input".to_string(), format!("{name}={}", path.display())]);
    }
    args
}

fn values(t: &HostTensor) -> Vec<f64> {
    t.data.to_f64()
}

/// Largest |got - want| relative to the largest |want| (or absolute below 1).
fn relative_error(got: &HostTensor, want: &HostTensor) -> f64 {
    let (got, want) = (values(got), values(want));
    let scale = want.iter().fold(1f64, |m, w| m.max(w.abs()));
    got.iter()
        .zip(&want)
        .map(|(g, w)| {
            if g.is_finite() && w.is_finite() {
                (g - w).abs() / scale
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// The `.npy` files in `dir`, by name without the extension, sorted.
fn npy_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "npy"))
        .map(|p| stem(&p))
        .collect();
    names.sort();
    names
}

/// Compiles `sir` to `dir/NAME.sart`.
fn compile(sir: &Path, dir: &Path) -> PathBuf {
    let sart = dir.join(format!("{}.sart", stem(sir)));
    let run = ok(&[s("compile"), s(sir), s("-o"), s(&sart)]);
    assert!(
        run.stdout.lines().any(|l| l.starts_with("compiled `")
            && l.contains(" kernels, ")
            && l.contains(" dispatches, arena ")
            && l.contains("lower bound")
            && l.ends_with(&s(&sart))),
        "compile summary:\n{}",
        run.stdout
    );
    sart
}

/// A small regression trained by SGD: one run is one step, its assigns update `w` and `b`.
const FIT: &str = "graph fit {
  input x: f32[8, 4]
  input y: f32[8, 2]
  param w: f32[4, 2] = normal(std=0.5, seed=1)
  param b: f32[2] = zeros
  loss = mse_loss(add(matmul(x, w), b), y)
  dw, db = grad(loss, w, b)
  assign w = sub(w, mul(dw, 0.1))
  assign b = sub(b, mul(db, 0.1))
  output loss, dw
}
";

fn scalar(path: &Path) -> f64 {
    let t = read_npy(path).unwrap();
    assert_eq!(
        t.shape,
        Vec::<usize>::new(),
        "{} is not a scalar",
        path.display()
    );
    values(&t)[0]
}

// ---------------------------------------------------------------------------------------------
// compile + run against eval

#[test]
fn compiled_examples_match_the_interpreter() {
    for sir in examples() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let inputs = write_inputs(&sir, d, 17);
        let sart = compile(&sir, d);

        let (want, got) = (d.join("eval"), d.join("run"));
        let mut eval = vec![s("eval"), s(&sir), s("--out"), s(&want)];
        eval.extend(inputs.iter().cloned());
        ok(&eval);
        let mut run = vec![s("run"), s(&sart), s("--out"), s(&got)];
        run.extend(inputs.iter().cloned());
        let run = ok(&run);

        let names = npy_files(&want);
        assert!(!names.is_empty(), "{}: eval wrote nothing", sir.display());
        assert_eq!(npy_files(&got), names, "{}: outputs differ", sir.display());
        for name in &names {
            let file = format!("{name}.npy");
            let (w, g) = (
                read_npy(&want.join(&file)).unwrap(),
                read_npy(&got.join(&file)).unwrap(),
            );
            assert_eq!(g.ty(), w.ty(), "{}: output `{name}`", sir.display());
            let err = relative_error(&g, &w);
            assert!(
                err <= 1e-4,
                "{}: output `{name}` differs from eval by {err:e} of max |ref|",
                sir.display()
            );
            // The summary line names the output, its type and its file.
            assert!(
                run.stdout
                    .lines()
                    .any(|l| l.starts_with(&format!("{name}: {}", w.ty())) && l.ends_with(&file)),
                "{}: no summary for `{name}`:\n{}",
                sir.display(),
                run.stdout
            );
        }
        assert!(
            run.stdout.lines().any(|l| l.starts_with("ran 1 step in ")),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn verbose_run_names_the_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sir = examples().into_iter().next().unwrap();
    let inputs = write_inputs(&sir, d, 3);
    let sart = compile(&sir, d);
    let mut args = vec![s("run"), s(&sart), s("--verbose")];
    args.extend(inputs);
    let run = ok(&args);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("adapter: "), "{}", run.stdout);
    assert!(
        lines[1].starts_with("loaded: ") && lines[1].contains("pipelines"),
        "{}",
        run.stdout
    );
}

/// `--steps`, `--save-weights` and `--weights` agree with each other: three steps from the
/// initial values equal one step, saved, then two steps from the saved weights; and a step from
/// saved weights equals `sinter eval` with the same weights.
#[test]
fn steps_and_weights_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sir = d.join("fit.sir");
    std::fs::write(&sir, FIT).unwrap();
    let inputs = write_inputs(&sir, d, 23);
    let sart = compile(&sir, d);
    let run = |out: &str, extra: &[String]| {
        let mut args = vec![s("run"), s(&sart), s("--out"), s(d.join(out))];
        args.extend(inputs.iter().cloned());
        args.extend_from_slice(extra);
        ok(&args)
    };
    let p = |name: &str| s(d.join(name));

    let one = run("one", &[s("--save-weights"), p("w1.safetensors")]);
    assert!(
        one.stdout.contains("saved 2 params and states -> ")
            && one.stdout.contains("w1.safetensors"),
        "{}",
        one.stdout
    );
    let three = run(
        "three",
        &[
            s("--steps"),
            s("3"),
            s("--save-weights"),
            p("w3.safetensors"),
        ],
    );
    assert!(
        three
            .stdout
            .lines()
            .any(|l| l.starts_with("ran 3 steps in ") && l.ends_with(" per step)")),
        "{}",
        three.stdout
    );
    run(
        "resumed",
        &[
            s("--weights"),
            p("w1.safetensors"),
            s("--steps"),
            s("2"),
            s("--save-weights"),
            p("w12.safetensors"),
        ],
    );

    // Training reduces the loss; resuming from saved weights continues the same trajectory.
    let (loss1, loss3) = (
        scalar(&d.join("one/loss.npy")),
        scalar(&d.join("three/loss.npy")),
    );
    assert!(
        loss3 < loss1,
        "loss after 3 steps {loss3} vs 1 step {loss1}"
    );
    let resumed_loss = scalar(&d.join("resumed/loss.npy"));
    assert!(
        (resumed_loss - loss3).abs() <= 1e-6 * loss3.abs().max(1.0),
        "resumed loss {resumed_loss} vs 3 steps {loss3}"
    );
    let (w3, w12) = (
        sinter_runtime::io::read_safetensors(&d.join("w3.safetensors")).unwrap(),
        sinter_runtime::io::read_safetensors(&d.join("w12.safetensors")).unwrap(),
    );
    assert_eq!(w3.len(), 2);
    for ((n3, t3), (n12, t12)) in w3.iter().zip(&w12) {
        assert_eq!(n3, n12);
        assert!(
            relative_error(t12, t3) <= 1e-6,
            "weight `{n3}` after resuming"
        );
    }

    // One GPU step from saved weights is what the interpreter computes from them.
    run("from_w1", &[s("--weights"), p("w1.safetensors")]);
    let mut eval = vec![s("eval"), s(&sir), s("--weights"), p("w1.safetensors")];
    eval.extend(["--out".to_string(), p("eval_w1")]);
    eval.extend(inputs.iter().cloned());
    ok(&eval);
    for name in ["loss", "dw"] {
        let file = format!("{name}.npy");
        let got = read_npy(&d.join("from_w1").join(&file)).unwrap();
        let want = read_npy(&d.join("eval_w1").join(&file)).unwrap();
        let err = relative_error(&got, &want);
        assert!(err <= 1e-4, "`{name}` from saved weights: {err:e}");
    }
    assert!(scalar(&d.join("from_w1/loss.npy")) < loss1);
}

// ---------------------------------------------------------------------------------------------
// compile's dumps, inspect

#[test]
fn dump_after_prints_each_pass_under_a_header() {
    let sir = examples().into_iter().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sart = dir.path().join("m.sart");
    let run = ok(&[
        s("compile"),
        s(&sir),
        s("-o"),
        s(&sart),
        s("--dump-after"),
        s("schedule"),
    ]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    // `schedule` names the schedule as lowering leaves it, after `in-place`
    assert_eq!(lines[0], "# ==== after in-place ====", "{}", run.stdout);
    assert!(lines[1].starts_with("schedule: "), "{}", run.stdout);
    assert!(run.stdout.contains("\n  step 0: "), "{}", run.stdout);
    assert!(lines.last().unwrap().starts_with("compiled `"));
    assert!(sart.exists());

    // Every pass, in pipeline order, with `all` (or a comma-separated list).
    let all = ok(&[
        s("compile"),
        s(&sir),
        s("-o"),
        s(&sart),
        s("--dump-after=all"),
    ]);
    let listed = ok(&[
        s("compile"),
        s(&sir),
        s("-o"),
        s(&sart),
        s("--dump-after"),
        s("memory,expand"),
        s("--dump-after"),
        s("autodiff"),
    ]);
    let headers = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("# ==== after "))
            .map(str::to_string)
            .collect()
    };
    let header = |p: &str| format!("# ==== after {p} ====");
    let expected: Vec<String> = [
        "expand",
        "autodiff",
        "contracts",
        "decompose",
        "e-graph",
        "algebra",
        "fusion",
        "extract",
        "fusion-to-stored",
        "re-extract",
        "kernel-graph",
        "merge-siblings",
        "merge-flash-backward",
        "store-recomputed",
        "lower",
        "in-place",
        "memory",
        "baseline",
        "codegen",
    ]
    .iter()
    .map(|p| header(p))
    .collect();
    assert_eq!(headers(&all.stdout), expected);
    assert_eq!(
        headers(&listed.stdout),
        [header("expand"), header("autodiff"), header("memory")]
    );
    assert!(all.stdout.contains("peak "), "{}", all.stdout);
    // every dump is text, not a Rust `Debug` form
    assert!(!all.stdout.contains("KernelPlan") && !all.stdout.contains("Some("));

    // `list` names every pass with what it does, and compiles nothing
    let list = ok(&[
        s("compile"),
        s(&sir),
        s("-o"),
        s(dir.path().join("unused.sart")),
        s("--dump-after"),
        s("list"),
    ]);
    assert!(list.stdout.starts_with("decode "), "{}", list.stdout);
    assert!(list.stdout.contains("\nprecision "), "{}", list.stdout);
    assert!(list.stdout.contains("\nin-place "), "{}", list.stdout);
    assert!(!dir.path().join("unused.sart").exists());

    // A pass that fails still leaves the dumps of the passes before it.
    let failed = sinter(&[
        s("compile"),
        s(&sir),
        s("-o"),
        s(&sart),
        s("--max-binding-size"),
        s("64"),
        s("--dump-after"),
        s("schedule,memory"),
    ]);
    assert_eq!(failed.code, 1, "{}", failed.stderr);
    assert_eq!(headers(&failed.stdout), [header("in-place")]);
    assert!(
        failed.stderr.contains("largest storage binding"),
        "{}",
        failed.stderr
    );
}

#[test]
fn inspect_lists_kernels_arena_and_manifest() {
    for sir in examples() {
        let dir = tempfile::tempdir().unwrap();
        let sart = compile(&sir, dir.path());
        let json = ok(&[s("inspect"), s(&sart), s("--json")]);
        let v: Value = serde_json::from_str(&json.stdout)
            .unwrap_or_else(|e| panic!("{}: inspect --json: {e}\n{}", sir.display(), json.stdout));
        let kernels = v["kernels"].as_array().expect("kernels");
        assert!(!kernels.is_empty(), "{}", sir.display());
        let mut used = 0;
        for k in kernels {
            assert!(k["name"].as_str().is_some_and(|n| !n.is_empty()), "{k}");
            assert!(k["pattern"].as_str().is_some_and(|p| !p.is_empty()), "{k}");
            let ops = k["ops"].as_array().expect("ops");
            assert!(ops.iter().all(Value::is_string) && !ops.is_empty(), "{k}");
            used += k["dispatches"].as_u64().expect("dispatch count");
        }
        let dispatches = v["dispatches"].as_u64().expect("dispatches");
        assert!(dispatches > 0);
        assert_eq!(
            used,
            dispatches,
            "{}: kernel dispatch counts",
            sir.display()
        );
        let (arena, bound) = (
            v["arena_bytes"].as_u64().expect("arena_bytes"),
            v["lower_bound_bytes"].as_u64().expect("lower_bound_bytes"),
        );
        assert!(bound > 0 && arena >= bound, "{arena} vs {bound}");
        let roles: Vec<&str> = v["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .map(|t| t["role"].as_str().expect("role"))
            .collect();
        assert!(
            roles.contains(&"input") && roles.contains(&"output"),
            "{roles:?}"
        );

        // The human listing shows the same kernels, and the arena map with its ratio.
        let text = ok(&[s("inspect"), s(&sart)]).stdout;
        let graph = v["graph"].as_str().expect("graph");
        assert!(text.contains(&format!("graph `{graph}`")), "{text}");
        for (i, k) in kernels.iter().enumerate() {
            let name = k["name"].as_str().unwrap();
            assert!(
                text.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() >= 4 && cols[0] == i.to_string() && cols[1] == name
                }),
                "kernel {i} `{name}` not listed:\n{text}"
            );
        }
        for needle in [
            "requirements:",
            &format!("kernels: {}", kernels.len()),
            &format!("arena map: peak {arena} bytes"),
            &format!("lower bound {bound} bytes"),
            "peak/lower bound ",
            &format!("dispatches: {dispatches}"),
            "input ",
            "output ",
        ] {
            assert!(text.contains(needle), "missing {needle:?}:\n{text}");
        }
    }
}

#[test]
fn inspect_kernel_prints_its_wgsl() {
    let sir = examples().into_iter().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sart = compile(&sir, dir.path());
    let by_index = ok(&[s("inspect"), s(&sart), s("--kernel"), s("0")]).stdout;
    assert!(by_index.contains("@compute"), "{by_index}");
    assert!(by_index.contains("fn main"), "{by_index}");
    let json: Value =
        serde_json::from_str(&ok(&[s("inspect"), s(&sart), s("--json")]).stdout).unwrap();
    let name = json["kernels"][0]["name"].as_str().unwrap().to_string();
    let by_name = ok(&[s("inspect"), s(&sart), s("--kernel"), name.clone()]).stdout;
    assert_eq!(by_index, by_name);
    let one: Value =
        serde_json::from_str(&ok(&[s("inspect"), s(&sart), s("-k"), name, s("--json")]).stdout)
            .unwrap();
    assert_eq!(
        one["wgsl"].as_str().map(|w| w.trim_end()),
        Some(by_index.trim_end())
    );
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

struct Case<'a> {
    what: &'static str,
    args: Vec<String>,
    env: &'a [(&'a str, &'a str)],
    code: i32,
    stderr: &'static [&'static str],
}

#[test]
fn bad_inputs_fail_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let p = |name: &str| s(d.join(name));
    let mlp = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir-spec/examples/mlp.sir");
    let sart = compile(&mlp, d);
    let mut rng = Rng(5);
    let f32s = |shape: Vec<usize>, rng: &mut Rng| {
        let n = shape.iter().product();
        HostTensor::f32(shape, (0..n).map(|_| rng.signed()).collect())
    };
    let files: &[(&str, HostTensor)] = &[
        ("x.npy", f32s(vec![32, 64], &mut rng)),
        ("labels.npy", HostTensor::i32(vec![32], vec![3; 32])),
        ("x_short.npy", f32s(vec![32, 63], &mut rng)),
        ("x_int.npy", HostTensor::i32(vec![32, 64], vec![1; 32 * 64])),
        ("labels_f32.npy", f32s(vec![32], &mut rng)),
    ];
    for (name, t) in files {
        write_npy(&d.join(name), t).unwrap();
    }
    write_safetensors(
        &d.join("w_shape.safetensors"),
        &[("w1".into(), f32s(vec![128, 64], &mut rng))],
    )
    .unwrap();
    write_safetensors(
        &d.join("w_bogus.safetensors"),
        &[("bogus".into(), f32s(vec![2], &mut rng))],
    )
    .unwrap();
    std::fs::write(d.join("bad.sir"), BAD_PROGRAM).unwrap();
    std::fs::write(d.join("a_file"), "").unwrap();
    std::fs::write(d.join("empty.sart"), "").unwrap();

    // Damaged copies of the artifact.
    let good = std::fs::read(&sart).unwrap();
    let damaged = |name: &str, edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        edit(&mut bytes);
        std::fs::write(d.join(name), bytes).unwrap();
        p(name)
    };
    let flipped = damaged("flipped.sart", &|b| {
        let mid = b.len() / 2;
        b[mid] ^= 0x10;
    });
    let truncated = damaged("truncated.sart", &|b| b.truncate(b.len() - 100));
    let version = damaged("version.sart", &|b| b[8] = 99);

    let x = [s("--input"), format!("x={}", p("x.npy"))];
    let labels = [s("--input"), format!("labels={}", p("labels.npy"))];
    let run_on = |artifact: &str, extra: &[&[String]]| {
        let mut args = vec![s("run"), artifact.to_string()];
        for e in extra {
            args.extend_from_slice(e);
        }
        args
    };
    let art = s(&sart);
    let run = |extra: &[&[String]]| run_on(&art, extra);
    let input = |spec: String| [s("--input"), spec];
    let no_backend = if cfg!(target_os = "macos") {
        "dx12"
    } else {
        "metal"
    };
    let no_adapter: &[(&str, &str)] = &[("SINTER_BACKEND", no_backend)];

    #[rustfmt::skip]
    let cases = vec![
        Case { what: "missing input", args: run(&[&x]), env: &[], code: 2,
               stderr: &["error: missing input `labels`: i32[32]", "--input"] },
        Case { what: "extra input", args: run(&[&x, &labels, &input(format!("extra={}", p("x.npy")))]), env: &[], code: 2,
               stderr: &["`extra` is not an input of graph `mlp`", "`x`: f32[32, 64]"] },
        Case { what: "output given as input", args: run(&[&x, &labels, &input(format!("logits={}", p("x.npy")))]), env: &[], code: 2,
               stderr: &["`logits` is computed by graph `mlp`, not an input"] },
        Case { what: "param given as input", args: run(&[&x, &labels, &input(format!("w1={}", p("x.npy")))]), env: &[], code: 2,
               stderr: &["`w1` is a param or state of graph `mlp`, not an input", "--weights"] },
        Case { what: "duplicate input", args: run(&[&x, &labels, &x]), env: &[], code: 2,
               stderr: &["input `x` is given twice"] },
        Case { what: "mis-shaped input", args: run(&[&input(format!("x={}", p("x_short.npy"))), &labels]), env: &[], code: 2,
               stderr: &["input `x` must be f32[32, 64], but", "x_short.npy holds f32[32, 63]"] },
        Case { what: "i32 given for f32", args: run(&[&input(format!("x={}", p("x_int.npy"))), &labels]), env: &[], code: 2,
               stderr: &["input `x` must be f32[32, 64], but", "x_int.npy holds i32[32, 64]", "astype('<f4')"] },
        Case { what: "f32 given for i32", args: run(&[&x, &input(format!("labels={}", p("labels_f32.npy")))]), env: &[], code: 2,
               stderr: &["input `labels` must be i32[32], but", "labels_f32.npy holds f32[32]"] },
        Case { what: "input file missing", args: run(&[&input(format!("x={}", p("nope.npy"))), &labels]), env: &[], code: 2,
               stderr: &["cannot read", "nope.npy"] },
        Case { what: "corrupt artifact (a flipped byte)", args: run_on(&flipped, &[&x, &labels]), env: &[], code: 2,
               stderr: &["flipped.sart: artifact is corrupted: checksum"] },
        Case { what: "truncated artifact", args: run_on(&truncated, &[&x, &labels]), env: &[], code: 2,
               stderr: &["truncated.sart: artifact is truncated"] },
        Case { what: "other format version", args: run_on(&version, &[&x, &labels]), env: &[], code: 2,
               stderr: &["version.sart: artifact format version 99 is not supported", "recompile"] },
        Case { what: "not an artifact (npy)", args: run_on(&p("x.npy"), &[&x, &labels]), env: &[], code: 2,
               stderr: &["x.npy: not a sinter artifact"] },
        Case { what: "not an artifact (a program)", args: run_on(&s(&mlp), &[&x, &labels]), env: &[], code: 2,
               stderr: &["not a sinter artifact", "sinter compile"] },
        Case { what: "empty artifact", args: run_on(&p("empty.sart"), &[&x, &labels]), env: &[], code: 2,
               stderr: &["empty.sart: not a sinter artifact: the file is 0 bytes"] },
        Case { what: "missing artifact", args: run_on(&p("missing.sart"), &[&x, &labels]), env: &[], code: 2,
               stderr: &["error: cannot read", "missing.sart"] },
        Case { what: "weights: mis-shaped", args: run(&[&x, &labels, &[s("--weights"), p("w_shape.safetensors")]]), env: &[], code: 2,
               stderr: &["weight `w1` must be f32[64, 128], but", "holds f32[128, 64]"] },
        Case { what: "weights: unknown tensor", args: run(&[&x, &labels, &[s("--weights"), p("w_bogus.safetensors")]]), env: &[], code: 2,
               stderr: &["tensor `bogus` is not a param or state of graph `mlp`", "`w1`: f32[64, 128]"] },
        Case { what: "weights: not safetensors", args: run(&[&x, &labels, &[s("--weights"), p("x.npy")]]), env: &[], code: 2,
               stderr: &["x.npy is not a safetensors file"] },
        Case { what: "zero steps", args: run(&[&x, &labels, &[s("--steps"), s("0")]]), env: &[], code: 2,
               stderr: &["--steps"] },
        Case { what: "output dir is a file", args: run(&[&x, &labels, &[s("--out"), p("a_file")]]), env: &[], code: 2,
               stderr: &["cannot create the output directory", "a_file"] },
        Case { what: "no adapter", args: run(&[&x, &labels]), env: no_adapter, code: 2,
               stderr: &["error: no GPU adapter found"] },
        Case { what: "compile: IR error", args: vec![s("compile"), p("bad.sir"), s("-o"), p("bad.sart")], env: &[], code: 1,
               stderr: &["bad.sir", "inner dimensions differ", "3 vs 4"] },
        Case { what: "compile: unreadable program", args: vec![s("compile"), p("missing.sir"), s("-o"), p("m.sart")], env: &[], code: 2,
               stderr: &["error: cannot read", "missing.sir"] },
        Case { what: "compile: a tensor too large for one binding", args: vec![s("compile"), s(&mlp), s("-o"), p("m.sart"), s("--max-binding-size"), s("1000")], env: &[], code: 1,
               stderr: &["error: tensor `", "--max-binding-size"] },
        Case { what: "compile: unknown pass", args: vec![s("compile"), s(&mlp), s("-o"), p("m.sart"), s("--dump-after"), s("parse")], env: &[], code: 2,
               stderr: &["parse", "schedule"] },
        Case { what: "compile: unwritable output", args: vec![s("compile"), s(&mlp), s("-o"), p("a_file/m.sart")], env: &[], code: 2,
               stderr: &["error: cannot write", "a_file/m.sart"] },
        Case { what: "inspect: kernel index out of range", args: vec![s("inspect"), art.clone(), s("--kernel"), s("999")], env: &[], code: 2,
               stderr: &["kernel index 999 is out of range"] },
        Case { what: "inspect: unknown kernel name", args: vec![s("inspect"), art.clone(), s("--kernel"), s("k99_nothing")], env: &[], code: 2,
               stderr: &["no kernel named `k99_nothing`", "k0_"] },
        Case { what: "inspect: corrupt artifact", args: vec![s("inspect"), flipped.clone(), s("--json")], env: &[], code: 2,
               stderr: &["artifact is corrupted"] },
    ];

    let mut failures = Vec::new();
    for case in &cases {
        let run = sinter_env(&case.args, case.env);
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
        if !run.stdout.is_empty() {
            failures.push(format!(
                "{}: printed to stdout on failure: {}",
                case.what, run.stdout
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        !d.join("bad.sart").exists(),
        "a failed compile must not leave an artifact"
    );
}

#[test]
fn compile_writes_dot_and_inspect_reports_the_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let sir = format!("{}/../ir-spec/examples/mlp.sir", env!("CARGO_MANIFEST_DIR"));
    let sart = dir.path().join("mlp.sart");
    let dots = dir.path().join("dot");
    let s = |v: &str| v.to_string();
    let compiled = sinter(&[
        s("compile"),
        sir.clone(),
        s("-o"),
        sart.display().to_string(),
        s("--dot"),
        dots.display().to_string(),
    ]);
    assert_eq!(compiled.code, 0, "{}", compiled.stderr);
    for name in ["before", "after"] {
        let text = std::fs::read_to_string(dots.join(format!("{name}.dot"))).unwrap();
        assert!(text.starts_with("digraph \"mlp\""), "{text}");
    }
    let json = sinter(&[s("inspect"), sart.display().to_string(), s("--json")]);
    assert_eq!(json.code, 0, "{}", json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let o = &v["optimizer"];
    assert!(
        o["before"]["dispatches"].as_u64().unwrap() > o["after"]["dispatches"].as_u64().unwrap(),
        "{o}"
    );
    assert!(o["rule_sets"].as_array().unwrap().len() >= 2, "{o}");
    let kernels = v["kernels"].as_array().unwrap();
    assert!(
        kernels.iter().any(|k| k["pattern"] == "matmul_epilogue"
            && k["rules"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "fuse-matmul-epilogue")),
        "{kernels:?}"
    );
    let listing = sinter(&[s("inspect"), sart.display().to_string()]);
    assert!(listing.stdout.contains("optimizer:"), "{}", listing.stdout);
    let plain = sinter(&[
        s("compile"),
        sir,
        s("-o"),
        sart.display().to_string(),
        s("--no-opt"),
    ]);
    assert_eq!(plain.code, 0, "{}", plain.stderr);
    let listing = sinter(&[s("inspect"), sart.display().to_string()]);
    assert!(
        listing.stdout.contains("optimizer: not run"),
        "{}",
        listing.stdout
    );
}
