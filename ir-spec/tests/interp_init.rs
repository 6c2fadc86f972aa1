//! Initializers: the documented SplitMix64 / Box–Muller construction, determinism, statistics.

use sinter_ir::Init;
use sinter_ir::TensorType;
use sinter_ir::init::{SplitMix64, initial_value};

fn check(shape: &[usize], init: Init) -> Vec<f64> {
    let t = initial_value(&TensorType::f32(shape.to_vec()), &init);
    assert_eq!(t.shape(), shape);
    t.data
}

#[test]
fn splitmix64_reference_vector() {
    // SplitMix64 from state 0 (Vigna's reference implementation).
    let mut r = SplitMix64::new(0);
    assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
    assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
}

/// The documented construction, written out independently of the crate.
fn draws(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / 9_007_199_254_740_992.0
        })
        .collect()
}

#[test]
fn follows_the_documented_construction() {
    let u = draws(42, 4);
    let uni = check(
        &[3],
        Init::Uniform {
            lo: -2.0,
            hi: 3.0,
            seed: 42,
        },
    );
    assert_eq!(uni, (0..3).map(|k| -2.0 + 5.0 * u[k]).collect::<Vec<_>>());
    // Three normals: the first pair (cos, sin), then the cos of the second pair.
    let z = |k: usize| {
        let (u1, u2) = (1.0 - u[2 * k], u[2 * k + 1]);
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        (r * th.cos(), r * th.sin())
    };
    let normal = check(
        &[3],
        Init::Normal {
            mean: 1.0,
            std: 0.5,
            seed: 42,
        },
    );
    let want = [1.0 + 0.5 * z(0).0, 1.0 + 0.5 * z(0).1, 1.0 + 0.5 * z(1).0];
    assert_eq!(normal, want);
}

/// `mean + std · z` with `z = r · cos θ` as one value, as IR.md says (not `(std · r) · cos θ`,
/// which rounds differently for a std that is not a power of two), and the runtime's f32 bytes
/// are those values rounded.
#[test]
fn normal_scales_the_whole_sample_and_bytes_round_it() {
    let u = draws(7, 6);
    let z = |k: usize| {
        let (u1, u2) = (1.0 - u[2 * k], u[2 * k + 1]);
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        (r * th.cos(), r * th.sin())
    };
    let init = Init::Normal {
        mean: 0.1,
        std: 0.02,
        seed: 7,
    };
    let got = check(&[5], init.clone());
    let want = [z(0).0, z(0).1, z(1).0, z(1).1, z(2).0].map(|z| 0.1 + 0.02 * z);
    assert_eq!(got, want);
    let ty = TensorType::f32(vec![5]);
    let bytes = sinter_ir::init::initial_bytes(&ty, &init);
    let rounded: Vec<u8> = want
        .iter()
        .flat_map(|&v| (v as f32).to_le_bytes())
        .collect();
    assert_eq!(bytes, rounded);
    let ids = TensorType::new(sinter_ir::DType::I32, vec![3]);
    let full = Init::Full(-2.7);
    let ints: Vec<u8> = [-2i32; 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(sinter_ir::init::initial_bytes(&ids, &full), ints);
}

#[test]
fn deterministic_per_seed() {
    let a = check(
        &[7, 13],
        Init::Normal {
            mean: 0.0,
            std: 1.0,
            seed: 1,
        },
    );
    let b = check(
        &[7, 13],
        Init::Normal {
            mean: 0.0,
            std: 1.0,
            seed: 1,
        },
    );
    let c = check(
        &[7, 13],
        Init::Normal {
            mean: 0.0,
            std: 1.0,
            seed: 2,
        },
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    let u1 = check(
        &[50],
        Init::Uniform {
            lo: 0.0,
            hi: 1.0,
            seed: 5,
        },
    );
    let u2 = check(
        &[50],
        Init::Uniform {
            lo: 0.0,
            hi: 1.0,
            seed: 6,
        },
    );
    assert_ne!(u1, u2);
    // A prefix of a larger tensor is the smaller tensor (elements in C order, one stream).
    let long = check(
        &[2, 50],
        Init::Uniform {
            lo: 0.0,
            hi: 1.0,
            seed: 5,
        },
    );
    assert_eq!(&long[..50], &u1[..]);
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn statistics_of_10k_draws() {
    let v = check(
        &[100, 100],
        Init::Normal {
            mean: 3.0,
            std: 2.0,
            seed: 7,
        },
    );
    let (mean, std) = mean_std(&v);
    assert!((mean - 3.0).abs() < 0.08, "normal mean {mean}"); // 4 standard errors
    assert!((std - 2.0).abs() < 0.06, "normal std {std}");
    let v = check(
        &[10_000],
        Init::Uniform {
            lo: -1.0,
            hi: 4.0,
            seed: 8,
        },
    );
    assert!(v.iter().all(|&x| (-1.0..4.0).contains(&x)));
    let (mean, std) = mean_std(&v);
    assert!((mean - 1.5).abs() < 0.06, "uniform mean {mean}");
    assert!((std - 5.0 / 12f64.sqrt()).abs() < 0.04, "uniform std {std}");
}

#[test]
fn constant_initializers() {
    assert_eq!(check(&[2, 2], Init::Zeros), vec![0.0; 4]);
    assert_eq!(check(&[3], Init::Ones), vec![1.0; 3]);
    assert_eq!(check(&[], Init::Full(-2.5)), vec![-2.5]);
    let ints = initial_value(&TensorType::i32(vec![2]), &Init::Full(-2.7));
    assert_eq!(ints.data, vec![-2.0, -2.0]);
    let ints = initial_value(
        &TensorType::i32(vec![100]),
        &Init::Uniform {
            lo: -5.0,
            hi: 5.0,
            seed: 1,
        },
    );
    assert!(
        ints.data
            .iter()
            .all(|v| v.fract() == 0.0 && (-4.0..=4.0).contains(v))
    );
}

/// Large tensors are generated in chunks from the counter-based stream: the bytes are those of
/// one sequential pass, for an odd count and both random initializers.
#[test]
fn chunked_generation_matches_the_sequential_stream() {
    let n = 300_001;
    let ty = TensorType::f32(vec![n]);
    for init in [
        Init::Normal {
            mean: 0.5,
            std: 0.02,
            seed: 9,
        },
        Init::Uniform {
            lo: -1.0,
            hi: 2.0,
            seed: 9,
        },
    ] {
        let want: Vec<u8> = sinter_ir::init::values(&init, n)
            .flat_map(|v| (v as f32).to_le_bytes())
            .collect();
        assert!(sinter_ir::init::initial_bytes(&ty, &init) == want, "{init}");
    }
}
