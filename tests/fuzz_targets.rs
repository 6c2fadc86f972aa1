//! Fuzz targets: functions from arbitrary bytes that must never panic (nor abort on an
//! allocation), and the mutator that makes new inputs from a corpus. They run on stable Rust:
//!
//! - `cargo test -p sinter-tests --test fuzz_corpus` replays the committed corpus
//!   (`tests/fuzz/corpus/TARGET/`) and every input a fuzzing run found
//!   (`tests/fuzz/regressions/TARGET/`) through each target;
//! - `cargo run --release -p sinter-tests --bin fuzz -- TARGET --seconds N` mutates the corpus
//!   for N seconds, and saves any input that panics under `tests/fuzz/regressions/TARGET/`.
//!
//! A target may return an error for bad bytes; it must not panic. Targets also check cheap
//! invariants of what they accept (a parsed graph prints to text that parses to the same
//! graph; an accepted artifact serializes back to the same bytes), so a panic can mean a
//! broken invariant as well as a crash.

use std::path::Path;

pub use crate::Rng;

/// A target: its name (the corpus folder) and the function.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Whether inputs are text (the mutator then also splices tokens and numbers).
    pub text: bool,
}

pub const TARGETS: &[Target] = &[
    Target {
        name: "parse",
        run: parse,
        text: true,
    },
    Target {
        name: "compile",
        run: compile,
        text: true,
    },
    Target {
        name: "artifact",
        run: artifact,
        text: true,
    },
    Target {
        name: "npy",
        run: npy,
        text: false,
    },
    Target {
        name: "safetensors",
        run: safetensors,
        text: false,
    },
];

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The text parser and verifier: any bytes are decoded and parsed; what parses prints back to
/// text that parses to an equal graph, and renders no diagnostic with a panic.
pub fn parse(bytes: &[u8]) {
    let src = match sinter_ir::text::decode(bytes) {
        Ok(src) => src,
        Err((lossy, diags)) => {
            let _ = diags.render("fuzz.sir", &lossy);
            return;
        }
    };
    match sinter_ir::text::parse(src) {
        Ok(g) => {
            let printed = sinter_ir::text::print(&g);
            let again = sinter_ir::text::parse(&printed).unwrap_or_else(|d| {
                panic!(
                    "printed graph does not parse:\n{printed}\n{}",
                    d.render("p", &printed)
                )
            });
            assert!(again == g, "print/parse changed the graph:\n{printed}");
        }
        Err(diags) => {
            let _ = diags.render("fuzz.sir", src);
        }
    }
}

/// Parsing and, for what parses, the whole compiler (autodiff, decomposition, optimization,
/// lowering, memory plan, codegen and naga validation): errors are fine, panics are not. Graphs
/// are compiled with a small binding limit, so the memory plan refuses large tensors before
/// anything is allocated for them.
pub fn compile(bytes: &[u8]) {
    let Ok(src) = std::str::from_utf8(bytes) else {
        return;
    };
    let Ok(g) = sinter_ir::text::parse(src) else {
        return;
    };
    let options = sinter_compiler::Options {
        target: sinter_compiler::Target::portable().with_max_binding(1 << 22),
        ..Default::default()
    };
    if let Ok(compiled) = sinter_compiler::compile(&g, &options) {
        let a = compiled.artifact;
        let back = sinter_ir::artifact::Artifact::from_bytes(&a.to_bytes())
            .unwrap_or_else(|e| panic!("a compiled artifact does not load: {e}"));
        assert!(back == a, "a compiled artifact changes through its file");
    }
}

/// The artifact loader from bytes. The input is the manifest (JSON); it is wrapped in a header
/// with a valid checksum, so that mutations reach the manifest checks instead of all failing
/// the checksum. An accepted artifact serializes back to what was read.
pub fn artifact(bytes: &[u8]) {
    let (manifest, blob) = match bytes.iter().position(|&b| b == 0) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let mut body = manifest.to_vec();
    body.extend_from_slice(blob);
    let mut file = Vec::with_capacity(32 + body.len());
    file.extend_from_slice(&sinter_ir::artifact::MAGIC);
    file.extend_from_slice(&sinter_ir::artifact::FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    file.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    file.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    file.extend_from_slice(&body);
    // The raw bytes as a whole file too (header damage).
    let _ = sinter_ir::artifact::Artifact::from_bytes(bytes);
    if let Ok(a) = sinter_ir::artifact::Artifact::from_bytes(&file) {
        let back = sinter_ir::artifact::Artifact::from_bytes(&a.to_bytes())
            .unwrap_or_else(|e| panic!("an accepted artifact does not reload: {e}"));
        assert!(back == a, "an accepted artifact changes through its file");
        // What the runtime works out before touching a GPU.
        let _ = sinter_runtime::io::HostTensor::f32(vec![], vec![0.0]);
        for t in &a.tensors {
            let _ = t.ty.size_bytes();
        }
    }
}

/// The `.npy` reader from bytes.
pub fn npy(bytes: &[u8]) {
    if let Ok(t) = sinter_runtime::io::npy_from_bytes(Path::new("fuzz.npy"), bytes) {
        assert_eq!(
            t.data.len(),
            t.shape.iter().product::<usize>(),
            "{:?}",
            t.shape
        );
        let written = sinter_runtime::io::npy_to_bytes(Path::new("fuzz.npy"), &t)
            .unwrap_or_else(|e| panic!("an accepted tensor does not write: {e}"));
        let back = sinter_runtime::io::npy_from_bytes(Path::new("fuzz.npy"), &written)
            .unwrap_or_else(|e| panic!("a written tensor does not read: {e}"));
        assert!(same(&back, &t), "npy round trip changed the tensor");
    }
}

/// The safetensors reader from bytes.
pub fn safetensors(bytes: &[u8]) {
    if let Ok(ts) = sinter_runtime::io::safetensors_from_bytes(Path::new("fuzz.st"), bytes) {
        let written = sinter_runtime::io::safetensors_to_bytes(Path::new("fuzz.st"), &ts)
            .unwrap_or_else(|e| panic!("accepted tensors do not write: {e}"));
        let back = sinter_runtime::io::safetensors_from_bytes(Path::new("fuzz.st"), &written)
            .unwrap_or_else(|e| panic!("written tensors do not read: {e}"));
        assert_eq!(back.len(), ts.len());
        for ((n, a), (m, b)) in back.iter().zip(&ts) {
            assert!(n == m && same(a, b), "safetensors round trip changed `{m}`");
        }
    }
}

/// Equal shapes and bit-identical data (NaN payloads included).
fn same(a: &sinter_runtime::io::HostTensor, b: &sinter_runtime::io::HostTensor) -> bool {
    a.shape == b.shape && a.to_le_bytes() == b.to_le_bytes()
}

/// Reads every file of a corpus folder (none when it does not exist), sorted by name.
pub fn corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            std::fs::read(e.path()).ok().map(|b| (name, b))
        })
        .collect();
    files.sort();
    files
}

