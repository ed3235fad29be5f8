//! The layer oracle: Go's own readers of a layer (`archive/tar`,
//! `compress/gzip`, klauspost's zstd at containerd 2.1.9's version, and
//! `unpigz`, which containerd prefers when it is on PATH), in one
//! long-running process built by `make deps` from `testkit/go/layeroracle`;
//! and [`LayerOracle::judge`], which reads the same bytes with kiln's
//! reader (`reread_blob`) and says where the two listings differ.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use kiln::domain::node_image::reread::reread_blob;
use kiln::primitives::unpack::LayerCompression;

/// One entry as Go's `archive/tar` returns it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GoEntry {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: i64,
    pub uid: i64,
    pub gid: i64,
    pub size: i64,
    pub mtime: i64,
    pub linkname: String,
    pub sha256: String,
    #[serde(default)]
    pub pax: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub xattrs: Option<Vec<String>>,
}

/// A layer as containerd would read it ([module doc](self)).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub compression: String,
    pub entries: Vec<GoEntry>,
    pub trailing: i64,
    pub diff_id: String,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub unpigz: Option<String>,
}

pub struct LayerOracle {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// The directory holding `unpigz` (`make deps`: Debian's pigz).
pub fn pigz_dir() -> std::path::PathBuf {
    let d = crate::tools::workspace().join(".deps/pigz/usr/bin");
    assert!(
        d.join("unpigz").exists(),
        "{} is missing: run `make deps`",
        d.join("unpigz").display()
    );
    d
}

impl LayerOracle {
    pub fn start() -> Self {
        let bin = crate::tools::workspace().join(".deps/go/bin/layeroracle");
        assert!(
            bin.exists(),
            "{} is missing: run `make deps`",
            bin.display()
        );
        let path = format!(
            "{}:{}",
            pigz_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(bin)
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the layer oracle");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        LayerOracle {
            child,
            stdin,
            stdout,
        }
    }

    /// What Go's readers make of `blob`.
    pub fn list(&mut self, media_type: &str, blob: &[u8]) -> Listing {
        let req = serde_json::json!({"mediaType": media_type, "size": blob.len()});
        writeln!(self.stdin, "{req}").unwrap();
        self.stdin.write_all(blob).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the layer oracle answered {line:?}: {e}"))
    }

    /// kiln's reader and Go's on the same `blob`: `Ok(None)` when kiln
    /// refuses it (with why), `Ok(Some(listing))` when kiln accepts it and
    /// Go reads exactly the same entries, data, diff ID and compression;
    /// `Err` says where they differ for a layer kiln accepted.
    pub fn judge(&mut self, media_type: &str, blob: &[u8]) -> Result<Option<Listing>, String> {
        let how = LayerCompression::of(media_type).expect("a layer media type");
        let mut kilns = Vec::new();
        let read = reread_blob(blob, how, u64::MAX, |e, data| {
            let mut h = Sha256::new();
            std::io::copy(data, &mut h)?;
            kilns.push((e.clone(), hex::encode(h.finalize())));
            Ok(())
        });
        let Ok(read) = read else {
            return Ok(None);
        };
        let go = self.list(media_type, blob);
        let want = match how {
            LayerCompression::Gzip => "gzip",
            LayerCompression::Zstd => "zstd",
            LayerCompression::None => "none",
        };
        let mut diffs = Vec::new();
        if let Some(e) = &go.error {
            diffs.push(format!("Go refuses it: {e}"));
        }
        if go.compression != want {
            diffs.push(format!(
                "containerd detects {} from its bytes, its media type says {want}",
                go.compression
            ));
        }
        if go.trailing != 0 {
            diffs.push(format!(
                "Go reads {} bytes after the archive's end",
                go.trailing
            ));
        }
        if go.error.is_none() && go.diff_id != read.diff_id.to_string() {
            diffs.push(format!("diff ID: Go {} kiln {}", go.diff_id, read.diff_id));
        }
        if let Some(u) = &go.unpigz {
            if u != &go.diff_id {
                diffs.push(format!("unpigz reads {u}, Go {}", go.diff_id));
            }
        }
        if go.entries.len() != kilns.len() {
            diffs.push(format!(
                "Go reads {} entries ({:?}), kiln {}",
                go.entries.len(),
                go.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
                kilns.len()
            ));
        }
        for (g, (k, sum)) in go.entries.iter().zip(&kilns) {
            let kind = if k.dir { "5" } else { "0" };
            let same = g.name.trim_end_matches('/') == k.path.to_string_lossy()
                && g.kind == kind
                && g.mode == i64::from(k.mode)
                && u64::try_from(g.uid).ok() == Some(k.owner.0)
                && u64::try_from(g.gid).ok() == Some(k.owner.1)
                && u64::try_from(g.size).ok() == Some(k.size)
                && u64::try_from(g.mtime).ok() == Some(k.mtime)
                && g.linkname.is_empty()
                && &g.sha256 == sum
                && g.pax.is_none()
                && g.xattrs.is_none();
            if !same {
                diffs.push(format!("Go reads {g:?}, kiln {k:?} with data {sum}"));
            }
        }
        if diffs.is_empty() {
            Ok(Some(go))
        } else {
            Err(diffs.join("; "))
        }
    }
}

impl Drop for LayerOracle {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
