//! The model filesystem's state, its operation log, and the crash model.
//!
//! Every mutating operation the FUSE layer serves is one [`Op`], applied to
//! a [`State`] by [`State::apply`] and appended to the log. The same
//! `apply` replays a prefix of the log offline, so the state after `k`
//! operations is exactly what the workload saw at that instant.
//!
//! **What survives a power cut** ([`CrashModel`]). A file's contents are
//! durable as of its last `fsync`/`fdatasync` (a file never synced is
//! empty); a directory's entries are durable as of its last `fsync` of the
//! directory (a directory never synced is empty). Everything else is lost.
//! [`CrashModel::SyncedOnly`] applies both rules; [`CrashModel::EagerMetadata`]
//! keeps every directory entry as of the cut (a journal that committed all
//! metadata) but file contents still only as of their last sync — the state
//! in which a rename published a file whose data never reached the disk.
//! [`CrashModel::TornWrites`] is `SyncedOnly` with the first half of each
//! file's unsynced appends kept: a log whose in-flight append was torn.
//!
//! A materialised view's files are all an hour old (the machine rebooted),
//! so a reader judging a torn tail by its age sees a writer long gone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Inode number of the root directory (FUSE's).
pub const ROOT: u64 = 1;

/// What kind of node an operation creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewNode {
    /// An empty regular file.
    File,
    /// An empty directory.
    Dir,
    /// A symbolic link (durable with its entry, as on ext4's fast symlinks).
    Symlink(PathBuf),
}

/// One mutating operation, as the filesystem served it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `parent/name` created as a new inode `ino`.
    Create {
        /// Directory.
        parent: u64,
        /// Entry name.
        name: OsString,
        /// The new inode.
        ino: u64,
        /// What it is.
        node: NewNode,
    },
    /// A hard link `parent/name` to `ino`.
    Link {
        /// Directory.
        parent: u64,
        /// Entry name.
        name: OsString,
        /// Existing inode.
        ino: u64,
    },
    /// `unlink` or `rmdir` of `parent/name`.
    Remove {
        /// Directory.
        parent: u64,
        /// Entry name.
        name: OsString,
    },
    /// `rename(parent/name, newparent/newname)`, replacing the target.
    Rename {
        /// Source directory.
        parent: u64,
        /// Source name.
        name: OsString,
        /// Target directory.
        newparent: u64,
        /// Target name.
        newname: OsString,
    },
    /// Bytes written at `offset`.
    Write {
        /// File.
        ino: u64,
        /// Where.
        offset: u64,
        /// What.
        data: Vec<u8>,
    },
    /// `ftruncate`/`truncate` to `size`.
    Truncate {
        /// File.
        ino: u64,
        /// New size.
        size: u64,
    },
    /// `fsync`/`fdatasync` of a file: its contents become durable.
    Fsync {
        /// File.
        ino: u64,
    },
    /// `fsync` of a directory: its entries become durable.
    FsyncDir {
        /// Directory.
        ino: u64,
    },
}

impl Op {
    /// A short label for reports.
    pub fn label(&self) -> &'static str {
        match self {
            Op::Create {
                node: NewNode::Dir, ..
            } => "mkdir",
            Op::Create {
                node: NewNode::File,
                ..
            } => "create",
            Op::Create { .. } => "symlink",
            Op::Link { .. } => "link",
            Op::Remove { .. } => "unlink",
            Op::Rename { .. } => "rename",
            Op::Write { .. } => "write",
            Op::Truncate { .. } => "truncate",
            Op::Fsync { .. } => "fsync",
            Op::FsyncDir { .. } => "fsyncdir",
        }
    }
}

/// A node's content: current and durable.
#[derive(Clone, Debug)]
pub enum Node {
    /// A regular file.
    File {
        /// What a reader sees now.
        data: Vec<u8>,
        /// What survives a power cut (as of the last fsync).
        durable: Vec<u8>,
    },
    /// A directory.
    Dir {
        /// Entries now.
        entries: BTreeMap<OsString, u64>,
        /// Entries as of the last directory fsync.
        durable: BTreeMap<OsString, u64>,
    },
    /// A symbolic link.
    Symlink(PathBuf),
}

/// Every inode (never freed: an unlinked inode may still be named by a
/// directory's durable entries).
#[derive(Clone, Debug)]
pub struct State {
    /// Inodes by number.
    pub nodes: HashMap<u64, Node>,
}

