//! The import-time folder against the ONNX node suite: the index ops exports apply to constant
//! tables (`GatherElements`, `ScatterElements`, `ScatterND`, `CumSum`, `ArgMax`/`ArgMin`,
//! `Slice` with negative steps), each case imported with every input given as an import-time
//! constant, so the whole graph folds; its outputs are then literals, held to the suite's
//! expected outputs. Data as for `node_tests.rs`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use common::{ATOL, RTOL, compare, data_sets, graph_inputs};
use sinter_ir::interp;
use sinter_onnx::Options;

const CASES: &[&str] = &[
    "test_gather_elements_0",
    "test_gather_elements_1",
    "test_gather_elements_negative_indices",
    "test_scatter_elements_with_duplicate_indices",
    "test_scatter_elements_with_axis",
    "test_scatter_elements_with_negative_indices",
    "test_scatter_elements_without_axis",
    "test_scatter_elements_with_reduction_max",
    "test_scatter_elements_with_reduction_min",
    "test_scatternd",
    "test_scatternd_add",
    "test_scatternd_multiply",
    "test_scatternd_max",
    "test_cumsum_1d",
    "test_cumsum_1d_exclusive",
    "test_cumsum_1d_reverse",
    "test_cumsum_1d_reverse_exclusive",
    "test_cumsum_2d_axis_0",
    "test_cumsum_2d_axis_1",
    "test_cumsum_2d_negative_axis",
    "test_argmax_default_axis_random",
    "test_argmax_keepdims_random_select_last_index",
    "test_argmax_negative_axis_keepdims_random",
    "test_argmax_no_keepdims_example",
    "test_argmin_default_axis_random",
    "test_argmin_no_keepdims_random_select_last_index",
    "test_slice_neg",
    "test_slice_neg_steps",
    "test_slice_negative_axes",
];

fn node_dir() -> PathBuf {
    std::env::var_os("SINTER_ONNX_NODE_TESTS")
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/onnx-node-tests"),
            PathBuf::from,
        )
        .join("node")
}

#[test]
fn index_ops_on_constants_fold_to_the_suites_outputs() {
    let node = node_dir();
    assert!(
        node.is_dir(),
        "the ONNX node suite is missing from {}: run tools/test.sh --setup-only",
        node.display()
    );
    let mut failures = Vec::new();
    for case in CASES {
        let dir = node.join(case);
        let model = std::fs::read(dir.join("model.onnx"))
            .unwrap_or_else(|e| panic!("{case}: {e} (is the suite onnx 1.19.0's?)"));
        let names = graph_inputs(&model);
        let sets = data_sets(&dir).unwrap_or_else(|e| panic!("{case}: {e}"));
        for set in &sets {
            let constants: BTreeMap<_, _> = names.iter().cloned().zip(set.inputs.clone()).collect();
            let options = Options {
                constants,
                ..Options::default()
            };
            let imported = match sinter_onnx::import(&model, &options) {
                Ok(i) => i,
                Err(e) => {
                    failures.push(format!("{case}: import: {e}"));
                    continue;
                }
            };
            assert!(
                imported.inputs.is_empty(),
                "{case}: every input is a constant"
            );
            let persistent: HashMap<_, _> = imported.weights.iter().cloned().collect();
            let run = interp::evaluate(&imported.graph, &HashMap::new(), &persistent)
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            for (port, want) in imported.outputs.iter().zip(&set.outputs) {
                let got = run.output(&port.sir).expect("an output");
                if let Err(e) = compare(&port.onnx, got, want, RTOL, ATOL) {
                    failures.push(format!("{case}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
