//! Generating tokens with a generation artifact (`sinter compile --generate`): its prefill and
//! step programs loaded over one set of arenas ([`Session::load_sharing_async`]), the model's
//! weights and the key/value caches on the GPU, one submission per token.
//!
//! [`Generator::start_async`] feeds the prompts: the prefill program takes up to its length of
//! tokens at once (a shorter prompt is padded; the padding's cache entries are overwritten
//! before any query can see them) and the step program the rest, one token each.
//! [`Generator::push_async`] feeds one more token per sequence. Each returns the logits of the
//! next token, `[batch][vocab]`, read back to the host, where [`crate::sample`] chooses from
//! them. [`Generator::generate_async`] is that loop, streaming every chosen token to a callback.
//!
//! **The window slides past the context.** The caches hold `context` positions (the forward
//! program's context length). When a token would go past them, the generator keeps the last
//! `keep` tokens (half the context by default, [`Generator::set_keep`]) and runs them through
//! the programs again from position 0 (a prefill, then steps), as if the text had started
//! there; every token is predicted from at least `keep` and at most `context` tokens. With
//! `keep` equal to the context every token past it re-reads the whole window: the next-token
//! distribution of the forward program over the last `context` tokens, at the cost of a
//! prefill per token.

use sinter_artifact::artifact::{Artifact, Role};
use sinter_artifact::generation::{Generation, GenerationInfo};
use sinter_artifact::{DType, TensorType};

use crate::device::AdapterChoice;
use crate::error::RuntimeError;
use crate::io::{HostTensor, TensorData};
use crate::sample::{Sampler, Sampling};
use crate::session::Session;

/// A generated token: sequence `sequence`'s token number `index` (from 0) after its prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Token {
    pub sequence: usize,
    pub index: usize,
    pub id: i32,
}

/// A generation artifact's programs loaded on a device.
#[derive(Debug)]
pub struct Generator {
    step: Session,
    prefill: Session,
    info: GenerationInfo,
    /// Every token fed so far, per sequence.
    tokens: Vec<Vec<i32>>,
    /// The caches hold `tokens[..][start..start + cached]` at positions `0..cached`.
    start: usize,
    cached: usize,
    /// Tokens kept when the window slides.
    keep: usize,
}

impl Generator {
    /// Loads a generation artifact (the step program with its prefill) on the adapter `choice`
    /// names.
    pub async fn load_async(
        mut artifact: Artifact,
        choice: &AdapterChoice,
    ) -> Result<Generator, RuntimeError> {
        artifact.check()?;
        let Some(generation) = artifact.generation.take() else {
            return Err(RuntimeError::NotGeneration {
                graph: artifact.graph,
            });
        };
        let Generation { info, prefill } = *generation;
        let [step, prefill]: [Session; 2] =
            Session::load_sharing_async(vec![artifact, prefill], choice)
                .await?
                .try_into()
                .expect("two artifacts, two sessions");
        let (b, v) = (info.batch as usize, info.vocab as usize);
        let expect = |s: &Session, name: &str, role: Role, ty: TensorType| {
            let found = s
                .artifact()
                .tensors
                .iter()
                .any(|t| t.name == name && t.role == role && t.ty == ty);
            if found {
                Ok(())
            } else {
                Err(RuntimeError::Artifact(
                    sinter_artifact::artifact::ArtifactError::Inconsistent(format!(
                        "the {} program lacks {role:?} `{name}` of type {ty}",
                        s.artifact().graph
                    )),
                ))
            }
        };
        let p = info.prefill as usize;
        expect(
            &prefill,
            &info.ids,
            Role::Input,
            TensorType::i32(vec![b, p]),
        )?;
        expect(&step, &info.ids, Role::Input, TensorType::i32(vec![b, 1]))?;
        let scalar = TensorType::scalar(DType::I32);
        expect(&prefill, &info.last, Role::Input, scalar.clone())?;
        expect(&step, &info.position, Role::Input, scalar)?;
        for s in [&prefill, &step] {
            expect(s, &info.logits, Role::Output, TensorType::f32(vec![b, v]))?;
        }
        let keep = (info.context as usize / 2).max(1);
        Ok(Generator {
            step,
            prefill,
            info,
            tokens: Vec::new(),
            start: 0,
            cached: 0,
            keep,
        })
    }

