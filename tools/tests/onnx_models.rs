//! Models exported from PyTorch (`tools/onnx/models/export_torch.py`: a small CNN and a small
//! transformer, with PyTorch's outputs saved at export time), imported and run on the
//! interpreter and the GPU against those outputs; then both trained with a loss and optimizer
//! added by `sinter import --append`: the CNN on the bundled digits, the transformer on
//! sequences whose next token is always the current one plus one.

use std::ffi::OsStr;
use std::path::Path;

mod common;
use common::{floats, ok, onnx_model as model};

fn max_diff(got: &Path, want: &Path) -> f32 {
    let (g, w) = (floats(got), floats(want));
    assert_eq!(g.len(), w.len(), "{} vs {}", got.display(), want.display());
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn pytorch_models_agree_with_pytorch_in_the_interpreter_and_on_the_gpu() {
    for (name, input) in [("cnn", "x"), ("transformer", "ids")] {
        let dir = tempfile::tempdir().expect("a temp dir");
        let onnx = model(&format!("{name}.onnx"));
        let sir = dir.path().join(format!("{name}.sir"));
        let weights = dir.path().join(format!("{name}.safetensors"));
        let feed = format!("{input}={}", model(&format!("{name}_input.npy")).display());
        let expected = model(&format!("{name}_output.npy"));
        let dim = OsStr::new("batch=4");
        ok(&[
            "import".as_ref(),
            onnx.as_os_str(),
            "-o".as_ref(),
            sir.as_os_str(),
            "--dim".as_ref(),
            dim,
        ]);
        let interp = dir.path().join("interp");
        ok(&[
            "eval".as_ref(),
            sir.as_os_str(),
            "--weights".as_ref(),
            weights.as_os_str(),
            "--input".as_ref(),
            feed.as_ref(),
            "--out".as_ref(),
            interp.as_os_str(),
        ]);
        let d = max_diff(&interp.join("logits.npy"), &expected);
        assert!(
            d < 1e-5,
            "{name}: the interpreter differs from PyTorch by {d}"
        );

        let sart = dir.path().join(format!("{name}.sart"));
        ok(&[
            "compile".as_ref(),
            sir.as_os_str(),
            "-o".as_ref(),
            sart.as_os_str(),
        ]);
        let gpu = dir.path().join("gpu");
        ok(&[
            "run".as_ref(),
            sart.as_os_str(),
            "--weights".as_ref(),
            weights.as_os_str(),
            "--input".as_ref(),
            feed.as_ref(),
            "--out".as_ref(),
            gpu.as_os_str(),
        ]);
        let d = max_diff(&gpu.join("logits.npy"), &expected);
        assert!(d < 1e-4, "{name}: the GPU differs from PyTorch by {d}");
    }
}

/// Imports `name.onnx` with `--append name_train.sir` at batch `batch`, trains it for 100 steps
/// on `data`, and checks that the loss (read every 10 steps) fell below `ratio` of its first
/// reading.
fn train_imported(name: &str, batch: usize, data: &Path, ratio: f64) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let sir = dir.path().join(format!("{name}_train.sir"));
    let log = dir.path().join("loss.csv");
    let dim = format!("batch={batch}");
    ok(&[
        "import".as_ref(),
        model(&format!("{name}.onnx")).as_os_str(),
        "-o".as_ref(),
        sir.as_os_str(),
        "--dim".as_ref(),
        dim.as_ref(),
        "--append".as_ref(),
        model(&format!("{name}_train.sir")).as_os_str(),
    ]);
    ok(&[
        "train".as_ref(),
        sir.as_os_str(),
        "--weights".as_ref(),
        dir.path()
            .join(format!("{name}_train.safetensors"))
            .as_os_str(),
        "--data".as_ref(),
        data.as_os_str(),
        "--steps".as_ref(),
        "100".as_ref(),
        "--shuffle-seed".as_ref(),
        "1".as_ref(),
        "--log-every".as_ref(),
        "10".as_ref(),
        "--log".as_ref(),
        log.as_os_str(),
    ]);
    let text = std::fs::read_to_string(&log).expect("the loss log");
    let losses: Vec<f64> = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split(',')
                .nth(1)
                .and_then(|v| v.parse().ok())
                .expect("step,loss,elapsed")
        })
        .collect();
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    assert!(
        last < ratio * first,
        "{name}: the loss did not fall: {first} at step 10, {last} at step 100\n{text}"
    );
}

#[test]
fn an_imported_cnn_trains_on_the_digits() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ir-spec/examples/data/digits/train");
    train_imported("cnn", 32, &data, 0.8);
}

#[test]
fn an_imported_transformer_learns_to_count() {
    use sinter_runtime::io::{HostTensor, write_npy};
    // 256 sequences of 16 tokens from a vocabulary of 32, each the previous one plus one
    // (mod 32) from a varying start; the targets are the sequences shifted by one.
    let (samples, seq, vocab) = (256, 16, 32);
    let token = |n: usize, k: usize| ((n * 7 + k) % vocab) as i32;
    let ids: Vec<i32> = (0..samples * seq)
        .map(|i| token(i / seq, i % seq))
        .collect();
    let targets: Vec<i32> = (0..samples * seq)
        .map(|i| token(i / seq, i % seq + 1))
        .collect();
    let dir = tempfile::tempdir().expect("a temp dir");
    for (name, data) in [("ids", ids), ("targets", targets)] {
        let t = HostTensor::i32(vec![samples, seq], data);
        write_npy(&dir.path().join(format!("{name}.npy")), &t).expect("write the data");
    }
    train_imported("transformer", 8, dir.path(), 0.5);
}
