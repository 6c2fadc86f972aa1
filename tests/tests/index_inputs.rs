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

fn compile(src: &str) -> Result<sinter_ir::artifact::Artifact, String> {
    let graph = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
    sinter_compiler::compile(&graph, &Default::default())
        .map(|c| c.artifact)
        .map_err(|e| e.to_string())
}

/// Ids that reach `embedding` through `concat` and `where` are checked on every input they come
/// from (the reproducer: exit 0 with NaN rows).
#[test]
fn ids_through_concat_and_where_are_checked_at_every_input() {
    let src = "graph t {
  input a: i32[2]
  input b: i32[2]
  input pick: f32[4]
  param table: f32[6, 3] = normal(std=1.0, seed=1)
  ids = concat(a, b, axis=0)
  e = embedding(table, where(pick, ids, reshape(transpose(reshape(ids, shape=[2, 2]), dim0=0, dim1=1), shape=[4])))
  output e
}
";
    let mut s = Session::load(compile(src).unwrap()).expect("loads");
    let a = HostTensor::i32(vec![2], vec![0, 5]);
    let pick = HostTensor::f32(vec![4], vec![1.0, 0.0, 1.0, 0.0]);
    let good = HostTensor::i32(vec![2], vec![3, 4]);
    assert!(s.run(&[("a", &a), ("b", &good), ("pick", &pick)]).is_ok());
    let bad = HostTensor::i32(vec![2], vec![3, 6]);
    let err = s
        .run(&[("a", &a), ("b", &bad), ("pick", &pick)])
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::IndexOutOfRange { name, position: 1, value: 6, bound: 6 } if name == "b"),
        "{err}"
    );
}

/// An optimizer step fed as an input is at least 1 and not NaN; the step state `train` keeps is
/// checked when weights are loaded.
#[test]
fn optimizer_steps_below_one_or_nan_are_refused() {
    let src = "graph t {
  input g: f32[3]
  input t: f32[]
  param w: f32[3] = ones
  state m: f32[3] = zeros
  state v: f32[3] = zeros
  w2, m2, v2 = adam(w, g, m, v, t)
  output w2
}
";
    let mut s = Session::load(compile(src).unwrap()).expect("loads");
    let g = HostTensor::f32(vec![3], vec![0.1, -0.2, 0.3]);
    assert!(
        s.run(&[("g", &g), ("t", &HostTensor::f32(vec![], vec![1.0]))])
            .is_ok()
    );
    for bad in [0.0, 0.5, f32::NAN, f32::NEG_INFINITY] {
        let err = s
            .run(&[("g", &g), ("t", &HostTensor::f32(vec![], vec![bad]))])
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::BelowMinimum { ref name, .. } if name == "t"),
            "{bad}: {err}"
        );
    }
    let train = "graph t {
  input x: f32[3]
  param w: f32[3] = ones
  loss = sum(mul(x, w))
  train loss with adamw(lr=0.1)
  output loss
}
";
    let mut s = Session::load(compile(train).unwrap()).expect("loads");
    let err = s
        .load_weights(&[("train.step".into(), HostTensor::f32(vec![], vec![-1.0]))])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("`train.step` holds -1 at flat position 0, but it must be at least 0"),
        "{err}"
    );
}

/// Ids computed from values whose range nothing shows are refused when compiling.
#[test]
fn computed_ids_without_a_known_range_do_not_compile() {
    let err = compile(
        "graph t {
  input x: f32[4]
  param table: f32[6, 3] = zeros
  e = embedding(table, cast(mul(x, 6), dtype=\"i32\"))
  output e
}
",
    )
    .unwrap_err();
    assert!(
        err.contains("`embedding` reads") && err.contains("must be in 0..=5"),
        "{err}"
    );
}
