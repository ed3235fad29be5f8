//! Kubernetes versions as kiln reads them from untrusted places (an
//! image's `/kind/version`, a release's `version` file): checked once here,
//! for kind's contract, a release, and kubeadm's image names alike.

/// The most a tag may hold (Docker's grammar, `[\w][\w.-]{0,127}`): a
/// version longer than this cannot name kubeadm's images.
const MAX_TAG_LEN: usize = 128;

/// Whether `v` is a Kubernetes version kiln can name images with: what
/// Go's `version.ParseSemantic` takes (`v1.34.1`, `v1.37.0-rc.1`,
/// `v1.34.1+abc`; a leading `v` optional), its pre-release and build parts
/// of `[0-9A-Za-z.-]`, and short enough to be a tag. Versions come from
/// untrusted places (an image's `/kind/version`, a release's `version`).
pub fn check(v: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "{:?} is not a Kubernetes version like v1.34.1 ({why})",
            crate::primitives::text::one_line(v)
        ))
    };
    if v.len() > MAX_TAG_LEN {
        return bad("longer than a tag may be");
    }
    let rest = v.strip_prefix('v').unwrap_or(v);
    let (core, suffix) = match rest.find(['-', '+']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3
        || !parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
    {
        return bad("MAJOR.MINOR.PATCH");
    }
    let ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    let (pre, build) = match suffix.split_once('+') {
        Some((pre, build)) => (pre, Some(build)),
        None => (suffix, None),
    };
    if let Some(pre) = pre.strip_prefix('-') {
        if !ok(pre) {
            return bad("the pre-release part");
        }
    } else if !pre.is_empty() {
        return bad("the pre-release part");
    }
    if build.is_some_and(|b| !ok(b)) {
        return bad("the build part");
    }
    Ok(())
}
