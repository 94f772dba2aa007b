//! The copy functions of device memory: the [`DeviceCopy`] trait, a registry of one per kind
//! of device ([`register_device_copy`]: the GPU runtime layer registers one per vendor when
//! it loads a runtime, or a loader installed with [`install_loader`] loads it on first need),
//! and `memcpy` for host memory, which is how staging is tested without a GPU.

use std::sync::{Arc, Mutex};

use crate::device::Device;
use crate::error::{Error, Result};

/// Copies between device memory and host memory.
pub trait DeviceCopy: Send + Sync {
    /// Copies `bytes` bytes from `src` on `device` to host memory at `dst`, and returns
    /// once they are there.
    ///
    /// # Errors
    /// The device runtime's error.
    ///
    /// # Safety
    /// `src` must be `bytes` readable bytes on `device`, `dst` `bytes` writable host bytes.
    unsafe fn to_host(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()>;
    /// Copies `bytes` bytes from host memory at `src` to `dst` on `device`, and returns once
    /// they are there.
    ///
    /// # Errors
    /// The device runtime's error.
    ///
    /// # Safety
    /// `src` must be `bytes` readable host bytes, `dst` `bytes` writable bytes on `device`.
    unsafe fn to_device(&self, device: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()>;
}

/// Host "device": `memcpy` (host buffers staged for testing).
struct HostCopy;

impl DeviceCopy for HostCopy {
    unsafe fn to_host(&self, _: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller promises both ranges; temporaries never overlap user buffers.
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }
    unsafe fn to_device(&self, _: Device, src: *const u8, dst: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: as above.
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }
}

/// The kinds of device memory a copy function serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// CUDA devices (`Device::Cuda`).
    Cuda,
    /// ROCm/HIP devices (`Device::Rocm`).
    Rocm,
}

impl DeviceKind {
    /// The kind of `device` (`None` for the host).
    pub fn of(device: Device) -> Option<DeviceKind> {
        match device {
            Device::Cpu => None,
            Device::Cuda(_) => Some(DeviceKind::Cuda),
            Device::Rocm(_) => Some(DeviceKind::Rocm),
        }
    }
}

/// Loads the copy function of a kind of device on first need (the construction layer
/// installs one that loads the vendor runtime).
pub type Loader = Box<dyn Fn(DeviceKind) -> std::result::Result<Arc<dyn DeviceCopy>, String> + Send + Sync>;

struct Registry {
    cuda: Option<Arc<dyn DeviceCopy>>,
    rocm: Option<Arc<dyn DeviceCopy>>,
    loader: Option<Arc<Loader>>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { cuda: None, rocm: None, loader: None });

/// Registers the copy functions used to stage buffers of one kind of device.
pub fn register_device_copy(kind: DeviceKind, copy: Arc<dyn DeviceCopy>) {
    let mut r = crate::sync::relock(&REGISTRY);
    match kind {
        DeviceKind::Cuda => r.cuda = Some(copy),
        DeviceKind::Rocm => r.rocm = Some(copy),
    }
}

/// Installs the loader asked for a kind of device with no registered copy functions.
pub fn install_loader(loader: Loader) {
    crate::sync::relock(&REGISTRY).loader = Some(Arc::new(loader));
}

/// How staging finds the copy functions of a device.
pub type Copier<'a> = &'a dyn Fn(Device) -> Result<Arc<dyn DeviceCopy>>;

/// The copy functions of `device` (`memcpy` for the host): registered, else loaded.
///
/// # Errors
/// [`Error::BackendUnavailable`] for backend `backend` when there are none, saying why.
pub fn copier_for(device: Device, backend: &str) -> Result<Arc<dyn DeviceCopy>> {
    // One shared host copier: the front door asks for every call's buffers, and an `Arc` made
    // per call would be an allocation on the latency path.
    static HOST: std::sync::OnceLock<Arc<dyn DeviceCopy>> = std::sync::OnceLock::new();
    let Some(kind) = DeviceKind::of(device) else { return Ok(Arc::clone(HOST.get_or_init(|| Arc::new(HostCopy)))) };
    let (found, loader) = {
        let r = crate::sync::relock(&REGISTRY);
        let found = match kind {
            DeviceKind::Cuda => r.cuda.clone(),
            DeviceKind::Rocm => r.rocm.clone(),
        };
        (found, r.loader.clone())
    };
    if let Some(c) = found {
        return Ok(c);
    }
    let why = match loader {
        Some(load) => match load(kind) {
            Ok(c) => {
                register_device_copy(kind, Arc::clone(&c));
                return Ok(c);
            }
            Err(why) => why,
        },
        None => "no device copy function is registered (oxccl::backend::staging::register_device_copy)".to_string(),
    };
    Err(Error::BackendUnavailable {
        backend: backend.to_string(),
        why: format!("a {device} buffer must be staged through host memory, but its runtime cannot copy: {why}"),
    })
}
