//! Twenty releases of a kindest/node-like image through the planner's own
//! `choose` and `order::arrange` (issue 53.7): what an upgrader's
//! `docker pull` (classic store: every layer from the first changed one
//! on) and a first pull fetch at each release, for 0, 25 and 50 % kept.
//! `cargo test --lib kept::simulate -- --nocapture` prints the table
//! docs/performance.md shows.

use std::collections::HashSet;

use super::super::order::arrange;
use super::super::plan::Part;
use super::super::LayerBlob;
use super::Keep;
use crate::primitives::digest::Digest;
use crate::primitives::oci::{media, Descriptor};

const MIB: u64 = 1 << 20;

/// A part of the node: its name, size (MiB, tenths), whether only images
/// tagged with the Kubernetes version hold it, and every how many
/// releases it changes (and at which phase).
struct Component {
    name: &'static str,
    tenths: u64,
    versioned: bool,
    every: u32,
    phase: u32,
}

const fn c(name: &'static str, tenths: u64, versioned: bool, every: u32, phase: u32) -> Component {
    Component {
        name,
        tenths,
        versioned,
        every,
        phase,
    }
}

/// Sizes as kindest/node v1.31's images have them (compressed); how often
/// each changes, as patch releases of a year go.
const COMPONENTS: &[Component] = &[
    c("etcd", 220, false, 4, 1),
    c("coredns", 160, false, 6, 3),
    c("distroless-static", 10, false, 5, 2),
    c("kindnetd", 120, false, 5, 4),
    c("local-path-provisioner", 140, false, 7, 5),
    c("debian-base", 120, false, 9, 6),
    c("go-runner", 20, true, 3, 0),
    c("debian-iptables", 120, true, 2, 0),
    c("kube-apiserver", 280, true, 1, 0),
    c("kube-controller-manager", 260, true, 1, 0),
    c("kube-scheduler", 180, true, 1, 0),
    c("kube-proxy", 140, true, 1, 0),
];

fn version(comp: &Component, release: u32) -> u32 {
    (release + comp.phase) / comp.every
}

fn layer(name: String, size: u64) -> LayerBlob {
    LayerBlob::named(&name, size)
}

/// Release `r`'s planned layers (the node's own apart) and the versioned set.
fn planned(r: u32) -> (Vec<(Part, LayerBlob)>, LayerBlob, HashSet<String>) {
    let mut layers = Vec::new();
    let mut versioned = HashSet::new();
    for comp in COMPONENTS {
        let l = layer(
            format!("{}@{}", comp.name, version(comp, r)),
            comp.tenths * MIB / 10,
        );
        let hex = l.digest.hex().to_string();
        if comp.versioned {
            versioned.insert(hex.clone());
        }
        layers.push((Part::Blob(hex), l));
    }
    layers.push((Part::SmallBlobs, layer(format!("small@{}", r / 6), MIB)));
    layers.push((Part::Release, layer(format!("release@{r}"), 90 * MIB)));
    layers.push((Part::Documents, layer(format!("docs@{r}"), MIB / 8)));
    (layers, layer(format!("node@{r}"), 2 * MIB), versioned)
}

/// One release's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Row {
    changed: u64,
    pulled: u64,
    kept: u64,
    first: u64,
}

