//! Reading a GPU buffer back to the host: the one place that waits for the device.
//!
//! Natively, `device.poll` blocks until the GPU is idle and runs the map callback; in a browser
//! the callback arrives on its own and the future is awaited instead.

use std::sync::{Arc, Mutex};

use crate::device::Gpu;
use crate::error::RuntimeError;

type MapResult = Result<(), wgpu::BufferAsyncError>;

/// The result of a `map_async` callback, and who to wake when it arrives.
#[derive(Clone, Default)]
struct MapSignal(Arc<Mutex<(Option<MapResult>, Option<std::task::Waker>)>>);

impl MapSignal {
    fn set(&self, result: MapResult) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = Some(result);
        if let Some(w) = s.1.take() {
            w.wake();
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn take(&self) -> Option<MapResult> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).0.take()
    }

    #[cfg(target_arch = "wasm32")]
    async fn wait(&self) -> MapResult {
        std::future::poll_fn(|cx| {
            let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match s.0.take() {
                Some(r) => std::task::Poll::Ready(r),
                None => {
                    s.1 = Some(cx.waker().clone());
                    std::task::Poll::Pending
                }
            }
        })
        .await
    }
}

#[cfg(not(target_arch = "wasm32"))]
async fn mapped(gpu: &Gpu, signal: &MapSignal) -> Result<(), RuntimeError> {
    wait_idle(gpu)?;
    match signal.take() {
        Some(r) => r.map_err(|e| RuntimeError::Map(e.to_string())),
        None => Err(RuntimeError::Map(
            "the device went idle but the buffer was not mapped".into(),
        )),
    }
}

#[cfg(target_arch = "wasm32")]
async fn mapped(_gpu: &Gpu, signal: &MapSignal) -> Result<(), RuntimeError> {
    signal
        .wait()
        .await
        .map_err(|e| RuntimeError::Map(e.to_string()))
}

/// Blocks until all submitted work is done (natively; a no-op in a browser).
pub(crate) fn wait_idle(gpu: &Gpu) -> Result<(), RuntimeError> {
    #[cfg(not(target_arch = "wasm32"))]
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| RuntimeError::Map(e.to_string()))?;
    #[cfg(target_arch = "wasm32")]
    let _ = gpu;
    Ok(())
}

/// The first `bytes` bytes of a `MAP_READ` buffer, after all submitted work.
pub(crate) async fn read_buffer(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    bytes: u64,
) -> Result<Vec<u8>, RuntimeError> {
    if bytes == 0 {
        wait_idle(gpu)?;
        return Ok(Vec::new());
    }
    let slice = buffer.slice(..bytes);
    let signal = MapSignal::default();
    let callback = signal.clone();
    slice.map_async(wgpu::MapMode::Read, move |r| callback.set(r));
    mapped(gpu, &signal).await?;
    let data = slice.get_mapped_range().map(|view| view.to_vec());
    buffer.unmap();
    data.map_err(|e| RuntimeError::Map(e.to_string()))
}
