//! A node image as `kind create cluster` reads it, checked before release.
//!
//! The facts, from kind's own source (kubernetes-sigs/kind, v0.20 to main
//! at fed26882; re-read them there before changing a rule here):
//! - `/kind/version`: exactly one line that parses as a semantic version
//!   (`pkg/cluster/nodeutils/util.go` `KubeVersion`); it picks the kubeadm
//!   config API and the cgroup driver.
//! - `/kind/manifests/default-cni.yaml`: run through Go's text/template with
//!   a struct holding only `PodSubnet` **if** the file contains
//!   [`TEMPLATE_MARKER`]; a control-plane endpoint env is added by a JSON
//!   patch of the DaemonSet's first container **if** it contains
//!   [`PATCH_MARKER`]; otherwise applied verbatim with `kubectl create`
//!   (`pkg/cluster/internal/create/actions/installcni/cni.go`).
//! - `/kind/manifests/default-storage.yaml`: applied as it is
//!   (`.../actions/installstorage/storage.go`); kind's own makes the default
//!   StorageClass `standard`.
//! - The image config: entrypoint `/usr/local/bin/entrypoint /sbin/init`
//!   (`pkg/build/nodeimage/buildcontext.go`, `docker commit --change`).
//! - The kubelet unit runs `/usr/bin/kubelet`; kind's build installs
//!   kubelet, kubeadm and kubectl there (`buildcontext.go`).

use std::path::Path;

use serde::Serialize;

use crate::primitives::inroot::Root;
use crate::primitives::platform::Platform;
use crate::primitives::reference::ImageRef;

/// kind templates default-cni.yaml only when it contains this text.
pub const TEMPLATE_MARKER: &str = "would you kindly template this file";
/// kind patches in the control-plane endpoint only when it contains this text.
pub const PATCH_MARKER: &str = "would you kindly patch this file";
/// The one field kind's template data has.
pub const POD_SUBNET_FIELD: &str = "PodSubnet";
/// What `kiln verify --kind` substitutes (kind's default IPv4 pod subnet).
pub const SAMPLE_POD_SUBNET: &str = "10.244.0.0/16";
/// kind's node entrypoint, as the image config must carry it.
pub const ENTRYPOINT: [&str; 2] = ["/usr/local/bin/entrypoint", "/sbin/init"];

/// One broken promise: the file (or config) and what is wrong with it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub file: String,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.what)
    }
}

fn problem(file: &str, what: impl Into<String>) -> Problem {
    Problem {
        file: file.to_string(),
        what: what.into(),
    }
}

/// default-cni.yaml as kind hands it to `kubectl create`: templated with
/// `pod_subnet` when it carries the marker. Go's template fails on any
/// action but `.PodSubnet` (the data has no other field), so does this.
pub fn render_cni(text: &str, pod_subnet: &str) -> Result<String, String> {
    if !text.contains(TEMPLATE_MARKER) {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| "an unclosed {{ (Go's template parser refuses it)".to_string())?;
        // `{{- x -}}` trims surrounding space in Go; kind's file has none.
        let action = after[..close].trim_matches('-').trim();
        if action != format!(".{POD_SUBNET_FIELD}") {
            return Err(format!(
                "template action {{{{{}}}}}: kind's data has only .{POD_SUBNET_FIELD}",
                &after[..close]
            ));
        }
        out.push_str(pod_subnet);
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every image a Kubernetes manifest runs: each `image:` of a container, and
/// what hides in strings: a `--helper-image` argument, and YAML inside a
/// ConfigMap's data (local-path's `helperPod.yaml`). Sorted, distinct.
pub fn images_run(yaml: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let v = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| format!("does not parse as YAML: {e}"))?;
        collect_images(&v, &mut out);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn collect_images(v: &serde_yaml_ng::Value, out: &mut Vec<String>) {
    use serde_yaml_ng::Value;
    match v {
        Value::Mapping(m) => {
            for (k, val) in m {
                match (k.as_str(), val) {
                    (Some("image"), Value::String(s)) => out.push(s.clone()),
                    (_, Value::String(s)) if s.contains("image:") => {
                        // YAML carried in a string (a ConfigMap's helperPod.yaml).
                        if let Ok(inner) = serde_yaml_ng::from_str::<Value>(s) {
                            collect_images(&inner, out);
                        }
                    }
                    _ => collect_images(val, out),
                }
            }
        }
        Value::Sequence(items) => {
            let mut it = items.iter().peekable();
            while let Some(item) = it.next() {
                if item.as_str() == Some("--helper-image") {
                    if let Some(Value::String(s)) = it.peek() {
                        out.push(s.clone());
                    }
                }
                collect_images(item, out);
            }
        }
        Value::Tagged(t) => collect_images(&t.value, out),
        _ => {}
    }
}

/// The images a node's two kind manifests run (CNI rendered first, as kind
/// does, so its template field does not break the YAML).
pub fn addon_images(cni: &str, storage: &str) -> Result<Vec<String>, String> {
    let cni = render_cni(cni, SAMPLE_POD_SUBNET).map_err(|e| format!("default-cni.yaml: {e}"))?;
    let mut all = images_run(&cni).map_err(|e| format!("default-cni.yaml {e}"))?;
    all.extend(images_run(storage).map_err(|e| format!("default-storage.yaml {e}"))?);
    all.sort();
    all.dedup();
    Ok(all)
}

/// Whether the documents hold the default StorageClass `standard`.
fn has_default_standard_class(yaml: &str) -> bool {
    serde_yaml_ng::Deserializer::from_str(yaml).any(|doc| {
        let Ok(v) = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc) else {
            return false;
        };
        v["kind"].as_str() == Some("StorageClass")
            && v["metadata"]["name"].as_str() == Some("standard")
            && v["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"].as_str()
                == Some("true")
    })
}

