//! Long synchronous work (unpacking a layer, writing kiln's layer) called
//! from async code: run where the runtime can still poll the rest. On the
//! multi-threaded runtime kiln runs, `block_in_place` hands this worker's
//! other tasks to another thread for as long as the work lasts; elsewhere
//! (a current-thread runtime in a test, no runtime) it simply runs.

/// Runs `f` without holding up the runtime's other tasks.
pub fn off_runtime<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}
