//! Malformed models never panic the importer: every committed model, truncated at many
//! lengths and with bytes overwritten at many places, imports or fails with an error.

use std::path::Path;

use sinter_onnx::Options;

/// SplitMix64, for reproducible corruption without a dependency.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn corrupted_models_are_errors_not_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the models folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "models missing from {}", dir.display());
    let options = Options {
        dims: [("batch".to_string(), 2)].into_iter().collect(),
        ..Options::default()
    };
    let mut state = 1u64;
    let mut imported = 0;
    for file in &files {
        let bytes = std::fs::read(file).expect("a model");
        // the model itself
        if sinter_onnx::import(&bytes, &options).is_ok() {
            imported += 1;
        }
        for k in 1..64 {
            let _ = sinter_onnx::import(&bytes[..bytes.len() * k / 64], &options);
        }
        for _ in 0..1000 {
            let mut b = bytes.clone();
            for _ in 0..1 + next(&mut state) % 4 {
                let at = (next(&mut state) % b.len() as u64) as usize;
                b[at] = next(&mut state) as u8;
            }
            let _ = sinter_onnx::import(&b, &options);
        }
    }
    assert!(imported >= 3, "the uncorrupted models should import");
}
