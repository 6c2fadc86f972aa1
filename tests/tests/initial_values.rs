//! Artifacts carry initializers, not initial values: the runtime evaluates each at load, bit for
//! bit as the reference interpreter's (IR.md, "Initializers"), so the file stays small however
//! large the weights are.

use sinter_runtime::Session;

#[test]
fn every_initializer_loads_as_the_interpreter_computes_it() {
    let src = "graph t {
  input x: f32[3]
  param a: f32[1001] = normal(std=0.02, seed=3)
  param b: f32[7, 9] = normal(mean=-1.5, std=3.3, seed=11)
  param c: f32[5, 6] = uniform(lo=-0.7, hi=0.9, seed=5)
  param d: f32[4] = full(2.5)
  param e: f32[4] = ones
  param f: f32[300000] = zeros
  state n: i32[3] = full(-2.7)
  y = add(x, sum(a))
  z = add(sum(b), add(sum(c), add(sum(d), add(sum(e), sum(f)))))
  m = cast(n, dtype=\"f32\")
  output y, z, m
}
";
    let graph = sinter_ir::text::parse(src).expect("valid program");
    let artifact = sinter_compiler::compile(&graph, &Default::default())
        .expect("compiles")
        .artifact;
    assert!(artifact.blob.is_empty(), "initial values stored as bytes");
    let bytes = artifact.to_bytes();
    assert!(
        bytes.len() < 64 * 1024,
        "{} bytes for 1.2 MB of initial values",
        bytes.len()
    );
    let artifact = sinter_ir::artifact::Artifact::from_bytes(&bytes).expect("reads back");
    let session = Session::load(artifact).unwrap_or_else(|e| panic!("load: {e}"));
    for slot in session.artifact().tensors.clone() {
        let Some(init) = &slot.fill else { continue };
        let want = sinter_ir::init::initial_bytes(&slot.ty, init);
        let got = session
            .read_persistent(&slot.name)
            .unwrap_or_else(|e| panic!("read `{}`: {e}", slot.name));
        assert_eq!(got.to_le_bytes(), want, "`{}` ({init})", slot.name);
    }
}
