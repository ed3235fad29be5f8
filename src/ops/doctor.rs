//! `kiln doctor`: this machine against what kiln needs to run (docs: the
//! README's "Install"): what is there, what is missing, and how to get it.
//! It reads files and PATH only (an existing cache is opened as a build
//! would); it runs nothing and creates nothing.

use serde::Serialize;

use crate::adapters::version::Version;
use crate::primitives::platform::Platform;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DoctorReport {
    pub checks: Vec<Need>,
    /// Whether everything kiln cannot work without is here.
    pub ready: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Need {
    pub name: String,
    /// What it is for.
    pub for_what: String,
    /// kiln cannot build without it (others serve one feature).
    pub required: bool,
    pub ok: bool,
    /// What was found, or what is missing.
    pub found: String,
    /// How to get it, when it is missing or too old.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The tested containerd lines (`make deps`: Debian trixie's 1.7, forky's 2.x).
const TESTED: &str = "1.7 and 2.x are tested; 1.6.25+ and 1.7.10+ pin reliably";

/// Checks this machine. `containerd`: `--containerd`, else PATH's.
pub fn doctor(containerd: Option<&std::path::Path>) -> DoctorReport {
    let mut checks = Vec::new();
    let which = crate::adapters::rootfs::which;
    // containerd: required, and new enough to report pins.
    let ctd = containerd
        .map(|p| p.to_path_buf())
        .or_else(|| which("containerd"));
    checks.push(match ctd {
        None => Need {
            name: "containerd".into(),
            for_what: "writing every store (kiln runs its own, privately)".into(),
            required: true,
            ok: false,
            found: "not on PATH".into(),
            fix: Some(format!(
                "Debian/Ubuntu: apt-get install containerd; or pass --containerd PATH ({TESTED})"
            )),
        },
        Some(p) => {
            let v = Version::of_binary(&p);
            let (ok, found, fix) = match &v {
                Ok(v) if v.pins_reliably() => (true, format!("{v} at {}", p.display()), None),
                Ok(v) => (
                    false,
                    format!("{v} at {}: pins images unreliably", p.display()),
                    Some(format!("a newer containerd ({TESTED})")),
                ),
                Err(e) => (
                    false,
                    format!("{}: no version read: {e:#}", p.display()),
                    Some(format!("a containerd release ({TESTED})")),
                ),
            };
            Need {
                name: "containerd".into(),
                for_what: "writing every store (kiln runs its own, privately)".into(),
                required: true,
                ok,
                found,
                fix,
            }
        }
    });
    let optional = |name: &str, for_what: &str, fix: &str| {
        let found = which(name);
        Need {
            name: name.into(),
            for_what: for_what.into(),
            required: false,
            ok: found.is_some(),
            fix: found.is_none().then(|| fix.to_string()),
            found: found.map_or("not on PATH".into(), |p| p.display().to_string()),
        }
    };
    checks.push(optional(
        "runc",
        "kiln verify --start (the node's static pods, offline)",
        "Debian/Ubuntu: apt-get install runc",
    ));
    // The emulator for the other common architecture.
    let other = if Platform::host().architecture == "amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    if let Some(q) = Platform::parse(other).ok().and_then(|p| p.qemu_name()) {
        let mut need = optional(
            &format!("qemu-{q}"),
            &format!("kiln verify of a {other} node on this machine (user-mode emulation)"),
            "Debian/Ubuntu: apt-get install qemu-user; or pass --qemu PATH",
        );
        if !need.ok {
            if let Some(p) = which(&format!("qemu-{q}-static")) {
                need.ok = true;
                need.found = p.display().to_string();
                need.fix = None;
            }
        }
        checks.push(need);
    }
    // The cache: kiln works without one, slower.
    let cache = crate::sink::cache::default_dir();
    let fresh = cache.as_deref().filter(|d| !d.exists());
    checks.push(
        match fresh.map(Ok).or_else(|| {
            cache
                .as_deref()
                .map(|d| crate::sink::cache::Cache::open(d).map(|_| d))
        }) {
            Some(Ok(d)) if fresh.is_some() => Need {
                name: "cache".into(),
                for_what: "builds that share blobs".into(),
                required: false,
                ok: true,
                found: format!("{} (made by the first build)", d.display()),
                fix: None,
            },
            Some(Ok(d)) => Need {
                name: "cache".into(),
                for_what: "builds that share blobs".into(),
                required: false,
                ok: true,
                found: d.display().to_string(),
                fix: None,
            },
            Some(Err(e)) => Need {
                name: "cache".into(),
                for_what: "builds that share blobs".into(),
                required: false,
                ok: false,
                found: format!("{e:#}"),
                fix: Some("make it yours and private (chmod 0700), or pass --cache-dir DIR".into()),
            },
            None => Need {
                name: "cache".into(),
                for_what: "builds that share blobs".into(),
                required: false,
                ok: false,
                found: "neither XDG_CACHE_HOME nor HOME is set".into(),
                fix: Some("set HOME, or pass --cache-dir DIR".into()),
            },
        },
    );
    // Registry credentials: none is fine for public registries.
    checks.push(
        match crate::adapters::registry::credentials::Credentials::load() {
            Ok(_) => Need {
                name: "registry credentials".into(),
                for_what: "private registries (Docker's config.json)".into(),
                required: false,
                ok: true,
                found: "readable (or none: public registries only)".into(),
                fix: None,
            },
            Err(e) => Need {
                name: "registry credentials".into(),
                for_what: "private registries (Docker's config.json)".into(),
                required: false,
                ok: false,
                found: format!("{e:#}"),
                fix: Some("fix $DOCKER_CONFIG/config.json (docker login rewrites it)".into()),
            },
        },
    );
    let ready = checks.iter().all(|c| c.ok || !c.required);
    DoctorReport { checks, ready }
}
