//! `fuzz`: a stable-Rust fuzzing driver for sinter's input parsers (see `fuzz_targets.rs`).
//!
//! ```text
//! cargo run --release -p sinter-tests --bin fuzz -- TARGET [--seconds N] [--seed S]
//! cargo run --release -p sinter-tests --bin fuzz -- --write-seeds
//! ```
//!
//! TARGET is one of `parse`, `compile`, `artifact`, `npy`, `safetensors` (or `all`, which splits
//! the time between them). Each iteration takes a corpus input (`tests/fuzz/corpus/TARGET/`),
//! mutates it (bit flips, byte and token insertions, splices from another input, extreme numbers,
//! duplicated lines) and runs the target; an input that panics is saved under
//! `tests/fuzz/regressions/TARGET/` (which `cargo test` then replays) and reported. The run ends
//! after N seconds (default 60) with the number of inputs tried.
//!
//! `--write-seeds` regenerates the seed corpus from the bundled examples and programs.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sinter_tests::fuzz_targets::{Rng, TARGETS, Target, corpus, mutate, target};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--write-seeds") {
        if let Err(e) = write_seeds() {
            eprintln!("fuzz: {e}");
            std::process::exit(2);
        }
        return;
    }
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let seconds = value("--seconds").unwrap_or(60);
    let seed = value("--seed").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let Some(name) = args.first().filter(|a| !a.starts_with("--")) else {
        eprintln!(
            "usage: fuzz TARGET [--seconds N] [--seed S] | fuzz --write-seeds; targets: all, {}",
            TARGETS
                .iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        std::process::exit(2);
    };
    let targets: Vec<&Target> = if name == "all" {
        TARGETS.iter().collect()
    } else {
        match target(name) {
            Some(t) => vec![t],
            None => {
                eprintln!("fuzz: no target `{name}`");
                std::process::exit(2);
            }
        }
    };
    // Panics are expected findings: keep their messages short and let the loop go on.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("panic: {info}");
    }));
    let share = Duration::from_secs(seconds) / targets.len() as u32;
    let mut found = 0;
    for t in targets {
        found += fuzz(t, share, seed);
    }
    if found > 0 {
        std::process::exit(1);
    }
}

/// Fuzzes one target for `time`; returns how many panicking inputs it saved.
fn fuzz(t: &Target, time: Duration, seed: u64) -> usize {
    let inputs = corpus(&root().join("corpus").join(t.name));
    if inputs.is_empty() {
        eprintln!("fuzz: no corpus for `{}`; run with --write-seeds", t.name);
        return 0;
    }
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let (mut runs, mut found) = (0u64, 0usize);
    while start.elapsed() < time {
        let (_, a) = &inputs[rng.index(inputs.len())];
        let (_, b) = &inputs[rng.index(inputs.len())];
        let input = mutate(a, b, t.text, &mut rng);
        runs += 1;
        if std::panic::catch_unwind(AssertUnwindSafe(|| (t.run)(&input))).is_err() {
            found += 1;
            let dir = root().join("regressions").join(t.name);
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("{:016x}", crc64(&input)));
            let _ = std::fs::write(&path, &input);
            eprintln!(
                "fuzz: `{}` panicked; input saved to {}",
                t.name,
                path.display()
            );
        }
    }
    println!(
        "fuzz: {}: {runs} inputs in {:.1} s ({:.0}/s), {found} panicking; seed {seed}",
        t.name,
        start.elapsed().as_secs_f64(),
        runs as f64 / start.elapsed().as_secs_f64().max(1e-9)
    );
    found
}

