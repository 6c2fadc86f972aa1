//! The JavaScript `Generator`: a generation artifact (`sinter compile --generate --browser`)
//! on the page's WebGPU, writing tokens one at a time and handing each to a callback as it
//! comes (see `sinter_runtime::generate`).

use std::path::Path;

use js_sys::{Array, Float32Array, Function, Int32Array, Object, Reflect};
use sinter_artifact::artifact::Role;
use sinter_runtime::io;
use sinter_runtime::{AdapterChoice, Sampling};
use wasm_bindgen::prelude::*;

use crate::error::{WebError, js_message};
use crate::{WEIGHTS_NAME, fetch_bytes, tensor_info};

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** How `Generator.generate` chooses tokens. */
export interface GenerateOptions {
  /** 0 takes the most likely token; above 0 samples from softmax(logits / temperature). Default 1. */
  temperature?: number;
  /** Sample among the `topK` most likely tokens only. */
  topK?: number;
  /** Sample among the most likely tokens whose probabilities reach `topP` together. */
  topP?: number;
  /** Seed of the sampling (an integer): the same seed writes the same tokens. Default 0. */
  seed?: number;
}

/**
 * Called with every token as soon as it is chosen: its id, its sequence and its index after
 * the prompt. Returning `false` stops the generation.
 */
export type OnToken = (token: number, sequence: number, index: number) => boolean | void;
"#;

/// A language model's generation artifact loaded on the browser's WebGPU device: its prefill
/// and one-token step programs share the weights and the key/value caches on the GPU.
#[wasm_bindgen]
pub struct Generator {
    inner: sinter_runtime::Generator,
}

#[wasm_bindgen]
impl Generator {
    /// Loads a generation artifact from the bytes of a `.sart` file; rejects one that is not a
    /// generation artifact, or that the adapter cannot run (as `Session.fromBytes`).
    #[wasm_bindgen(js_name = fromBytes)]
    pub async fn from_bytes(
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: Vec<u8>,
    ) -> Result<Generator, JsError> {
        Ok(Generator::load(&bytes).await?)
    }

    /// Fetches a generation artifact and loads it.
    #[wasm_bindgen(js_name = fromUrl)]
    pub async fn from_url(url: String) -> Result<Generator, JsError> {
        let bytes = fetch_bytes(&url).await?;
        Ok(Generator::load(&bytes).await?)
    }

    /// Positions the caches hold: the model's context length.
    #[wasm_bindgen(getter)]
    pub fn context(&self) -> u32 {
        self.inner.info().context as u32
    }

    /// Sequences generated together: `generate` takes one prompt per sequence.
    #[wasm_bindgen(getter)]
    pub fn batch(&self) -> u32 {
        self.inner.info().batch as u32
    }

    /// Tokens the model scores: ids lie in `0..vocab`.
    #[wasm_bindgen(getter)]
    pub fn vocab(&self) -> u32 {
        self.inner.info().vocab as u32
    }

    /// The model's params (what `importWeights` takes), in manifest order.
    #[wasm_bindgen(getter, unchecked_return_type = "TensorInfo[]")]
    pub fn weights(&self) -> Array {
        (self.inner.session().artifact().tensors.iter())
            .filter(|slot| slot.role == Role::Param)
            .map(tensor_info)
            .collect()
    }

