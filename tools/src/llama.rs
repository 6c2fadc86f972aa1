//! A generator of Llama-family training steps as `.sir` programs, for benchmarks, examples and
//! tests: any number of layers, width, query and key/value heads, MLP width, vocabulary,
//! context and batch.
//!
//! The model is Hugging Face's `LlamaForCausalLM`: pre-norm blocks with RMSNorm, rotary
//! position embeddings (rotate-half, applied to q and k), grouped-query causal attention
//! through the `attention` composite (k and v with `kv_heads` heads), a SwiGLU MLP
//! (`down(silu(gate(x)) · up(x))`), a final RMSNorm and the output projection tied to the token
//! embedding; no biases. It is trained with AdamW on next-token cross-entropy.
//! `bench/llama_torch.py` builds the same model in PyTorch from the same weights.

/// The shape of a model and its training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub width: usize,
    /// Query heads; the head dimension is `width / heads`.
    pub heads: usize,
    /// Key/value heads, dividing `heads` (grouped-query attention; `heads` for none).
    pub kv_heads: usize,
    /// Width of the SwiGLU MLP's hidden layer.
    pub mlp: usize,
    pub vocab: usize,
    pub context: usize,
    pub batch: usize,
    /// The rotary embedding's base (`rope_theta`).
    pub rope_theta: f64,
    /// RMSNorm's epsilon.
    pub norm_eps: f64,
    /// AdamW's learning rate and weight decay (every param decays).
    pub lr: f64,
    pub weight_decay: f64,
}

impl LlamaConfig {
    /// SmolLM2-135M's shape (30 layers, width 576, 9 heads over 3 key/value heads, MLP 1536,
    /// vocabulary 49152, rope_theta 100000) with context 512 and batch 4.
    pub const SMOLLM2_135M: LlamaConfig = LlamaConfig {
        layers: 30,
        width: 576,
        heads: 9,
        kv_heads: 3,
        mlp: 1536,
        vocab: 49152,
        context: 512,
        batch: 4,
        rope_theta: 100_000.0,
        norm_eps: 1e-5,
        lr: 3e-4,
        weight_decay: 0.1,
    };

    /// The bundled example `ir-spec/examples/llama_train.sir`: a character-level model of
    /// `ir-spec/examples/data/text` (vocabulary 36, windows of 16), 2 layers of width 32, 4
    /// heads over 2 key/value heads, trained in seconds on a CPU.
    pub const EXAMPLE: LlamaConfig = LlamaConfig {
        layers: 2,
        width: 32,
        heads: 4,
        kv_heads: 2,
        mlp: 64,
        vocab: 36,
        context: 16,
        batch: 4,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        lr: 1e-2,
        weight_decay: 0.01,
    };

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Why the shape is not a model, if it is not.
    pub fn check(&self) -> Result<(), String> {
        crate::gpt::at_least_one(&[
            ("layers", self.layers),
            ("width", self.width),
            ("heads", self.heads),
            ("kv-heads", self.kv_heads),
            ("mlp", self.mlp),
            ("vocab", self.vocab),
            ("context", self.context),
            ("batch", self.batch),
        ])?;
        if !self.width.is_multiple_of(self.heads) {
            return Err(format!(
                "the width {} does not split into {} heads",
                self.width, self.heads
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} key/value heads do not divide {} query heads",
                self.kv_heads, self.heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "the head dimension {} is odd; rotary embeddings rotate pairs",
                self.head_dim()
            ));
        }
        if !(self.rope_theta > 1.0 && self.rope_theta.is_finite()) {
            return Err(format!("rope_theta {} must be above 1", self.rope_theta));
        }
        if !(self.norm_eps > 0.0 && self.norm_eps.is_finite()) {
            return Err(format!("norm_eps {} must be positive", self.norm_eps));
        }
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            return Err(format!("lr {} must be finite and not negative", self.lr));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(format!(
                "weight_decay {} must be finite and not negative",
                self.weight_decay
            ));
        }
        Ok(())
    }

    /// Parameters of the model.
    pub fn params(&self) -> usize {
        let (d, hd) = (self.width, self.head_dim());
        let attention = d * self.heads * hd * 2 + d * self.kv_heads * hd * 2;
        let per_layer = 2 * d + attention + 3 * d * self.mlp;
        self.vocab * d + self.layers * per_layer + d
    }
}