/// A name for a saved input (FNV-1a, 64 bits).
fn crc64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The seed corpus: the bundled example programs and bad programs (parse, compile), small
/// compiled artifacts (artifact), and tensors in every encoding the readers take (npy,
/// safetensors).
fn write_seeds() -> Result<(), String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let write = |target: &str, name: &str, bytes: &[u8]| -> Result<(), String> {
        let dir = root().join("corpus").join(target);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(name), bytes).map_err(|e| e.to_string())
    };
    let mut programs: Vec<(String, Vec<u8>)> = Vec::new();
    for dir in ["ir-spec/examples", "ir-spec/tests/bad_programs"] {
        for (name, bytes) in corpus(&repo.join(dir)) {
            if name.ends_with(".sir") {
                programs.push((name, bytes));
            }
        }
    }
    for (name, src) in SMALL_PROGRAMS {
        programs.push((format!("{name}.sir"), src.as_bytes().to_vec()));
    }
    for (name, bytes) in &programs {
        write("parse", name, bytes)?;
    }
    for (name, src) in SMALL_PROGRAMS {
        write("compile", &format!("{name}.sir"), src.as_bytes())?;
        let g = sinter_ir::text::parse(src).map_err(|e| e.to_string())?;
        let a = sinter_compiler::compile(&g, &Default::default())
            .map_err(|e| e.to_string())?
            .artifact;
        let mut input = serde_json_manifest(&a);
        input.push(0);
        input.extend_from_slice(&a.blob);
        write("artifact", &format!("{name}.json"), &input)?;
    }
    use sinter_runtime::io::{HostTensor, npy_to_bytes, safetensors_to_bytes};
    let f = HostTensor::f32(
        vec![2, 3],
        vec![0.5, -1.0, f32::NAN, 3.0, f32::INFINITY, 0.0],
    );
    let i = HostTensor::i32(vec![4], vec![0, -1, i32::MAX, 7]);
    let s = HostTensor::f32(vec![], vec![2.5]);
    let p = Path::new("seed");
    for (name, t) in [("f32", &f), ("i32", &i), ("scalar", &s)] {
        write(
            "npy",
            &format!("{name}.npy"),
            &npy_to_bytes(p, t).map_err(|e| e.to_string())?,
        )?;
    }
    // f64 and i64 files and a version 2 header, as NumPy writes them.
    let mut f8 = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }";
    let padded = format!("{header:<117}\n");
    f8.extend_from_slice(&(padded.len() as u16).to_le_bytes());
    f8.extend_from_slice(padded.as_bytes());
    f8.extend_from_slice(&1.5f64.to_le_bytes());
    f8.extend_from_slice(&(-2.0f64).to_le_bytes());
    write("npy", "f64.npy", &f8)?;
    let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
    let header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2), }";
    let padded = format!("{header:<115}\n");
    v2.extend_from_slice(&(padded.len() as u32).to_le_bytes());
    v2.extend_from_slice(padded.as_bytes());
    v2.extend_from_slice(&3i64.to_le_bytes());
    v2.extend_from_slice(&(-4i64).to_le_bytes());
    write("npy", "i64_v2.npy", &v2)?;
    let weights = vec![("w".to_string(), f.clone()), ("ids".to_string(), i.clone())];
    write(
        "safetensors",
        "two.safetensors",
        &safetensors_to_bytes(p, &weights).map_err(|e| e.to_string())?,
    )?;
    write(
        "safetensors",
        "scalar.safetensors",
        &safetensors_to_bytes(p, &[("s".to_string(), s)]).map_err(|e| e.to_string())?,
    )?;
    println!(
        "fuzz: seed corpus written under {}",
        root().join("corpus").display()
    );
    Ok(())
}

fn serde_json_manifest(a: &sinter_ir::artifact::Artifact) -> Vec<u8> {
    // The file format's manifest is the artifact as JSON; read it back out of a file.
    let bytes = a.to_bytes();
    let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes")) as usize;
    bytes[32..32 + len].to_vec()
}

/// Small programs that cover most ops and every statement kind.
const SMALL_PROGRAMS: &[(&str, &str)] = &[
    (
        "mlp",
        "graph mlp {
  input x: f32[4, 6]
  input labels: i32[4]
  param w1: f32[6, 8] = normal(std=0.3, seed=1)
  param b1: f32[8] = zeros
  param w2: f32[8, 3] = uniform(lo=-0.5, hi=0.5, seed=2)
  h = relu(add(matmul(x, w1), b1))
  logits = matmul(h, w2)
  loss = cross_entropy(logits, labels)
  train loss with adam(lr=0.01, clip_norm=1.0)
  output loss, logits
}
",
    ),
    (
        "conv",
        "graph conv {
  input x: f32[1, 2, 6, 6]
  param w: f32[3, 2, 3, 3] = normal(std=0.2, seed=3)
  param ones_like_g: f32[3] = ones
  param beta_g: f32[3] = zeros
  y = conv2d(x, w, stride=1, padding=1)
  p = max_pool2d(relu(y), kernel=2)
  a = avg_pool2d(y, kernel=[3, 2], stride=[1, 2], padding=1)
  n = group_norm(y, ones_like_g, beta_g, groups=3)
  loss = add(add(mean(p), sum(a)), mean(n))
  d = grad(loss, w)
  output loss, d
}
",
    ),
    (
        "layout",
        "graph layout {
  input x: f32[2, 3, 4]
  input ids: i32[5]
  param t: f32[7, 4] = normal(seed=4)
  e = embedding(t, ids)
  v = reshape(permute(x, perm=[2, 0, 1]), shape=[4, 6])
  s = slice(transpose(v, dim0=0, dim1=1), axis=0, start=1, end=6, step=2)
  c = concat(s, slice(e, axis=1, start=0, end=4), axis=0)
  m = where(gt(c, 0.5), c, neg(c))
  k = softmax(log_softmax(m, axis=0), axis=-1)
  r = argmax(k, axis=1, keepdim=true)
  q = cast(r, dtype=\"f32\")
  output k, q
}
",
    ),
    (
        "attention",
        "graph att {
  input q: f32[1, 2, 4, 8]
  input k: f32[1, 2, 4, 8]
  input v: f32[1, 2, 4, 8]
  param ones_g: f32[8] = ones
  param zeros_g: f32[8] = full(0.5)
  o = attention(q, k, v, causal=true, window=2)
  l = layer_norm(o, ones_g, zeros_g)
  loss = mse_loss(l, q)
  output loss
}
",
    ),
];