/// Twenty releases at `percent`: each release's row (the first has no
/// upgrade).
fn run(percent: u8) -> Vec<Row> {
    let base = vec![Descriptor::new(
        media::OCI_LAYER_GZIP,
        Digest::of(b"kindest/base"),
        40 * MIB,
    )];
    let mut previous: Option<Vec<Descriptor>> = None;
    let mut rows = Vec::new();
    for r in 1..=20 {
        let (mut layers, node, versioned) = planned(r);
        let mut kept_bytes = 0;
        if let Some(prev) = &previous {
            let choice = Keep {
                previous: prev,
                base: &base,
                room: 63,
                percent,
            }
            .choose(layers.iter().map(|(_, l)| l), usize::MAX);
            // Never kept at a loss: what is kept saves more than it costs.
            assert!(choice.keep.is_empty() || choice.saves > choice.costs);
            for d in &choice.keep {
                kept_bytes += d.size;
                layers.push((Part::Kept, layer(String::new(), d.size)));
                layers.last_mut().unwrap().1.digest = d.digest.clone();
            }
        }
        layers.push((Part::Node, node));
        let ordered = arrange(layers, previous.as_deref(), &versioned);
        let full: Vec<Descriptor> = base
            .iter()
            .cloned()
            .chain(
                ordered
                    .iter()
                    .map(|l| Descriptor::new(l.media_type, l.digest.clone(), l.size)),
            )
            .collect();
        let first: u64 = full.iter().map(|d| d.size).sum();
        let row = match &previous {
            None => Row {
                first,
                ..Default::default()
            },
            Some(prev) => {
                let had: HashSet<&Digest> = prev.iter().map(|d| &d.digest).collect();
                let changed = full
                    .iter()
                    .filter(|d| !had.contains(&d.digest))
                    .map(|d| d.size)
                    .sum();
                // Docker's classic store: from the first layer not in its
                // place (its chain), every layer is fetched.
                let same = full
                    .iter()
                    .zip(prev)
                    .take_while(|(a, b)| a.digest == b.digest)
                    .count();
                let pulled = full[same..].iter().map(|d| d.size).sum();
                Row {
                    changed,
                    pulled,
                    kept: kept_bytes,
                    first,
                }
            }
        };
        rows.push(row);
        previous = Some(full);
    }
    rows
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / MIB as f64)
}

/// The table, and the properties the choice of the default rests on.
#[test]
fn twenty_releases_at_0_25_and_50_percent() {
    let runs: Vec<(u8, Vec<Row>)> = [0u8, 25, 50].into_iter().map(|p| (p, run(p))).collect();
    let mut table = String::from(
        "| release | changed | pulled 0 % | pulled 25 % | pulled 50 % | kept 25 % | kept 50 % | first pull 0 % | 25 % | 50 % |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in 1..20 {
        let at = |p: usize| runs[p].1[r];
        table.push_str(&format!(
            "| v{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r + 1,
            mib(at(0).changed),
            mib(at(0).pulled),
            mib(at(1).pulled),
            mib(at(2).pulled),
            mib(at(1).kept),
            mib(at(2).kept),
            mib(at(0).first),
            mib(at(1).first),
            mib(at(2).first),
        ));
    }
    let total = |p: usize, f: fn(&Row) -> u64| -> u64 { runs[p].1[1..].iter().map(f).sum() };
    table.push_str(&format!(
        "| v2–v20 | {} | {} | {} | {} | | | {} | {} | {} |\n",
        mib(total(0, |r| r.changed)),
        mib(total(0, |r| r.pulled)),
        mib(total(1, |r| r.pulled)),
        mib(total(2, |r| r.pulled)),
        mib(total(0, |r| r.first)),
        mib(total(1, |r| r.first)),
        mib(total(2, |r| r.first)),
    ));
    eprintln!("{table}");
    let (p0, p25, p50) = (
        total(0, |r| r.pulled),
        total(1, |r| r.pulled),
        total(2, |r| r.pulled),
    );
    let (f0, f25, f50) = (
        total(0, |r| r.first),
        total(1, |r| r.first),
        total(2, |r| r.first),
    );
    // Keeping saves upgraders bytes, never costs them.
    assert!(p25 < p0 && p50 <= p25, "{p0} {p25} {p50}");
    // First pulls pay at most the share.
    for (p, rows) in &runs {
        for (a, z) in runs[0].1.iter().zip(rows) {
            assert!(z.first - a.first <= a.first * u64::from(*p) / 100 + MIB);
        }
    }
    // No release freezes at the cap saving nothing: each one's pull is
    // within what it changed plus what the chain breaks on.
    for (_, rows) in &runs[1..] {
        for r in &rows[1..] {
            assert!(r.pulled >= r.changed.saturating_sub(r.kept));
        }
    }
    eprintln!(
        "pulled v2–v20: 0 % {}, 25 % {}, 50 % {} MiB; first pulls +{:.1} % at 25 %, +{:.1} % at 50 %",
        mib(p0),
        mib(p25),
        mib(p50),
        (f25 as f64 / f0 as f64 - 1.0) * 100.0,
        (f50 as f64 / f0 as f64 - 1.0) * 100.0
    );
    // The default (50 %): first pulls pay under a tenth more over the
    // twenty releases, for upgraders' savings no lower share reaches.
    assert!(f50 * 10 <= f0 * 11, "{f0} {f50}");
    assert!(p0 - p50 >= p0 - p25, "{p0} {p25} {p50}");
}
