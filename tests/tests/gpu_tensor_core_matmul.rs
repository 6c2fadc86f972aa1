//! The matmul on tensor cores (`matmul::Form::TensorCores`: products of two f16 operands as
//! cooperative matrices, accumulated in f32) against the interpreter's f16 model.
//!
//! Everywhere, in the kernel's emulated form (`Features::cooperative_emulated`: the same
//! kernel with its cooperative operations written in plain WGSL), so that staging, indices,
//! edges, batches, transposed operands, split-K and epilogues are checked on CI's software
//! Vulkan; and the hardware form of every case compiles and passes naga's validation. Where
//! the adapter has cooperative matrices, an ignored test (`--include-ignored`; the H200 run
//! sets `SINTER_REQUIRE_TENSOR_CORES=1`, which makes skipping it fail) runs the hardware form.

use sinter_compiler::matmul::{Forced, Form, Tile, tc_workgroup_bytes};
use sinter_compiler::{Options, Target};
use sinter_ir::interp::Tensor;
use sinter_ir::{DType, TensorType};
use sinter_tests::check_graph_gpu;

/// Tensor-core block shapes: those the h200 preset lists, and three of them with two stages
/// (the next step's slabs stored to the other buffer while the current ones are read).
const TILES: [Tile; 8] = [
    Tile::TC_HUGE,
    Tile::TC_LARGE,
    Tile::TC_WIDE,
    Tile::TC_MEDIUM,
    Tile::TC_SMALL,
    Tile {
        stages: 2,
        ..Tile::TC_LARGE
    },
    Tile {
        stages: 2,
        ..Tile::TC_WIDE
    },
    Tile {
        stages: 2,
        ..Tile::TC_MEDIUM
    },
];

/// The block shapes of [`TILES`] whose workgroup memory `target` offers (CI's software Vulkan
/// offers 32 KiB; the larger blocks run in the hardware test).
fn offered(target: &Target) -> Vec<Tile> {
    let limit = u64::from(target.limits.workgroup_bytes);
    TILES
        .into_iter()
        .filter(|&t| tc_workgroup_bytes(t) <= limit)
        .collect()
}

/// Products of f16 operands: ragged edges (no extent a multiple of 16), several blocks and K
/// steps with a partial last one, operands read along k or across it (transposed views,
/// where staging walks m or n), quads and scalars, batches with broadcasting, epilogues, f16
/// and f32 results.
fn cases() -> Vec<(&'static str, String)> {
    let graph = |inputs: &str, body: &str, out: &str| {
        format!("graph t {{\n{inputs}\n{body}\n  output {out}\n}}\n")
    };
    vec![
        (
            "plain, ragged",
            graph(
                "  input a: f16[70, 40]\n  input b: f16[40, 50]",
                "  c = matmul(a, b)",
                "c",
            ),
        ),
        (
            "blocks and steps, quads along k and n",
            graph(
                "  input a: f16[150, 104]\n  input b: f16[104, 136]",
                "  c = matmul(a, b)",
                "c",
            ),
        ),
        (
            "transposed a (staging walks m), transposed b (staging walks k)",
            graph(
                "  input a: f16[72, 130]\n  input b: f16[52, 72]",
                "  c = matmul(transpose(a, dim0=0, dim1=1), transpose(b, dim0=0, dim1=1))",
                "c",
            ),
        ),
        (
            "bias, gelu and an f32 result",
            graph(
                "  input a: f16[66, 48]\n  input b: f16[48, 80]\n  input bias: f16[80]",
                "  c = cast(gelu(add(matmul(a, b), bias)), dtype=\"f32\")",
                "c",
            ),
        ),
        (
            "batched, b broadcast",
            graph(
                "  input a: f16[3, 33, 48]\n  input b: f16[48, 20]",
                "  c = matmul(a, b)",
                "c",
            ),
        ),
        (
            "a long K (128 steps of 32), sums of 4096 products",
            graph(
                "  input a: f16[40, 4096]\n  input b: f16[4096, 24]",
                "  c = cast(matmul(a, b), dtype=\"f32\")",
                "c",
            ),
        ),
        (
            "batched both, broadcast batch axis",
            graph(
                "  input a: f16[2, 3, 17, 32]\n  input b: f16[2, 1, 32, 24]",
                "  c = matmul(a, b)",
                "c",
            ),
        ),
    ]
}

