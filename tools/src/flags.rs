//! Command-line flags that `sinter` and `sinter-bench` share.

/// `--attention` (see [`sinter_compiler::optimize::AttentionPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Attention {
    Auto,
    Flash,
    Unfused,
}

/// `--flash-backward`: an attention's flash backward as one kernel (`whole`: dQ through partial
/// sums per group of key blocks, where that pays) or as the dQ and dK/dV kernels (`split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FlashBackward {
    #[default]
    Whole,
    Split,
}

impl FlashBackward {
    /// [`sinter_compiler::Options::merge_flash_backward`].
    pub fn merge(self) -> bool {
        self == FlashBackward::Whole
    }
}

impl From<Attention> for sinter_compiler::optimize::AttentionPolicy {
    fn from(a: Attention) -> Self {
        use sinter_compiler::optimize::AttentionPolicy as P;
        match a {
            Attention::Auto => P::Auto,
            Attention::Flash => P::Flash,
            Attention::Unfused => P::Unfused,
        }
    }
}

/// What `sinter compile --generate` and `sinter generate` derive (see
/// [`sinter_ir::decode::DecodeSpec`]).
#[derive(Clone, Debug, clap::Args)]
pub struct GenerationFlags {
    /// The program's token ids, an input i32[batch, positions].
    #[arg(long, default_value = "ids", value_name = "NAME")]
    pub ids: String,
    /// The program's next-token logits ([batch, positions, vocabulary], or [batch * positions,
    /// vocabulary]); in a training program, the value before the loss.
    #[arg(long, default_value = "logits", value_name = "NAME")]
    pub logits: String,
    /// Sequences generated at once (each from the prompt).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Tokens the prefill program takes at once (default: the program's context length); a
    /// shorter prompt is padded, a longer one continued one token at a time.
    #[arg(long, value_name = "N")]
    pub prefill: Option<usize>,
}

impl GenerationFlags {
    pub fn spec(&self) -> sinter_ir::decode::DecodeSpec {
        sinter_ir::decode::DecodeSpec {
            ids: self.ids.clone(),
            logits: self.logits.clone(),
            batch: Some(self.batch as usize),
            prefill: self.prefill,
        }
    }
}
