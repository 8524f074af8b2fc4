//! The in-memory model filesystem, served over FUSE with `fuser`.
//!
//! It implements what `runkeep-fs` uses — lookup, getattr/setattr
//! (truncate, times, mode), create/mknod, mkdir, unlink, rmdir, rename
//! (replacing; `RENAME_NOREPLACE` honoured, `RENAME_EXCHANGE` refused),
//! hard links, symlinks, open/read/write (`O_APPEND` writes at the model's
//! end of file), readdir, fsync and fsyncdir — and logs every mutation as
//! an [`Op`] (the log is the recording the harness replays).
//!
//! Not implemented, on purpose: `O_TMPFILE` (fuser has no `tmpfile`
//! operation, so the kernel answers `EOPNOTSUPP` and the store takes its
//! scratch-name publish, which it probes at open), extended attributes,
//! `fallocate`. Locks are left to the kernel: fuser does not negotiate
//! `FUSE_FLOCK_LOCKS`/`FUSE_POSIX_LOCKS`, so the kernel keeps `flock` and
//! `fcntl` locks locally for this mount, which is exactly what one host
//! needs (`runkeep-fs`'s run lock is an `flock`).
//!
//! Every file is opened with `FOPEN_DIRECT_IO` and every attribute and
//! entry is answered with a zero TTL, so the kernel keeps no page cache or
//! attribute of its own: every read and write reaches the model.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};

use crate::model::{NewNode, Node, Op, State, ROOT};

const TTL: Duration = Duration::ZERO;
const O_APPEND: i32 = 0o2000;

#[derive(Clone, Debug)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    nlink: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
}

impl Meta {
    fn new(perm: u16, uid: u32, gid: u32) -> Self {
        let now = SystemTime::now();
        Meta {
            perm,
            uid,
            gid,
            nlink: 1,
            atime: now,
            mtime: now,
            ctime: now,
        }
    }
}

#[derive(Debug)]
enum Handle {
    File { append: bool },
    Dir(Vec<(u64, FileType, std::ffi::OsString)>),
}

/// The live filesystem: the model state, its log, and what FUSE needs
/// beside (attributes, handles).
#[derive(Debug)]
pub struct Live {
    state: State,
    log: Vec<Op>,
    meta: HashMap<u64, Meta>,
    next_ino: u64,
    next_fh: u64,
    handles: HashMap<u64, Handle>,
}

impl Live {
    fn new() -> Self {
        let mut meta = HashMap::new();
        let mut root = Meta::new(0o755, 0, 0);
        root.nlink = 2;
        meta.insert(ROOT, root);
        Live {
            state: State::default(),
            log: Vec::new(),
            meta,
            next_ino: ROOT + 1,
            next_fh: 1,
            handles: HashMap::new(),
        }
    }

    fn record(&mut self, op: Op) {
        self.state.apply(&op);
        self.log.push(op);
    }

    fn touch_dir(&mut self, dir: u64) {
        if let Some(m) = self.meta.get_mut(&dir) {
            let now = SystemTime::now();
            m.mtime = now;
            m.ctime = now;
        }
    }

    fn touch_ctime(&mut self, ino: u64) {
        if let Some(m) = self.meta.get_mut(&ino) {
            m.ctime = SystemTime::now();
        }
    }

