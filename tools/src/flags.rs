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
