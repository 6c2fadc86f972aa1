//! The artifact (`.sart`): everything the runtime needs to run a compiled graph, and nothing
//! that needs the compiler to understand.
//!
//! File layout (all integers little-endian):
//!
//! | bytes | content |
//! |---|---|
//! | 8 | magic `SINTART\0` |
//! | 4 | format version ([`FORMAT_VERSION`]) |
//! | 4 | CRC-32 (IEEE) of everything after the header |
//! | 8 | manifest length `m` |
//! | 8 | blob length `b` |
//! | m | manifest: [`Artifact`] as JSON |
//! | b | blob: initial values of params and states given as bytes, as their slots' `init` ranges say |
//!
//! A param or state whose program gives it an initializer (`zeros`, `normal(..)`, ...) carries
//! it as a [`TensorSlot::fill`] spec instead, which the runtime evaluates at load exactly as
//! [`crate::init`] specifies (zeros cost nothing: buffers start zeroed), so an artifact's size
//! does not grow with its weights.
//!
//! **Invariant:** a runtime reading this file needs no knowledge of the IR's ops: kernels are
//! WGSL text, dispatches are (kernel, param words, workgroup counts), tensors are (arena, byte
//! offset, type).

use crate::types::TensorType;

pub const MAGIC: [u8; 8] = *b"SINTART\0";

/// Bytes of one arena word: word arenas are `array<f32>`, and i32 values live in them as bit
/// patterns. Offsets in param blocks count an arena's elements (words, or halves in an f16
/// arena); offsets in the manifest count bytes.
pub const WORD_BYTES: u64 = crate::types::DType::F32.size_bytes() as u64;
pub const FORMAT_VERSION: u32 = 4;
/// The subgroup size the compiler's tensor-core kernels are written for (cooperative
/// operations must sit in uniform control flow, so the tiles go to subgroups by a fixed
/// stride); the runtime refuses an artifact that needs cooperative matrices on an adapter
/// whose subgroups may be any other size.
pub const COOPERATIVE_SUBGROUP_SIZE: u32 = 32;
const HEADER_LEN: usize = 32;

/// A compiled graph.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Artifact {
    /// Name of the source graph.
    pub graph: String,
    /// Device features and limits the artifact needs.
    pub requirements: Requirements,
    /// Arena buffers; each is bound as one `array<f32>` storage binding.
    pub arenas: Vec<ArenaLayout>,
    pub kernels: Vec<Kernel>,
    /// In execution order; one run records all of them into one command buffer.
    pub dispatches: Vec<Dispatch>,
    /// The I/O manifest: inputs, outputs, params and states with their places.
    pub tensors: Vec<TensorSlot>,
    /// Copies done after the last dispatch of a run (`assign` statements).
    pub assigns: Vec<AssignCopy>,
    /// Params and states whose `assign` needs no copy: a dispatch writes the new value over
    /// the old one (`in_place.rs` in the compiler). With `assigns`, every tensor a run updates.
    #[serde(default)]
    pub updated_in_place: Vec<String>,
    pub memory: MemoryReport,
    /// What the e-graph optimizer did (absent when it did not run).
    #[serde(default)]
    pub optimizer: Option<OptimizerSummary>,
    /// For a generation artifact (this is its one-token step): the prefill program beside it
    /// and what a generation loop needs (see [`crate::generation`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<Box<crate::generation::Generation>>,
    /// Initial values of params and states (referenced by [`TensorSlot::init`]).
    #[serde(skip)]
    pub blob: Vec<u8>,
}

/// Device features and limits an artifact needs.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Requirements {
    /// wgpu feature names, e.g. `"SHADER_F16"`.
    pub features: Vec<String>,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_storage_buffers_per_shader_stage: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_uniform_buffer_binding_size: u64,
}