/// Values that tend to break size and index arithmetic.
const INTERESTING: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "255",
    "256",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-2147483648",
    "18446744073709551615",
    "1e308",
    "1e-308",
    "nan",
    "inf",
    "-inf",
    "0.0",
    "-0.0",
    "1e39",
];

/// Byte sequences that tend to break parsers of the formats.
const TOKENS: &[&[u8]] = &[
    b"\0",
    b"\xff",
    b"\xef\xbb\xbf",
    b"\x1b[2J",
    b"\xe2\x80\xae",
    b"(",
    b")",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"=",
    b"\n",
    b"\"",
    b"'",
    b":",
    b"#",
    b"grad(",
    b"train ",
    b"f32[",
    b"i32[",
    b"output ",
    b"assign ",
    b"relu(",
    b"concat(",
    b"slice(",
    b"'descr'",
    b"'shape'",
    b"\"shape\"",
    b"\"dtype\"",
    b"\"data_offsets\"",
    b"\"params\"",
    b"\"workgroups\"",
    b"\"address_words\"",
];

/// One mutation of `input`, sometimes splicing in part of `other`.
pub fn mutate(input: &[u8], other: &[u8], text: bool, rng: &mut Rng) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = 1 + rng.index(4);
    for _ in 0..rounds {
        let len = out.len();
        let at = rng.index(len + 1);
        match rng.index(if text { 10 } else { 7 }) {
            0 if len > 0 => {
                let i = rng.index(len);
                out[i] ^= 1 << rng.index(8);
            }
            1 if len > 0 => {
                let i = rng.index(len);
                out[i] = rng.next_u64() as u8;
            }
            2 if len > 0 => {
                let end = (at + 1 + rng.index(16)).min(len);
                out.drain(at.min(len)..end);
            }
            3 => {
                let token = TOKENS[rng.index(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            4 if !other.is_empty() => {
                let from = rng.index(other.len());
                let n = 1 + rng.index(64.min(other.len() - from));
                out.splice(at..at, other[from..from + n].iter().copied());
            }
            5 if len > 0 => {
                // Duplicate a chunk.
                let from = rng.index(len);
                let n = 1 + rng.index(32.min(len - from));
                let chunk: Vec<u8> = out[from..from + n].to_vec();
                out.splice(at..at, chunk);
            }
            6 if len >= 4 => {
                // Overwrite four bytes with an extreme little-endian word.
                let i = rng.index(len - 3);
                let word = [0u32, 1, u32::MAX, 1 << 31, 0x7fc0_0000, 0x7f80_0000][rng.index(6)];
                out[i..i + 4].copy_from_slice(&word.to_le_bytes());
            }
            7 | 8 => {
                // Replace a number with an interesting one.
                let digits: Vec<usize> = (0..len).filter(|&i| out[i].is_ascii_digit()).collect();
                if let Some(&i) = digits.get(rng.index(digits.len().max(1))) {
                    let end = (i..len).find(|&j| !out[j].is_ascii_digit()).unwrap_or(len);
                    let start = (0..i)
                        .rev()
                        .find(|&j| !out[j].is_ascii_digit())
                        .map_or(0, |j| j + 1);
                    let value = INTERESTING[rng.index(INTERESTING.len())];
                    out.splice(start..end, value.bytes());
                }
            }
            9 => {
                // Duplicate a line.
                let lines: Vec<usize> = (0..len).filter(|&i| out[i] == b'\n').collect();
                if lines.len() >= 2 {
                    let k = rng.index(lines.len() - 1);
                    let line: Vec<u8> = out[lines[k] + 1..=lines[k + 1]].to_vec();
                    let to = lines[rng.index(lines.len())] + 1;
                    out.splice(to..to, line);
                }
            }
            _ => {}
        }
    }
    out.truncate(1 << 16);
    out
}
