//! One check of `kiln verify` and what it found: shared by the checks in
//! [`super::verify`] and the offline start in [`super::start`].

use serde::Serialize;

/// The name of the offline-start check ([`super::start`]).
pub const START: &str = "the pod sandbox and the control plane start offline";

/// One check and what it found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// False when the check could not run here (then `ok` is false too and
    /// `details` say why and what to pass).
    pub ran: bool,
    /// What is wrong (empty when `ok`), or what was seen.
    pub details: Vec<String>,
}

impl Check {
    /// A check that ran: ok when nothing is wrong.
    pub fn new(name: impl Into<String>, details: Vec<String>) -> Check {
        Check {
            name: name.into(),
            ok: details.is_empty(),
            ran: true,
            details,
        }
    }

    pub(super) fn not_run(name: &str, why: &str) -> Check {
        Check {
            name: name.into(),
            ok: false,
            ran: false,
            details: vec![why.to_string()],
        }
    }
}
