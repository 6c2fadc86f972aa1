//! Adapter and device selection: which GPU runs the artifact, and a device with exactly the
//! features and limits the artifact needs.
//!
//! Order of preference: Vulkan, Metal, DX12, then GL (GL only when none of the others has an
//! adapter); within a backend, discrete before integrated before virtual before CPU adapters.
//! `SINTER_BACKEND` (vulkan|metal|dx12|gl) or wgpu's own `WGPU_BACKEND` restricts the backends;
//! `SINTER_ADAPTER` picks the adapter whose name contains it (case-insensitive).

use std::sync::{Arc, Mutex};

use sinter_artifact::artifact::Requirements;

use crate::error::RuntimeError;
use crate::profile::{Timestamps, timestamp_support};

/// Which adapter to use. [`AdapterChoice::from_env`] reads it from the environment.
#[derive(Clone, Debug, Default)]
pub struct AdapterChoice {
    /// Backends to look at; `None`: Vulkan, Metal and DX12, then GL if those have no adapter.
    pub backends: Option<wgpu::Backends>,
    /// Case-insensitive substring of the adapter's name.
    pub name_contains: Option<String>,
    /// Ask the device for GPU timestamp queries, so that [`crate::Session::profile`] works.
    /// Off by default: a device gets no feature it does not need.
    pub profiling: bool,
    /// Run every kernel's plain form, even where the adapter has subgroups and the kernel a
    /// subgroup form (`SINTER_SUBGROUPS=off`): for comparing the two, and for drivers whose
    /// subgroup support misbehaves.
    pub no_subgroups: bool,
    /// Keep naga's index clamping in every kernel, even those whose indices the compiler
    /// proved in range (`SINTER_INDEX_CHECKS=on`): for telling a kernel's own indexing bug
    /// from another one.
    pub check_all_indices: bool,
    /// Fill every arena with NaN at load, before the initial values are written, instead of
    /// leaving it zeroed (`SINTER_POISON_ARENAS=on`): a kernel that reads memory nothing wrote
    /// (a temporary it should have stored whole) then shows in its results.
    pub poison_arenas: bool,
}

impl AdapterChoice {
    /// `SINTER_BACKEND` (else `WGPU_BACKEND`) and `SINTER_ADAPTER`.
    pub fn from_env() -> Result<AdapterChoice, RuntimeError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        // an on/off setting, if set
        let switch = |name: &'static str| var(name).map(|v| parse_switch(name, &v)).transpose();
        let backends = match var("SINTER_BACKEND") {
            Some(value) => Some(parse_backend(&value)?),
            None => wgpu::Backends::from_env(),
        };
        Ok(AdapterChoice {
            backends,
            name_contains: var("SINTER_ADAPTER"),
            profiling: false,
            no_subgroups: !switch("SINTER_SUBGROUPS")?.unwrap_or(true),
            check_all_indices: switch("SINTER_INDEX_CHECKS")?.unwrap_or(false),
            poison_arenas: switch("SINTER_POISON_ARENAS")?.unwrap_or(false),
        })
    }
}

fn parse_backend(value: &str) -> Result<wgpu::Backends, RuntimeError> {
    Ok(match value.trim().to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => wgpu::Backends::VULKAN,
        "metal" | "mtl" => wgpu::Backends::METAL,
        "dx12" | "d3d12" => wgpu::Backends::DX12,
        "gl" | "gles" | "opengl" => wgpu::Backends::GL,
        _ => {
            return Err(RuntimeError::BadBackend {
                value: value.to_string(),
            });
        }
    })
}

/// An on/off environment setting.
fn parse_switch(name: &'static str, value: &str) -> Result<bool, RuntimeError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "yes" | "true" => Ok(true),
        "off" | "0" | "no" | "false" => Ok(false),
        _ => Err(RuntimeError::BadSwitch {
            name,
            value: value.to_string(),
        }),
    }
}

