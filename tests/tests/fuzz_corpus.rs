//! Replays the fuzzing corpus through every fuzz target (`tests/fuzz_targets.rs`): the committed
//! seeds, every input a fuzzing run saved as a regression, and a fixed-seed burst of mutations
//! of them, so that `cargo test` catches a parser that starts panicking without a fuzzing run.
//! Longer runs: `cargo run --release -p sinter-tests --bin fuzz -- TARGET --seconds N`.

use std::path::Path;

use sinter_tests::fuzz_targets::{Rng, TARGETS, corpus, mutate};

/// Mutated inputs per target and test run (a few seconds in all).
const MUTATIONS: usize = 300;

#[test]
fn every_target_survives_its_corpus_and_a_burst_of_mutations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for t in TARGETS {
        let seeds = corpus(&root.join("corpus").join(t.name));
        assert!(!seeds.is_empty(), "no seed corpus for `{}`", t.name);
        let regressions = corpus(&root.join("regressions").join(t.name));
        for (name, bytes) in seeds.iter().chain(&regressions) {
            let run = std::panic::catch_unwind(|| (t.run)(bytes));
            assert!(run.is_ok(), "`{}` panics on {name}", t.name);
        }
        let mut rng = Rng::new(0x5eed ^ t.name.len() as u64);
        for _ in 0..MUTATIONS {
            let a = &seeds[rng.index(seeds.len())].1;
            let b = &seeds[rng.index(seeds.len())].1;
            let input = mutate(a, b, t.text, &mut rng);
            let run = std::panic::catch_unwind(|| (t.run)(&input));
            assert!(
                run.is_ok(),
                "`{}` panics on a mutated input: {:?}",
                t.name,
                String::from_utf8_lossy(&input)
            );
        }
    }
}
