//! i32 inputs that index something (embedding ids, class labels) are range-checked by the
//! runtime before a run: a kernel could only turn a bad index into NaN.

use sinter_runtime::io::HostTensor;
use sinter_runtime::{RuntimeError, Session};

const SRC: &str = "graph t {
  input ids: i32[2, 3]
  input labels: i32[6]
  param table: f32[5, 4] = normal(std=1.0, seed=1)
  param w: f32[4, 7] = normal(std=1.0, seed=2)
  e = reshape(embedding(table, ids), shape=[6, 4])
  loss = cross_entropy(matmul(e, w), labels)
  output loss
}
";

fn session() -> Session {
    let graph = sinter_ir::text::parse(SRC).expect("valid");
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .expect("compiles")
        .artifact;
    let bound = |name: &str| {
        artifact
            .tensors
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.index_bound)
    };
    assert_eq!((bound("ids"), bound("labels")), (Some(5), Some(7)));
    Session::load(artifact).expect("loads")
}

#[test]
fn indices_in_range_run_and_out_of_range_are_named() {
    let mut s = session();
    let ids = HostTensor::i32(vec![2, 3], vec![0, 4, 2, 1, 3, 4]);
    let labels = HostTensor::i32(vec![6], vec![6, 0, 1, 2, 3, 5]);
    let out = s
        .run(&[("ids", &ids), ("labels", &labels)])
        .expect("in range");
    assert!(out.get("loss").is_some());

    let bad_ids = HostTensor::i32(vec![2, 3], vec![0, 4, 5, 1, 3, 4]);
    match s.run(&[("ids", &bad_ids), ("labels", &labels)]) {
        Err(e @ RuntimeError::IndexOutOfRange { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("`ids`") && msg.contains("index 5") && msg.contains("0..5"),
                "{msg}"
            );
        }
        other => panic!("expected an index error, got {other:?}"),
    }
    let bad_labels = HostTensor::i32(vec![6], vec![0, 0, -1, 2, 3, 5]);
    match s.run(&[("ids", &ids), ("labels", &bad_labels)]) {
        Err(RuntimeError::IndexOutOfRange {
            name,
            position,
            value,
            bound,
        }) => {
            assert_eq!(
                (name.as_str(), position, value, bound),
                ("labels", 2, -1, 7)
            );
        }
        other => panic!("expected an index error, got {other:?}"),
    }
}
