//! Tidy tests, as rust-analyzer has them: the invariants ARCHITECTURE.md promises, checked over
//! the source tree, so that a change that breaks one fails `cargo test` with the file and line.
//!
//! - crate dependencies: `sinter-ir` links no compiler or GPU crate, the runtime never links the
//!   compiler (and the IR crate only behind its `interp` feature), the artifact schema links
//!   nothing of the front end, the compiler never links the runtime;
//! - file access (`std::fs` and friends) only in the runtime's native layer (`runtime/src/
//!   native.rs`) among the library crates (the CLI and tests may);
//! - element and word sizes only through `DType::size_bytes` (and `WORD_BYTES`): no literal `4`
//!   multiplies, divides or aligns a size outside an allow-list of non-byte uses;
//! - every op of the op table has a GPU test and, when it is differentiable, a gradient check:
//!   adding an op without tests fails here.

use std::path::{Path, PathBuf};

use sinter_ir::op::OPS;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a folder entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn relative(p: &Path) -> String {
    let root = repo().canonicalize().expect("repo root");
    let p = p.canonicalize().expect("a source file");
    p.strip_prefix(&root)
        .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
}

/// The code of a Rust file, line by line: comments and string contents blanked, and nothing
/// from the first `#[cfg(test)]` module on (unit tests may use files and literals freely).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_block_comment = false;
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map_or("", |l| l.trim());
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            break;
        }
        let mut code = String::new();
        let mut chars = line.chars().peekable();
        let mut in_string = false;
        while let Some(c) = chars.next() {
            if in_block_comment {
                if c == '*' && chars.peek() == Some(&'/') {
                    chars.next();
                    in_block_comment = false;
                }
                continue;
            }
            if in_string {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        in_string = false;
                        code.push('"');
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '/' if chars.peek() == Some(&'/') => break,
                '/' if chars.peek() == Some(&'*') => {
                    chars.next();
                    in_block_comment = true;
                }
                '"' => {
                    in_string = true;
                    code.push('"');
                }
                // A char literal: skip it (`'"'` would open a string otherwise).
                '\'' => {
                    let rest: String = chars.clone().take(3).collect();
                    if rest.starts_with('\\') || rest.chars().nth(1) == Some('\'') {
                        let skip = if rest.starts_with('\\') { 3 } else { 2 };
                        for _ in 0..skip {
                            chars.next();
                        }
                        code.push_str("' '");
                    } else {
                        code.push(c);
                    }
                }
                _ => code.push(c),
            }
        }
        out.push((i + 1, code));
    }
    out
}

/// The string literals of a Rust file (escapes left as written).
fn string_literals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // raw strings r"..." and r#"..."#
        if bytes[i] == b'r' && (bytes.get(i + 1) == Some(&b'"') || bytes.get(i + 1) == Some(&b'#'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while bytes.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if bytes.get(j) == Some(&b'"') {
                let close = format!("\"{}", "#".repeat(hashes));
                if let Some(end) = text[j + 1..].find(&close) {
                    out.push(text[j + 1..j + 1 + end].to_string());
                    i = j + 1 + end + close.len();
                    continue;
                }
            }
        }
        if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                if bytes[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            out.push(text[i + 1..j.min(text.len())].to_string());
            i = j + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// The names under `[dependencies]` of a Cargo.toml, and under every target's
/// `[target.'cfg(…)'.dependencies]`.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("Cargo.toml");
    let mut in_deps = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]"
                || (line.starts_with("[target.") && line.ends_with(".dependencies]"));
            continue;
        }
        if in_deps
            && let Some(name) = line.split(['=', '.', ' ']).next()
            && !name.is_empty()
            && !name.starts_with('#')
        {
            out.push(name.to_string());
        }
    }
    out
}