/// A target whose f16 products take the tensor-core kernel, emulated or not.
fn tensor_core_target(emulated: bool) -> Target {
    let mut target = Target::portable();
    target.features.cooperative_matrix = true;
    target.features.cooperative_emulated = emulated;
    target
}

fn parse(src: &str) -> sinter_ir::Graph {
    sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)))
}

/// Options for `target`, the products forced to `tile` (or chosen) and split `splits` ways.
fn options(target: Target, tile: Option<Tile>, splits: Option<usize>) -> Options {
    Options {
        target,
        matmul: Forced { tile, splits },
        ..Options::default()
    }
}

/// The f16 products of a program compile to the tensor-core kernel on a target with
/// cooperative matrices, and to the FMA kernel without them or with f32 operands.
#[test]
fn f16_products_take_tensor_cores_where_the_target_has_them() {
    let kernels = |src: &str, target: Target| {
        let artifact = sinter_compiler::compile(&parse(src), &options(target, None, None))
            .unwrap_or_else(|e| panic!("compile: {e}"))
            .artifact;
        let wgsl: Vec<String> = artifact.kernels.iter().map(|k| k.wgsl.clone()).collect();
        (wgsl, artifact.requirements.features)
    };
    let (f16, f32) = (&cases()[0].1, &cases()[0].1.replace("f16", "f32"));
    let (wgsl, features) = kernels(f16, tensor_core_target(false));
    assert!(
        wgsl.iter().any(|w| w.contains("coopMultiplyAdd")),
        "{wgsl:?}"
    );
    assert!(
        features
            .iter()
            .any(|f| f == "EXPERIMENTAL_COOPERATIVE_MATRIX")
    );
    let (wgsl, features) = kernels(f16, tensor_core_target(true));
    assert!(wgsl.iter().any(|w| w.contains("multiply_add(")), "{wgsl:?}");
    assert!(!wgsl.iter().any(|w| w.contains("coop")), "{wgsl:?}");
    assert!(!features.iter().any(|f| f.contains("COOPERATIVE")));
    let (wgsl, _) = kernels(f16, Target::portable());
    assert!(!wgsl.iter().any(|w| w.contains("multiply_add")), "{wgsl:?}");
    let (wgsl, _) = kernels(f32, tensor_core_target(false));
    assert!(!wgsl.iter().any(|w| w.contains("coop")), "{wgsl:?}");
    // a decode step's few rows keep the FMA kernel
    let (wgsl, _) = kernels(
        "graph t {\n  input a: f16[4, 64]\n  input b: f16[64, 32]\n  c = matmul(a, b)\n  output c\n}\n",
        tensor_core_target(false),
    );
    assert!(!wgsl.iter().any(|w| w.contains("coop")), "{wgsl:?}");
    // the error of compiling the f16 product with `tile` forced on the 32 KiB target
    let refused = |tile: Tile, why: &str| {
        sinter_compiler::compile(
            &parse(f16),
            &options(tensor_core_target(false), Some(tile), None),
        )
        .expect_err(why)
        .to_string()
    };
    // a tile forced through the API is checked like one parsed
    let bad = Tile {
        tm: 64,
        tn: 128,
        ..Tile::TC_LARGE
    };
    let e = refused(bad, "an invalid tile");
    assert!(e.contains("does not give 8 subgroups"), "{e}");
    assert_eq!(Tile::parse("tc:64x64x32x16x32"), Ok(Tile::TC_MEDIUM));
    assert_eq!(Tile::TC_MEDIUM.to_string(), "tc:64x64x32x16x32");
    assert_eq!(Tile::TC_MEDIUM.form, Form::TensorCores);
    assert!(
        Tile::parse("tc:64x64x32x8x8").is_err(),
        "sub-blocks of whole tiles"
    );
    let staged = Tile::parse("tc:64x64x32x16x32x2").expect("two stages");
    assert_eq!(staged.stages, 2);
    assert_eq!(staged.to_string(), "tc:64x64x32x16x32x2");
    for bad in ["tc:64x64x32x16x32x3", "128x128x8x8x8x2"] {
        let e = Tile::parse(bad).expect_err(bad);
        assert!(e.contains(bad), "{e}");
    }
    // a forced block shape whose workgroup memory the target lacks is a compile-time error
    let large = Tile {
        stages: 2,
        ..Tile::TC_LARGE
    };
    let e = refused(large, "46 KiB of workgroup memory on a 32 KiB target");
    assert!(
        e.contains("bytes of workgroup memory, past the target's 32768"),
        "{e}"
    );
    // two stages of the 128 x 256 block's slabs pass the workgroup memory
    assert!(
        Tile::check(Tile {
            stages: 2,
            ..Tile::TC_HUGE
        })
        .is_err()
    );
}

