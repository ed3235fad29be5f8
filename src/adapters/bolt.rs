//! containerd's metadata database (`meta.db`, a bbolt file) made canonical:
//! read whole, every record's `createdat`/`updatedat` set to one time, and
//! written back as a fresh single-transaction file (keys in order, pages
//! filled in order, no free pages), so its bytes depend only on its contents.
//!
//! Why not a crate: `bbolt-rs` ports bbolt's transactional engine, whose page
//! layout depends on the order writes happened in; kiln needs the opposite,
//! a layout that is a pure function of the tree. Reading and writing the
//! on-disk format (bbolt's `page.go`, `bucket.go` and `db.go` layouts, version
//! 2) is small. Little-endian hosts only, as bbolt files are native-endian.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, ensure};

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const FREELIST: u16 = 0x10;
/// A leaf element that is a nested bucket.
const BUCKET_LEAF: u32 = 0x01;
/// The bucket header before a bucket's root (or inline page).
const BUCKET_HEADER: usize = 16;

/// A bucket: keys in order, each a value or a nested bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bucket {
    pub sequence: u64,
    pub items: BTreeMap<Vec<u8>, Item>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    Value(Vec<u8>),
    Bucket(Bucket),
}

/// A whole database: its page size and root bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Db {
    pub page_size: usize,
    pub root: Bucket,
}

fn u16_at(b: &[u8], at: usize) -> anyhow::Result<u16> {
    Ok(u16::from_le_bytes(
        b.get(at..at + 2)
            .ok_or_else(|| anyhow!("truncated at {at}"))?
            .try_into()?,
    ))
}
fn u32_at(b: &[u8], at: usize) -> anyhow::Result<u32> {
    Ok(u32::from_le_bytes(
        b.get(at..at + 4)
            .ok_or_else(|| anyhow!("truncated at {at}"))?
            .try_into()?,
    ))
}
fn u64_at(b: &[u8], at: usize) -> anyhow::Result<u64> {
    Ok(u64::from_le_bytes(
        b.get(at..at + 8)
            .ok_or_else(|| anyhow!("truncated at {at}"))?
            .try_into()?,
    ))
}

fn fnv64a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A meta page's fields that matter for reading: (txid, root pgid, page size).
fn meta(file: &[u8], at: usize) -> anyhow::Result<(u64, u64, usize)> {
    let m = at + PAGE_HEADER;
    ensure!(u32_at(file, m)? == MAGIC, "not a bbolt file (bad magic)");
    ensure!(u32_at(file, m + 4)? == VERSION, "unsupported bbolt version");
    let sum = u64_at(file, m + 56)?;
    ensure!(
        fnv64a(&file[m..m + 56]) == sum,
        "meta page checksum mismatch"
    );
    let page_size = u32_at(file, m + 8)? as usize;
    Ok((u64_at(file, m + 48)?, u64_at(file, m + 16)?, page_size))
}