impl Default for State {
    fn default() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node::Dir {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
        );
        State { nodes }
    }
}

impl State {
    /// The entries of directory `ino` now.
    pub fn entries(&self, ino: u64) -> Option<&BTreeMap<OsString, u64>> {
        match self.nodes.get(&ino) {
            Some(Node::Dir { entries, .. }) => Some(entries),
            _ => None,
        }
    }

    fn entries_mut(&mut self, ino: u64) -> &mut BTreeMap<OsString, u64> {
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir { entries, .. }) => entries,
            _ => panic!("inode {ino} is not a directory (the FUSE layer checks before logging)"),
        }
    }

    /// Applies one operation (already validated by the FUSE layer).
    pub fn apply(&mut self, op: &Op) {
        match op {
            Op::Create {
                parent,
                name,
                ino,
                node,
            } => {
                let n = match node {
                    NewNode::File => Node::File {
                        data: Vec::new(),
                        durable: Vec::new(),
                    },
                    NewNode::Dir => Node::Dir {
                        entries: BTreeMap::new(),
                        durable: BTreeMap::new(),
                    },
                    NewNode::Symlink(t) => Node::Symlink(t.clone()),
                };
                self.nodes.insert(*ino, n);
                self.entries_mut(*parent).insert(name.clone(), *ino);
            }
            Op::Link { parent, name, ino } => {
                self.entries_mut(*parent).insert(name.clone(), *ino);
            }
            Op::Remove { parent, name } => {
                self.entries_mut(*parent).remove(name);
            }
            Op::Rename {
                parent,
                name,
                newparent,
                newname,
            } => {
                let ino = self
                    .entries_mut(*parent)
                    .remove(name)
                    .expect("rename source exists");
                self.entries_mut(*newparent).insert(newname.clone(), ino);
            }
            Op::Write { ino, offset, data } => {
                if let Some(Node::File { data: d, .. }) = self.nodes.get_mut(ino) {
                    let end = *offset as usize + data.len();
                    if d.len() < end {
                        d.resize(end, 0);
                    }
                    d[*offset as usize..end].copy_from_slice(data);
                }
            }
            Op::Truncate { ino, size } => {
                if let Some(Node::File { data, .. }) = self.nodes.get_mut(ino) {
                    data.resize(*size as usize, 0);
                }
            }
            Op::Fsync { ino } => {
                if let Some(Node::File { data, durable }) = self.nodes.get_mut(ino) {
                    *durable = data.clone();
                }
            }
            Op::FsyncDir { ino } => {
                if let Some(Node::Dir { entries, durable }) = self.nodes.get_mut(ino) {
                    *durable = entries.clone();
                }
            }
        }
    }

    /// What a power cut now would leave, under `model`.
    pub fn durable_view(&self, model: CrashModel) -> View {
        let mut view = View::default();
        let mut on_path = HashSet::new();
        self.walk(ROOT, PathBuf::new(), model, &mut on_path, &mut view);
        view
    }

    fn walk(
        &self,
        dir: u64,
        at: PathBuf,
        model: CrashModel,
        on_path: &mut HashSet<u64>,
        view: &mut View,
    ) {
        let Some(Node::Dir { entries, durable }) = self.nodes.get(&dir) else {
            return;
        };
        let mut with_index;
        let entries = match model {
            CrashModel::SyncedOnly | CrashModel::TornWrites => durable,
            CrashModel::EagerMetadata => entries,
            CrashModel::TornWithIndex => {
                // The index's own entry as of the cut, too.
                with_index = durable.clone();
                with_index.remove(OsStr::new(INDEX_FILE));
                if let Some(ino) = entries.get(OsStr::new(INDEX_FILE)) {
                    with_index.insert(INDEX_FILE.into(), *ino);
                }
                &with_index
            }
        };
        on_path.insert(dir);
        for (name, ino) in entries {
            let path = at.join(name);
            match self.nodes.get(ino) {
                Some(Node::Dir { .. }) => {
                    // A stale durable entry can name a directory that is
                    // already on the way here; a cycle is cut, not followed.
                    if on_path.contains(ino) {
                        continue;
                    }
                    view.entries.insert(path.clone(), ViewEntry::Dir);
                    self.walk(*ino, path, model, on_path, view);
                }
                Some(Node::File { data, durable }) => {
                    let bytes = match model {
                        CrashModel::TornWrites => torn(durable, data),
                        CrashModel::TornWithIndex if name.as_os_str() == OsStr::new(INDEX_FILE) => {
                            data.clone()
                        }
                        CrashModel::TornWithIndex => torn(durable, data),
                        _ => durable.clone(),
                    };
                    view.entries.insert(
                        path,
                        ViewEntry::File {
                            ino: *ino,
                            data: bytes,
                        },
                    );
                }
                Some(Node::Symlink(t)) => {
                    view.entries.insert(path, ViewEntry::Symlink(t.clone()));
                }
                None => {}
            }
        }
        on_path.remove(&dir);
    }
}