impl Requirements {
    /// Every limit with its wgpu name (`wgpu::Limits` field), in a fixed order.
    pub fn limits(&self) -> [(&'static str, u64); 8] {
        [
            (
                "max_storage_buffer_binding_size",
                self.max_storage_buffer_binding_size,
            ),
            ("max_buffer_size", self.max_buffer_size),
            (
                "max_storage_buffers_per_shader_stage",
                self.max_storage_buffers_per_shader_stage.into(),
            ),
            (
                "max_compute_workgroup_storage_size",
                self.max_compute_workgroup_storage_size.into(),
            ),
            (
                "max_compute_invocations_per_workgroup",
                self.max_compute_invocations_per_workgroup.into(),
            ),
            (
                "max_compute_workgroup_size_x",
                self.max_compute_workgroup_size_x.into(),
            ),
            (
                "max_compute_workgroups_per_dimension",
                self.max_compute_workgroups_per_dimension.into(),
            ),
            (
                "max_uniform_buffer_binding_size",
                self.max_uniform_buffer_binding_size,
            ),
        ]
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArenaLayout {
    pub size_bytes: u64,
    /// How the arena's elements are stored: what kernels bind it as.
    #[serde(default)]
    pub storage: Storage,
}

impl ArenaLayout {
    /// A word arena of `size_bytes`.
    pub fn words(size_bytes: u64) -> ArenaLayout {
        ArenaLayout {
            size_bytes,
            storage: Storage::Word,
        }
    }

    /// Elements the arena holds (what its param-block offsets count).
    pub fn elements(&self) -> u64 {
        self.size_bytes / self.storage.bytes()
    }
}

/// The element an arena holds.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum Storage {
    /// 32-bit words: `array<f32>` (i32 values as bit patterns; f16 values as f32 where the
    /// target has no f16 storage).
    #[default]
    Word,
    /// `array<f16>` (wgpu's `SHADER_F16`).
    Half,
}

impl Storage {
    pub fn bytes(self) -> u64 {
        match self {
            Storage::Word => WORD_BYTES,
            Storage::Half => crate::types::DType::F16.size_bytes() as u64,
        }
    }
}

/// One compute shader.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kernel {
    pub name: String,
    /// What the kernel implements: `elementwise`, `reduce`, `softmax`, `matmul`, ...
    pub pattern: String,
    /// The source ops it covers, as `value = op` strings.
    pub ops: Vec<String>,
    /// WGSL source, validated by naga at compile time.
    pub wgsl: String,
    /// The same kernel written with subgroup operations (wgpu's `SUBGROUP` feature), for
    /// adapters that have them; validated by naga like `wgsl`, which stays the fallback. Both
    /// read the same param block and bindings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subgroup_wgsl: Option<String>,
    pub entry_point: String,
    pub workgroup_size: [u32; 3],
    /// Number of arena storage bindings (`@binding(1)` .. `@binding(n)`); binding 0 is the
    /// param block.
    pub arena_bindings: u32,
    /// Every loop's trip count is bounded by param-block values, so the runtime may turn off
    /// wgpu's loop bounding for this shader.
    pub loops_bounded: bool,
    /// Every index into a workgroup or function-local array, and every storage address, is in
    /// range by construction (the kernel clamps or masks its global reads and writes itself),
    /// so the runtime may build the shader without naga's index clamping. The flash kernels
    /// set it: the clamps cost them 12% (BENCHMARKS, "Index clamping").
    #[serde(default)]
    pub indices_in_range: bool,
    /// The rewrite rules that built this kernel (empty for a kernel of one source op).
    #[serde(default)]
    pub rules: Vec<String>,
    /// Words (u32) of the param block the shader declares; every dispatch of the kernel ships
    /// exactly this many.
    pub param_words: u32,
}

impl Kernel {
    /// The WGSL to run: the subgroup form where `subgroups` (the device has the feature) and
    /// the kernel has one, else the plain form.
    pub fn source(&self, subgroups: bool) -> &str {
        match &self.subgroup_wgsl {
            Some(wgsl) if subgroups => wgsl,
            _ => &self.wgsl,
        }
    }
}

/// One dispatch of a kernel.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dispatch {
    pub kernel: u32,
    /// Arena index bound at each arena binding of the kernel.
    pub arenas: Vec<u32>,
    /// The param block: offsets (in elements), extents and strides, as u32 words.
    pub params: Vec<u32>,
    pub workgroups: [u32; 3],
    /// The most loop iterations (back-edges of all loops together) one invocation runs, for
    /// drivers that cap them (Mesa's lavapipe stops every loop after 65535).
    pub loop_iterations: u64,
    /// `[word, binding]`: param words that hold a base element offset into the arena bound at
    /// arena binding `binding` (0-based); each must lie inside that arena.
    pub address_words: Vec<[u32; 2]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Role {
    Input,
    Output,
    Param,
    State,
}

/// A named tensor the caller can see: where it lives and what it is.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TensorSlot {
    pub name: String,
    pub role: Role,
    pub ty: TensorType,
    pub arena: u32,
    /// Byte offset in the arena; contiguous, C order.
    pub offset: u64,
    /// Byte range of the initial value in the blob (params and states).
    pub init: Option<(u64, u64)>,
    /// The initializer of a param or state, evaluated by the runtime at load (bit for bit as
    /// [`crate::init::initial_bytes`]); never together with `init`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill: Option<crate::init::Init>,
    /// For i32 inputs that index something (embedding ids, class labels): every value must lie
    /// in `0..index_bound`. The runtime checks before uploading, since a kernel can only turn
    /// an out-of-range index into NaN.
    #[serde(default)]
    pub index_bound: Option<u64>,
    /// For f32 inputs, params and states that an op's contract restricts (an optimizer's step
    /// count): every value must be at least this, and not NaN. The runtime checks inputs before
    /// upload and params and states when weights are loaded.
    #[serde(default)]
    pub at_least: Option<f64>,
}

