//! The runtime in a real browser (headless Chromium's WebGPU, through `wasm-bindgen-test-runner`
//! and chromedriver): artifacts of the bundled examples, run through the JavaScript API, against
//! the outputs the reference interpreter produced natively for the same inputs.
//!
//! `tests/fixtures.sh DIR` writes the artifacts and the reference outputs; the tests embed them
//! from `SINTER_WEB_FIXTURES=DIR` at build time (see `.ci/run`).

#![cfg(target_arch = "wasm32")]

use js_sys::{Array, Float32Array, Int32Array, Object, Reflect, Uint8Array};
use sinter_runtime::io::{self, HostTensor, TensorData};
use sinter_web::{Generator, Session, typed_array};
use std::path::Path;
use wasm_bindgen::{JsCast, JsError, JsValue};
use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

macro_rules! fixture {
    ($($part:literal)+) => {
        include_bytes!(concat!(
            env!(
                "SINTER_WEB_FIXTURES",
                "run runtime/web/tests/fixtures.sh DIR and set SINTER_WEB_FIXTURES=DIR"
            ),
            "/",
            $($part),+
        ))
        .as_slice()
    };
}

/// One bundled example: its artifact, inputs and the interpreter's outputs.
struct Example {
    name: &'static str,
    artifact: &'static [u8],
    x: &'static [u8],
    labels: &'static [u8],
    loss: &'static [u8],
    logits: &'static [u8],
}

macro_rules! example {
    ($name:literal) => {
        Example {
            name: $name,
            artifact: fixture!($name ".sart"),
            x: fixture!($name "/x.npy"),
            labels: fixture!($name "/labels.npy"),
            loss: fixture!($name "/loss.npy"),
            logits: fixture!($name "/logits.npy"),
        }
    };
}

fn examples() -> [Example; 4] {
    [
        example!("mlp"),
        example!("cnn"),
        example!("digits_mlp_eval"),
        example!("digits_mlp"),
    ]
}

fn npy(name: &str, bytes: &[u8]) -> HostTensor {
    io::npy_from_bytes(Path::new(name), bytes).unwrap_or_else(|e| panic!("{e}"))
}

impl Example {
    /// `{ x, labels }` as typed arrays.
    fn inputs(&self) -> Object {
        let object = Object::new();
        for (key, bytes) in [("x", self.x), ("labels", self.labels)] {
            let t = npy(key, bytes);
            Reflect::set(&object, &key.into(), &typed_array(&t)).expect("a plain object");
        }
        object
    }

