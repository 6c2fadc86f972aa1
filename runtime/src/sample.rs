//! Choosing the next token from its logits on the host: greedy (temperature 0), or a draw from
//! the softmax of the logits over the temperature, limited to the `top_k` most likely tokens
//! and to the smallest set of most likely tokens whose probabilities reach `top_p` (nucleus
//! sampling). Draws come from SplitMix64 (the initializers' generator) seeded by the caller,
//! one per token, so a seed gives the same text every time.

use sinter_artifact::init::SplitMix64;

use crate::error::RuntimeError;

/// How to choose tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 takes the most likely token (the first of equals); above 0 divides the logits before
    /// the softmax (below 1 sharper, above 1 flatter).
    pub temperature: f64,
    /// Draw among the `k` most likely tokens only.
    pub top_k: Option<usize>,
    /// Draw among the most likely tokens whose probabilities first reach `p` together
    /// (`0 < p ≤ 1`).
    pub top_p: Option<f64>,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            ..Sampling::default()
        }
    }

    /// Why the settings are out of range, if they are.
    pub fn check(&self) -> Result<(), RuntimeError> {
        let bad = |m: String| Err(RuntimeError::Sampling(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!(
                "the temperature must be finite and at least 0 (0: greedy), got {}",
                self.temperature
            ));
        }
        if self.top_k == Some(0) {
            return bad("top-k must be at least 1".into());
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad(format!("top-p must be above 0 and at most 1, got {p}"));
        }
        Ok(())
    }
}

/// A seeded stream of token choices.
#[derive(Clone, Debug)]
pub struct Sampler {
    settings: Sampling,
    rng: SplitMix64,
}

impl Sampler {
    pub fn new(settings: Sampling) -> Result<Sampler, RuntimeError> {
        settings.check()?;
        Ok(Sampler {
            settings,
            rng: SplitMix64::new(settings.seed),
        })
    }

    pub fn settings(&self) -> &Sampling {
        &self.settings
    }

    /// The next token given its logits (one draw from the stream unless greedy). NaN logits
    /// are an error; `-inf` ones are never chosen unless all are.
    pub fn choose(&mut self, logits: &[f32]) -> Result<usize, RuntimeError> {
        if logits.is_empty() {
            return Err(RuntimeError::Sampling("no logits to sample from".into()));
        }
        if let Some(i) = logits.iter().position(|x| x.is_nan()) {
            return Err(RuntimeError::Sampling(format!(
                "the logits are NaN (token {i} first): the model's weights or inputs give no \
                 distribution"
            )));
        }
        if self.settings.temperature == 0.0 {
            return Ok(argmax(logits));
        }
        let probs = self.distribution(logits);
        let u = self.rng.next_unit();
        let mut acc = 0.0;
        for &(i, p) in &probs {
            acc += p;
            if u < acc {
                return Ok(i);
            }
        }
        Ok(probs.last().map_or_else(|| argmax(logits), |&(i, _)| i))
    }

    /// The tokens the settings allow with their probabilities (summing to 1), most likely
    /// first (ties by index).
    pub fn distribution(&self, logits: &[f32]) -> Vec<(usize, f64)> {
        let t = self.settings.temperature;
        let scaled: Vec<f64> = logits.iter().map(|&x| f64::from(x) / t).collect();
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let by_score = |a: &usize, b: &usize| scaled[*b].total_cmp(&scaled[*a]).then(a.cmp(b));
        if let Some(k) = self.settings.top_k.filter(|&k| k < order.len()) {
            order.select_nth_unstable_by(k - 1, by_score);
            order.truncate(k);
        }
        order.sort_by(by_score);
        let top = scaled[order[0]];
        if top.is_infinite() {
            // every allowed token is impossible, or one is certain: the first of them
            return vec![(order[0], 1.0)];
        }
        let weights: Vec<f64> = order.iter().map(|&i| (scaled[i] - top).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut probs: Vec<(usize, f64)> = order
            .into_iter()
            .zip(weights)
            .map(|(i, w)| (i, w / total))
            .collect();
        if let Some(p) = self.settings.top_p {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&(_, q)| {
                    acc += q;
                    acc >= p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let kept: f64 = probs.iter().map(|&(_, q)| q).sum();
            for (_, q) in &mut probs {
                *q /= kept;
            }
        }
        probs
    }
}

/// The index of the first largest value.
fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f64, top_k: Option<usize>, top_p: Option<f64>, seed: u64) -> Sampler {
        Sampler::new(Sampling {
            temperature,
            top_k,
            top_p,
            seed,
        })
        .expect("valid settings")
    }