#[test]
fn crate_dependencies_follow_the_layout() {
    let rules: &[(&str, &[&str], &str)] = &[
        (
            "ir-spec",
            &["egg", "naga", "wgpu", "sinter-compiler", "sinter-runtime"],
            "the IR is the contract both sides build against",
        ),
        (
            "runtime",
            &["sinter-compiler", "egg", "naga"],
            "the runtime never links the compiler",
        ),
        (
            "ir-spec/artifact",
            &[
                "sinter-ir",
                "codespan-reporting",
                "egg",
                "naga",
                "wgpu",
                "sinter-compiler",
                "sinter-runtime",
            ],
            "the artifact schema is all a runtime needs: no front end, no GPU crate",
        ),
        (
            "runtime/web",
            &[
                "sinter-ir",
                "sinter-compiler",
                "codespan-reporting",
                "egg",
                "naga",
            ],
            "the browser runtime links the runtime and the artifact schema, never the compiler \
             or the IR's front end",
        ),
        (
            "compiler",
            &["wgpu", "sinter-runtime"],
            "the compiler emits artifacts, it does not run them",
        ),
        (
            "tools/onnx",
            &["sinter-compiler", "sinter-runtime", "egg", "naga", "wgpu"],
            "the ONNX importer is a front end: it produces graphs, it neither compiles nor runs them",
        ),
    ];
    let mut broken = Vec::new();
    // the runtime links the IR crate only behind its `interp` feature (for tests and tools)
    let runtime = std::fs::read_to_string(repo().join("runtime/Cargo.toml")).expect("Cargo.toml");
    for line in runtime
        .lines()
        .filter(|l| l.trim_start().starts_with("sinter-ir"))
    {
        if !line.contains("optional = true") {
            broken.push(format!(
                "runtime/Cargo.toml: `{line}`: the runtime links the IR crate only as an \
                 optional dependency"
            ));
        }
    }
    for (krate, forbidden, why) in rules {
        let deps = dependencies(&repo().join(krate).join("Cargo.toml"));
        assert!(!deps.is_empty(), "{krate}/Cargo.toml lists no dependencies");
        for f in *forbidden {
            if deps.iter().any(|d| d == f) {
                broken.push(format!("{krate}/Cargo.toml depends on `{f}`: {why}"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn only_the_native_layer_touches_files() {
    let allowed = ["runtime/src/native.rs"];
    let patterns = ["std::fs", "fs::", "File::", "OpenOptions", "read_dir("];
    let mut files = Vec::new();
    for dir in [
        "ir-spec/src",
        "ir-spec/artifact/src",
        "compiler/src",
        "runtime/src",
        "tools/onnx/src",
        "runtime/web/src",
    ] {
        rust_files(&repo().join(dir), &mut files);
    }
    for a in allowed {
        assert!(
            files.iter().any(|f| relative(f) == a),
            "the native layer `{a}` is not among the library sources; fix `allowed`"
        );
    }
    let mut found = Vec::new();
    for f in &files {
        let rel = relative(f);
        if allowed.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("a source file");
        for (n, code) in code_lines(&text) {
            let word = |p: &str| {
                code.match_indices(p).any(|(at, _)| {
                    at == 0 || {
                        let c = code.as_bytes()[at - 1];
                        !(c.is_ascii_alphanumeric() || c == b'_')
                    }
                })
            };
            if let Some(p) = patterns.iter().find(|p| word(p)) {
                found.push(format!("{rel}:{n}: `{p}` outside the native layer"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Uses of a literal 4 in `*`, `/` or `%` that are not element or word sizes, with why.
const NOT_SIZES: &[(&str, &str, &str)] = &[
    (
        "compiler/src/codegen/matmul.rs",
        "tm % 4 == 0 && tn % 4 == 0",
        "micro-tiles in vec4 quads",
    ),
    (
        "compiler/src/codegen/matmul.rs",
        "(tn / 4) * 4",
        "vec4 lanes of the write loops",
    ),
    (
        "compiler/src/codegen/matmul.rs",
        "t.tm / 4, t.tn / 4",
        "vec4 quads per micro-tile",
    ),
    ("compiler/src/codegen/matmul.rs", "r / 4", "vec4 quad index"),
    (
        "compiler/src/codegen/matmul.rs",
        "if vec { n / 4 }",
        "vec4 quads per staging loop",
    ),
    (
        "compiler/src/codegen/matmul.rs",
        "sa / 4, sb / 4",
        "vec4 quads per padded row of workgroup memory",
    ),
    (
        "compiler/src/codegen/matmul.rs",
        "/ 4 / h",
        "vec4 quads per micro-tile",
    ),
    ("compiler/src/codegen/matmul.rs", "r % 4", "vec4 lane index"),
    (
        "compiler/src/optimize/mod.rs",
        "4 * graph_nodes",
        "an e-graph node limit",
    ),
    (
        "tools/src/gpt.rs",
        "4 * d",
        "a GPT block's MLP is four times as wide as the model",
    ),
    (
        "tools/src/bin/bench/scaling.rs",
        "4 * nodes",
        "the larger program of the scaling benchmark",
    ),
];

/// Whether `code` uses the literal 4 as an operand of `*`, `/` or `%`.
fn multiplies_by_four(code: &str) -> bool {
    let b = code.as_bytes();
    for i in 0..b.len() {
        if b[i] != b'4' {
            continue;
        }
        let before_ok =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b'.');
        let mut end = i + 1;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        let suffix = &code[i + 1..end];
        let is_four = ["", "u", "u32", "u64", "usize", "i32", "i64"].contains(&suffix)
            && b.get(end) != Some(&b'.');
        if !before_ok || !is_four {
            continue;
        }
        let prev = code[..i].trim_end().chars().next_back();
        let next = code[end..].trim_start().chars().next();
        let op = |c: Option<char>| matches!(c, Some('*' | '/' | '%'));
        if op(prev) || op(next) {
            return true;
        }
    }
    false
}

#[test]
fn element_sizes_only_through_dtype() {
    let mut files = Vec::new();
    for dir in [
        "ir-spec/src",
        "ir-spec/artifact/src",
        "compiler/src",
        "runtime/src",
        "runtime/web/src",
        "tools/src",
        "tools/onnx/src",
    ] {
        rust_files(&repo().join(dir), &mut files);
    }
    let mut found = Vec::new();
    let mut used = vec![false; NOT_SIZES.len()];
    for f in &files {
        let rel = relative(f);
        let text = std::fs::read_to_string(f).expect("a source file");
        let lines: Vec<&str> = text.lines().collect();
        for (n, code) in code_lines(&text) {
            if !multiplies_by_four(&code) {
                continue;
            }
            // Entries name the line as written (`code` has its strings blanked).
            let raw = lines[n - 1];
            let mut allowed = false;
            for (entry, (file, snippet, _)) in NOT_SIZES.iter().enumerate() {
                if *file == rel && raw.contains(snippet) {
                    used[entry] = true;
                    allowed = true;
                }
            }
            if !allowed {
                found.push(format!("{rel}:{n}: {}", raw.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "byte arithmetic with a literal 4; use `DType::size_bytes()` (or \
         `sinter_ir::artifact::WORD_BYTES` for arena words), or add the line to NOT_SIZES with \
         the reason it is not a size:\n{}",
        found.join("\n")
    );
    let stale: Vec<String> = NOT_SIZES
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|((file, snippet, _), _)| format!("{file}: `{snippet}`"))
        .collect();
    assert!(
        stale.is_empty(),
        "NOT_SIZES entries that allow no line (the line changed or moved; fix or remove the \
         entry):\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_four_finder_finds_fours() {
    assert!(multiplies_by_four("let b = n * 4;"));
    assert!(multiplies_by_four("x.len() as u64 * 4u64"));
    assert!(multiplies_by_four("offset / 4"));
    assert!(multiplies_by_four("4 * n"));
    assert!(!multiplies_by_four("let x = 4;"));
    assert!(!multiplies_by_four("a * 44"));
    assert!(!multiplies_by_four("v * 4.0"));
    assert!(!multiplies_by_four("f32x4 * 2"));
    assert!(!multiplies_by_four("let s = \"\";"));
}

/// Op names that a test file's string literals use: a literal that is the name, or holds
/// `name(`.
fn ops_named_in(files: &[&str]) -> Vec<&'static str> {
    let mut literals = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(repo().join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        literals.extend(string_literals(&text));
    }
    OPS.iter()
        .map(|s| s.name)
        .filter(|name| {
            literals.iter().any(|l| {
                l == name
                    || l.match_indices(&format!("{name}(")).any(|(at, _)| {
                        at == 0
                            || !l.as_bytes()[at - 1].is_ascii_alphanumeric()
                                && l.as_bytes()[at - 1] != b'_'
                    })
            })
        })
        .collect()
}

#[test]
fn every_op_runs_in_a_gpu_test() {
    // Why an op needs no program of its own.
    let exempt: &[(&str, &str)] = &[(
        "constant",
        "every number literal in a program is one (`add(x, 0.5)`)",
    )];
    let covered = ops_named_in(&["tests/tests/gpu_ops.rs", "tests/tests/gpu_numerics.rs"]);
    let missing: Vec<&str> = OPS
        .iter()
        .map(|s| s.name)
        .filter(|n| !covered.contains(n) && !exempt.iter().any(|(e, _)| e == n))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a GPU test (tests/tests/gpu_ops.rs or gpu_numerics.rs): {missing:?}"
    );
}

#[test]
fn every_differentiable_op_has_a_gradient_check() {
    let exempt: &[(&str, &str)] = &[(
        "max_pool2d_grad",
        "autodiff refuses to differentiate it again (IR.md §12.12)",
    )];
    let covered = ops_named_in(&["compiler/tests/gradcheck.rs"]);
    let missing: Vec<&str> = OPS
        .iter()
        .filter(|s| s.operands.iter().any(|o| o.differentiable))
        .map(|s| s.name)
        .filter(|n| !covered.contains(n) && !exempt.iter().any(|(e, _)| e == n))
        .collect();
    assert!(
        missing.is_empty(),
        "differentiable ops without a gradient check (compiler/tests/gradcheck.rs): {missing:?}"
    );
}