    async fn session(&self) -> Session {
        Session::load(self.artifact)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

/// The message of an error the JavaScript API threw.
fn message(e: JsError) -> String {
    let value: JsValue = e.into();
    match value.dyn_into::<js_sys::Error>() {
        Ok(error) => String::from(error.message()),
        Err(value) => panic!("not an Error: {value:?}"),
    }
}

fn floats(value: &JsValue) -> Vec<f32> {
    value
        .dyn_ref::<Float32Array>()
        .unwrap_or_else(|| panic!("not a Float32Array: {value:?}"))
        .to_vec()
}

fn field(object: &Object, name: &str) -> JsValue {
    let value = Reflect::get(object, &name.into()).expect("a plain object");
    assert!(!value.is_undefined(), "no `{name}` in {object:?}");
    value
}

/// Compares a GPU result (f32) with the interpreter's (f64, rounded to f32).
fn assert_close(what: &str, got: &[f32], want: &HostTensor) {
    let TensorData::F32(want) = &want.data else {
        panic!("{what}: the reference is not f32");
    };
    assert_eq!(got.len(), want.len(), "{what}: element count");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tolerance = 1e-4 + 1e-3 * w.abs();
        assert!(
            (g - w).abs() <= tolerance,
            "{what}[{i}]: the browser computed {g}, the interpreter {w}"
        );
    }
}

#[wasm_bindgen_test]
async fn bundled_examples_match_the_interpreter() {
    for example in examples() {
        let mut session = example.session().await;
        let outputs = session
            .run(example.inputs())
            .await
            .unwrap_or_else(|e| panic!("{}: {}", example.name, message(e)));
        for (name, bytes) in [("loss", example.loss), ("logits", example.logits)] {
            let want = npy(name, bytes);
            let what = format!("{} {name}", example.name);
            assert_close(&what, &floats(&field(&outputs, name)), &want);
        }
    }
}

#[wasm_bindgen_test]
async fn training_steps_lower_the_loss_and_export_weights() {
    let [_, _, eval, train] = examples();
    let mut session = train.session().await;
    let read = |names: &[&str]| Some(names.iter().map(|n| n.to_string()).collect());

    // Step 1 reads what the interpreter computed before the update.
    let first = session
        .step(train.inputs(), read(&["loss", "logits"]))
        .await
        .unwrap_or_else(|e| panic!("{}", message(e)));
    assert_close(
        "step 1 loss",
        &floats(&field(&first, "loss")),
        &npy("loss", train.loss),
    );
    assert_close(
        "step 1 logits",
        &floats(&field(&first, "logits")),
        &npy("logits", train.logits),
    );
    let w1_before = session.read_weight("w1".into()).await.map_err(message);

    // Steps that read nothing return an empty object without waiting.
    for _ in 0..40 {
        let none = session.step(train.inputs(), None).await.map_err(message);
        assert_eq!(Object::keys(&none.expect("a step")).length(), 0);
    }
    let last = session
        .step(train.inputs(), read(&["loss"]))
        .await
        .map_err(message)
        .expect("a step");
    let (loss_first, loss_last) = (
        floats(&field(&first, "loss"))[0],
        floats(&field(&last, "loss"))[0],
    );
    assert!(
        loss_last < 0.5 * loss_first,
        "42 AdamW steps on one batch took the loss from {loss_first} to {loss_last} only"
    );
    let w1_after = session.read_weight("w1".into()).await.map_err(message);
    assert_ne!(
        floats(&w1_before.expect("w1")),
        floats(&w1_after.expect("w1")),
        "the training step did not update w1"
    );

    // All weights: the params and the optimizer's states.
    let bytes = session
        .export_weights(None)
        .await
        .map_err(message)
        .expect("weights");
    let bytes = Uint8Array::new(&bytes).to_vec();
    let weights = io::safetensors_from_bytes(Path::new("exported"), &bytes).expect("safetensors");
    let names: Vec<&str> = weights.iter().map(|(n, _)| n.as_str()).collect();
    const PARAMS: [&str; 6] = ["b1", "b2", "b3", "w1", "w2", "w3"];
    for param in PARAMS {
        assert!(names.contains(&param), "{param} missing from {names:?}");
    }
    assert!(
        weights.len() > PARAMS.len(),
        "no optimizer states exported: {names:?}"
    );
    // The params alone carry the training over to the eval graph.
    let params = session
        .export_weights(Some(PARAMS.map(String::from).to_vec()))
        .await
        .map_err(message)
        .expect("params");
    let params = Uint8Array::new(&params).to_vec();
    let mut scoring = eval.session().await;
    scoring
        .import_weights(params)
        .map_err(message)
        .expect("imports");
    let scored = scoring
        .run(eval.inputs())
        .await
        .map_err(message)
        .expect("runs");
    let TensorData::F32(untrained) = npy("loss", eval.loss).data else {
        panic!("the reference loss is not f32");
    };
    let untrained = untrained[0];
    let trained = floats(&field(&scored, "loss"))[0];
    assert!(
        trained < untrained,
        "held-out loss {trained} after training, {untrained} before"
    );
}

#[wasm_bindgen_test]
async fn too_low_a_limit_names_the_limit_and_both_numbers() {
    let [mlp, ..] = examples();
    let mut artifact = sinter_runtime::Artifact::from_bytes(mlp.artifact).expect("an artifact");
    artifact.requirements.max_storage_buffer_binding_size = 1 << 40;
    let err = Session::load_artifact(artifact)
        .await
        .err()
        .expect("no adapter offers 1 TiB bindings")
        .to_string();
    let (head, tail) = err.split_once("`, offers ").unwrap_or_else(|| {
        err.split_once("` offers ")
            .unwrap_or_else(|| panic!("unexpected message: {err}"))
    });
    assert!(
        head.starts_with(
            "the artifact needs max_storage_buffer_binding_size >= 1099511627776, but adapter `"
        ),
        "{err}"
    );
    assert!(tail.parse::<u64>().is_ok_and(|n| n < 1 << 40), "{err}");
}

#[wasm_bindgen_test]
async fn an_artifact_compiled_for_native_gpus_is_refused_with_the_fix() {
    let err = Session::load(fixture!("mlp_native.sart"))
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some(
            "kernel `k0_matmul_epilogue` binds arena 0 twice in one dispatch (as scalars and as \
             vec4 quads), which WebGPU in a browser forbids; compile the program for browsers: \
             sinter compile --browser"
        )
    );
}