/// One limit an artifact needs: wgpu's field name and the least acceptable value.
pub(crate) type LimitNeed = (&'static str, u64);

type LimitGet = fn(&wgpu::Limits) -> u64;
type LimitSet = fn(&mut wgpu::Limits, u64);

macro_rules! limit_table {
    ($($field:ident),* $(,)?) => {
        /// The limits the runtime may raise, by name (all "higher is better" limits).
        const LIMITS: &[(&str, LimitGet, LimitSet)] = &[
            $((stringify!($field), |l| l.$field as u64, |l, v| l.$field = v as _),)*
        ];
    };
}

limit_table!(
    max_storage_buffer_binding_size,
    max_buffer_size,
    max_storage_buffers_per_shader_stage,
    max_uniform_buffers_per_shader_stage,
    max_uniform_buffer_binding_size,
    max_bindings_per_bind_group,
    max_dynamic_uniform_buffers_per_pipeline_layout,
    max_compute_workgroup_storage_size,
    max_compute_invocations_per_workgroup,
    max_compute_workgroup_size_x,
    max_compute_workgroup_size_y,
    max_compute_workgroup_size_z,
    max_compute_workgroups_per_dimension,
);

/// The limits an artifact declares in its [`Requirements`].
pub(crate) fn declared_limits(r: &Requirements) -> Vec<LimitNeed> {
    r.limits().to_vec()
}

/// The adapter, device and queue a session runs on (sessions loaded together share one: a clone
/// is another handle to the same device).
#[derive(Clone)]
pub struct Gpu {
    pub(crate) adapter: wgpu::Adapter,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// Errors no error scope caught (a backstop: wgpu's default handler would panic).
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// The timestamp queries the device was created with (see [`AdapterChoice::profiling`]).
    pub(crate) timestamps: Timestamps,
    /// The device has wgpu's `SUBGROUP` feature, so kernels run their subgroup forms.
    pub(crate) subgroups: bool,
    /// See [`AdapterChoice::check_all_indices`].
    pub(crate) check_all_indices: bool,
    /// See [`AdapterChoice::poison_arenas`].
    pub(crate) poison_arenas: bool,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &describe_adapter(&self.adapter.get_info()))
            .finish_non_exhaustive()
    }
}

/// See [`Gpu::loop_limit`].
pub fn loop_limit(info: &wgpu::AdapterInfo) -> Option<u64> {
    let llvmpipe = |s: &str| s.to_ascii_lowercase().contains("llvmpipe");
    (llvmpipe(&info.name) || llvmpipe(&info.driver)).then_some(65535)
}

/// The adapter's name for messages. Browsers often keep it empty (WebGPU's `description` may
/// be withheld for privacy); then the backend stands in, so that an error never names ``.
pub fn adapter_name(info: &wgpu::AdapterInfo) -> String {
    if info.name.trim().is_empty() {
        format!("{} adapter", info.backend)
    } else {
        info.name.clone()
    }
}

/// One line about an adapter: name, backend, kind and driver (for `sinter run --verbose`).
pub fn describe_adapter(info: &wgpu::AdapterInfo) -> String {
    let mut s = format!(
        "{} ({}, {:?}",
        adapter_name(info),
        info.backend,
        info.device_type
    );
    if !info.driver.is_empty() {
        s.push_str(&format!("; driver {}", info.driver));
        if !info.driver_info.is_empty() {
            s.push_str(&format!(" {}", info.driver_info));
        }
    }
    s.push(')');
    s
}

thread_local! {
    /// The thread's instance per backend set, shared by its sessions. With an instance per
    /// session, NVIDIA's Vulkan driver on the H200 host stopped listing its GPU after about 30
    /// sessions in one process (`sinter-bench matmul` over many shapes and tiles: "no GPU adapter
    /// found").
    static INSTANCES: std::cell::RefCell<Vec<(wgpu::Backends, wgpu::Instance)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The thread's instance for `backends` (see `INSTANCES`), made on first use.
fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    INSTANCES.with_borrow_mut(|cache| {
        if let Some((_, instance)) = cache.iter().find(|(b, _)| *b == backends) {
            return instance.clone();
        }
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle_from_env()
        });
        cache.push((backends, instance.clone()));
        instance
    })
}

/// The adapters that `choice` allows, best first.
pub async fn list_adapters(choice: &AdapterChoice) -> Vec<wgpu::Adapter> {
    let tiers = match choice.backends {
        Some(b) => vec![b],
        None => vec![wgpu::Backends::PRIMARY, wgpu::Backends::SECONDARY],
    };
    for backends in tiers {
        let instance = instance(backends);
        let mut adapters = instance.enumerate_adapters(backends).await;
        if adapters.is_empty() {
            // Browsers cannot enumerate; ask for the default adapter instead.
            if let Ok(a) = instance
                .request_adapter(&wgpu::RequestAdapterOptions::default())
                .await
            {
                adapters.push(a);
            }
        }
        if !adapters.is_empty() {
            adapters.sort_by_key(|a| rank(&a.get_info()));
            return adapters;
        }
    }
    Vec::new()
}

fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let backend = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        wgpu::Backend::BrowserWebGpu => 3,
        wgpu::Backend::Gl => 4,
        _ => 5,
    };
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    };
    (backend, kind)
}

fn no_adapter_hint() -> &'static str {
    if cfg!(target_arch = "wasm32") {
        "this page has no WebGPU (`navigator.gpu` is missing or gave no adapter): use a browser \
         with WebGPU turned on (Chrome or Edge 113+; Chromium on Linux needs \
         --enable-unsafe-webgpu), over https or localhost"
    } else if cfg!(target_os = "linux") {
        "install a Vulkan driver; without a GPU, install Mesa's software Vulkan driver: \
         apt-get install mesa-vulkan-drivers libvulkan1"
    } else if cfg!(target_os = "macos") {
        "sinter needs Metal, which every Mac since 2012 has"
    } else if cfg!(target_os = "windows") {
        "install your GPU vendor's driver (DX12 or Vulkan)"
    } else {
        "install a Vulkan driver for this GPU"
    }
}

impl Gpu {
    /// Picks an adapter and creates a device with the features in `requirements` and every limit
    /// in `limits` (the declared ones plus what the runtime derives from the artifact), and
    /// with subgroups where `wants_subgroups` (some kernel has a subgroup form), the adapter
    /// has them and `choice` does not turn them off.
    pub(crate) async fn request(
        choice: &AdapterChoice,
        requirements: &Requirements,
        limits: &[LimitNeed],
        wants_subgroups: bool,
    ) -> Result<Gpu, RuntimeError> {
        let adapters = list_adapters(choice).await;
        if adapters.is_empty() {
            let tried = match choice.backends {
                Some(b) => b
                    .iter_names()
                    .map(|(name, _)| name.to_lowercase())
                    .collect::<Vec<_>>()
                    .join(", "),
                None if cfg!(target_arch = "wasm32") => "webgpu".to_string(),
                None => "vulkan, metal, dx12, gl".to_string(),
            };
            return Err(RuntimeError::NoAdapter {
                tried,
                hint: no_adapter_hint(),
            });
        }
        let adapter = match &choice.name_contains {
            None => adapters.into_iter().next(),
            Some(pattern) => {
                let p = pattern.to_lowercase();
                let names: Vec<String> = adapters
                    .iter()
                    .map(|a| describe_adapter(&a.get_info()))
                    .collect();
                let found = adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&p));
                if found.is_none() {
                    return Err(RuntimeError::NoMatchingAdapter {
                        pattern: pattern.clone(),
                        available: names,
                    });
                }
                found
            }
        }
        .expect("adapters is not empty");
        let name = adapter_name(&adapter.get_info());

        let mut features = wgpu::Features::empty();
        for f in &requirements.features {
            let Some(flag) = wgpu::Features::from_name(f) else {
                return Err(RuntimeError::UnknownFeature { feature: f.clone() });
            };
            if !adapter.features().contains(flag) {
                return Err(RuntimeError::MissingFeature {
                    feature: f.clone(),
                    adapter: name,
                });
            }
            features |= flag;
        }
        if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
            cooperative_support(&adapter, &name)?;
        }
        let timestamps = timestamp_support(choice.profiling, adapter.features());
        features |= timestamps.features();
        // In a browser the subgroup forms would need `enable subgroups;` and the `subgroup_id`
        // builtins, which naga's WGSL front end (the compiler's validator) does not accept
        // yet: plain forms there.
        let subgroups = wants_subgroups
            && !choice.no_subgroups
            && !cfg!(target_arch = "wasm32")
            && adapter.features().contains(wgpu::Features::SUBGROUP);
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }

        let available = adapter.limits();
        // Start from the downlevel defaults (clamped to the adapter, so that no limit the
        // artifact did not ask for can fail), then raise each needed limit.
        let mut required = wgpu::Limits::downlevel_defaults().or_worse_values_from(&available);
        for &(limit, value) in limits {
            let (_, get, set) = LIMITS
                .iter()
                .find(|(n, _, _)| *n == limit)
                .expect("every needed limit is in the table");
            if value > get(&available) {
                return Err(RuntimeError::LimitTooLow {
                    limit,
                    required: value,
                    available: get(&available),
                    adapter: name,
                });
            }
            if value > get(&required) {
                set(&mut required, value);
            }
        }

        let experimental = if requirements
            .features
            .iter()
            .any(|f| f.starts_with("EXPERIMENTAL_"))
        {
            // SAFETY: the artifact asks for an experimental feature (cooperative matrices);
            // wgpu documents that these may have bugs, which the compiler works around (GPU.md).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("sinter"),
                required_features: features,
                required_limits: required,
                experimental_features: experimental,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| RuntimeError::RequestDevice {
                adapter: name,
                message: e.to_string(),
            })?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        Ok(Gpu {
            adapter,
            device,
            queue,
            uncaptured,
            timestamps,
            subgroups,
            check_all_indices: choice.check_all_indices,
            poison_arenas: choice.poison_arenas,
        })
    }

    pub fn adapter_info(&self) -> wgpu::AdapterInfo {
        self.adapter.get_info()
    }

    /// The most loop iterations one invocation may run on this adapter, when its driver caps
    /// them: Mesa's llvmpipe (lavapipe) keeps one counter per invocation for all loops and ends
    /// them silently at 65535.
    pub fn loop_limit(&self) -> Option<u64> {
        loop_limit(&self.adapter.get_info())
    }

    /// One line about the adapter in use (see [`describe_adapter`]).
    pub fn describe(&self) -> String {
        describe_adapter(&self.adapter.get_info())
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// Runs `f` with every wgpu error it causes captured; returns the first one as a message.
    pub(crate) async fn capture<T>(&self, f: impl FnOnce() -> T) -> (T, Option<String>) {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        // Scopes pop in reverse order of their pushes.
        let v = validation.pop().await;
        let i = internal.pop().await;
        let o = oom.pop().await;
        let first = v.or(i).or(o).map(|e| error_text(&e));
        (out, first.or_else(|| self.take_uncaptured()))
    }

    /// An error that escaped every scope since the last call, if any.
    pub(crate) fn take_uncaptured(&self) -> Option<String> {
        let mut v = self.uncaptured.lock().ok()?;
        let first = v.first().cloned();
        v.clear();
        first
    }
}

