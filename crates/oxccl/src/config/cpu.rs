//! The settings of the `cpu` backend, as resolved from the builder, the environment and the
//! defaults ([`registry`](super::registry)).

use std::fmt;
use std::time::Duration;

/// Which transports carry the traffic (`OXCCL_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory within a host, TCP across hosts.
    Auto,
    /// Shared memory only (every rank must be on one host).
    Shm,
    /// TCP for everything, also within a host (for testing).
    Tcp,
}

/// How the ranks of a job of processes find each other (`OXCCL_BOOTSTRAP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BootstrapMode {
    /// Through the launcher's PMIx where it runs one and its library loads, else the store.
    #[default]
    Auto,
    /// Through oxccl's TCP store.
    Store,
    /// Through PMIx; setup fails when the process was not started under PMIx.
    Pmix,
}

/// A secret's text; its `Debug` form hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(pub String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText(<hidden>)")
    }
}

/// Settings of the `cpu` backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSettings {
    /// Which transports to use (`OXCCL_TRANSPORT`).
    pub transport: TransportChoice,
    /// Bytes per slot of the shared-memory collectives (`OXCCL_SHM_SLOT_BYTES`).
    pub shm_slot_bytes: usize,
    /// Whether large moves read straight from the peers' buffers (`OXCCL_SHM_SINGLE_COPY`).
    pub shm_single_copy: bool,
    /// Bytes per shared-memory ring between two ranks (`OXCCL_SHM_RING_BYTES`).
    pub shm_ring_bytes: usize,
    /// How long a shared-memory wait busy-polls (`OXCCL_SPIN_US`); `None`: chosen from the
    /// host's ranks and CPUs.
    pub spin: Option<Duration>,
    /// How long a shared-memory wait then polls yielding the CPU before it sleeps
    /// (`OXCCL_YIELD_US`); `None`: chosen from the host's ranks and CPUs.
    pub yield_for: Option<Duration>,
    /// A profile of measured costs for the algorithm choice (`OXCCL_TUNE_FILE`).
    pub tune_file: Option<std::path::PathBuf>,
    /// The network interfaces TCP may use (`OXCCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// The largest frame payload sent or accepted (`OXCCL_MAX_FRAME`).
    pub max_frame: usize,
    /// TCP connections per pair of ranks on different hosts (`OXCCL_SOCKETS_PER_PEER`).
    pub sockets_per_peer: usize,
    /// This process's host identity, when overridden (`OXCCL_HOST_ID`).
    pub host_id: Option<String>,
    /// Stage every buffer through host temporaries, as device buffers are
    /// (`OXCCL_CPU_FORCE_STAGING`; tests the device path without a GPU).
    pub force_staging: bool,
    /// `host:port` of a running store (`OXCCL_STORE_ADDR`).
    pub store_addr: Option<String>,
    /// The port of the store rank 0 hosts (`OXCCL_STORE_PORT`).
    pub store_port: Option<u16>,
    /// The job secret (`OXCCL_SECRET`).
    pub secret: Option<SecretText>,
    /// How the ranks find each other (`OXCCL_BOOTSTRAP`).
    pub bootstrap: BootstrapMode,
    /// The PMIx library to load instead of searching (`OXCCL_PMIX_LIBRARY`).
    pub pmix_library: Option<std::path::PathBuf>,
    /// `init` joins a running job as a newcomer (`OXCCL_JOIN`).
    pub join: bool,
}
