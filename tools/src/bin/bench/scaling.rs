//! `sinter-bench scaling`: compile time against program size, to catch a pass that turns
//! quadratic. Each family of programs is generated at N and at 4N nodes and compiled (parse,
//! verify, every pass, codegen; best of `--repeats`); a linear or n·log n pipeline takes about
//! 4x as long for 4x the nodes, a quadratic one 16x. A ratio above `--max-ratio` is a failure.

use std::fmt::Write as _;
use std::time::Instant;

use super::{Failure, Json, Output};

#[derive(clap::Args)]
pub struct ScalingArgs {
    /// The smaller size N of the relu chain (nodes); it is also compiled at 4N.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// The smaller size of the training chain (whose e-graph optimization costs milliseconds
    /// per node); it is also compiled at 4 times this.
    #[arg(long, default_value_t = 1_000)]
    train_nodes: usize,
    /// Compilations per size; the fastest counts.
    #[arg(long, default_value_t = 3)]
    repeats: u32,
    /// Largest acceptable time(4N) / time(N).
    #[arg(long, default_value_t = 8.0)]
    max_ratio: f64,
}

/// A chain of `n` relus: one kernel, `n` dispatches, `n` short-lived buffers.
pub fn relu_chain(n: usize) -> String {
    let mut s = String::from("graph chain {\n  input x: f32[16]\n  v0 = relu(x)\n");
    for i in 1..n {
        writeln!(s, "  v{i} = relu(v{})", i - 1).expect("writing to a String");
    }
    writeln!(s, "  output v{}\n}}", n - 1).expect("writing to a String");
    s
}

/// A training step through a chain of `n` elementwise ops: autodiff doubles it, and every
/// forward value stays live until the backward pass reads it.
pub fn training_chain(n: usize) -> String {
    let mut s = String::from(
        "graph chain {\n  input x: f32[16]\n  param w: f32[16] = normal(std=1.0, seed=1)\n  v0 = mul(x, w)\n",
    );
    for i in 1..n {
        let op = if i % 2 == 1 { "relu" } else { "tanh" };
        writeln!(s, "  v{i} = {op}(v{})", i - 1).expect("writing to a String");
    }
    writeln!(
        s,
        "  loss = sum(v{})\n  train loss with sgd(lr=0.1)\n  output loss\n}}",
        n - 1
    )
    .expect("writing to a String");
    s
}

fn compile_seconds(src: &str, repeats: u32) -> Result<f64, Failure> {
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        let graph = sinter_ir::text::parse(src).map_err(|d| Failure::Error(d.to_string()))?;
        sinter_compiler::compile(&graph, &sinter_compiler::Options::default())?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

pub fn scaling(args: &ScalingArgs, out: &Output) -> Result<(), Failure> {
    type Family = (&'static str, fn(usize) -> String, usize);
    let families: [Family; 2] = [
        ("relu_chain", relu_chain, args.nodes),
        ("training_chain", training_chain, args.train_nodes),
    ];
    out.table(&format!(
        "{:<16} {:>8} {:>10} {:>8} {:>10} {:>7}",
        "program", "N", "compile", "4N", "compile", "ratio"
    ));
    let mut worst: Option<String> = None;
    for (name, make, nodes) in families {
        let (n, big) = (nodes.max(2), 4 * nodes.max(2));
        let small_s = compile_seconds(&make(n), args.repeats)?;
        let big_s = compile_seconds(&make(big), args.repeats)?;
        let ratio = big_s / small_s.max(1e-9);
        out.table(&format!(
            "{name:<16} {n:>8} {small_s:>9.3}s {big:>8} {big_s:>9.3}s {ratio:>7.2}"
        ));
        out.record(&[
            ("bench", Json::Str("scaling".into())),
            ("program", Json::Str(name.into())),
            ("n", Json::Int(n as u64)),
            ("seconds", Json::Num(small_s)),
            ("n4", Json::Int(big as u64)),
            ("seconds4", Json::Num(big_s)),
            ("ratio", Json::Num(ratio)),
            ("ok", Json::Bool(ratio <= args.max_ratio)),
        ]);
        if ratio > args.max_ratio {
            worst = Some(format!(
                "compiling `{name}` took {ratio:.1}x as long at {big} nodes as at {n} \
                 (limit {}x): some pass is worse than n log n",
                args.max_ratio
            ));
        }
    }
    match worst {
        Some(message) => Err(Failure::Wrong(message)),
        None => Ok(()),
    }
}
