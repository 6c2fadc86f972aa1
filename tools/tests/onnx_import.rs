//! `sinter import` and `.onnx` models in `check`, `compile`, `eval` and `run`: the hand-built
//! models of `tools/onnx/models/` (`make_tiny.py` writes them and numpy's expected output),
//! imported, evaluated on the interpreter and the GPU, and the errors a model sinter cannot
//! take must produce.

use std::path::{Path, PathBuf};

mod common;
use common::{floats, ok, onnx_model as model, sinter};

/// `out/probs.npy` agrees with what numpy computed for `tiny_mlp_x.npy`.
fn assert_mlp_output(out: &Path, tol: f32) {
    let got = floats(&out.join("probs.npy"));
    let want = floats(&model("tiny_mlp_y.npy"));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= tol, "element {i}: {g} vs {w}");
    }
}

#[test]
fn import_writes_a_program_and_its_weights_that_eval_runs() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sir = dir.path().join("mlp.sir");
    let out = dir.path().join("out");
    let run = ok(&[
        "import".as_ref(),
        model("tiny_mlp.onnx").as_os_str(),
        "-o".as_ref(),
        sir.as_os_str(),
        "--dim".as_ref(),
        "batch=2".as_ref(),
    ]);
    assert!(run.stdout.contains("4 params and states"), "{}", run.stdout);
    let text = std::fs::read_to_string(&sir).expect("the program");
    // the values are in the weights file beside the program
    assert!(
        text.contains("param  fc1.weight: f32[8, 12] = external"),
        "{text}"
    );
    // The Shape -> Gather -> Unsqueeze -> Concat chain is folded into a static reshape.
    assert!(text.contains("reshape(x, shape=[2, 12])"), "{text}");
    ok(&[
        "eval".as_ref(),
        sir.as_os_str(),
        "--weights".as_ref(),
        dir.path().join("mlp.safetensors").as_os_str(),
        "--input".as_ref(),
        format!("x={}", model("tiny_mlp_x.npy").display()).as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_mlp_output(&out, 1e-6);

    // Without the weights, eval and run refuse (not zeros), naming the params.
    let x = format!("x={}", model("tiny_mlp_x.npy").display());
    let eval = sinter(&[
        "eval".as_ref(),
        sir.as_os_str(),
        "--input".as_ref(),
        x.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(eval.code, 2, "{}{}", eval.stdout, eval.stderr);
    assert!(
        eval.stderr.contains("takes its value from a weights file"),
        "{}",
        eval.stderr
    );
    let sart = dir.path().join("mlp.sart");
    ok(&[
        "compile".as_ref(),
        sir.as_os_str(),
        "-o".as_ref(),
        sart.as_os_str(),
    ]);
    let run = sinter(&[
        "run".as_ref(),
        sart.as_os_str(),
        "--input".as_ref(),
        x.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("from a weights file") && run.stderr.contains("`fc1.weight`"),
        "{}",
        run.stderr
    );
    ok(&[
        "run".as_ref(),
        sart.as_os_str(),
        "--weights".as_ref(),
        dir.path().join("mlp.safetensors").as_os_str(),
        "--input".as_ref(),
        x.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_mlp_output(&out, 1e-5);
}

#[test]
fn check_and_compile_take_onnx_models_and_the_artifact_carries_the_weights() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let onnx = model("tiny_mlp.onnx");
    let run = ok(&[
        "check".as_ref(),
        onnx.as_os_str(),
        "--dim".as_ref(),
        "batch=2".as_ref(),
    ]);
    assert!(run.stdout.contains("probs: f32[2, 5]"), "{}", run.stdout);
    let sart = dir.path().join("mlp.sart");
    ok(&[
        "compile".as_ref(),
        onnx.as_os_str(),
        "--dim".as_ref(),
        "batch=2".as_ref(),
        "-o".as_ref(),
        sart.as_os_str(),
    ]);
    let out = dir.path().join("out");
    ok(&[
        "run".as_ref(),
        sart.as_os_str(),
        "--input".as_ref(),
        format!("x={}", model("tiny_mlp_x.npy").display()).as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    assert_mlp_output(&out, 1e-5);
}

#[test]
fn models_sinter_cannot_take_are_clear_errors() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sir = dir.path().join("m.sir");
    let garbage = dir.path().join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xff\xff not protobuf").expect("write");
    let cases: &[(PathBuf, &[&str], &str)] = &[
        (
            model("tiny_mlp.onnx"),
            &[],
            "dynamic dimension `batch` left open; fix each with --dim NAME=VALUE",
        ),
        (
            model("tiny_mlp.onnx"),
            &["--dim", "batch=2", "--dim", "seq=4"],
            "the model has no dynamic dimension `seq` (it has batch)",
        ),
        (
            model("tiny_old_opset.onnx"),
            &["--dim", "batch=2"],
            "imports opset 11 of the default ONNX domain; sinter imports opset 13 and later",
        ),
        (
            model("tiny_unsupported.onnx"),
            &[],
            "node `top` (TopK): unsupported op: `TopK` needs a new sinter op (sorting)",
        ),
        (garbage.clone(), &[], "not an ONNX model"),
    ];
    for (file, extra, message) in cases {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "import".as_ref(),
            file.as_os_str(),
            "-o".as_ref(),
            sir.as_os_str(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        let run = sinter(&args);
        assert_eq!(run.code, 1, "{file:?} {extra:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(message),
            "{file:?} {extra:?}: {}",
            run.stderr
        );
        assert!(!sir.exists(), "a failed import wrote {}", sir.display());
    }
}
