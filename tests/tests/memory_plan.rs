//! The memory plan on every bundled example: peak within 1.15x of the lower bound (the largest
//! total of simultaneously live bytes), and no two simultaneously live buffers overlapping; and
//! the bindings of artifacts for browsers: no arena bound twice in a dispatch.

use sinter_compiler::{Options, compile};

fn examples() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../ir-spec/examples");
    let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("examples folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sir"))
        .map(|p| {
            (
                p.file_stem().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(out.len() >= 3, "bundled examples missing");
    out
}

#[test]
fn peak_is_near_the_lower_bound_and_live_buffers_never_overlap() {
    for (name, src) in examples() {
        check_plan(&name, &src);
        check_plan(
            &format!("{name} with gradients"),
            &sinter_tests::with_param_grads(&src),
        );
    }
}

/// WebGPU in a browser refuses a dispatch that binds one buffer twice (see
/// the target's `quad_aliases`); natively the matmuls of `mlp` do, for 16-byte loads.
#[test]
fn artifacts_for_browsers_bind_no_arena_twice() {
    let twice = |artifact: &sinter_ir::artifact::Artifact| {
        artifact.dispatches.iter().any(|d| {
            let mut arenas = d.arenas.clone();
            arenas.sort_unstable();
            arenas.windows(2).any(|w| w[0] == w[1])
        })
    };
    let browser = Options {
        target: sinter_compiler::Target::browser(),
        ..Options::default()
    };
    for (name, src) in examples() {
        let graph =
            sinter_ir::text::parse(&src).unwrap_or_else(|d| panic!("{}", d.render(&name, &src)));
        let artifact = compile(&graph, &browser)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .artifact;
        assert!(
            !twice(&artifact),
            "{name}: an arena is bound twice with quad aliases off"
        );
        if name == "mlp" {
            let native = compile(&graph, &Options::default())
                .expect("compiles")
                .artifact;
            assert!(
                twice(&native),
                "mlp natively: expected a vec4 alias binding"
            );
        }
    }
}

fn check_plan(name: &str, src: &str) {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render(name, src)));
    let artifact = compile(&graph, &Options::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .artifact;
    let m = &artifact.memory;
    let ratio = m.peak_bytes as f64 / m.lower_bound_bytes as f64;
    assert!(
        ratio <= 1.15,
        "{name}: peak {} is {ratio:.3}x the bound {}",
        m.peak_bytes,
        m.lower_bound_bytes
    );
    for (i, a) in m.buffers.iter().enumerate() {
        for b in &m.buffers[i + 1..] {
            let live_together = a.live.0 <= b.live.1 && b.live.0 <= a.live.1;
            let overlap = a.arena == b.arena
                && a.offset < b.offset + b.size_bytes
                && b.offset < a.offset + a.size_bytes;
            assert!(
                !(live_together && overlap),
                "{name}: `{}` and `{}` overlap while both live",
                a.label,
                b.label
            );
        }
    }
    println!(
        "{name}: peak {} B, bound {} B, {ratio:.3}x",
        m.peak_bytes, m.lower_bound_bytes
    );
}