/// The bytes of a file whose unsynced writes only extended its synced
/// bytes (appends): the synced bytes and the first half of the rest, a
/// tear in the middle of what was in flight. Any other file keeps its
/// synced bytes.
fn torn(durable: &[u8], data: &[u8]) -> Vec<u8> {
    if data.len() > durable.len() && data.starts_with(durable) {
        let keep = durable.len() + (data.len() - durable.len()).div_ceil(2);
        data[..keep].to_vec()
    } else {
        durable.to_vec()
    }
}

/// `runkeep-fs`'s transcript offset index: header `RKTXIDX1`, then the
/// transcript's device and inode (little-endian `u64` at 8 and 16).
pub const INDEX_FILE: &str = "transcript.idx";
/// The transcript the index names (its sibling's parent holds it).
const TRANSCRIPT_FILE: &str = "transcript.jsonl";

/// Which crash a view models (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CrashModel {
    /// Only what was synced: file contents and directory entries each as of
    /// their last fsync.
    SyncedOnly,
    /// Every directory entry as of the cut, file contents as of their last
    /// fsync.
    EagerMetadata,
    /// As `SyncedOnly`, but a file whose unsynced writes were appends keeps
    /// the first half of them: a torn tail (an append cut mid-record).
    TornWrites,
    /// As `TornWrites`, with `runkeep-fs`'s transcript offset index
    /// (`.runkeep/transcript.idx`, never synced) as of the cut, as if it
    /// were synced on every write: a diagnostic of whether its
    /// pending-batch marker, were it durable, keeps a torn batch all or
    /// nothing.
    TornWithIndex,
}

/// One entry of a durable view.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ViewEntry {
    /// A directory.
    Dir,
    /// A regular file: its inode (names sharing one are hard links) and
    /// its durable bytes.
    File {
        /// Inode (identity only).
        ino: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// A symbolic link.
    Symlink(PathBuf),
}

/// A whole durable tree, by path relative to the mount root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Paths in order (a directory before what it contains).
    pub entries: BTreeMap<PathBuf, ViewEntry>,
}

impl View {
    /// A digest of the view, to materialise each distinct view once.
    /// Inode numbers count only as "which names are one file".
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut first_name: HashMap<u64, &Path> = HashMap::new();
        for (path, e) in &self.entries {
            path.as_os_str().as_bytes().hash(&mut h);
            match e {
                ViewEntry::Dir => 0u8.hash(&mut h),
                ViewEntry::File { ino, data } => {
                    1u8.hash(&mut h);
                    data.hash(&mut h);
                    first_name
                        .entry(*ino)
                        .or_insert(path.as_path())
                        .as_os_str()
                        .as_bytes()
                        .hash(&mut h);
                }
                ViewEntry::Symlink(t) => {
                    2u8.hash(&mut h);
                    t.as_os_str().as_bytes().hash(&mut h);
                }
            }
        }
        h.finish()
    }

    /// Writes the view into `dest` (an empty real directory): directories,
    /// files with their durable bytes, hard links for names of one inode.
    pub fn materialise(&self, dest: &Path) -> io::Result<()> {
        let mut made: HashMap<u64, PathBuf> = HashMap::new();
        let rebooted = std::time::SystemTime::now() - std::time::Duration::from_secs(3_600);
        for (path, e) in &self.entries {
            let target = dest.join(path);
            match e {
                ViewEntry::Dir => std::fs::create_dir(&target)?,
                ViewEntry::File { ino, data } => match made.get(ino) {
                    Some(first) => std::fs::hard_link(first, &target)?,
                    None => {
                        let mut f = std::fs::File::create(&target)?;
                        std::io::Write::write_all(&mut f, data)?;
                        f.set_modified(rebooted)?;
                        made.insert(*ino, target);
                    }
                },
                ViewEntry::Symlink(t) => std::os::unix::fs::symlink(t, &target)?,
            }
        }
        Ok(())
    }

    /// A machine that reboots keeps its files' device and inode numbers; a
    /// materialised copy does not. So every transcript offset index that
    /// names (by model inode) the transcript now beside it is made to name
    /// that transcript's new device and inode; one naming another file
    /// stays stale, as it would be.
    pub fn carry_index_identity(&self, dest: &Path) -> io::Result<()> {
        use std::os::unix::fs::{FileExt, MetadataExt};
        for (path, e) in &self.entries {
            let ViewEntry::File { data, .. } = e else {
                continue;
            };
            if path.file_name() != Some(OsStr::new(INDEX_FILE)) || data.len() < 24 {
                continue;
            }
            if &data[..8] != b"RKTXIDX1" {
                continue;
            }
            let Some(run) = path.parent().and_then(Path::parent) else {
                continue;
            };
            let transcript = run.join(TRANSCRIPT_FILE);
            let Some(ViewEntry::File { ino, .. }) = self.entries.get(&transcript) else {
                continue;
            };
            let named = u64::from_le_bytes(data[16..24].try_into().expect("8 bytes"));
            if named != *ino {
                continue;
            }
            let real = std::fs::metadata(dest.join(&transcript))?;
            let mut ids = real.dev().to_le_bytes().to_vec();
            ids.extend_from_slice(&real.ino().to_le_bytes());
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(dest.join(path))?;
            f.write_all_at(&ids, 8)?;
        }
        Ok(())
    }

    /// True when the view has an entry at `path`.
    pub fn contains(&self, path: &Path) -> bool {
        self.entries.contains_key(path)
    }
}

