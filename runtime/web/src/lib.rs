//! # sinter-web
//!
//! sinter's runtime in a browser: a JavaScript API, through wasm-bindgen, over
//! [`sinter_runtime`] running on the page's WebGPU. Build it for `wasm32-unknown-unknown` and
//! run the wasm-bindgen CLI over the `.wasm` (`tools/web/build.sh` does both); the CLI writes
//! the JS glue and TypeScript declarations.
//!
//! ```js
//! import init, { Session, readNpy } from "./pkg/sinter_web.js";
//! await init();
//! const train = await Session.fromUrl("digits_mlp.sart");
//! for (let step = 1; step <= 1000; step++) {
//!   // a training artifact's `assign`s update its params in place on the GPU
//!   const out = await train.step({ x: batchX, labels: batchLabels }, step % 50 ? [] : ["loss"]);
//!   if (out.loss) console.log(step, out.loss[0]);
//! }
//! const evalSession = await Session.fromUrl("digits_mlp_eval.sart");
//! // safetensors bytes of the params the eval graph has (the training graph adds AdamW's states)
//! evalSession.importWeights(await train.exportWeights(evalSession.weights.map((w) => w.name)));
//! const { logits } = await evalSession.run({ x: testX, labels: testLabels });
//!
//! // a language model's generation artifact (`sinter compile --generate --browser`)
//! const gen = await Generator.fromUrl("lm_generate.sart");
//! gen.importWeights(await lmTrain.exportWeights(gen.weights.map((w) => w.name)));
//! const [tokens] = await gen.generate(Int32Array.from(promptIds), 100,
//!   { temperature: 0.8, topK: 10, seed: 1 }, (token) => output.append(vocab[token]));
//! ```
//!
//! Tensors cross as flat typed arrays in C order: `Float32Array` for `f32`, `Int32Array` for
//! `i32`; a tensor's shape is the one its slot declares (see [`Session::inputs`]). Every
//! failure is a JS `Error` whose message is the runtime's (the tensor, the expected and the
//! actual type, the limit and the adapter).
//!
//! Calls on one session must be awaited one after the other (a second call while one is
//! running throws); steps that read nothing return at once and queue on the GPU.
//!
//! **Architecture Invariant:** this crate links the runtime and the artifact schema, never the
//! compiler or the IR's front end; it adds only the conversions between JS and host tensors.

mod convert;
mod error;
mod generate;

use std::path::Path;

use js_sys::{Array, Object, Uint8Array};
use sinter_artifact::artifact::Role;
use sinter_runtime::AdapterChoice;
use sinter_runtime::io::{self, HostTensor};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;

pub use convert::{tensor_info, typed_array};
pub use error::WebError;
pub use generate::Generator;

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = r#"
/** Element type of a tensor: `Float32Array` carries `f32`, `Int32Array` carries `i32`. */
export type DType = "f32" | "i32";

/** The elements of one tensor, flat, in C (row-major) order. */
export type TensorData = Float32Array | Int32Array;

/** Tensors by name: the inputs of a run, or the outputs it read. */
export type Tensors = Record<string, TensorData>;

/** One tensor of an artifact's manifest. */
export interface TensorInfo {
  name: string;
  role: "input" | "output" | "param" | "state";
  dtype: DType;
  /** Dimensions, outermost first; `[]` for a scalar. */
  shape: number[];
}

/** A tensor read from a `.npy` file. */
export interface Tensor {
  dtype: DType;
  shape: number[];
  data: TensorData;
}
"#;

#[wasm_bindgen]
extern "C" {
    /// The global `fetch` (a window's or a worker's).
    #[wasm_bindgen(catch, js_name = fetch)]
    fn global_fetch(url: &str) -> Result<js_sys::Promise, JsValue>;

    type Response;
    #[wasm_bindgen(method, getter)]
    fn ok(this: &Response) -> bool;
    #[wasm_bindgen(method, getter)]
    fn status(this: &Response) -> u16;
    #[wasm_bindgen(method, js_name = arrayBuffer)]
    fn array_buffer(this: &Response) -> js_sys::Promise;
}