    fn kind(&self, ino: u64) -> Option<FileType> {
        Some(match self.state.nodes.get(&ino)? {
            Node::File { .. } => FileType::RegularFile,
            Node::Dir { .. } => FileType::Directory,
            Node::Symlink(_) => FileType::Symlink,
        })
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.state.nodes.get(&ino)?;
        let m = self.meta.get(&ino)?;
        let size = match node {
            Node::File { data, .. } => data.len() as u64,
            Node::Dir { entries, .. } => entries.len() as u64,
            Node::Symlink(t) => t.as_os_str().len() as u64,
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: m.atime,
            mtime: m.mtime,
            ctime: m.ctime,
            crtime: m.ctime,
            kind: self.kind(ino)?,
            perm: m.perm,
            nlink: m.nlink,
            uid: m.uid,
            gid: m.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<Option<u64>, Errno> {
        match self.state.entries(parent) {
            Some(e) => Ok(e.get(name).copied()),
            None => Err(Errno::ENOTDIR),
        }
    }

    fn create_node(
        &mut self,
        req: &Request,
        parent: u64,
        name: &OsStr,
        node: NewNode,
        perm: u16,
    ) -> Result<FileAttr, Errno> {
        if self.child(parent, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let mut m = Meta::new(perm, req.uid(), req.gid());
        if node == NewNode::Dir {
            m.nlink = 2;
        }
        self.meta.insert(ino, m);
        self.record(Op::Create {
            parent,
            name: name.to_os_string(),
            ino,
            node,
        });
        self.touch_dir(parent);
        Ok(self.attr(ino).expect("just created"))
    }

    fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let ino = self.child(parent, name)?.ok_or(Errno::ENOENT)?;
        match (self.state.nodes.get(&ino), dir) {
            (Some(Node::Dir { entries, .. }), true) => {
                if !entries.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            (Some(Node::Dir { .. }), false) => return Err(Errno::EISDIR),
            (_, true) => return Err(Errno::ENOTDIR),
            (_, false) => {}
        }
        self.record(Op::Remove {
            parent,
            name: name.to_os_string(),
        });
        self.touch_dir(parent);
        if let Some(m) = self.meta.get_mut(&ino) {
            m.nlink = m.nlink.saturating_sub(1);
        }
        self.touch_ctime(ino);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE)
            || flags.contains(RenameFlags::RENAME_WHITEOUT)
        {
            return Err(Errno::EINVAL);
        }
        let src = self.child(parent, name)?.ok_or(Errno::ENOENT)?;
        self.child(newparent, newname)?;
        let target = self.child(newparent, newname)?;
        if let Some(t) = target {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if t == src {
                // Two names of one file: rename does nothing (POSIX).
                return Ok(());
            }
            let src_dir = matches!(self.state.nodes.get(&src), Some(Node::Dir { .. }));
            match self.state.nodes.get(&t) {
                Some(Node::Dir { entries, .. }) => {
                    if !src_dir {
                        return Err(Errno::EISDIR);
                    }
                    if !entries.is_empty() {
                        return Err(Errno::ENOTEMPTY);
                    }
                }
                _ if src_dir => return Err(Errno::ENOTDIR),
                _ => {}
            }
            if let Some(m) = self.meta.get_mut(&t) {
                m.nlink = m.nlink.saturating_sub(1);
            }
            self.touch_ctime(t);
        }
        self.record(Op::Rename {
            parent,
            name: name.to_os_string(),
            newparent,
            newname: newname.to_os_string(),
        });
        self.touch_dir(parent);
        self.touch_dir(newparent);
        self.touch_ctime(src);
        Ok(())
    }
}

/// The filesystem fuser serves; cheap handles to the same [`Live`] state
/// are given out by [`ModelFs::recorder`].
#[derive(Debug, Clone)]
pub struct ModelFs {
    live: Arc<Mutex<Live>>,
}

impl Default for ModelFs {
    fn default() -> Self {
        ModelFs {
            live: Arc::new(Mutex::new(Live::new())),
        }
    }
}

/// What the workload asks the filesystem while it runs: how many operations
/// the log holds (the instant a call returned), and at the end the log.
#[derive(Debug, Clone)]
pub struct Recorder {
    live: Arc<Mutex<Live>>,
}

impl Recorder {
    /// The number of operations logged so far.
    pub fn position(&self) -> usize {
        lock(&self.live).log.len()
    }

    /// A copy of the log so far.
    pub fn log(&self) -> Vec<Op> {
        lock(&self.live).log.clone()
    }

    /// The model's current state (what a reader of the mount sees).
    pub fn state(&self) -> State {
        lock(&self.live).state.clone()
    }
}

fn lock(live: &Mutex<Live>) -> MutexGuard<'_, Live> {
    // A panic inside a handler poisons the lock; the state is still the
    // last consistent one (every handler validates before it mutates).
    live.lock().unwrap_or_else(|p| p.into_inner())
}

impl ModelFs {
    /// A handle to read the log while the filesystem is mounted.
    pub fn recorder(&self) -> Recorder {
        Recorder {
            live: self.live.clone(),
        }
    }

    fn live(&self) -> MutexGuard<'_, Live> {
        lock(&self.live)
    }
}

fn perm_of(mode: u32) -> u16 {
    (mode & 0o7777) as u16
}