#[wasm_bindgen_test]
async fn wrong_inputs_throw_errors_that_name_the_tensor() {
    let [mlp, ..] = examples();
    let mut session = mlp.session().await;
    let labels = field(&mlp.inputs(), "labels");
    let with = |x: JsValue, labels: &JsValue| {
        let object = Object::new();
        Reflect::set(&object, &"x".into(), &x).expect("a plain object");
        Reflect::set(&object, &"labels".into(), labels).expect("a plain object");
        object
    };
    let cases: [(Object, &str); 4] = [
        (
            with(Int32Array::new_with_length(2048).into(), &labels),
            "input `x` must be a Float32Array holding f32[32, 64], but it is an Int32Array",
        ),
        (
            with(Float32Array::new_with_length(3).into(), &labels),
            "input `x` holds 3 elements, but the graph expects f32[32, 64] (2048 elements)",
        ),
        (
            with(Array::of1(&1.0.into()).into(), &labels),
            "input `x` must be a Float32Array holding f32[32, 64], but it is an Array (wrap it: \
             Float32Array.from(a) or Int32Array.from(a))",
        ),
        (
            {
                let object = with(Float32Array::new_with_length(2048).into(), &labels);
                Reflect::set(&object, &"y".into(), &labels).expect("a plain object");
                object
            },
            "`y` is not an input of this graph; its inputs are: x, labels",
        ),
    ];
    for (inputs, expected) in cases {
        let err = session.run(inputs).await.err().map(message);
        assert_eq!(err.as_deref(), Some(expected));
    }
    let missing = Object::new();
    Reflect::set(&missing, &"x".into(), &Float32Array::new_with_length(2048)).expect("set");
    let err = session.run(missing).await.err().map(message);
    assert_eq!(
        err.as_deref(),
        Some("input `labels` is missing: the graph expects i32[32]")
    );
}

#[wasm_bindgen_test]
async fn a_missing_url_names_the_url_and_the_status() {
    let err = Session::from_url("/no-such-artifact.sart".into())
        .await
        .err()
        .map(message);
    assert_eq!(
        err.as_deref(),
        Some("cannot fetch /no-such-artifact.sart: the server answered HTTP 404")
    );
}

#[wasm_bindgen_test]
fn read_npy_gives_dtype_shape_and_data() {
    let [mlp, ..] = examples();
    let tensor = sinter_web::read_npy(mlp.labels.to_vec(), Some("labels.npy".into()))
        .map_err(message)
        .expect("a .npy");
    assert_eq!(field(&tensor, "dtype").as_string().as_deref(), Some("i32"));
    let shape: Vec<f64> = Array::from(&field(&tensor, "shape"))
        .iter()
        .filter_map(|d| d.as_f64())
        .collect();
    assert_eq!(shape, [32.0]);
    assert!(field(&tensor, "data").is_instance_of::<Int32Array>());
    let err = sinter_web::read_npy(vec![1, 2, 3], Some("bad.npy".into()))
        .err()
        .map(message)
        .unwrap_or_default();
    assert!(err.starts_with("bad.npy is not a .npy file"), "{err}");
}

fn ints(t: &HostTensor) -> &[i32] {
    match &t.data {
        TensorData::I32(v) => v,
        TensorData::F32(_) | TensorData::F16(_) => panic!("not i32"),
    }
}