/// Fetches `url` as bytes.
pub(crate) async fn fetch_bytes(url: &str) -> Result<Vec<u8>, WebError> {
    let failed = |reason: String| WebError::Fetch {
        url: url.to_string(),
        reason,
    };
    let promise = global_fetch(url).map_err(|e| failed(error::js_message(&e)))?;
    let response: Response = JsFuture::from(promise)
        .await
        .map_err(|e| failed(error::js_message(&e)))?
        .unchecked_into();
    if !response.ok() {
        return Err(failed(format!(
            "the server answered HTTP {}",
            response.status()
        )));
    }
    let buffer = JsFuture::from(response.array_buffer())
        .await
        .map_err(|e| failed(error::js_message(&e)))?;
    Ok(Uint8Array::new(&buffer).to_vec())
}

/// A compiled sinter artifact (`.sart`) loaded on the browser's WebGPU device: buffers,
/// pipelines and bind groups built once; params and states stay on the GPU between runs.
#[wasm_bindgen]
pub struct Session {
    inner: sinter_runtime::Session,
}

#[wasm_bindgen]
impl Session {
    /// Loads an artifact from the bytes of a `.sart` file. Rejects with an `Error` when the
    /// bytes are not an artifact, when the page has no WebGPU adapter, or when the adapter lacks
    /// a feature or a limit the artifact needs (the message names the limit, what the artifact
    /// needs and what the adapter offers).
    #[wasm_bindgen(js_name = fromBytes)]
    pub async fn from_bytes(
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: Vec<u8>,
    ) -> Result<Session, JsError> {
        Ok(Session::load(&bytes).await?)
    }

    /// Fetches a `.sart` file and loads it (see `fromBytes`); an HTTP error names the URL and
    /// the status.
    #[wasm_bindgen(js_name = fromUrl)]
    pub async fn from_url(url: String) -> Result<Session, JsError> {
        let bytes = fetch_bytes(&url).await?;
        Ok(Session::load(&bytes).await?)
    }

    /// The graph's inputs, in manifest order.
    #[wasm_bindgen(getter, unchecked_return_type = "TensorInfo[]")]
    pub fn inputs(&self) -> Array {
        self.infos(&[Role::Input])
    }

    /// The graph's outputs, in manifest order.
    #[wasm_bindgen(getter, unchecked_return_type = "TensorInfo[]")]
    pub fn outputs(&self) -> Array {
        self.infos(&[Role::Output])
    }

    /// The params and states (what `exportWeights` writes), in manifest order.
    #[wasm_bindgen(getter, unchecked_return_type = "TensorInfo[]")]
    pub fn weights(&self) -> Array {
        self.infos(&[Role::Param, Role::State])
    }

    /// The adapter the session runs on, in one line.
    #[wasm_bindgen(getter)]
    pub fn adapter(&self) -> String {
        self.inner.report().adapter.clone()
    }

    /// Runs the graph once with every input given by name and reads every output back. A
    /// training artifact's params and states are updated in place, as by `step`.
    #[wasm_bindgen(unchecked_return_type = "Tensors")]
    pub async fn run(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Tensors")] inputs: Object,
    ) -> Result<Object, JsError> {
        let feeds = convert::feeds(&self.inner, &inputs)?;
        let outputs = self.inner.run_async(&convert::named(&feeds)).await?;
        Ok(convert::tensors_object(outputs.iter())?)
    }

    /// One training step: runs the graph once (its `assign`s update params and states in
    /// place) and reads back only the outputs named in `read`. With `read` empty or left out,
    /// the step is queued on the GPU and the promise resolves at once to `{}`, so that steps
    /// run back to back; reading, say, the loss every 50 steps waits for all steps before it.
    #[wasm_bindgen(unchecked_return_type = "Tensors")]
    pub async fn step(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Tensors")] inputs: Object,
        read: Option<Vec<String>>,
    ) -> Result<Object, JsError> {
        let feeds = convert::feeds(&self.inner, &inputs)?;
        let read = read.unwrap_or_default();
        let names: Vec<&str> = read.iter().map(String::as_str).collect();
        let outputs = self
            .inner
            .run_reading_async(&convert::named(&feeds), &names)
            .await?;
        Ok(convert::tensors_object(outputs.iter())?)
    }

