//! The runtime's one error type. Every message names what was wrong (the tensor, the kernel, the
//! limit) and, where there is one, what to do about it.

use std::path::PathBuf;

use sinter_artifact::TensorType;
use sinter_artifact::artifact::{ArtifactError, Role};

use crate::io::IoError;

/// Anything that can go wrong while loading or running an artifact.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "{} take{} {} value{} from a weights file (`= external` in the program, as `sinter \
         import` writes a model's weights), and none was loaded: load one (`--weights \
         FILE.safetensors`)",
        names_list(names),
        if names.len() == 1 { "s" } else { "" },
        if names.len() == 1 { "its" } else { "their" },
        if names.len() == 1 { "" } else { "s" }
    )]
    WeightsNotLoaded { names: Vec<String> },
    #[error("no GPU adapter found (backends tried: {tried}); {hint}")]
    NoAdapter { tried: String, hint: &'static str },
    #[error(
        "SINTER_ADAPTER={pattern:?} matches none of the adapters found: {}",
        available.join("; ")
    )]
    NoMatchingAdapter {
        pattern: String,
        available: Vec<String>,
    },
    #[error("SINTER_BACKEND={value:?} is not a backend; use vulkan, metal, dx12 or gl")]
    BadBackend { value: String },
    #[error("{name}={value:?} is not a setting: use on or off")]
    BadSwitch { name: &'static str, value: String },
    #[error("the artifact needs the device feature {feature}, which wgpu does not know")]
    UnknownFeature { feature: String },
    #[error(
        "the artifact needs the device feature {feature}, which adapter `{adapter}` lacks{}",
        feature_hint(feature)
    )]
    MissingFeature { feature: String, adapter: String },
    #[error("the artifact needs {limit} >= {required}, but adapter `{adapter}` offers {available}")]
    LimitTooLow {
        limit: &'static str,
        required: u64,
        available: u64,
        adapter: String,
    },
    #[error("adapter `{adapter}` refused to create a device: {message}")]
    RequestDevice { adapter: String, message: String },
    #[error("cannot read artifact {}: {source}", path.display())]
    ReadArtifact {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(
        "kernel `{kernel}` (dispatch {dispatch}) runs {iterations} loop iterations per invocation, \
         but adapter `{adapter}` ends every loop after {limit} (all loops of an invocation \
         count together) and would return a short result; run it on another adapter"
    )]
    LoopLimit {
        kernel: String,
        dispatch: usize,
        iterations: u64,
        limit: u64,
        adapter: String,
    },
    #[error(
        "kernel `{kernel}` binds arena {arena} twice in one dispatch (as scalars and as vec4 \
         quads), which WebGPU in a browser forbids; compile the program for browsers: \
         sinter compile --browser"
    )]
    AliasedArena { kernel: String, arena: u32 },
    #[error("kernel `{kernel}` failed to build: {message}")]
    Shader { kernel: String, message: String },
    #[error("the GPU reported an error while {during}: {message}")]
    Gpu {
        during: &'static str,
        message: String,
    },
    #[error("input `{name}` is missing: the graph expects {expected}")]
    MissingInput { name: String, expected: TensorType },
    #[error("`{name}` is not an input of this graph{}; its inputs are: {}",
        role.map(|r| format!(" (it is {})", role_name(r))).unwrap_or_default(),
        if inputs.is_empty() { "(none)".to_string() } else { inputs.join(", ") })]
    UnknownInput {
        name: String,
        role: Option<Role>,
        inputs: Vec<String>,
    },
    #[error("`{name}` is not an output of this graph{}; its outputs are: {}",
        role.map(|r| format!(" (it is {})", role_name(r))).unwrap_or_default(),
        if outputs.is_empty() { "(none)".to_string() } else { outputs.join(", ") })]
    UnknownOutput {
        name: String,
        role: Option<Role>,
        outputs: Vec<String>,
    },
    #[error("input `{name}` is given twice")]
    DuplicateInput { name: String },
    #[error("input `{name}` has type {actual}, but the graph expects {expected}")]
    InputType {
        name: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error(
        "input `{name}` holds the index {value} at flat position {position}, outside 0..{bound} \
         (it indexes {bound} embedding rows or classes)"
    )]
    IndexOutOfRange {
        name: String,
        position: usize,
        value: i32,
        bound: u64,
    },
    #[error(
        "`{name}` holds {value} at flat position {position}, but it must be at least {minimum} \
         (an optimizer's step count, which starts at 1)"
    )]
    BelowMinimum {
        name: String,
        position: usize,
        value: f32,
        minimum: f64,
    },
    #[error(
        "tensor `{name}` is malformed: shape {shape:?} has {expected} elements, data has {len}"
    )]
    MalformedTensor {
        name: String,
        shape: Vec<usize>,
        expected: usize,
        len: usize,
    },
    #[error("`{name}` is not a param or state of this graph{}",
        role.map(|r| format!(" (it is {})", role_name(r))).unwrap_or_default())]
    UnknownWeight { name: String, role: Option<Role> },
    #[error("weight `{name}` has type {actual}, but the graph expects {expected}")]
    WeightType {
        name: String,
        expected: TensorType,
        actual: TensorType,
    },
    #[error("run_steps needs at least one step")]
    ZeroSteps,
    #[error("cannot profile on adapter `{adapter}`: {reason}")]
    Profiling { adapter: String, reason: String },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("reading results back from the GPU failed: {0}")]
    Map(String),
    #[error(
        "artifacts `{graph}` and `{with}` cannot share their params and states: they do not hold \
         the same ones at the same places"
    )]
    SharedPlaces { graph: String, with: String },
    #[error(
        "artifact `{graph}` is not a generation artifact; make one with `sinter compile \
         --generate`"
    )]
    NotGeneration { graph: String },
    /// Prompts a generator cannot take: none, of unequal lengths, tokens outside the vocabulary.
    #[error("{0}")]
    Prompt(String),
    /// A sampling setting out of range, or logits it cannot sample from.
    #[error("{0}")]
    Sampling(String),
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Input => "an input",
        Role::Output => "an output",
        Role::Param => "a param",
        Role::State => "a state",
    }
}

/// How to compile an artifact that does without `feature` (for [`RuntimeError::MissingFeature`]).
fn feature_hint(feature: &str) -> &'static str {
    if feature.starts_with("EXPERIMENTAL_COOPERATIVE_MATRIX") {
        "; compile without --tensor-cores, for a target without cooperative matrices \
         (`--target portable`)"
    } else if feature == "SHADER_F16" {
        "; compile for a target without f16 storage (`sinter compile --target browser`), \
         whose artifacts keep f16 values in f32 words"
    } else {
        ""
    }
}

/// `` `a` ``, `` `a` and `b` ``, or the first three and how many more.
fn names_list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().take(3).map(|n| format!("`{n}`")).collect();
    match names.len() {
        0 => String::from("no tensor"),
        1 => quoted[0].clone(),
        2 | 3 => format!(
            "{} and {}",
            quoted[..quoted.len() - 1].join(", "),
            quoted[quoted.len() - 1]
        ),
        n => format!("{} and {} more", quoted.join(", "), n - 3),
    }
}
