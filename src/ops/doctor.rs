//! `kiln doctor`: this machine against what kiln needs to run (its list:
//! docs/install.md): what is there, what is missing, and how to get it.
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

impl Need {
    /// A need: `found` is what was found (ok), or what is missing and how
    /// to get it.
    fn new(
        name: &str,
        for_what: &str,
        required: bool,
        found: Result<String, (String, String)>,
    ) -> Need {
        let (ok, found, fix) = match found {
            Ok(f) => (true, f, None),
            Err((f, fix)) => (false, f, Some(fix)),
        };
        Need {
            name: name.into(),
            for_what: for_what.into(),
            required,
            ok,
            found,
            fix,
        }
    }
}

/// A program on PATH, or what is missing and `fix`.
fn on_path(name: &str, fix: &str) -> Result<String, (String, String)> {
    crate::adapters::rootfs::which(name)
        .map(|p| p.display().to_string())
        .ok_or_else(|| ("not on PATH".into(), fix.into()))
}

/// Checks this machine. `containerd`: `--containerd`, else PATH's.
pub fn doctor(containerd: Option<&std::path::Path>) -> DoctorReport {
    // containerd: required, and new enough to report pins. Its version is
    // read from its file, never by running it.
    let ctd = match containerd {
        Some(p) => Ok(p.to_path_buf()),
        None => crate::adapters::rootfs::which("containerd").ok_or_else(|| {
            (
                "not on PATH".to_string(),
                format!("Debian/Ubuntu: apt-get install containerd; or pass --containerd PATH ({TESTED})"),
            )
        }),
    };
    let ctd = ctd.and_then(|p| {
        let v = std::fs::File::open(&p)
            .map_err(anyhow::Error::from)
            .and_then(|f| Version::of_elf(&f));
        match v {
            Ok(v) if v.pins_reliably() => Ok(format!("{v} at {}", p.display())),
            Ok(v) => Err((
                format!("{v} at {}: pins images unreliably", p.display()),
                format!("a newer containerd ({TESTED})"),
            )),
            Err(e) => Err((
                format!("{}: no version read: {e:#}", p.display()),
                format!("a containerd release ({TESTED})"),
            )),
        }
    });
    let mut checks = vec![
        Need::new(
            "containerd",
            "writing every store (kiln runs its own, privately)",
            true,
            ctd,
        ),
        Need::new(
            "runc",
            "kiln verify --start (the node's static pods, offline)",
            false,
            on_path("runc", "Debian/Ubuntu: apt-get install runc"),
        ),
    ];
    // The emulator for the other common architecture.
    let other = if Platform::host().architecture == "amd64" {
        "linux/arm64"
    } else {
        "linux/amd64"
    };
    if let Some(q) = Platform::parse(other).ok().and_then(|p| p.qemu_name()) {
        let fix = "Debian/Ubuntu: apt-get install qemu-user; or pass --qemu PATH";
        checks.push(Need::new(
            &format!("qemu-{q}"),
            &format!("kiln verify of a {other} node on this machine (user-mode emulation)"),
            false,
            on_path(&format!("qemu-{q}"), fix)
                .or_else(|_| on_path(&format!("qemu-{q}-static"), fix)),
        ));
    }
    // The cache: kiln works without one, slower. One not made yet is fine.
    let cache = match crate::sink::cache::default_dir() {
        None => Err((
            "neither XDG_CACHE_HOME nor HOME is set".to_string(),
            "set HOME, or pass --cache-dir DIR".to_string(),
        )),
        Some(d) if !d.exists() => Ok(format!("{} (made by the first build)", d.display())),
        // Judged as a build would open it, but nothing made or locked.
        Some(d) => crate::sink::cache::check(&d)
            .map(|_| d.display().to_string())
            .map_err(|e| {
                (
                    format!("{e:#}"),
                    "make it yours and private (chmod 0700), or pass --cache-dir DIR".to_string(),
                )
            }),
    };
    checks.push(Need::new("cache", "builds that share blobs", false, cache));
    // Registry credentials: none is fine for public registries.
    checks.push(Need::new(
        "registry credentials",
        "private registries (Docker's config.json)",
        false,
        crate::adapters::registry::credentials::Credentials::load()
            .map(|_| "readable (or none: public registries only)".to_string())
            .map_err(|e| {
                (
                    format!("{e:#}"),
                    "fix $DOCKER_CONFIG/config.json (docker login rewrites it)".to_string(),
                )
            }),
    ));
    let ready = checks.iter().all(|c| c.ok || !c.required);
    DoctorReport { checks, ready }
}
