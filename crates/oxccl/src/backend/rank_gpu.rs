//! Which GPU this rank uses, by PCI address, for the host backends' choices of locality (the
//! NIC nearest the rank's GPU, as NCCL picks one per GPU). The GPU runtime layer knows the
//! answer (the device a rank gets by `OXCCL_GPU_DEVICE` or its local rank, and the driver's
//! PCI address of it); it installs a [`Locator`] at initialisation, so the backends ask
//! without calling upward.

use std::sync::{Mutex, PoisonError};

use crate::config::ResolvedConfig;

/// Answers the PCI address (`0000:3b:00.0`) of the GPU that local rank `local_rank` uses
/// under `cfg`, or `None` when there is no GPU runtime, no device, or the driver cannot say.
pub type Locator = fn(cfg: &ResolvedConfig, local_rank: usize) -> Option<String>;

static LOCATOR: Mutex<Option<Locator>> = Mutex::new(None);

/// Installs the locator (the GPU runtime layer's; the last one installed answers).
pub fn install_locator(locator: Locator) {
    *LOCATOR.lock().unwrap_or_else(PoisonError::into_inner) = Some(locator);
}

/// The PCI address of local rank `local_rank`'s GPU, as the installed locator says (`None`
/// without one).
pub fn bus_id(cfg: &ResolvedConfig, local_rank: usize) -> Option<String> {
    let locator = *LOCATOR.lock().unwrap_or_else(PoisonError::into_inner);
    locator.and_then(|l| l(cfg, local_rank))
}
