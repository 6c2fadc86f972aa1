//! Generation artifacts: a one-token step program with the prefill program beside it, both
//! derived from a language model's forward program by the compiler (`sinter_ir::decode`).
//!
//! The file is the step program's artifact; [`crate::artifact::Artifact::generation`] carries
//! the prefill program and what the runtime's generation loop needs to know. The two programs
//! have the same params and states (the model's weights and the key/value caches) at the same
//! places, so a runtime runs them over one set of arenas: the prefill writes the caches that
//! the step reads and extends.

use crate::artifact::{Artifact, ArtifactError, Role};

/// What a generation loop needs to know about a pair of derived programs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GenerationInfo {
    /// The token ids: an `i32` input of both programs, `[batch, prefill]` in the prefill and
    /// `[batch, 1]` in the step.
    pub ids: String,
    /// The next-token scores: an `f32` output `[batch, vocab]` of both programs.
    pub logits: String,
    /// The step's `i32[]` input: the position of the token it is fed (below `context`).
    pub position: String,
    /// The prefill's `i32[]` input: the position whose logits it returns (below `prefill`).
    pub last: String,
    /// Positions the caches hold: the forward program's context length.
    pub context: u64,
    /// Sequences generated together.
    pub batch: u64,
    /// Tokens the prefill takes at once (a shorter prompt is padded; a longer one is continued
    /// by steps).
    pub prefill: u64,
    pub vocab: u64,
    /// The states that hold the keys and values of the tokens so far.
    pub caches: Vec<String>,
}

/// The prefill program beside a step artifact.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Generation {
    pub info: GenerationInfo,
    /// The prefill program. Its params and states are the step's, at the same places; the
    /// step's slots carry their initial values, so these carry none.
    pub prefill: Artifact,
}

impl Generation {
    /// The prefill against the step artifact `step`: the same params and states at the same
    /// places, none initialized here, the arenas the step's; the I/O the info names.
    pub fn check(&self, step: &Artifact) -> Result<(), ArtifactError> {
        let bad = |m: String| Err(ArtifactError::Inconsistent(m));
        let p = &self.prefill;
        if p.generation.is_some() {
            return bad("the prefill program has a prefill program itself".into());
        }
        p.check()?;
        let persistent = |a: &Artifact| {
            let mut slots: Vec<_> = a
                .tensors
                .iter()
                .filter(|t| matches!(t.role, Role::Param | Role::State))
                .map(|t| (t.name.clone(), t.role, t.ty.clone(), t.arena, t.offset))
                .collect();
            slots.sort_by(|x, y| x.0.cmp(&y.0));
            slots
        };
        if persistent(p) != persistent(step) {
            return bad(
                "the prefill and step programs do not hold the same params and states at the \
                 same places"
                    .into(),
            );
        }
        if let Some(t) = p
            .tensors
            .iter()
            .find(|t| t.init.is_some() || t.fill.is_some())
        {
            return bad(format!(
                "the prefill program initializes `{}`, which the step program's slot does",
                t.name
            ));
        }
        let has = |a: &Artifact, name: &str, role: Role| {
            a.tensors.iter().any(|t| t.name == name && t.role == role)
        };
        let i = &self.info;
        let needed = [
            (p, &i.ids, Role::Input, "prefill"),
            (p, &i.last, Role::Input, "prefill"),
            (p, &i.logits, Role::Output, "prefill"),
            (step, &i.ids, Role::Input, "step"),
            (step, &i.position, Role::Input, "step"),
            (step, &i.logits, Role::Output, "step"),
        ];
        for (a, name, role, which) in needed {
            if !has(a, name, role) {
                return bad(format!(
                    "the {which} program has no {role:?} `{name}`",
                    role = role
                ));
            }
        }
        for c in &i.caches {
            if !has(step, c, Role::State) {
                return bad(format!("the step program has no cache state `{c}`"));
            }
        }
        if i.context == 0 || i.batch == 0 || i.vocab == 0 || i.prefill == 0 || i.prefill > i.context
        {
            return bad(format!(
                "generation sizes out of range: context {}, batch {}, prefill {}, vocabulary {}",
                i.context, i.batch, i.prefill, i.vocab
            ));
        }
        Ok(())
    }
}
