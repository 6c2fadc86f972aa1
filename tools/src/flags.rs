//! Command-line flags that `sinter` and `sinter-bench` share.

/// `--attention` (see [`sinter_compiler::optimize::AttentionPolicy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Attention {
    Auto,
    Flash,
    Unfused,
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
