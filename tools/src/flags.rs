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
    /// [`sinter_compiler::flash::variant::Choices::merge_backward`].
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

/// `--flash-tile`: the flash kernels' tiling (see [`sinter_compiler::flash::variant::Tiling`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FlashTile {
    A,
    #[default]
    B,
    C,
    D,
}

impl From<FlashTile> for sinter_compiler::flash::variant::Tiling {
    fn from(t: FlashTile) -> Self {
        use sinter_compiler::flash::variant::Tiling;
        match t {
            FlashTile::A => Tiling::A,
            FlashTile::B => Tiling::B,
            FlashTile::C => Tiling::C,
            FlashTile::D => Tiling::D,
        }
    }
}

/// The flags that choose the compile's target (`sinter compile`, `sinter train`, `sinter-bench`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TargetArgs {
    /// The device to compile for: `portable` (any native WebGPU adapter; the default),
    /// `browser` (WebGPU in a browser: no f16, no arena bound twice in a dispatch), `h200`
    /// (measured: cooperative matrices, 2 GiB bindings), or a JSON file such as `sinter-bench
    /// calibrate` writes.
    #[arg(long, value_name = "NAME|FILE.json")]
    pub target: Option<String>,
    /// Largest arena storage binding in bytes (the target's by default); larger plans are split
    /// over several arenas. Match it to the adapter's max_storage_buffer_binding_size.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(4..))]
    pub max_binding_size: Option<u64>,
    /// Kernels that WebGPU in a browser accepts (the `browser` target's features on any
    /// target): no arena bound twice in one dispatch, no f16.
    #[arg(long)]
    pub browser: bool,
    /// Run the flash-attention kernels' products on tensor cores (cooperative matrices of f16
    /// operands, f32 accumulation) where their head dimensions allow: faster, 11-bit operands.
    /// Adds cooperative matrices to the target (as `--target h200` has them), and its 48 KiB of
    /// workgroup memory, so that matmuls of f16 operands (`--precision mixed`) run on tensor
    /// cores too: the artifact then runs only where wgpu offers them (native Vulkan).
    #[arg(long)]
    pub tensor_cores: bool,
}

impl TargetArgs {
    /// The target these flags name, or what is wrong with them.
    pub fn target(&self) -> Result<sinter_compiler::Target, String> {
        use sinter_compiler::Target;
        let mut target = match self.target.as_deref() {
            None => Target::default(),
            Some(name) => match Target::named(name) {
                Some(t) => t,
                None if name.ends_with(".json") => {
                    let text = std::fs::read_to_string(name)
                        .map_err(|e| format!("cannot read the target file {name}: {e}"))?;
                    Target::from_json(&text).map_err(|e| format!("target file {name}: {e}"))?
                }
                None => {
                    return Err(format!(
                        "unknown target `{name}`: expected one of {} or a .json file",
                        Target::PRESETS.join(", ")
                    ));
                }
            },
        };
        if let Some(bytes) = self.max_binding_size {
            target.limits.max_binding = bytes;
        }
        if self.browser {
            let browser = Target::browser().features;
            target.features.quad_aliases = browser.quad_aliases;
            target.features.f16 = browser.f16;
            target.features.cooperative_matrix = browser.cooperative_matrix;
        }
        if self.tensor_cores {
            if self.browser {
                return Err(
                    "--tensor-cores and --browser exclude each other: browsers have no \
                            cooperative matrices"
                        .into(),
                );
            }
            target = target.with_tensor_cores();
        }
        Ok(target)
    }
}

/// `--precision`: the program as declared (`f32`), or its products in f16 as PyTorch's
/// autocast runs them, with its gradients scaled (`mixed`; see
/// [`sinter_compiler::precision`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    #[default]
    F32,
    Mixed,
}

impl From<Precision> for sinter_compiler::precision::Precision {
    fn from(p: Precision) -> Self {
        use sinter_compiler::precision::Precision as P;
        match p {
            Precision::F32 => P::F32,
            Precision::Mixed => P::Mixed,
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