impl Db {
    /// Parses a bbolt file (the newer valid meta page wins, as bbolt does).
    pub fn read(file: &[u8]) -> anyhow::Result<Db> {
        let first = meta(file, 0);
        let page_size = match &first {
            Ok((_, _, ps)) => *ps,
            Err(_) => 4096,
        };
        let second = meta(file, page_size);
        let (_, root, page_size) = match (first, second) {
            (Ok(a), Ok(b)) => {
                if b.0 > a.0 {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) | (Err(_), Ok(a)) => a,
            (Err(e), Err(_)) => return Err(e),
        };
        ensure!(
            (512..=1 << 16).contains(&page_size),
            "implausible page size {page_size}"
        );
        let mut r = Reader {
            file,
            page_size,
            depth: 0,
        };
        let items = r.tree(root)?;
        Ok(Db {
            page_size,
            root: Bucket { sequence: 0, items },
        })
    }

    /// The canonical file: meta pages 0 and 1, an empty freelist at 2, then
    /// every bucket's pages depth first, keys in order.
    pub fn write(&self) -> anyhow::Result<Vec<u8>> {
        let mut w = Writer {
            page_size: self.page_size,
            pages: vec![0u8; 3 * self.page_size],
        };
        let root = w.bucket_pages(&self.root)?;
        let high_water = (w.pages.len() / self.page_size) as u64;
        // Freelist: no free pages.
        w.header(2, 2, FREELIST, 0, 0);
        for (id, txid) in [(0u64, 0u64), (1, 1)] {
            w.header(id, id, META, 0, 0);
            let m = id as usize * self.page_size + PAGE_HEADER;
            let mut meta = Vec::with_capacity(64);
            meta.extend_from_slice(&MAGIC.to_le_bytes());
            meta.extend_from_slice(&VERSION.to_le_bytes());
            meta.extend_from_slice(&(self.page_size as u32).to_le_bytes());
            meta.extend_from_slice(&0u32.to_le_bytes());
            meta.extend_from_slice(&root.to_le_bytes());
            meta.extend_from_slice(&self.root.sequence.to_le_bytes());
            meta.extend_from_slice(&2u64.to_le_bytes());
            meta.extend_from_slice(&high_water.to_le_bytes());
            meta.extend_from_slice(&txid.to_le_bytes());
            let sum = fnv64a(&meta);
            meta.extend_from_slice(&sum.to_le_bytes());
            w.pages[m..m + 64].copy_from_slice(&meta);
        }
        Ok(w.pages)
    }
}

struct Reader<'a> {
    file: &'a [u8],
    page_size: usize,
    depth: usize,
}

impl Reader<'_> {
    fn page(&self, id: u64) -> anyhow::Result<&[u8]> {
        let at = (id as usize)
            .checked_mul(self.page_size)
            .ok_or_else(|| anyhow!("page {id} out of range"))?;
        let overflow = u32_at(self.file, at + 12)? as usize;
        let end = at + (overflow + 1) * self.page_size;
        self.file
            .get(at..end.min(self.file.len()))
            .filter(|p| p.len() >= PAGE_HEADER)
            .ok_or_else(|| anyhow!("page {id} is past the end of the file"))
    }

    /// The key/values under a page (a branch's children, in order).
    fn tree(&mut self, id: u64) -> anyhow::Result<BTreeMap<Vec<u8>, Item>> {
        self.depth += 1;
        ensure!(self.depth < 64, "tree too deep (a cycle?)");
        let page = self.page(id)?.to_vec();
        let mut out = BTreeMap::new();
        self.page_items(&page, &mut out)?;
        self.depth -= 1;
        Ok(out)
    }

    fn page_items(&mut self, page: &[u8], out: &mut BTreeMap<Vec<u8>, Item>) -> anyhow::Result<()> {
        let flags = u16_at(page, 8)?;
        let count = u16_at(page, 10)? as usize;
        for i in 0..count {
            let e = PAGE_HEADER + i * ELEMENT;
            if flags & BRANCH != 0 {
                let child = u64_at(page, e + 8)?;
                out.append(&mut self.tree(child)?);
            } else if flags & LEAF != 0 {
                let eflags = u32_at(page, e)?;
                let pos = e + u32_at(page, e + 4)? as usize;
                let ksize = u32_at(page, e + 8)? as usize;
                let vsize = u32_at(page, e + 12)? as usize;
                let key = page
                    .get(pos..pos + ksize)
                    .ok_or_else(|| anyhow!("leaf key out of its page"))?
                    .to_vec();
                let value = page
                    .get(pos + ksize..pos + ksize + vsize)
                    .ok_or_else(|| anyhow!("leaf value out of its page"))?;
                let item = if eflags & BUCKET_LEAF != 0 {
                    Item::Bucket(self.bucket(value)?)
                } else {
                    Item::Value(value.to_vec())
                };
                out.insert(key, item);
            } else {
                bail!("page of kind {flags:#x} inside a tree");
            }
        }
        Ok(())
    }

    /// A nested bucket from its leaf value: header, then a root page id or
    /// (root 0) an inline page.
    fn bucket(&mut self, value: &[u8]) -> anyhow::Result<Bucket> {
        let root = u64_at(value, 0)?;
        let sequence = u64_at(value, 8)?;
        let items = if root == 0 {
            let inline = value.get(BUCKET_HEADER..).unwrap_or_default().to_vec();
            let mut out = BTreeMap::new();
            if inline.len() >= PAGE_HEADER {
                self.depth += 1;
                ensure!(self.depth < 64, "tree too deep");
                self.page_items(&inline, &mut out)?;
                self.depth -= 1;
            }
            out
        } else {
            self.tree(root)?
        };
        Ok(Bucket { sequence, items })
    }
}

