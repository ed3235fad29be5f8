//! Errors every layer may raise and the command line maps to exit codes.

/// Input the user must fix (manifest, flags, a base or release that cannot
/// work): exit code 2, wherever in the chain of causes it sits.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// `kiln verify` checked everything it could, and all of that passed, but
/// some checks could not run here (a foreign platform's CRI view without
/// emulation): exit code 3, "verified except what was not run".
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotVerified(pub String);

/// Some images failed; the rest were kept, and each failure was reported
/// on its own line: exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PartialFailure(pub String);

/// A sink could not take a blob's bytes but can now (a registry's token
/// expired during a long push and was renewed): the copy engine sends the
/// same blob once more, from a new stream. The engine knows no protocol;
/// a sink says this only after it did what makes a second try succeed.
#[derive(Debug, thiserror::Error)]
#[error("{0}; sending it again")]
pub struct SendAgain(pub String);

/// Every place asked answered that it has no such thing (a registry's 404
/// for a manifest): not an outage, not a refusal. Callers that may meet a
/// first time (the `--push` tag's image before the first push) look for it
/// in the chain; anything else is an answer to report.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotFound(pub String);

/// No place asked could be reached at all (DNS, refused, no route, TLS):
/// the network or the registry is down, not the input (exit 1). Callers
/// that would take a failed read as bad input look for it in the chain.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);