    pub fn info(&self) -> &GenerationInfo {
        &self.info
    }

    /// The step program's session (its params are the model's weights).
    pub fn session(&self) -> &Session {
        &self.step
    }

    /// The prefill and the step program's sessions (to profile their kernels; running them
    /// directly leaves the generator's record of what the caches hold behind).
    pub fn sessions_mut(&mut self) -> (&mut Session, &mut Session) {
        (&mut self.prefill, &mut self.step)
    }

    /// Overwrites weights by name (see [`Session::load_weights`]).
    pub fn load_weights(&mut self, weights: &[(String, HostTensor)]) -> Result<(), RuntimeError> {
        self.step.load_weights(weights)?;
        // the prefill reads the same arenas
        self.prefill
            .note_loaded(weights.iter().map(|(n, _)| n.as_str()));
        Ok(())
    }

    /// Every token fed so far, per sequence.
    pub fn tokens(&self) -> &[Vec<i32>] {
        &self.tokens
    }

    /// How many tokens the window keeps when it slides past the context (1 to the context).
    pub fn set_keep(&mut self, keep: usize) -> Result<(), RuntimeError> {
        let context = self.info.context as usize;
        if !(1..=context).contains(&keep) {
            return Err(RuntimeError::Prompt(format!(
                "the window keeps from 1 to {context} tokens (the context) when it slides, not \
                 {keep}"
            )));
        }
        self.keep = keep;
        Ok(())
    }

    /// The vocabulary's size: token ids lie in `0..vocab`.
    fn vocab(&self) -> usize {
        let slot = (self.step.inputs()).find(|t| t.name == self.info.ids);
        let bound = slot.and_then(|t| t.index_bound).unwrap_or(self.info.vocab);
        bound.min(self.info.vocab) as usize
    }