struct Writer {
    page_size: usize,
    /// The file so far (whole pages).
    pages: Vec<u8>,
}

/// A leaf element as it will be laid out: flags, key, value bytes.
type Element = (u32, Vec<u8>, Vec<u8>);

impl Writer {
    fn header(&mut self, at_page: u64, id: u64, flags: u16, count: u16, overflow: u32) {
        let at = at_page as usize * self.page_size;
        self.pages[at..at + 8].copy_from_slice(&id.to_le_bytes());
        self.pages[at + 8..at + 10].copy_from_slice(&flags.to_le_bytes());
        self.pages[at + 10..at + 12].copy_from_slice(&count.to_le_bytes());
        self.pages[at + 12..at + 16].copy_from_slice(&overflow.to_le_bytes());
    }

    /// The elements of a bucket, nested buckets written (or inlined) first.
    fn elements(&mut self, b: &Bucket) -> anyhow::Result<Vec<Element>> {
        let mut out = Vec::with_capacity(b.items.len());
        for (k, item) in &b.items {
            match item {
                Item::Value(v) => out.push((0, k.clone(), v.clone())),
                Item::Bucket(child) => {
                    let mut v = Vec::new();
                    match inline_page(child, self.page_size) {
                        Some(page) => {
                            v.extend_from_slice(&0u64.to_le_bytes());
                            v.extend_from_slice(&child.sequence.to_le_bytes());
                            v.extend_from_slice(&page);
                        }
                        None => {
                            let root = self.bucket_pages(child)?;
                            v.extend_from_slice(&root.to_le_bytes());
                            v.extend_from_slice(&child.sequence.to_le_bytes());
                        }
                    }
                    out.push((BUCKET_LEAF, k.clone(), v));
                }
            }
        }
        Ok(out)
    }

    /// Writes a bucket as pages; returns its root page id.
    fn bucket_pages(&mut self, b: &Bucket) -> anyhow::Result<u64> {
        let elements = self.elements(b)?;
        // Leaves, filled in order.
        let mut level: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut chunk: Vec<Element> = Vec::new();
        let mut size = PAGE_HEADER;
        for e in elements {
            let need = ELEMENT + e.1.len() + e.2.len();
            if !chunk.is_empty() && size + need > self.page_size {
                let first = chunk[0].1.clone();
                level.push((first, self.put(LEAF, &leaf_body(&chunk), chunk.len())));
                chunk.clear();
                size = PAGE_HEADER;
            }
            size += need;
            chunk.push(e);
        }
        if !chunk.is_empty() || level.is_empty() {
            let first = chunk.first().map(|c| c.1.clone()).unwrap_or_default();
            level.push((first, self.put(LEAF, &leaf_body(&chunk), chunk.len())));
        }
        // Branches, until one page holds the root.
        while level.len() > 1 {
            let mut next = Vec::new();
            let mut chunk: Vec<(Vec<u8>, u64)> = Vec::new();
            let mut size = PAGE_HEADER;
            for c in level {
                let need = ELEMENT + c.0.len();
                if chunk.len() >= 2 && size + need > self.page_size {
                    let first = chunk[0].0.clone();
                    next.push((first, self.put(BRANCH, &branch_body(&chunk), chunk.len())));
                    chunk.clear();
                    size = PAGE_HEADER;
                }
                size += need;
                chunk.push(c);
            }
            let first = chunk[0].0.clone();
            next.push((first, self.put(BRANCH, &branch_body(&chunk), chunk.len())));
            level = next;
        }
        Ok(level[0].1)
    }