/// A name as bytes, for messages.
pub fn show(name: &OsStr) -> String {
    String::from_utf8_lossy(name.as_bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> OsString {
        OsString::from(s)
    }

    /// The crash model, operation by operation: a published, synced file
    /// survives; data written but not synced does not; an entry whose
    /// directory was not synced does not (under `SyncedOnly`), but does
    /// under `EagerMetadata` with the file's synced bytes only.
    #[test]
    fn only_what_was_synced_survives() {
        let mut s = State::default();
        let log = vec![
            Op::Create {
                parent: ROOT,
                name: name("d"),
                ino: 2,
                node: NewNode::Dir,
            },
            Op::FsyncDir { ino: ROOT },
            Op::Create {
                parent: 2,
                name: name("f.tmp"),
                ino: 3,
                node: NewNode::File,
            },
            Op::Write {
                ino: 3,
                offset: 0,
                data: b"one".to_vec(),
            },
            Op::Fsync { ino: 3 },
            Op::Rename {
                parent: 2,
                name: name("f.tmp"),
                newparent: 2,
                newname: name("f"),
            },
            Op::FsyncDir { ino: 2 },
            Op::Write {
                ino: 3,
                offset: 3,
                data: b" two".to_vec(),
            },
            Op::Create {
                parent: 2,
                name: name("g"),
                ino: 4,
                node: NewNode::File,
            },
        ];
        let mut views = Vec::new();
        views.push(s.durable_view(CrashModel::SyncedOnly));
        for op in &log {
            s.apply(op);
            views.push(s.durable_view(CrashModel::SyncedOnly));
        }
        let f = Path::new("d/f");
        // Before the root's fsync, not even the directory survives.
        assert!(!views[1].contains(Path::new("d")));
        assert!(views[2].contains(Path::new("d")));
        // Renamed but the directory not synced: the old name survives
        // (created before the sync? no: created after it, so nothing).
        assert!(!views[6].contains(f) && !views[6].contains(Path::new("d/f.tmp")));
        assert_eq!(
            views[7].entries.get(f),
            Some(&ViewEntry::File {
                ino: 3,
                data: b"one".to_vec()
            })
        );
        // The unsynced append is lost; the unsynced create too.
        assert_eq!(views[9], views[7]);
        // Eager metadata: the new entry survives, empty (never synced), and
        // the appended bytes are still lost.
        let eager = s.durable_view(CrashModel::EagerMetadata);
        assert_eq!(
            eager.entries.get(Path::new("d/g")),
            Some(&ViewEntry::File {
                ino: 4,
                data: Vec::new()
            })
        );
        assert_eq!(
            eager.entries.get(f),
            Some(&ViewEntry::File {
                ino: 3,
                data: b"one".to_vec()
            })
        );
        assert_ne!(views[7].fingerprint(), eager.fingerprint());
        assert_eq!(views[9].fingerprint(), views[7].fingerprint());
    }

    /// A torn view keeps the first half of unsynced appends, and only of
    /// appends: a file rewritten since its sync keeps its synced bytes.
    #[test]
    fn a_torn_view_keeps_half_of_the_unsynced_appends_only() {
        assert_eq!(torn(b"ab\n", b"ab\ncd\nef\n"), b"ab\ncd\n".to_vec());
        assert_eq!(torn(b"", b"xyz1"), b"xy".to_vec());
        assert_eq!(torn(b"ab\n", b"zz\ncd\n"), b"ab\n".to_vec());
        assert_eq!(torn(b"ab\n", b"ab\n"), b"ab\n".to_vec());
        let mut s = State::default();
        for op in [
            Op::Create {
                parent: ROOT,
                name: name("log"),
                ino: 2,
                node: NewNode::File,
            },
            Op::FsyncDir { ino: ROOT },
            Op::Write {
                ino: 2,
                offset: 0,
                data: b"one\n".to_vec(),
            },
            Op::Fsync { ino: 2 },
            Op::Write {
                ino: 2,
                offset: 4,
                data: b"two\nthree\n".to_vec(),
            },
        ] {
            s.apply(&op);
        }
        let bytes = |m| match s.durable_view(m).entries.get(Path::new("log")) {
            Some(ViewEntry::File { data, .. }) => data.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(bytes(CrashModel::SyncedOnly), b"one\n");
        assert_eq!(bytes(CrashModel::TornWrites), b"one\ntwo\nt");
    }

    /// An index naming the transcript beside it is made to name the copy's
    /// device and inode; one naming another inode is left stale.
    #[test]
    fn index_identity_is_carried_over_only_for_its_own_transcript() {
        let mut header = b"RKTXIDX1".to_vec();
        header.extend_from_slice(&77u64.to_le_bytes());
        header.extend_from_slice(&5u64.to_le_bytes());
        header.extend_from_slice(&[0u8; 16]);
        let mut view = View::default();
        for run in ["a", "b"] {
            view.entries.insert(run.into(), ViewEntry::Dir);
            view.entries
                .insert(format!("{run}/.runkeep").into(), ViewEntry::Dir);
            view.entries.insert(
                format!("{run}/transcript.jsonl").into(),
                ViewEntry::File {
                    ino: if run == "a" { 5 } else { 6 },
                    data: b"{}\n".to_vec(),
                },
            );
            view.entries.insert(
                format!("{run}/.runkeep/transcript.idx").into(),
                ViewEntry::File {
                    ino: if run == "a" { 10 } else { 11 },
                    data: header.clone(),
                },
            );
        }
        let dir = tempfile::tempdir().unwrap();
        view.materialise(dir.path()).unwrap();
        view.carry_index_identity(dir.path()).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ids = |run: &str| {
            let b = std::fs::read(dir.path().join(run).join(".runkeep/transcript.idx")).unwrap();
            (
                u64::from_le_bytes(b[8..16].try_into().unwrap()),
                u64::from_le_bytes(b[16..24].try_into().unwrap()),
            )
        };
        let t = std::fs::metadata(dir.path().join("a/transcript.jsonl")).unwrap();
        assert_eq!(ids("a"), (t.dev(), t.ino()));
        assert_eq!(ids("b"), (77, 5), "an index of another file stays stale");
    }

    /// Hard links materialise as hard links; a view materialises into a
    /// real directory that reads back the durable bytes.
    #[test]
    fn a_view_materialises_with_its_hard_links() {
        let mut s = State::default();
        for op in [
            Op::Create {
                parent: ROOT,
                name: name("a"),
                ino: 2,
                node: NewNode::File,
            },
            Op::Write {
                ino: 2,
                offset: 0,
                data: b"body".to_vec(),
            },
            Op::Fsync { ino: 2 },
            Op::Link {
                parent: ROOT,
                name: name("b"),
                ino: 2,
            },
            Op::FsyncDir { ino: ROOT },
        ] {
            s.apply(&op);
        }
        let dir = tempfile::tempdir().unwrap();
        s.durable_view(CrashModel::SyncedOnly)
            .materialise(dir.path())
            .unwrap();
        use std::os::unix::fs::MetadataExt;
        let a = std::fs::metadata(dir.path().join("a")).unwrap();
        let b = std::fs::metadata(dir.path().join("b")).unwrap();
        assert_eq!(a.ino(), b.ino());
        assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), b"body");
    }
}