    /// Counts of `n` draws from `logits`.
    fn counts(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[s.choose(logits).unwrap()] += 1;
        }
        c
    }

    /// Each count lies within 6 standard deviations of `n·p` (binomial): a sound sampler
    /// fails this with probability below 1e-8 per token, whatever the seed.
    fn near(counts: &[usize], probs: &[f64], n: usize) {
        for (i, (&c, &p)) in counts.iter().zip(probs).enumerate() {
            let mean = n as f64 * p;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (c as f64 - mean).abs() <= 6.0 * sd + 1e-9,
                "token {i}: {c} draws, expected {mean:.1} ± {sd:.1}"
            );
        }
    }

    fn softmax(xs: &[f64]) -> Vec<f64> {
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = xs.iter().map(|x| (x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    }

    const LOGITS: [f32; 6] = [1.0, 2.5, -0.5, 2.5, 0.0, -3.0];

    #[test]
    fn greedy_takes_the_first_largest() {
        assert_eq!(sampler(0.0, None, None, 1).choose(&LOGITS).unwrap(), 1);
    }

    #[test]
    fn draws_follow_the_softmax_at_the_temperature() {
        let n = 20_000;
        for (t, seed) in [(1.0, 1), (0.5, 2), (2.0, 3)] {
            let c = counts(&mut sampler(t, None, None, seed), &LOGITS, n);
            let scaled: Vec<f64> = LOGITS.iter().map(|&x| f64::from(x) / t).collect();
            near(&c, &softmax(&scaled), n);
        }
    }

    #[test]
    fn top_k_draws_only_among_the_k_most_likely() {
        let n = 20_000;
        let c = counts(&mut sampler(1.0, Some(3), None, 4), &LOGITS, n);
        // tokens 1 and 3 tie at 2.5, then token 0
        assert_eq!((c[2], c[4], c[5]), (0, 0, 0));
        let p = softmax(&[1.0, 2.5, 2.5]);
        near(&[c[0], c[1], c[3]], &p, n);
    }

    #[test]
    fn top_p_draws_from_the_nucleus() {
        let n = 20_000;
        // probabilities at temperature 1: tokens 1 and 3 hold 0.85 together, token 0 0.09
        let full = softmax(&LOGITS.map(f64::from));
        let c = counts(&mut sampler(1.0, None, Some(0.9), 5), &LOGITS, n);
        assert_eq!((c[2], c[4], c[5]), (0, 0, 0));
        let kept = full[0] + full[1] + full[3];
        near(
            &[c[0], c[1], c[3]],
            &[full[0] / kept, full[1] / kept, full[3] / kept],
            n,
        );
        // a nucleus of one token is greedy
        let c = counts(&mut sampler(1.0, None, Some(0.01), 6), &LOGITS, 100);
        assert_eq!(c[1], 100);
    }

    #[test]
    fn a_seed_repeats_its_draws() {
        let a = counts(&mut sampler(1.0, None, None, 7), &LOGITS, 50);
        let b = counts(&mut sampler(1.0, None, None, 7), &LOGITS, 50);
        assert_eq!(a, b);
        let mut s = sampler(1.0, None, None, 7);
        let mut t = sampler(1.0, None, None, 7);
        for _ in 0..50 {
            assert_eq!(s.choose(&LOGITS).unwrap(), t.choose(&LOGITS).unwrap());
        }
    }

    #[test]
    fn bad_settings_and_nan_logits_are_errors() {
        for bad in [
            Sampling {
                temperature: -1.0,
                ..Sampling::default()
            },
            Sampling {
                top_k: Some(0),
                ..Sampling::default()
            },
            Sampling {
                top_p: Some(0.0),
                ..Sampling::default()
            },
            Sampling {
                top_p: Some(1.5),
                ..Sampling::default()
            },
        ] {
            assert!(Sampler::new(bad).is_err(), "{bad:?}");
        }
        let mut s = sampler(1.0, None, None, 1);
        assert!(s.choose(&[0.0, f32::NAN]).is_err());
        // impossible tokens are never drawn
        let c = counts(&mut s, &[f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY], 100);
        assert_eq!(c, vec![0, 100, 0]);
    }
}