    /// Appends a page (with overflow pages as needed); returns its id.
    fn put(&mut self, flags: u16, body: &[u8], count: usize) -> u64 {
        let id = (self.pages.len() / self.page_size) as u64;
        let total = PAGE_HEADER + body.len();
        let npages = total.div_ceil(self.page_size);
        self.pages
            .resize(self.pages.len() + npages * self.page_size, 0);
        self.header(id, id, flags, count as u16, (npages - 1) as u32);
        let at = id as usize * self.page_size + PAGE_HEADER;
        self.pages[at..at + body.len()].copy_from_slice(body);
        id
    }
}

/// A leaf page's elements and data (no page header).
fn leaf_body(elements: &[Element]) -> Vec<u8> {
    let mut heads = Vec::with_capacity(elements.len() * ELEMENT);
    let mut data = Vec::new();
    for (i, (flags, k, v)) in elements.iter().enumerate() {
        // Offset from this element to its key.
        let pos = (elements.len() - i) * ELEMENT + data.len();
        heads.extend_from_slice(&flags.to_le_bytes());
        heads.extend_from_slice(&(pos as u32).to_le_bytes());
        heads.extend_from_slice(&(k.len() as u32).to_le_bytes());
        heads.extend_from_slice(&(v.len() as u32).to_le_bytes());
        data.extend_from_slice(k);
        data.extend_from_slice(v);
    }
    heads.extend_from_slice(&data);
    heads
}

fn branch_body(children: &[(Vec<u8>, u64)]) -> Vec<u8> {
    let mut heads = Vec::with_capacity(children.len() * ELEMENT);
    let mut data = Vec::new();
    for (i, (k, id)) in children.iter().enumerate() {
        let pos = (children.len() - i) * ELEMENT + data.len();
        heads.extend_from_slice(&(pos as u32).to_le_bytes());
        heads.extend_from_slice(&(k.len() as u32).to_le_bytes());
        heads.extend_from_slice(&id.to_le_bytes());
        data.extend_from_slice(k);
    }
    heads.extend_from_slice(&data);
    heads
}

/// The inline page of a bucket small enough to live in its parent's leaf
/// (bbolt's rule: values only, at most a quarter page); `None` otherwise.
fn inline_page(b: &Bucket, page_size: usize) -> Option<Vec<u8>> {
    let mut size = PAGE_HEADER;
    let mut elements = Vec::with_capacity(b.items.len());
    for (k, item) in &b.items {
        let Item::Value(v) = item else { return None };
        size += ELEMENT + k.len() + v.len();
        if size > page_size / 4 {
            return None;
        }
        elements.push((0, k.clone(), v.clone()));
    }
    let mut page = vec![0u8; PAGE_HEADER];
    page[8..10].copy_from_slice(&LEAF.to_le_bytes());
    page[10..12].copy_from_slice(&(elements.len() as u16).to_le_bytes());
    page.extend_from_slice(&leaf_body(&elements));
    Some(page)
}