/// The training step of `c` as a `.sir` program (AdamW with `c.lr` and `c.weight_decay` on
/// every parameter).
pub fn program(c: &LlamaConfig) -> String {
    let (b, t, d, v) = (c.batch, c.context, c.width, c.vocab);
    let (h, kv, hd, f) = (c.heads, c.kv_heads, c.head_dim(), c.mlp);
    let half = hd / 2;
    let mut s = String::new();
    let mut seed = 0;
    // Hugging Face's initialization: every projection and the embedding N(0, 0.02²)
    let mut normal = || {
        seed += 1;
        format!("normal(std=0.02, seed={seed})")
    };
    let mut line = |text: String| {
        s.push_str(&text);
        s.push('\n');
    };
    line(format!(
        "# Llama-style training step: {} layers, width {d}, {h} heads over {kv} key/value heads, \
         MLP {f}, vocabulary {v}, context {t}, batch {b}.",
        c.layers
    ));
    line(
        "# Generated by `sinter-bench llama` (tools/src/llama.rs); bench/llama_torch.py is the \
         same model in PyTorch."
            .into(),
    );
    line("graph llama {".into());
    line(format!("  input ids: i32[{b}, {t}]"));
    line(format!("  input targets: i32[{b}, {t}]"));
    line(format!("  param embed: f32[{v}, {d}] = {}", normal()));
    line(
        "  # rotary tables [context, head_dim]: column j turns at 1 / theta^(2i / head_dim), \
         i = j mod head_dim/2"
            .into(),
    );
    line(format!("  rope_pos = iota(shape=[{t}, {hd}], axis=0)"));
    line(format!("  rope_col = iota(shape=[{t}, {hd}], axis=1)"));
    line(format!(
        "  rope_i = where(lt(rope_col, {half}.0), rope_col, sub(rope_col, {half}.0))"
    ));
    line(format!(
        "  rope_inv = reciprocal(pow({}, div(mul(rope_i, 2.0), {hd}.0)))",
        float(c.rope_theta)
    ));
    line("  rope_cos = cos(mul(rope_pos, rope_inv))".into());
    line("  rope_sin = sin(mul(rope_pos, rope_inv))".into());
    line("  x0 = embedding(embed, ids)".into());
    let eps = float(c.norm_eps);
    for l in 0..c.layers {
        let p = format!("l{l}");
        let x = format!("x{}", 2 * l);
        let (xa, xm) = (format!("x{}", 2 * l + 1), format!("x{}", 2 * l + 2));
        line(format!("  # ---- layer {l} ----"));
        line(format!("  param {p}.attn_norm: f32[{d}] = ones"));
        line(format!(
            "  param {p}.wq: f32[{d}, {}] = {}",
            h * hd,
            normal()
        ));
        line(format!(
            "  param {p}.wk: f32[{d}, {}] = {}",
            kv * hd,
            normal()
        ));
        line(format!(
            "  param {p}.wv: f32[{d}, {}] = {}",
            kv * hd,
            normal()
        ));
        line(format!(
            "  param {p}.wo: f32[{}, {d}] = {}",
            h * hd,
            normal()
        ));
        line(format!("  param {p}.mlp_norm: f32[{d}] = ones"));
        line(format!("  param {p}.w_gate: f32[{d}, {f}] = {}", normal()));
        line(format!("  param {p}.w_up: f32[{d}, {f}] = {}", normal()));
        line(format!("  param {p}.w_down: f32[{f}, {d}] = {}", normal()));
        line(format!("  {p}_h = rms_norm({x}, {p}.attn_norm, eps={eps})"));
        for (name, heads) in [("q", h), ("k", kv), ("v", kv)] {
            line(format!(
                "  {p}_{name} = permute(reshape(matmul({p}_h, {p}.w{name}), shape=[{b}, {t}, {heads}, {hd}]), perm=[0, 2, 1, 3])"
            ));
        }
        // x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1] for the halves x1, x2
        for name in ["q", "k"] {
            let y = format!("{p}_{name}");
            line(format!(
                "  {y}_rot = add(mul({y}, rope_cos), mul(concat(neg(slice({y}, axis=3, start={half}, end={hd})), slice({y}, axis=3, start=0, end={half}), axis=3), rope_sin))"
            ));
        }
        line(format!(
            "  {p}_att = attention({p}_q_rot, {p}_k_rot, {p}_v, causal=true)"
        ));
        line(format!(
            "  {p}_merged = reshape(transpose({p}_att, dim0=1, dim1=2), shape=[{b}, {t}, {}])",
            h * hd
        ));
        line(format!("  {xa} = add({x}, matmul({p}_merged, {p}.wo))"));
        line(format!("  {p}_m = rms_norm({xa}, {p}.mlp_norm, eps={eps})"));
        line(format!(
            "  {xm} = add({xa}, matmul(mul(silu(matmul({p}_m, {p}.w_gate)), matmul({p}_m, {p}.w_up)), {p}.w_down))"
        ));
    }
    let last = 2 * c.layers;
    line(format!("  param final_norm: f32[{d}] = ones"));
    line(format!(
        "  xf = reshape(rms_norm(x{last}, final_norm, eps={eps}), shape=[{}, {d}])",
        b * t
    ));
    line("  logits = matmul(xf, transpose(embed, dim0=0, dim1=1))".into());
    line(format!(
        "  loss = cross_entropy(logits, reshape(targets, shape=[{}]))",
        b * t
    ));
    line(format!(
        "  train loss with adamw(lr={}, weight_decay={})",
        float(c.lr),
        float(c.weight_decay)
    ));
    line("  output loss".into());
    line("}".into());
    s
}