impl TensorSlot {
    pub fn size_bytes(&self) -> u64 {
        self.ty.size_bytes() as u64
    }

    /// The bytes a copy to or from the slot moves: its size rounded up to [`COPY_ALIGN`] (an
    /// f16 tensor of odd length ends mid-word; the compiler leaves that word to it).
    pub fn copy_bytes(&self) -> u64 {
        self.size_bytes().next_multiple_of(COPY_ALIGN)
    }
}

/// Buffer copies (uploads, readbacks, assigns) move multiples of this many bytes from and to
/// offsets that are multiples of it (WebGPU's `COPY_BUFFER_ALIGNMENT`): every slot offset and
/// assign is aligned so, and the bytes up to the next multiple past a tensor belong to it.
pub const COPY_ALIGN: u64 = 4;

/// `assign`: copy `bytes` from (source arena, offset) to (target arena, offset) after a run.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AssignCopy {
    pub target: String,
    pub source_arena: u32,
    pub source_offset: u64,
    pub target_arena: u32,
    pub target_offset: u64,
    pub bytes: u64,
}

/// A training or inference step before and after optimization.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct StepSummary {
    pub dispatches: u64,
    /// Bytes the kernels read and write, estimated from their operands and results.
    pub bytes_moved: u64,
    /// The optimizer's cost model's estimate of the step's time, in microseconds.
    pub estimated_us: f64,
}

/// One rule set's saturation run.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct RuleSetSummary {
    pub name: String,
    pub iterations: u64,
    /// Why saturation stopped (`saturated`, or the limit it reached).
    pub stop: String,
    pub e_nodes: u64,
    pub e_classes: u64,
    pub ms: f64,
    /// `(rule, times applied)`.
    pub applied: Vec<(String, u64)>,
}

/// What the e-graph optimizer did.
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct OptimizerSummary {
    pub before: StepSummary,
    pub after: StepSummary,
    pub rule_sets: Vec<RuleSetSummary>,
    /// Time of the whole pass.
    pub ms: f64,
}

/// What the memory planner did.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct MemoryReport {
    /// Bytes of arena used (sum over arenas of their sizes).
    pub peak_bytes: u64,
    /// The largest total of simultaneously live bytes: no plan can do better.
    pub lower_bound_bytes: u64,
    pub buffers: Vec<BufferPlacement>,
}

/// One planned buffer in an arena.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BufferPlacement {
    /// The values stored in it (a buffer and its views).
    pub label: String,
    pub arena: u32,
    pub offset: u64,
    pub size_bytes: u64,
    /// First and last dispatch index during which it is live.
    pub live: (u32, u32),
}

/// A file that is not a readable artifact.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("not a sinter artifact: the file is {0} bytes, shorter than the 32-byte header")]
    TooShort(usize),
    #[error("not a sinter artifact: bad magic bytes (expected `SINTART`)")]
    BadMagic,
    #[error(
        "artifact format version {found} is not supported (this runtime reads version {supported}); recompile the model"
    )]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("artifact is truncated: header announces {expected} bytes of body, file has {actual}")]
    Truncated { expected: u64, actual: u64 },
    #[error("artifact is corrupted: checksum {actual:08x} does not match {expected:08x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("artifact manifest is malformed: {0}")]
    Manifest(#[from] serde_json::Error),
    #[error("artifact is inconsistent: {0}")]
    Inconsistent(String),
}