/// Go's `time.Time.MarshalBinary` of `unix` seconds in UTC (version 1:
/// seconds since year 1, nanoseconds, offset -1 for UTC), as containerd
/// stores `createdat`/`updatedat`.
pub fn go_time(unix: i64) -> Vec<u8> {
    const UNIX_TO_YEAR_1: i64 = 62_135_596_800;
    let mut b = vec![1u8];
    b.extend_from_slice(&((unix + UNIX_TO_YEAR_1) as u64).to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b
}

/// Sets every `createdat`/`updatedat` holding a Go time to `time`; returns
/// how many were set.
pub fn set_times(b: &mut Bucket, time: &[u8]) -> usize {
    let mut n = 0;
    for (k, item) in b.items.iter_mut() {
        match item {
            Item::Bucket(child) => n += set_times(child, time),
            Item::Value(v) => {
                let is_time = (v.len() == 15 && v[0] == 1) || (v.len() == 16 && v[0] == 2);
                if (k == b"createdat" || k == b"updatedat") && is_time {
                    *v = time.to_vec();
                    n += 1;
                }
            }
        }
    }
    n
}

/// Rewrites the bbolt file at `path` canonically with every record time set
/// to `unix`: same contents, bytes that depend only on them. Written to a
/// temporary file and renamed over, mode 0644.
pub fn canonicalize(path: &std::path::Path, unix: i64) -> anyhow::Result<()> {
    use std::io::Write;
    let bytes = std::fs::read(path)?;
    let mut db = Db::read(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    set_times(&mut db.root, &go_time(unix));
    let out = db.write()?;
    // 0644 whatever the umask: the mode is part of a reproducible layer.
    let mut tmp = crate::primitives::atomic::temp_beside(path)?;
    tmp.write_all(&out)?;
    crate::primitives::atomic::persist_mode(tmp, path, Some(0o644))
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: &[u8]) -> Item {
        Item::Value(v.to_vec())
    }

    fn sample(n: usize) -> Db {
        let mut blobs = Bucket::default();
        for i in 0..n {
            let mut blob = Bucket::default();
            blob.items.insert(
                b"createdat".to_vec(),
                value(&go_time(1_600_000_000 + i as i64)),
            );
            blob.items.insert(b"size".to_vec(), value(&[i as u8; 3]));
            let mut labels = Bucket::default();
            labels.items.insert(
                b"containerd.io/gc.ref.content.l.0".to_vec(),
                value(format!("sha256:{i:064x}").as_bytes()),
            );
            blob.items.insert(b"labels".to_vec(), Item::Bucket(labels));
            blobs
                .items
                .insert(format!("sha256:{i:064x}").into_bytes(), Item::Bucket(blob));
        }
        blobs
            .items
            .insert(b"big".to_vec(), value(&vec![7u8; 10_000]));
        let mut v1 = Bucket {
            sequence: 9,
            ..Default::default()
        };
        v1.items.insert(b"version".to_vec(), value(&[3]));
        v1.items.insert(b"blob".to_vec(), Item::Bucket(blobs));
        v1.items
            .insert(b"empty".to_vec(), Item::Bucket(Bucket::default()));
        let mut root = Bucket::default();
        root.items.insert(b"v1".to_vec(), Item::Bucket(v1));
        Db {
            page_size: 4096,
            root,
        }
    }

    #[test]
    fn writes_read_back_the_same_tree() {
        for n in [0, 1, 5, 300, 3000] {
            let db = sample(n);
            let bytes = db.write().unwrap();
            assert_eq!(bytes.len() % 4096, 0);
            let back = Db::read(&bytes).unwrap();
            assert_eq!(back, db, "n = {n}");
            // Canonical: writing what was read gives the same bytes.
            assert_eq!(back.write().unwrap(), bytes);
        }
    }

    #[test]
    fn times_are_set_everywhere() {
        let mut db = sample(10);
        let t = go_time(1_700_000_000);
        assert_eq!(set_times(&mut db.root, &t), 10);
        let a = db.write().unwrap();
        let mut again = sample(10);
        set_times(&mut again.root, &t);
        assert_eq!(again.write().unwrap(), a);
    }

    #[test]
    fn go_time_matches_go() {
        // time.Unix(1700000000, 0).UTC().MarshalBinary(): 1700000000 + 62135596800
        // seconds since year 1 = 0xedce5e800, no nanoseconds, offset -1 (UTC).
        assert_eq!(
            hex::encode(go_time(1_700_000_000)),
            "010000000edce5e80000000000ffff"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(Db::read(b"").is_err());
        assert!(Db::read(&[0u8; 8192]).is_err());
        let mut bytes = sample(50).write().unwrap();
        let n = bytes.len();
        bytes.truncate(n - 4096);
        let _ = Db::read(&bytes);
    }
}