/// What the contract found, for the report and the bundled-image check.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindView {
    /// `/kind/version`'s one line, if it is one.
    pub version: Option<String>,
    /// Images the two manifests run (normalised, as CRI names them).
    pub addon_images: Vec<String>,
    pub problems: Vec<Problem>,
}

/// Reads a node the way `kind create cluster` does and lists every broken
/// promise. `config` is the image config (`None` for a bare rootfs).
pub fn check(root: &Root, platform: &Platform, config: Option<&serde_json::Value>) -> KindView {
    let mut view = KindView::default();
    let version_file = format!("/{}", super::VERSION_FILE);
    match root.read(Path::new(super::VERSION_FILE)) {
        Ok(Some(b)) => match parse_version_file(&b) {
            Ok(v) => view.version = Some(v),
            Err(e) => view.problems.push(problem(&version_file, e)),
        },
        Ok(None) => view.problems.push(problem(
            &version_file,
            "missing: kind fails with \"failed to get kubernetes version\"; build with --kubernetes SRC",
        )),
        Err(e) => view.problems.push(problem(&version_file, e.to_string())),
    }
    let cni_file = format!("/{}", super::CNI_MANIFEST);
    match root.read(Path::new(super::CNI_MANIFEST)) {
        Ok(Some(b)) => {
            let text = String::from_utf8_lossy(&b);
            for marker in [TEMPLATE_MARKER, PATCH_MARKER] {
                if !text.contains(marker) {
                    view.problems.push(problem(
                        &cni_file,
                        format!(
                            "lacks the line \"# {marker}\": kind applies it without {}",
                            if marker == TEMPLATE_MARKER {
                                "filling in {{ .PodSubnet }}"
                            } else {
                                "the control-plane endpoint"
                            }
                        ),
                    ));
                }
            }
            match render_cni(&text, SAMPLE_POD_SUBNET) {
                Ok(r) => {
                    // In a comment it is harmless; anywhere else kubectl
                    // gets it verbatim.
                    if let Some(line) = r
                        .lines()
                        .find(|l| l.contains("{{") && !l.trim_start().starts_with('#'))
                    {
                        view.problems.push(problem(
                            &cni_file,
                            format!(
                                "a template field is left after kind's step: {}",
                                line.trim()
                            ),
                        ));
                    }
                    match images_run(&r) {
                        Ok(i) => view.addon_images.extend(i),
                        Err(e) => view.problems.push(problem(
                            &cni_file,
                            format!("after substituting PodSubnet, {e}"),
                        )),
                    }
                }
                Err(e) => view.problems.push(problem(&cni_file, e)),
            }
        }
        Ok(None) => view.problems.push(problem(
            &cni_file,
            "missing: the cluster would have no pod network",
        )),
        Err(e) => view.problems.push(problem(&cni_file, e.to_string())),
    }
    let storage_file = format!("/{}", super::STORAGE_MANIFEST);
    match root.read(Path::new(super::STORAGE_MANIFEST)) {
        Ok(Some(b)) => {
            let text = String::from_utf8_lossy(&b);
            match images_run(&text) {
                Ok(i) => view.addon_images.extend(i),
                Err(e) => view.problems.push(problem(&storage_file, e)),
            }
            if !has_default_standard_class(&text) {
                view.problems.push(problem(
                    &storage_file,
                    "has no default StorageClass named standard",
                ));
            }
        }
        Ok(None) => view.problems.push(problem(
            &storage_file,
            "missing: kind falls back to a host-path StorageClass",
        )),
        Err(e) => view.problems.push(problem(&storage_file, e.to_string())),
    }
    view.addon_images = view
        .addon_images
        .iter()
        .map(|i| match ImageRef::parse(i) {
            Ok(r) => r.tagged_name().unwrap_or_else(|| r.to_string()),
            Err(_) => i.clone(),
        })
        .collect();
    view.addon_images.sort();
    view.addon_images.dedup();
    for b in crate::domain::kubernetes::BINARIES {
        let rel = format!("usr/bin/{b}");
        let file = format!("/{rel}");
        match binary_arch(root, Path::new(&rel)) {
            Ok((mode, arch)) => {
                if mode & 0o777 != 0o755 {
                    view.problems
                        .push(problem(&file, format!("mode {:o}, not 755", mode & 0o7777)));
                }
                match arch {
                    Some(a) if a == platform.architecture => {}
                    Some(a) => view.problems.push(problem(
                        &file,
                        format!("built for {a}, the node is {platform}"),
                    )),
                    None => view.problems.push(problem(&file, "not an ELF executable")),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => view.problems.push(problem(
                &file,
                "missing: kind's kubelet unit runs /usr/bin/kubelet; build with --kubernetes SRC",
            )),
            Err(e) => view.problems.push(problem(&file, e.to_string())),
        }
    }
    if let Some(cfg) = config {
        let ep = &cfg["config"]["Entrypoint"];
        if *ep != serde_json::json!(ENTRYPOINT) {
            view.problems.push(problem(
                "image config",
                format!("Entrypoint is {ep}, kind's nodes run {ENTRYPOINT:?}"),
            ));
        }
    }
    view
}

/// `/kind/version`: one line, a semantic version (kind's `KubeVersion`).
pub fn parse_version_file(bytes: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())?;
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() != 1 {
        return Err(format!("{} lines; kind reads exactly one", lines.len()));
    }
    let v = lines[0].trim();
    crate::domain::kube_version::check(v)?;
    Ok(v.to_string())
}

/// A file's mode and, if it is ELF, its architecture as OCI names it.
pub fn binary_arch(root: &Root, rel: &Path) -> std::io::Result<(u32, Option<String>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = root.open_file(rel)?;
    let mode = f.metadata()?.permissions().mode();
    Ok((
        mode,
        crate::primitives::platform::read_architecture(&mut f)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_template_step_fills_the_subnet_and_refuses_other_fields() {
        let t = format!("# {TEMPLATE_MARKER}\nvalue: {{{{ .PodSubnet }}}}\n");
        assert_eq!(
            render_cni(&t, "10.244.0.0/16").unwrap(),
            format!("# {TEMPLATE_MARKER}\nvalue: 10.244.0.0/16\n")
        );
        let bad = format!("# {TEMPLATE_MARKER}\nvalue: {{{{ .ServiceSubnet }}}}\n");
        assert!(render_cni(&bad, "x").unwrap_err().contains("ServiceSubnet"));
        // Without the marker kind applies it verbatim: the field stays.
        let raw = "value: \"{{ .PodSubnet }}\"\n";
        assert_eq!(render_cni(raw, "x").unwrap(), raw);
    }

    #[test]
    fn images_hide_in_args_and_configmaps() {
        let y = "kind: Deployment\nspec:\n  containers:\n  - image: a/b:1\n    command: [x, --helper-image, c/d:2]\n---\nkind: ConfigMap\ndata:\n  helperPod.yaml: |-\n    spec:\n      containers:\n      - image: e/f:3\n";
        assert_eq!(images_run(y).unwrap(), vec!["a/b:1", "c/d:2", "e/f:3"]);
    }

    #[test]
    fn version_file_is_one_semver_line() {
        assert_eq!(parse_version_file(b"v1.34.1\n").unwrap(), "v1.34.1");
        assert!(parse_version_file(b"v1.37.0-rc.1\n").is_ok());
        assert!(parse_version_file(b"v1.34\n").is_err());
        assert!(parse_version_file(b"v1.34.1\nv1.35.0\n").is_err());
        assert!(parse_version_file(b"").is_err());
    }
}
