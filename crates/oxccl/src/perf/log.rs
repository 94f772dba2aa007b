//! oxccl's log: events go through `tracing` (targets are module paths: `oxccl::cpu::selector`,
//! `oxccl::perf`, ...), so an application that has its own subscriber sees them there. When
//! it has none, [`install`] sets one that writes to stderr, filtered by `OXCCL_LOG` (default
//! `warn`), once per process, before the first communicator is made.

use std::sync::OnceLock;

static INSTALLED: OnceLock<()> = OnceLock::new();

/// Installs the stderr subscriber with `directives` (as
/// [`log_directives`](crate::config::log_directives) writes them), unless this process
/// already has a global subscriber or this ran before.
pub(crate) fn install(directives: &str) {
    INSTALLED.get_or_init(|| {
        if tracing::dispatcher::has_been_set() {
            return;
        }
        let Ok(filter) = tracing_subscriber::EnvFilter::try_new(directives) else { return };
        // Fails only when another subscriber won the race: then that one logs.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(true)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init();
    });
}