    fn check_tokens(&self, tokens: &[i32], what: &str) -> Result<(), RuntimeError> {
        let vocab = self.vocab();
        match tokens.iter().find(|&&t| t < 0 || t as usize >= vocab) {
            Some(t) => Err(RuntimeError::Prompt(format!(
                "{what} holds the token {t}, outside the vocabulary 0..{vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// Starts over: feeds `prompts` (one per sequence, all of one length, at least 1) and
    /// returns the logits of each sequence's next token. A prompt longer than the context keeps
    /// its last `context` tokens in the window.
    pub async fn start_async(
        &mut self,
        prompts: &[Vec<i32>],
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let b = self.info.batch as usize;
        if prompts.len() != b {
            return Err(RuntimeError::Prompt(format!(
                "this generator runs {b} sequence(s) at once; got {} prompt(s)",
                prompts.len()
            )));
        }
        let len = prompts[0].len();
        if len == 0 || prompts.iter().any(|p| p.len() != len) {
            return Err(RuntimeError::Prompt(
                "the prompts must be of one length, at least one token".into(),
            ));
        }
        for p in prompts {
            self.check_tokens(p, "the prompt")?;
        }
        self.tokens = prompts.to_vec();
        let start = len.saturating_sub(self.info.context as usize);
        self.refill(start).await
    }

    /// Feeds one more token per sequence and returns the logits of the next ones.
    pub async fn push_async(&mut self, next: &[i32]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let b = self.info.batch as usize;
        if self.tokens.is_empty() {
            return Err(RuntimeError::Prompt(
                "no prompt yet: start the generator first".into(),
            ));
        }
        if next.len() != b {
            return Err(RuntimeError::Prompt(format!(
                "one token per sequence ({b}) at a time; got {}",
                next.len()
            )));
        }
        self.check_tokens(next, "the next token")?;
        for (seq, &t) in self.tokens.iter_mut().zip(next) {
            seq.push(t);
        }
        if self.cached < self.info.context as usize {
            let logits = self.step_at(self.cached, next).await?;
            self.cached += 1;
            Ok(logits)
        } else {
            let start = self.tokens[0].len() - self.keep;
            self.refill(start).await
        }
    }

    /// Runs `tokens[..][start..]` (at most the context) from position 0: the prefill takes what
    /// it can, the step the rest.
    async fn refill(&mut self, start: usize) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let (b, p) = (self.info.batch as usize, self.info.prefill as usize);
        let n = self.tokens[0].len() - start;
        let first = n.min(p);
        let mut ids = vec![0i32; b * p];
        for (r, seq) in self.tokens.iter().enumerate() {
            ids[r * p..r * p + first].copy_from_slice(&seq[start..start + first]);
        }
        let ids = HostTensor::i32(vec![b, p], ids);
        let last = HostTensor::i32(vec![], vec![first as i32 - 1]);
        let inputs = [
            (self.info.ids.as_str(), &ids),
            (self.info.last.as_str(), &last),
        ];
        let out = (self.prefill)
            .run_reading_async(&inputs, &[&self.info.logits])
            .await?;
        let mut logits = self.rows(out.get(&self.info.logits));
        self.start = start;
        self.cached = first;
        for i in first..n {
            let column: Vec<i32> = self.tokens.iter().map(|s| s[start + i]).collect();
            logits = self.step_at(self.cached, &column).await?;
            self.cached += 1;
        }
        Ok(logits)
    }

    /// The step program on one token per sequence at position `pos`.
    async fn step_at(&mut self, pos: usize, tokens: &[i32]) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let ids = HostTensor::i32(vec![tokens.len(), 1], tokens.to_vec());
        let pos = HostTensor::i32(vec![], vec![pos as i32]);
        let inputs = [
            (self.info.ids.as_str(), &ids),
            (self.info.position.as_str(), &pos),
        ];
        let out = (self.step)
            .run_reading_async(&inputs, &[&self.info.logits])
            .await?;
        Ok(self.rows(out.get(&self.info.logits)))
    }

    /// The logits output as one row per sequence.
    fn rows(&self, logits: Option<&HostTensor>) -> Vec<Vec<f32>> {
        let v = self.info.vocab as usize;
        match logits.map(|t| &t.data) {
            Some(TensorData::F32(data)) => data.chunks(v).map(<[f32]>::to_vec).collect(),
            _ => unreachable!("checked at load: the logits are an f32 output"),
        }
    }

    /// Generates up to `max_new` tokens after `prompts` (see [`Generator::start_async`]),
    /// choosing each as `sampling` says and calling `on_token` with every token as soon as it is
    /// chosen (sequence by sequence); stops early when `on_token` returns `false`. Returns the
    /// generated tokens per sequence. The last chosen tokens are not fed to the model (nothing
    /// would read their logits); [`Generator::tokens`] holds what was.
    pub async fn generate_async(
        &mut self,
        prompts: &[Vec<i32>],
        max_new: usize,
        sampling: &Sampling,
        mut on_token: impl FnMut(&Token) -> bool,
    ) -> Result<Vec<Vec<i32>>, RuntimeError> {
        let mut sampler = Sampler::new(*sampling)?;
        let mut out = vec![Vec::with_capacity(max_new); self.info.batch as usize];
        if max_new == 0 {
            return Ok(out);
        }
        let mut logits = self.start_async(prompts).await?;
        for index in 0..max_new {
            let mut next = Vec::with_capacity(logits.len());
            let mut go = true;
            for (sequence, row) in logits.iter().enumerate() {
                let id = sampler.choose(row)? as i32;
                next.push(id);
                out[sequence].push(id);
                go &= on_token(&Token {
                    sequence,
                    index,
                    id,
                });
            }
            if !go || index + 1 == max_new {
                break;
            }
            logits = self.push_async(&next).await?;
        }
        Ok(out)
    }
}
