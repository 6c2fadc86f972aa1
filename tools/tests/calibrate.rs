//! `sinter-bench calibrate` on the machine's adapter (lavapipe in CI), at sizes small enough to
//! take a second: it writes a target file that `sinter compile --target` takes, whose measured
//! rates are the device's, not the base preset's.

use std::process::Command;

mod common;
use common::ok;

#[test]
fn calibrate_writes_a_target_that_compile_takes() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("device.json");
    let run = Command::new(env!("CARGO_BIN_EXE_sinter-bench"))
        .args([
            "calibrate",
            "--size",
            "128",
            "--elements",
            "4096",
            "--repeats",
            "2",
        ])
        .args(["--sms", "7", "--name", "this-device", "-o"])
        .arg(&file)
        .output()
        .expect("runs sinter-bench");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{stderr}");
    assert!(stdout.contains("launch"), "{stdout}");
    assert!(stderr.contains("kept from `portable`: 7 SMs"), "{stderr}");
    let text = std::fs::read_to_string(&file).expect("the target file");
    let target = sinter_compiler::Target::from_json(&text).expect("a valid target");
    let base = sinter_compiler::Target::portable();
    assert_eq!(target.name, "this-device");
    assert_eq!(target.rates.sms, 7);
    assert_eq!(target.limits, base.limits);
    for (measured, preset) in [
        (target.rates.launch_ns, base.rates.launch_ns),
        (target.rates.bytes_per_ns, base.rates.bytes_per_ns),
        (target.rates.flops_per_ns, base.rates.flops_per_ns),
        (
            target.rates.product_flops_per_ns,
            base.rates.product_flops_per_ns,
        ),
    ] {
        assert!(
            measured.is_finite() && measured > 0.0 && measured != preset,
            "{measured}"
        );
    }
    assert!(target.rates.matmul.iter().all(|m| m.tflops > 0.0));
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../ir-spec/examples");
    ok(&[
        "compile".as_ref(),
        format!("{examples}/mlp.sir").as_ref(),
        "-o".as_ref(),
        dir.path().join("mlp.sart").as_os_str(),
        "--target".as_ref(),
        file.as_os_str(),
    ]);
}