/// A float as the text format reads it back exactly.
fn float(v: f64) -> String {
    format!("{v:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: LlamaConfig = LlamaConfig {
        layers: 2,
        width: 16,
        heads: 4,
        kv_heads: 2,
        mlp: 24,
        vocab: 11,
        context: 8,
        batch: 2,
        ..LlamaConfig::EXAMPLE
    };

    #[test]
    fn generated_programs_parse_and_count_their_params() {
        let g = sinter_ir::text::parse(&program(&SMALL)).expect("a valid program");
        let params: usize = g.params().map(|p| g.ty(p).numel()).sum();
        assert_eq!(params, SMALL.params());
        assert!(LlamaConfig::SMOLLM2_135M.check().is_ok());
        // SmolLM2-135M has 134.5 M parameters (its embedding tied)
        assert_eq!(LlamaConfig::SMOLLM2_135M.params(), 134_515_008);
        assert!(
            LlamaConfig {
                kv_heads: 3,
                ..SMALL
            }
            .check()
            .is_err()
        );
        // a width that does not split into the heads, an odd head dimension
        assert!(LlamaConfig { heads: 5, ..SMALL }.check().is_err());
        assert!(LlamaConfig { width: 12, ..SMALL }.check().is_err());
    }

    #[test]
    fn the_bundled_example_is_the_generators_output() {
        let file = include_str!("../../ir-spec/examples/llama_train.sir");
        assert!(
            file.ends_with(&program(&LlamaConfig::EXAMPLE)),
            "ir-spec/examples/llama_train.sir is not its header followed by \
             program(&LlamaConfig::EXAMPLE): regenerate it"
        );
    }
}
