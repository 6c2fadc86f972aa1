//! Artifacts edited after compilation, with a valid checksum: the loader checks the manifest
//! against itself (param blocks of the kernel's size, address words inside their arenas, no more
//! workgroups than the arenas have words, workgroup counts within what the artifact declares) and
//! names what is wrong, before anything reaches the GPU.

use sinter_ir::artifact::{Artifact, ArtifactError};

fn compiled() -> Artifact {
    let src = "graph t {\n  input x: f32[300, 17]\n  input w: f32[17, 40]\n  y = softmax(matmul(relu(x), w))\n  output y\n}\n";
    let graph = sinter_ir::text::parse(src).unwrap();
    sinter_compiler::compile(&graph, &Default::default())
        .unwrap()
        .artifact
}

/// The error reading back `a` after `edit`, through the file format (so the checksum is valid).
fn reload_error(edit: impl FnOnce(&mut Artifact)) -> String {
    let mut a = compiled();
    edit(&mut a);
    match Artifact::from_bytes(&a.to_bytes()) {
        Err(e @ ArtifactError::Inconsistent(_)) => e.to_string(),
        other => panic!("expected an inconsistency, got {other:?}"),
    }
}

#[test]
fn an_untouched_artifact_loads() {
    let a = compiled();
    assert_eq!(Artifact::from_bytes(&a.to_bytes()).unwrap(), a);
    assert!(a.dispatches.iter().all(|d| !d.address_words.is_empty()));
}

#[test]
fn workgroups_past_the_arena_or_the_declared_limit() {
    let err = reload_error(|a| a.dispatches[0].workgroups = [65535, 65535, 64]);
    assert!(
        err.contains("dispatch 0") && err.contains("workgroups"),
        "{err}"
    );
    let err = reload_error(|a| a.dispatches[1].workgroups = [1, 1, 0]);
    assert!(
        err.contains("dispatch 1") && err.contains("0 in all"),
        "{err}"
    );
    let err = reload_error(|a| a.dispatches[0].workgroups = [70000, 1, 1]);
    assert!(
        err.contains("70000 workgroups along one dimension"),
        "{err}"
    );
}

#[test]
fn param_blocks_of_the_wrong_size() {
    let err = reload_error(|a| a.dispatches[0].params.clear());
    assert!(err.contains("ships 0 param words"), "{err}");
    let err = reload_error(|a| a.dispatches[0].params.truncate(4));
    assert!(err.contains("ships 4 param words"), "{err}");
    let err = reload_error(|a| a.kernels[0].param_words += 4);
    assert!(err.contains("param block has"), "{err}");
}

#[test]
fn address_words_outside_their_arena() {
    let err = reload_error(|a| {
        let [word, _] = a.dispatches[0].address_words[0];
        a.dispatches[0].params[word as usize] = u32::MAX;
    });
    assert!(err.contains("addresses element 4294967295"), "{err}");
    let err = reload_error(|a| a.dispatches[0].address_words.push([9999, 0]));
    assert!(err.contains("param word 9999"), "{err}");
    let err = reload_error(|a| a.dispatches[0].address_words.push([0, 7]));
    assert!(err.contains("arena binding 7"), "{err}");
}

#[test]
fn initializers_only_on_params_and_states_and_valid() {
    use sinter_ir::Init;
    use sinter_ir::artifact::Role;
    let input = |a: &Artifact| {
        a.tensors
            .iter()
            .position(|t| t.role == Role::Input)
            .unwrap()
    };
    let err = reload_error(|a| {
        let i = input(a);
        a.tensors[i].fill = Some(Init::Ones);
    });
    assert!(err.contains("is not a param or state"), "{err}");
    let src = "graph t {\n  input x: f32[3]\n  param w: f32[3] = normal(std=0.5, seed=4)\n  y = mul(x, w)\n  output y\n}\n";
    let graph = sinter_ir::text::parse(src).unwrap();
    let mut a = sinter_compiler::compile(&graph, &Default::default())
        .unwrap()
        .artifact;
    let w = a.tensors.iter().position(|t| t.name == "w").unwrap();
    a.tensors[w].fill = Some(Init::Normal {
        mean: 0.0,
        std: -1.0,
        seed: 4,
    });
    match Artifact::from_bytes(&a.to_bytes()) {
        Err(e) => assert!(e.to_string().contains("std=-1 must be finite"), "{e}"),
        Ok(_) => panic!("a negative std loaded"),
    }
}

/// A kernel whose WGSL does not compile (pipelines are created on several threads) is named in
/// the load error, whichever thread created it.
#[test]
fn a_broken_kernel_is_named_when_loading() {
    let mut a = compiled();
    assert!(a.kernels.len() > 1);
    let last = a.kernels.len() - 1;
    a.kernels[last].wgsl = "@compute @workgroup_size(1) fn main() { let x = ; }".into();
    let name = a.kernels[last].name.clone();
    match sinter_runtime::Session::load(a) {
        Err(sinter_runtime::RuntimeError::Shader { kernel, .. }) => assert_eq!(kernel, name),
        Err(other) => panic!("expected a shader error, got {other}"),
        Ok(_) => panic!("a broken kernel loaded"),
    }
}