impl Artifact {
    pub fn to_bytes(&self) -> Vec<u8> {
        let manifest = serde_json::to_vec(self).expect("artifact serializes");
        let mut body = Vec::with_capacity(manifest.len() + self.blob.len());
        body.extend_from_slice(&manifest);
        body.extend_from_slice(&self.blob);
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.blob.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact, ArtifactError> {
        if bytes.len() < HEADER_LEN {
            return Err(ArtifactError::TooShort(bytes.len()));
        }
        if bytes[..8] != MAGIC {
            return Err(ArtifactError::BadMagic);
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let version = word(8);
        if version != FORMAT_VERSION {
            return Err(ArtifactError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let (crc, manifest_len, blob_len) = (word(12), long(16), long(24));
        let body = &bytes[HEADER_LEN..];
        let expected = manifest_len.saturating_add(blob_len);
        if body.len() as u64 != expected {
            return Err(ArtifactError::Truncated {
                expected,
                actual: body.len() as u64,
            });
        }
        let actual = crc32fast::hash(body);
        if actual != crc {
            return Err(ArtifactError::Checksum {
                expected: crc,
                actual,
            });
        }
        let (manifest, blob) = body.split_at(manifest_len as usize);
        let mut artifact: Artifact = serde_json::from_slice(manifest)?;
        artifact.blob = blob.to_vec();
        artifact.check()?;
        Ok(artifact)
    }

    /// Cross-references that a well-formed artifact satisfies; checked on load so that the
    /// runtime can index without checks.
    pub fn check(&self) -> Result<(), ArtifactError> {
        let bad = |m: String| Err(ArtifactError::Inconsistent(m));
        let in_arena = |arena: u32, offset: u64, bytes: u64| {
            self.arenas.get(arena as usize).is_some_and(|a| {
                offset
                    .checked_add(bytes)
                    .is_some_and(|end| end <= a.size_bytes)
            })
        };
        for (i, d) in self.dispatches.iter().enumerate() {
            let Some(k) = self.kernels.get(d.kernel as usize) else {
                return bad(format!(
                    "dispatch {i} names kernel {} of {}",
                    d.kernel,
                    self.kernels.len()
                ));
            };
            if d.arenas.len() != k.arena_bindings as usize
                || d.arenas.iter().any(|&a| a as usize >= self.arenas.len())
            {
                return bad(format!(
                    "dispatch {i} binds arenas {:?} for kernel `{}`",
                    d.arenas, k.name
                ));
            }
            self.check_dispatch(i, d, k)?;
        }
        for t in &self.tensors {
            if !in_arena(t.arena, t.offset, t.copy_bytes()) {
                return bad(format!("tensor `{}` lies outside its arena", t.name));
            }
            if !t.offset.is_multiple_of(COPY_ALIGN) {
                return bad(format!(
                    "tensor `{}` starts at byte {}, not a multiple of {COPY_ALIGN}",
                    t.name, t.offset
                ));
            }
            if let Some((off, len)) = t.init
                && (len != t.size_bytes()
                    || off
                        .checked_add(len)
                        .is_none_or(|e| e > self.blob.len() as u64))
            {
                return bad(format!(
                    "initial value of `{}` lies outside the blob",
                    t.name
                ));
            }
            if let Some(fill) = &t.fill {
                if t.init.is_some() || !matches!(t.role, Role::Param | Role::State) {
                    return bad(format!(
                        "`{}` has an initializer but is not a param or state without bytes",
                        t.name
                    ));
                }
                if let Err((_, why)) = crate::init::check(fill) {
                    return bad(format!("initializer of `{}`: {why}", t.name));
                }
            }
        }
        for a in &self.assigns {
            if !in_arena(a.source_arena, a.source_offset, a.bytes)
                || !in_arena(a.target_arena, a.target_offset, a.bytes)
            {
                return bad(format!("assign to `{}` lies outside its arena", a.target));
            }
            if [a.source_offset, a.target_offset, a.bytes]
                .iter()
                .any(|n| !n.is_multiple_of(COPY_ALIGN))
            {
                return bad(format!(
                    "assign to `{}` is not aligned to {COPY_ALIGN} bytes",
                    a.target
                ));
            }
        }
        for (i, name) in self.updated_in_place.iter().enumerate() {
            let updatable = self
                .tensors
                .iter()
                .any(|t| t.name == *name && matches!(t.role, Role::Param | Role::State));
            if !updatable {
                return bad(format!(
                    "`{name}` is updated in place but is not a param or state"
                ));
            }
            if self.updated_in_place[..i].contains(name)
                || self.assigns.iter().any(|a| a.target == *name)
            {
                return bad(format!("`{name}` is updated twice"));
            }
        }
        if let Some(generation) = &self.generation {
            generation.check(self)?;
        }
        Ok(())
    }

    /// A dispatch against its kernel and its arenas: a param block of the kernel's size (the
    /// words a shader reads past the end of its block would be zeros), every address word
    /// inside its arena, and no more workgroups than its arenas have words (every workgroup of
    /// a sinter kernel writes words no other writes; the slack covers the rounding of a
    /// workgroup count split over two dimensions).
    fn check_dispatch(&self, i: usize, d: &Dispatch, k: &Kernel) -> Result<(), ArtifactError> {
        let bad = |m: String| Err(ArtifactError::Inconsistent(m));
        let name = &k.name;
        if k.param_words == 0 || d.params.len() != k.param_words as usize {
            return bad(format!(
                "dispatch {i} of kernel `{name}` ships {} param words; the kernel's param block \
                 has {}",
                d.params.len(),
                k.param_words
            ));
        }
        let words = |binding: usize| {
            d.arenas
                .get(binding)
                .and_then(|&a| self.arenas.get(a as usize))
                .map(ArenaLayout::elements)
        };
        for &[word, binding] in &d.address_words {
            let Some(limit) = words(binding as usize) else {
                return bad(format!(
                    "dispatch {i} of kernel `{name}` names arena binding {binding}, which it \
                     does not have"
                ));
            };
            match d.params.get(word as usize) {
                Some(&offset) if u64::from(offset) < limit => {}
                Some(&offset) => {
                    return bad(format!(
                        "dispatch {i} of kernel `{name}`: param word {word} addresses element \
                         {offset} of an arena of {limit} elements"
                    ));
                }
                None => {
                    return bad(format!(
                        "dispatch {i} of kernel `{name}` names param word {word} of {}",
                        d.params.len()
                    ));
                }
            }
        }
        let per_dimension = self
            .requirements
            .max_compute_workgroups_per_dimension
            .max(65535);
        if let Some(w) = d.workgroups.iter().find(|&&w| w > per_dimension) {
            return bad(format!(
                "dispatch {i} of kernel `{name}` launches {w} workgroups along one dimension; \
                 the artifact declares at most {per_dimension}"
            ));
        }
        let total: u64 = d.workgroups.iter().map(|&w| u64::from(w)).product();
        let bound: u64 = (0..d.arenas.len()).filter_map(words).sum::<u64>() + 65535;
        if total == 0 || total > bound {
            return bad(format!(
                "dispatch {i} of kernel `{name}` launches {:?} workgroups, {total} in all, for \
                 arenas of {} words",
                d.workgroups,
                bound - 65535
            ));
        }
        Ok(())
    }

    pub fn slots(&self, role: Role) -> impl Iterator<Item = &TensorSlot> {
        self.tensors.iter().filter(move |t| t.role == role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TensorType;

    fn sample() -> Artifact {
        Artifact {
            graph: "g".into(),
            requirements: Requirements::default(),
            arenas: vec![ArenaLayout::words(64)],
            kernels: vec![],
            dispatches: vec![],
            tensors: vec![TensorSlot {
                name: "w".into(),
                role: Role::Param,
                ty: TensorType::f32(vec![4]),
                arena: 0,
                offset: 16,
                init: Some((0, 16)),
                fill: None,
                index_bound: None,
                at_least: None,
            }],
            assigns: vec![],
            updated_in_place: vec![],
            memory: MemoryReport::default(),
            optimizer: None,
            generation: None,
            blob: vec![7; 16],
        }
    }

    #[test]
    fn round_trips() {
        let a = sample();
        assert_eq!(Artifact::from_bytes(&a.to_bytes()).unwrap(), a);
    }

    #[test]
    fn rejects_damage() {
        let bytes = sample().to_bytes();
        assert!(matches!(
            Artifact::from_bytes(&bytes[..10]),
            Err(ArtifactError::TooShort(10))
        ));
        assert!(matches!(
            Artifact::from_bytes(&bytes[..bytes.len() - 1]),
            Err(ArtifactError::Truncated { .. })
        ));
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            Artifact::from_bytes(&flipped),
            Err(ArtifactError::Checksum { .. })
        ));
        let mut version = bytes.clone();
        version[8] = 99;
        assert!(matches!(
            Artifact::from_bytes(&version),
            Err(ArtifactError::UnsupportedVersion { found: 99, .. })
        ));
        let mut magic = bytes;
        magic[0] = b'X';
        assert!(matches!(
            Artifact::from_bytes(&magic),
            Err(ArtifactError::BadMagic)
        ));
    }
}
