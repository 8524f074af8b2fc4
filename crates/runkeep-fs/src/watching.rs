//! `watch` on a directory (contract v2): inotify where it works, polling
//! where it does not (and a log line saying why).
//!
//! - `Runnable(scope)` watches the store directory, every run directory
//!   (and `children/` of sub-runs), and each run's `claims/` (a release,
//!   snooze or finish tombstone), `checkpoints/` (a new or answered
//!   checkpoint) and `.runkeep/lifecycle.json` (enqueue, reopen). A run
//!   directory created later is added when its creation is seen.
//! - `Events(run)` watches the run's directory for its transcript being
//!   created or appended to (and the parent directory until the run
//!   directory exists).
//!
//! A lease that lapses changes no file, so a notified watch also wakes
//! every [`FALLBACK`]: a worker waiting for an expired lease notices it
//! within that interval. One thread per watch blocks in `poll` on its
//! inotify descriptor and exits within [`CHECK_CLOSED`] of the watch being
//! dropped.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use runkeep::watch::{Watch, WatchTopic, DEFAULT_POLL};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

use crate::checkpoints::CHECKPOINTS_DIR;
use crate::claims::CLAIMS_DIR;
use crate::inner::Inner;
use crate::lock::META_DIR;
use crate::run_state::LIFECYCLE_FILE;
use crate::testing_hooks::{self, Switch, Trace};
use crate::transcript::TRANSCRIPT;

/// How often a notified watch wakes anyway (a lapsed lease changes no file).
pub(crate) const FALLBACK: Duration = Duration::from_secs(1);
/// How often the watch thread checks that its watch still exists.
const CHECK_CLOSED: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// The store directory, or a `children/` directory: run directories.
    Runs,
    /// A run directory (its subdirectories appear here).
    Run,
    /// `claims/` or `checkpoints/`: every change matters.
    Any,
    /// `.runkeep/`: only the lifecycle record.
    Meta,
    /// The parent of a watched run that does not exist yet.
    Parent,
    /// The run directory of an `Events` watch.
    Transcript,
}

struct Watcher {
    fd: OwnedFd,
    wds: HashMap<i32, (PathBuf, Kind)>,
    topic: WatchTopic,
    run_dir: Option<PathBuf>,
}

fn mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MOVED_TO
        | WatchFlags::MODIFY
        | WatchFlags::DELETE
        | WatchFlags::ONLYDIR
}

impl Watcher {
    fn add(&mut self, path: &Path, kind: Kind) -> rustix::io::Result<()> {
        let wd = inotify::add_watch(&self.fd, path, mask())?;
        self.wds.insert(wd, (path.to_path_buf(), kind));
        Ok(())
    }

    /// Adds a run directory and the subdirectories that matter.
    fn add_run(&mut self, dir: &Path) {
        if self.add(dir, Kind::Run).is_err() {
            return;
        }
        let _ = self.add(&dir.join(CLAIMS_DIR), Kind::Any);
        let _ = self.add(&dir.join(CHECKPOINTS_DIR), Kind::Any);
        let _ = self.add(&dir.join(META_DIR), Kind::Meta);
        let children = dir.join("children");
        if self.add(&children, Kind::Runs).is_ok() {
            self.add_runs_in(&children);
        }
    }