    /// The adapter the generator runs on, in one line.
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.inner.session().report().adapter.clone()
    }

    /// Overwrites params from the bytes of a safetensors file, for instance a training
    /// session's: `gen.importWeights(await train.exportWeights(gen.weights.map((w) => w.name)))`.
    #[wasm_bindgen(js_name = importWeights)]
    pub fn import_weights(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: Vec<u8>,
    ) -> Result<(), JsError> {
        let weights = io::safetensors_from_bytes(Path::new(WEIGHTS_NAME), &bytes)?;
        self.inner.load_weights(&weights)?;
        Ok(())
    }

    /// How many tokens the window keeps when the text passes the context (1 to the context;
    /// half of it by default).
    #[wasm_bindgen(js_name = setKeep)]
    pub fn set_keep(&mut self, keep: u32) -> Result<(), JsError> {
        Ok(self.inner.set_keep(keep as usize)?)
    }

    /// Starts over with `prompts` (as `generate` takes them) and resolves to the logits of each
    /// sequence's next token, one `Float32Array` of `vocab` scores per sequence: for sampling
    /// in JavaScript, with `push`.
    #[wasm_bindgen(unchecked_return_type = "Float32Array[]")]
    pub async fn start(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Int32Array | Int32Array[]")] prompts: JsValue,
    ) -> Result<Array, JsError> {
        let prompts = prompt_list(&prompts)?;
        Ok(logits_rows(self.inner.start_async(&prompts).await?))
    }

    /// Feeds one more token per sequence and resolves to the logits of the next ones.
    #[wasm_bindgen(unchecked_return_type = "Float32Array[]")]
    pub async fn push(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Int32Array")] tokens: Int32Array,
    ) -> Result<Array, JsError> {
        Ok(logits_rows(self.inner.push_async(&tokens.to_vec()).await?))
    }

    /// Writes up to `maxNewTokens` tokens after `prompts` (one `Int32Array` of token ids per
    /// sequence, all of one length; one array alone when the batch is 1), calling `onToken`
    /// with each token as soon as it is chosen; resolves to the tokens written, one
    /// `Int32Array` per sequence. One GPU submission per token.
    #[wasm_bindgen(unchecked_return_type = "Int32Array[]")]
    pub async fn generate(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Int32Array | Int32Array[]")] prompts: JsValue,
        #[wasm_bindgen(js_name = maxNewTokens)] max_new_tokens: u32,
        #[wasm_bindgen(unchecked_param_type = "GenerateOptions")] options: Option<Object>,
        #[wasm_bindgen(js_name = onToken, unchecked_param_type = "OnToken")] on_token: Option<
            Function,
        >,
    ) -> Result<Array, JsError> {
        let prompts = prompt_list(&prompts)?;
        let sampling = sampling(options.as_ref())?;
        let mut thrown: Option<JsValue> = None;
        let generated = self
            .inner
            .generate_async(&prompts, max_new_tokens as usize, &sampling, |t| {
                let Some(f) = &on_token else {
                    return true;
                };
                let args = [t.id, t.sequence as i32, t.index as i32].map(JsValue::from);
                match f.call3(&JsValue::NULL, &args[0], &args[1], &args[2]) {
                    Ok(v) => v.as_bool() != Some(false),
                    Err(e) => {
                        thrown = Some(e);
                        false
                    }
                }
            })
            .await?;
        if let Some(e) = thrown {
            return Err(WebError::Js(format!("onToken threw: {}", js_message(&e))).into());
        }
        Ok(generated
            .iter()
            .map(|tokens| JsValue::from(Int32Array::from(tokens.as_slice())))
            .collect())
    }
}

impl Generator {
    async fn load(bytes: &[u8]) -> Result<Generator, WebError> {
        let artifact = sinter_runtime::Artifact::from_bytes(bytes)?;
        let inner =
            sinter_runtime::Generator::load_async(artifact, &AdapterChoice::default()).await?;
        Ok(Generator { inner })
    }
}

fn logits_rows(rows: Vec<Vec<f32>>) -> Array {
    rows.iter()
        .map(|r| JsValue::from(Float32Array::from(r.as_slice())))
        .collect()
}

/// One prompt (an `Int32Array`) or an array of them.
fn prompt_list(value: &JsValue) -> Result<Vec<Vec<i32>>, WebError> {
    let one = |v: &JsValue| {
        v.dyn_ref::<Int32Array>()
            .map(Int32Array::to_vec)
            .ok_or_else(|| WebError::Js("a prompt must be an Int32Array of token ids".to_string()))
    };
    if Array::is_array(value) {
        Array::from(value).iter().map(|v| one(&v)).collect()
    } else {
        Ok(vec![one(value)?])
    }
}

/// The sampling settings of a `GenerateOptions` object (missing fields take the defaults).
fn sampling(options: Option<&Object>) -> Result<Sampling, WebError> {
    let mut s = Sampling::default();
    let Some(o) = options else {
        return Ok(s);
    };
    let number = |key: &str| -> Result<Option<f64>, WebError> {
        let v = Reflect::get(o, &key.into()).map_err(|e| WebError::Js(js_message(&e)))?;
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        v.as_f64()
            .map(Some)
            .ok_or_else(|| WebError::Js(format!("option `{key}` must be a number")))
    };
    let whole = |key: &str, v: f64| -> Result<u64, WebError> {
        if v >= 0.0 && v.fract() == 0.0 && v <= 2f64.powi(53) {
            Ok(v as u64)
        } else {
            Err(WebError::Js(format!(
                "option `{key}` must be a whole number from 0 to 2^53, got {v}"
            )))
        }
    };
    if let Some(t) = number("temperature")? {
        s.temperature = t;
    }
    if let Some(k) = number("topK")? {
        s.top_k = Some(whole("topK", k)? as usize);
    }
    s.top_p = number("topP")?;
    if let Some(seed) = number("seed")? {
        s.seed = whole("seed", seed)?;
    }
    Ok(s)
}