impl Filesystem for ModelFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let live = self.live();
        match live.child(parent.0, name) {
            Ok(Some(ino)) => match live.attr(ino) {
                Some(a) => reply.entry(&TTL, &a, Generation(0)),
                None => reply.error(Errno::ENOENT),
            },
            Ok(None) => reply.error(Errno::ENOENT),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.live().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut live = self.live();
        let ino = ino.0;
        if !live.meta.contains_key(&ino) {
            return reply.error(Errno::ENOENT);
        }
        if let Some(size) = size {
            if live.kind(ino) != Some(FileType::RegularFile) {
                return reply.error(Errno::EISDIR);
            }
            live.record(Op::Truncate { ino, size });
            if let Some(m) = live.meta.get_mut(&ino) {
                m.mtime = SystemTime::now();
            }
        }
        let now = SystemTime::now();
        let at = |t: TimeOrNow| match t {
            TimeOrNow::SpecificTime(t) => t,
            TimeOrNow::Now => now,
        };
        if let Some(m) = live.meta.get_mut(&ino) {
            if let Some(mode) = mode {
                m.perm = perm_of(mode);
            }
            if let Some(uid) = uid {
                m.uid = uid;
            }
            if let Some(gid) = gid {
                m.gid = gid;
            }
            if let Some(t) = atime {
                m.atime = at(t);
            }
            if let Some(t) = mtime {
                m.mtime = at(t);
            }
            m.ctime = now;
        }
        match live.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.live().state.nodes.get(&ino.0) {
            Some(Node::Symlink(t)) => {
                reply.data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()))
            }
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        const S_IFMT: u32 = 0o170000;
        const S_IFREG: u32 = 0o100000;
        if mode & S_IFMT != S_IFREG {
            return reply.error(Errno::EPERM);
        }
        match self
            .live()
            .create_node(req, parent.0, name, NewNode::File, perm_of(mode & !umask))
        {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self
            .live()
            .create_node(req, parent.0, name, NewNode::Dir, perm_of(mode & !umask))
        {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.live().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.live().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        match self.live().create_node(
            req,
            parent.0,
            link_name,
            NewNode::Symlink(target.to_path_buf()),
            0o777,
        ) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .live()
            .rename(parent.0, name, newparent.0, newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut live = self.live();
        let ino = ino.0;
        match live.kind(ino) {
            None => return reply.error(Errno::ENOENT),
            Some(FileType::Directory) => return reply.error(Errno::EPERM),
            Some(_) => {}
        }
        match live.child(newparent.0, newname) {
            Err(e) => return reply.error(e),
            Ok(Some(_)) => return reply.error(Errno::EEXIST),
            Ok(None) => {}
        }
        live.record(Op::Link {
            parent: newparent.0,
            name: newname.to_os_string(),
            ino,
        });
        live.touch_dir(newparent.0);
        if let Some(m) = live.meta.get_mut(&ino) {
            m.nlink += 1;
        }
        live.touch_ctime(ino);
        match live.attr(ino) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut live = self.live();
        match live.kind(ino.0) {
            None => return reply.error(Errno::ENOENT),
            Some(FileType::Directory) => return reply.error(Errno::EISDIR),
            Some(_) => {}
        }
        let fh = live.next_fh;
        live.next_fh += 1;
        live.handles.insert(
            fh,
            Handle::File {
                append: flags.0 & O_APPEND != 0,
            },
        );
        reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut live = self.live();
        match live.create_node(req, parent.0, name, NewNode::File, perm_of(mode & !umask)) {
            Ok(a) => {
                let fh = live.next_fh;
                live.next_fh += 1;
                live.handles.insert(
                    fh,
                    Handle::File {
                        append: flags & O_APPEND != 0,
                    },
                );
                reply.created(
                    &TTL,
                    &a,
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::FOPEN_DIRECT_IO,
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let live = self.live();
        match live.state.nodes.get(&ino.0) {
            Some(Node::File { data, .. }) => {
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                reply.data(&data[start..end]);
            }
            Some(Node::Dir { .. }) => reply.error(Errno::EISDIR),
            _ => reply.error(Errno::EINVAL),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut live = self.live();
        let ino = ino.0;
        let len = match live.state.nodes.get(&ino) {
            Some(Node::File { data, .. }) => data.len() as u64,
            _ => return reply.error(Errno::EINVAL),
        };
        let append = matches!(live.handles.get(&fh.0), Some(Handle::File { append: true }))
            || flags.0 & O_APPEND != 0;
        let offset = if append { len } else { offset };
        live.record(Op::Write {
            ino,
            offset,
            data: data.to_vec(),
        });
        if let Some(m) = live.meta.get_mut(&ino) {
            let now = SystemTime::now();
            m.mtime = now;
            m.ctime = now;
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.live().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut live = self.live();
        match live.kind(ino.0) {
            Some(FileType::RegularFile) => {
                live.record(Op::Fsync { ino: ino.0 });
                reply.ok();
            }
            Some(FileType::Directory) => {
                live.record(Op::FsyncDir { ino: ino.0 });
                reply.ok();
            }
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut live = self.live();
        let Some(entries) = live.state.entries(ino.0) else {
            return reply.error(Errno::ENOTDIR);
        };
        // A snapshot per open: offsets stay stable while the directory changes.
        let mut list = vec![
            (ino.0, FileType::Directory, ".".into()),
            (ino.0, FileType::Directory, "..".into()),
        ];
        let entries: BTreeMap<_, _> = entries.clone();
        for (name, child) in entries {
            if let Some(k) = live.kind(child) {
                list.push((child, k, name));
            }
        }
        let fh = live.next_fh;
        live.next_fh += 1;
        live.handles.insert(fh, Handle::Dir(list));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let live = self.live();
        let Some(Handle::Dir(list)) = live.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.live().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut live = self.live();
        if live.state.entries(ino.0).is_none() {
            return reply.error(Errno::ENOTDIR);
        }
        live.record(Op::FsyncDir { ino: ino.0 });
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 19, 1 << 19, 1 << 20, 1 << 19, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        if self.live().meta.contains_key(&ino.0) {
            reply.ok();
        } else {
            reply.error(Errno::ENOENT);
        }
    }
}
