//! Errors every layer may raise and the command line maps to exit codes.

/// Input the user must fix (manifest, flags, a base or release that cannot
/// work): exit code 2, wherever in the chain of causes it sits.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);