fn rows(value: &Array) -> Vec<Vec<f32>> {
    value.iter().map(|r| floats(&r)).collect()
}

/// Logits against the interpreter's, relative to their largest magnitude (the errors of f32
/// through a few layers add up in the small logits).
fn assert_logits(what: &str, got: &[f32], want: &HostTensor) {
    let TensorData::F32(want) = &want.data else {
        panic!("{what}: the reference is not f32");
    };
    let scale = want.iter().fold(1.0f32, |m, w| m.max(w.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
    assert!(
        err <= 1e-3 * scale,
        "{what}: the browser's logits differ from the interpreter's by {err} (largest {scale})"
    );
}

fn argmax(row: &[f32]) -> i32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as i32
}

#[wasm_bindgen_test]
async fn a_generation_artifact_gives_the_forward_programs_logits_token_by_token() {
    let ids = npy("ids", fixture!("lm/ids.npy"));
    let want = npy("logits", fixture!("lm/logits.npy"));
    let TensorData::F32(want) = &want.data else {
        panic!("the reference logits are not f32");
    };
    let (t, v) = (12, 24);
    let mut generator = Generator::from_bytes(fixture!("lm_generate.sart").to_vec())
        .await
        .map_err(message)
        .expect("loads");
    assert_eq!(
        (generator.context(), generator.batch(), generator.vocab()),
        (12, 1, 24)
    );
    for seq in 0..2 {
        let tokens = &ints(&ids)[seq * t..(seq + 1) * t];
        let at = |pos: usize| {
            let start = (seq * t + pos) * v;
            HostTensor::f32(vec![v], want[start..start + v].to_vec())
        };
        // five prompt tokens: four through the prefill, one through the step
        let prompt = Int32Array::from(&tokens[..5]);
        let logits = generator
            .start(prompt.into())
            .await
            .map_err(message)
            .expect("runs");
        assert_logits(
            &format!("sequence {seq} after 5"),
            &rows(&logits)[0],
            &at(4),
        );
        for pos in 5..t {
            let next = Int32Array::from(&tokens[pos..=pos]);
            let logits = generator.push(next).await.map_err(message).expect("runs");
            assert_logits(
                &format!("sequence {seq} after {}", pos + 1),
                &rows(&logits)[0],
                &at(pos),
            );
        }
    }
    // `generate` streams the greedy tokens that `start` and `push` give
    let prompt = &ints(&ids)[..3];
    let mut expected = Vec::new();
    let mut logits = rows(
        &generator
            .start(Int32Array::from(prompt).into())
            .await
            .map_err(message)
            .expect("runs"),
    );
    for _ in 0..4 {
        let token = argmax(&logits[0]);
        expected.push(token);
        let next = Int32Array::from(&[token][..]);
        logits = rows(&generator.push(next).await.map_err(message).expect("runs"));
    }
    let streamed = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let sink = streamed.clone();
    let on_token = wasm_bindgen::closure::Closure::<dyn FnMut(i32, i32, i32)>::new(
        move |token: i32, sequence: i32, index: i32| {
            sink.borrow_mut().push((token, sequence, index))
        },
    );
    let options = Object::new();
    Reflect::set(&options, &"temperature".into(), &0.0.into()).expect("a plain object");
    let written = generator
        .generate(
            Int32Array::from(prompt).into(),
            4,
            Some(options),
            Some(
                on_token
                    .as_ref()
                    .unchecked_ref::<js_sys::Function>()
                    .clone(),
            ),
        )
        .await
        .map_err(message)
        .expect("generates");
    let written: Vec<i32> = Int32Array::from(written.get(0)).to_vec();
    assert_eq!(written, expected);
    let order: Vec<(i32, i32, i32)> = (0..4).map(|i| (expected[i], 0, i as i32)).collect();
    assert_eq!(*streamed.borrow(), order);
    // a plain artifact is not a generation artifact
    let err = Generator::from_bytes(fixture!("mlp.sart").to_vec())
        .await
        .err()
        .map(message);
    assert_eq!(
        err.as_deref(),
        Some(
            "artifact `mlp` is not a generation artifact; make one with `sinter compile --generate`"
        )
    );
}