    fn add_runs_in(&mut self, dir: &Path) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && crate::listing::is_listed_run_name(&name.to_string_lossy()) {
                self.add_run(&e.path());
            }
        }
    }

    /// Drains the pending events; answers whether any of them matters.
    fn drain(&mut self) -> bool {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut woke = false;
        let mut added: Vec<(PathBuf, Kind)> = Vec::new();
        {
            let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut buf);
            while let Ok(ev) = reader.next() {
                let Some((path, kind)) = self.wds.get(&ev.wd()).cloned() else {
                    continue;
                };
                let name = ev
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match kind {
                    Kind::Any => woke = true,
                    Kind::Meta => woke |= name == LIFECYCLE_FILE,
                    Kind::Runs => {
                        if crate::listing::is_listed_run_name(&name) {
                            added.push((path.join(&name), Kind::Run));
                            woke = true;
                        }
                    }
                    Kind::Run => {
                        if [CLAIMS_DIR, CHECKPOINTS_DIR, META_DIR, "children"]
                            .contains(&name.as_str())
                        {
                            added.push((path.clone(), Kind::Run));
                            woke = true;
                        }
                    }
                    Kind::Parent => {
                        if let Some(run) = &self.run_dir {
                            if run.exists() {
                                added.push((run.clone(), Kind::Transcript));
                                woke = true;
                            }
                        }
                    }
                    Kind::Transcript => woke |= name == TRANSCRIPT,
                }
            }
        }
        for (path, kind) in added {
            match kind {
                Kind::Transcript => {
                    let _ = self.add(&path, Kind::Transcript);
                }
                _ => self.add_run(&path),
            }
        }
        woke
    }
}

/// Starts an inotify watch, or says why it cannot.
fn start(base: &Path, run_dir: Option<PathBuf>, topic: &WatchTopic) -> Result<Watch, String> {
    let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
        .map_err(|e| format!("inotify_init failed ({e})"))?;
    let mut w = Watcher {
        fd,
        wds: HashMap::new(),
        topic: topic.clone(),
        run_dir: run_dir.clone(),
    };
    match &w.topic {
        WatchTopic::Runnable(_) => {
            w.add(base, Kind::Runs)
                .map_err(|e| format!("cannot watch {} ({e})", base.display()))?;
            w.add_runs_in(base);
        }
        WatchTopic::Events(_) => {
            let dir = run_dir.unwrap_or_else(|| base.to_path_buf());
            if w.add(&dir, Kind::Transcript).is_err() {
                let parent = dir.parent().unwrap_or(base).to_path_buf();
                let watched = w.add(&parent, Kind::Parent).or_else(|_| {
                    // A sub-run whose parent has no children/ yet: wait
                    // for the store directory (then re-check).
                    w.add(base, Kind::Parent)
                });
                watched.map_err(|e| format!("cannot watch {} ({e})", parent.display()))?;
                if dir.exists() {
                    let _ = w.add(&dir, Kind::Transcript);
                }
            }
        }
    }
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let traced = base.to_path_buf();
    std::thread::Builder::new()
        .name("runkeep-fs-watch".into())
        .spawn(move || {
            use rustix::event::{poll, PollFd, PollFlags};
            let timeout = i32::try_from(CHECK_CLOSED.as_millis()).unwrap_or(500);
            loop {
                let ready = {
                    let mut fds = [PollFd::new(&w.fd, PollFlags::IN)];
                    poll(&mut fds, timeout)
                };
                if tx.is_closed() {
                    break;
                }
                match ready {
                    Ok(0) => continue,
                    Ok(_) => {
                        if w.drain() {
                            testing_hooks::trace(Trace::WatchWoke(&traced));
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    }
                    Err(e) if e == rustix::io::Errno::INTR => continue,
                    Err(e) => {
                        tracing::info!("the directory store's watch stopped ({e}); its watcher polls every {FALLBACK:?} from now on");
                        break;
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start the watch thread ({e})"))?;
    Ok(Watch::notified(rx, FALLBACK))
}

/// The watch for `topic` on the store of `inner`: inotify, else (with a
/// log line saying why) polling.
pub(crate) fn watch(inner: &Inner, topic: &WatchTopic) -> Watch {
    let base = inner.base();
    let run_dir = match topic {
        WatchTopic::Events(run) => Some(inner.run_dir(run)),
        WatchTopic::Runnable(_) => None,
    };
    let result = match inner.switches.off_reason(Switch::Inotify) {
        Some(why) => Err(why),
        None => start(base, run_dir, topic),
    };
    match result {
        Ok(w) => w,
        Err(why) => {
            tracing::info!(
                "the directory store at {} cannot use inotify for {topic:?}: {why}; falling back to polling every {DEFAULT_POLL:?}",
                base.display()
            );
            Watch::polling(DEFAULT_POLL)
        }
    }
}
