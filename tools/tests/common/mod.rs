//! The harness the `sinter` binary's tests share: run it, capture what it printed, and fail on
//! any panic.
#![allow(dead_code)] // each test file uses its own subset

use std::ffi::OsStr;
use std::process::Command;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `sinter ARGS` with extra environment variables.
pub fn sinter_env<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sinter"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run sinter");
    let run = Run {
        code: out.status.code().expect("sinter exited by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !run.stderr.contains("panicked"),
        "sinter panicked:\n{}",
        run.stderr
    );
    run
}

pub fn sinter<S: AsRef<OsStr>>(args: &[S]) -> Run {
    sinter_env(args, &[])
}

/// Runs sinter and fails the test unless it exits 0.
pub fn ok<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let run = sinter(args);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert_eq!(
        run.code, 0,
        "sinter {shown:?} failed:\n{}{}",
        run.stdout, run.stderr
    );
    run
}

/// A model of `tools/onnx/models/`.
pub fn onnx_model(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("onnx/models")
        .join(file)
}

/// The values of an f32 `.npy` file.
pub fn floats(path: &std::path::Path) -> Vec<f32> {
    use sinter_runtime::io::{TensorData, read_npy};
    match read_npy(path).expect("an npy file").data {
        TensorData::F32(v) => v,
        TensorData::I32(_) | TensorData::F16(_) => panic!("{} does not hold f32", path.display()),
    }
}