    /// The current value of one param or state.
    #[wasm_bindgen(js_name = readWeight, unchecked_return_type = "TensorData")]
    pub async fn read_weight(&self, name: String) -> Result<JsValue, JsError> {
        let t = self.inner.read_persistent_async(&name).await?;
        Ok(typed_array(&t))
    }

    /// Params and states as the bytes of a safetensors file (the format `sinter run --weights`
    /// and PyTorch read): those named in `names`, or all of them. To hand a training session's
    /// params to an inference session of the same model, name the latter's weights:
    /// `infer.importWeights(await train.exportWeights(infer.weights.map((w) => w.name)))`.
    #[wasm_bindgen(js_name = exportWeights, unchecked_return_type = "Uint8Array")]
    pub async fn export_weights(&self, names: Option<Vec<String>>) -> Result<Uint8Array, JsError> {
        let weights = match names {
            None => self.inner.weights_async().await?,
            Some(names) => {
                let mut weights = Vec::with_capacity(names.len());
                for name in names {
                    let t = self.inner.read_persistent_async(&name).await?;
                    weights.push((name, t));
                }
                weights
            }
        };
        let bytes = io::safetensors_to_bytes(Path::new(WEIGHTS_NAME), &weights)?;
        Ok(Uint8Array::from(bytes.as_slice()))
    }

    /// Overwrites params and states from the bytes of a safetensors file (for instance what
    /// `exportWeights` of a training session wrote). All tensors are checked first: an unknown
    /// name, a wrong dtype or shape throws and changes nothing; names it lacks keep their values.
    #[wasm_bindgen(js_name = importWeights)]
    pub fn import_weights(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: Vec<u8>,
    ) -> Result<(), JsError> {
        let weights = io::safetensors_from_bytes(Path::new(WEIGHTS_NAME), &bytes)?;
        self.inner.load_weights(&weights)?;
        Ok(())
    }
}

/// What safetensors bytes are called in error messages (they have no file name).
pub(crate) const WEIGHTS_NAME: &str = "the safetensors bytes";

impl Session {
    /// Parses, checks and loads an artifact on the browser's default adapter.
    pub async fn load(bytes: &[u8]) -> Result<Session, WebError> {
        let artifact = sinter_runtime::Artifact::from_bytes(bytes)?;
        Ok(Session::load_artifact(artifact).await?)
    }

    /// Loads an artifact that is already parsed (tests use it to alter requirements).
    pub async fn load_artifact(
        artifact: sinter_runtime::Artifact,
    ) -> Result<Session, sinter_runtime::RuntimeError> {
        let inner =
            sinter_runtime::Session::load_async(artifact, &AdapterChoice::default()).await?;
        Ok(Session { inner })
    }

    fn infos(&self, roles: &[Role]) -> Array {
        self.inner
            .artifact()
            .tensors
            .iter()
            .filter(|slot| roles.contains(&slot.role))
            .map(tensor_info)
            .collect()
    }
}

/// Reads the bytes of a `.npy` file (little-endian `f4`/`i4` in C order; `f8`/`i8` are
/// narrowed with a range check). `name` stands for the file in error messages.
#[wasm_bindgen(js_name = readNpy, unchecked_return_type = "Tensor")]
pub fn read_npy(
    #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: Vec<u8>,
    name: Option<String>,
) -> Result<Object, JsError> {
    let name = name.unwrap_or_else(|| "the .npy bytes".to_string());
    let t: HostTensor = io::npy_from_bytes(Path::new(&name), &bytes)?;
    Ok(convert::tensor_object(&t)?)
}
