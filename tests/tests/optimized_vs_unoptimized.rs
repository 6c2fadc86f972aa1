//! Every bundled example compiled with the e-graph optimizer and without it (`--no-opt`) runs on
//! the GPU to the same outputs and the same updated params and states, on the same inputs, over
//! two steps; and the optimized artifact has fewer dispatches.

use sinter_compiler::Options;
use sinter_runtime::Session;
use sinter_runtime::io::HostTensor;
use sinter_tests::{random_inputs, relative_error};

fn examples() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../ir-spec/examples");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("examples")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".sir").map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Named tensors, in order.
type Named = Vec<(String, HostTensor)>;

/// Runs two steps; returns the dispatch count, the last outputs and every param and state after.
fn run(
    graph: &sinter_ir::Graph,
    optimize: bool,
    feeds: &[(&str, &HostTensor)],
) -> (usize, Named, Named) {
    let options = Options {
        optimize,
        ..Options::default()
    };
    let artifact = sinter_compiler::compile(graph, &options)
        .unwrap_or_else(|e| panic!("compile: {e}"))
        .artifact;
    let dispatches = artifact.dispatches.len();
    let mut session = Session::load(artifact).unwrap_or_else(|e| panic!("load: {e}"));
    let outputs = session
        .run_steps(2, feeds)
        .unwrap_or_else(|e| panic!("run: {e}"));
    let weights = session.weights().expect("weights");
    (dispatches, outputs.into_vec(), weights)
}

#[test]
fn optimized_artifacts_compute_what_unoptimized_ones_do() {
    for name in examples() {
        let src = sinter_tests::example_source(&name);
        let graph = sinter_ir::text::parse(&src).expect("valid example");
        let classes = 10; // a valid label, token and class for every example
        let inputs = random_inputs(&graph, 3, classes, &[]);
        let host: Vec<(String, HostTensor)> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), HostTensor::from_interp(t)))
            .collect();
        let feeds: Vec<(&str, &HostTensor)> = host.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (fused, out_opt, w_opt) = run(&graph, true, &feeds);
        let (plain, out_plain, w_plain) = run(&graph, false, &feeds);
        assert!(
            fused < plain,
            "{name}: {fused} dispatches optimized, {plain} without"
        );
        for ((n, a), (_, b)) in out_opt
            .iter()
            .chain(&w_opt)
            .zip(out_plain.iter().chain(&w_plain))
        {
            let err = relative_error(&a.to_interp().data, &b.to_interp().data);
            assert!(err < 2e-4, "{name}: `{n}` differs by {err:e}");
        }
    }
}
