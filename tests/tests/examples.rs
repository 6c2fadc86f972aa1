//! Every program in `ir-spec/examples/` parses, survives a print/parse round trip, and runs on
//! the reference interpreter with finite outputs. New examples are picked up without editing
//! this file.

use std::collections::HashMap;
use std::path::PathBuf;

use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{DType, Graph, ValueDef};

fn examples() -> Vec<(PathBuf, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ir-spec/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ir-spec/examples exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "sir"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "expected the example programs in {dir:?}");
    files
        .into_iter()
        .map(|p| {
            let src = std::fs::read_to_string(&p).expect("readable example");
            (p, src)
        })
        .collect()
}

fn parse(path: &std::path::Path, src: &str) -> Graph {
    sinter_ir::text::parse(src).unwrap_or_else(|d| {
        panic!("{}", d.render(&path.display().to_string(), src));
    })
}

#[test]
fn examples_round_trip_through_the_printer() {
    for (path, src) in examples() {
        let graph = parse(&path, &src);
        let printed = sinter_ir::text::print(&graph);
        let reparsed = sinter_ir::text::parse(&printed).unwrap_or_else(|d| {
            panic!(
                "{}: printed form does not parse:\n{}",
                path.display(),
                d.render("printed", &printed)
            )
        });
        assert_eq!(
            reparsed,
            graph,
            "{}: print/parse changed the graph",
            path.display()
        );
        assert!(!graph.outputs.is_empty(), "{}: no outputs", path.display());
    }
}

/// Runs each example with f32 inputs in [-1, 1) and i32 inputs of 0 (a valid class, token and
/// position everywhere), params and states from their initializers.
#[test]
fn examples_evaluate_to_finite_outputs() {
    for (path, src) in examples() {
        let graph = sinter_ir::expand::expand_composites(&parse(&path, &src));
        let graph = sinter_compiler::autodiff::differentiate(&graph)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .graph;
        let mut inputs = HashMap::new();
        let mut persistent = HashMap::new();
        let mut state = 1u64;
        for value in &graph.values {
            match &value.def {
                ValueDef::Input => {
                    let n = value.ty.numel();
                    let data = match value.ty.dtype {
                        DType::F32 | DType::F16 => (0..n)
                            .map(|_| {
                                state = state
                                    .wrapping_mul(6364136223846793005)
                                    .wrapping_add(1442695040888963407);
                                let x = (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                                value.ty.dtype.round(x)
                            })
                            .collect(),
                        DType::I32 => vec![0.0; n],
                    };
                    inputs.insert(
                        value.name.clone(),
                        Tensor {
                            ty: value.ty.clone(),
                            data,
                        },
                    );
                }
                ValueDef::Param(init) | ValueDef::State(init) => {
                    persistent.insert(
                        value.name.clone(),
                        sinter_ir::init::initial_value(&value.ty, init),
                    );
                }
                ValueDef::Node { .. } => {}
            }
        }
        let evaluation = evaluate(&graph, &inputs, &persistent)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            evaluation.outputs.len(),
            graph.outputs.len(),
            "{}",
            path.display()
        );
        for (name, tensor) in &evaluation.outputs {
            let expected = graph.ty(graph.lookup(name).expect("output names a value"));
            assert_eq!(&tensor.ty, expected, "{}: output `{name}`", path.display());
            assert!(
                tensor.data.iter().all(|v| v.is_finite()),
                "{}: output `{name}` is not finite",
                path.display()
            );
        }
    }
}