/// Every case with every block shape and with split-K, in the hardware form: compiles and
/// passes naga's validation (with cooperative matrices) on any machine.
#[test]
fn tensor_core_matmuls_validate() {
    let mut target = tensor_core_target(false);
    target.limits.workgroup_bytes = Target::h200().limits.workgroup_bytes;
    for (what, src) in cases() {
        for tile in TILES.map(Some).into_iter().chain([None]) {
            for splits in [None, Some(2)] {
                sinter_compiler::compile(&parse(&src), &options(target.clone(), tile, splits))
                    .unwrap_or_else(|e| panic!("{what}, {tile:?}, {splits:?}: {e}"));
            }
        }
    }
}

/// Every case with every block shape, and with the chosen one split two ways along K, in the
/// emulated form on the GPU against the interpreter: the products within an f16 rounding of
/// the result (the order of the f32 sums differs from the interpreter's).
#[test]
fn emulated_tensor_core_matmuls_match_the_interpreter() {
    let tiles = offered(&tensor_core_target(true));
    assert!(
        tiles.iter().any(|t| t.stages == 2),
        "two stages run emulated"
    );
    let variants = (tiles.into_iter().map(|t| (Some(t), None))).chain([(None, Some(2))]);
    let variants: Vec<_> = variants.collect();
    for (what, src) in cases() {
        let g = parse(&src);
        for &(tile, splits) in &variants {
            let errors = check_graph_gpu(
                &g,
                2e-3,
                &[],
                5,
                &options(tensor_core_target(true), tile, splits),
            );
            assert!(
                !errors.is_empty(),
                "{what}, {tile:?}, {splits:?}: no outputs compared"
            );
        }
    }
}

/// NaN and ±inf in the operands reach exactly the outputs IEEE arithmetic says (a NaN row of
/// `a` makes its row NaN, an infinity its row ±inf or NaN where signs meet), as the
/// interpreter computes them, through the emulated kernel's zero-filled edges.
#[test]
fn emulated_tensor_core_matmuls_propagate_special_values() {
    let src = "graph t {\n  input a: f16[20, 24]\n  input b: f16[24, 18]\n  c = matmul(a, b)\n  output c\n}\n";
    let mut a: Vec<f64> = (0..20 * 24)
        .map(|i| ((i * 37 % 23) as f64 - 11.0) / 8.0 + 0.0625)
        .collect();
    a[3 * 24 + 5] = f64::NAN;
    a[7 * 24] = f64::INFINITY;
    a[11 * 24 + 23] = f64::NEG_INFINITY;
    let b: Vec<f64> = (0..24 * 18)
        .map(|i| 0.5 + (i * 13 % 7) as f64 / 16.0)
        .collect();
    let f16 = |shape: Vec<usize>, data| Tensor::new(TensorType::new(DType::F16, shape), data);
    let overrides = [("a", f16(vec![20, 24], a)), ("b", f16(vec![24, 18], b))];
    check_graph_gpu(
        &parse(src),
        2e-3,
        &overrides,
        5,
        &options(tensor_core_target(true), Some(Tile::TC_SMALL), None),
    );
}

/// The hardware form on an adapter with cooperative matrices, against the interpreter.
#[test]
#[ignore = "needs cooperative matrices: --include-ignored runs it (SINTER_REQUIRE_TENSOR_CORES=1 makes skipping it fail)"]
fn tensor_core_matmuls_match_the_interpreter() {
    for (what, src) in cases() {
        let g = parse(&src);
        for tile in TILES.map(Some).into_iter().chain([None]) {
            let errors = check_graph_gpu(&g, 2e-3, &[], 5, &options(Target::h200(), tile, None));
            assert!(!errors.is_empty(), "{what}: no outputs compared");
        }
    }
}