/// wgpu's message (which already spells out the chain of causes), without its
/// "Validation Error / Caused by:" preamble.
fn error_text(e: &wgpu::Error) -> String {
    let full = e.to_string();
    match full.split_once("Caused by:") {
        Some((_, cause)) => cause.trim().to_string(),
        None => full.trim().to_string(),
    }
}

/// Refuses an adapter that has cooperative matrices but not those the compiler's tensor-core
/// kernels are written for: 16 × 16 × 16 products of `f16` operands accumulated in `f32`, and
/// subgroups of exactly 32 invocations (each takes every eighth tile of a 256-invocation
/// workgroup).
#[cfg(not(target_arch = "wasm32"))]
fn cooperative_support(adapter: &wgpu::Adapter, name: &str) -> Result<(), RuntimeError> {
    use sinter_artifact::artifact::COOPERATIVE_SUBGROUP_SIZE as COOPERATIVE_SUBGROUP;
    use wgpu::CooperativeScalarType as T;
    let info = adapter.get_info();
    let sixteen = adapter.cooperative_matrix_properties().iter().any(|p| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == T::F16 && p.cr_type == T::F32
    });
    let subgroups = (info.subgroup_min_size, info.subgroup_max_size);
    if !sixteen || subgroups != (COOPERATIVE_SUBGROUP, COOPERATIVE_SUBGROUP) {
        return Err(RuntimeError::MissingFeature {
            feature: format!(
                "EXPERIMENTAL_COOPERATIVE_MATRIX with 16x16x16 f16 -> f32 products and \
                 subgroups of {COOPERATIVE_SUBGROUP} (the adapter: those products {}, subgroups \
                 of {} to {})",
                if sixteen { "offered" } else { "not offered" },
                subgroups.0,
                subgroups.1
            ),
            adapter: name.to_string(),
        });
    }
    Ok(())
}

/// Browsers have no cooperative matrices: `request` refuses the feature before this.
#[cfg(target_arch = "wasm32")]
fn cooperative_support(_: &wgpu::Adapter, _: &str) -> Result<(), RuntimeError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_read_on_and_off_and_name_a_bad_value() {
        for on in ["on", "1", "YES", " true "] {
            assert!(parse_switch("SINTER_SUBGROUPS", on).expect("valid"));
        }
        for off in ["off", "0", "no", "False"] {
            assert!(!parse_switch("SINTER_SUBGROUPS", off).expect("valid"));
        }
        let err = parse_switch("SINTER_SUBGROUPS", "sometimes").unwrap_err();
        assert_eq!(
            err.to_string(),
            "SINTER_SUBGROUPS=\"sometimes\" is not a setting: use on or off"
        );
    }
}
