//! Device buffers on host backends, staged through host memory: the room is
//! [`crate::staging`] now; this module keeps the path backend implementers have used.

pub use crate::staging::{
    copier_for, install_loader, register_device_copy, stage, stage_with, Copier, DeviceCopy, DeviceKind, Loader, Staged,
};
