//! Whether a directory's filesystem has hard links.
//!
//! The directory backend publishes a run's holding by hard `link` (the
//! kernel picks exactly one winner per fence number), so a volume without
//! hard links cannot keep a single writer per run: [`crate::FsStore::open`]
//! probes once and refuses such a volume, a publish that meets one of
//! [`NO_HARD_LINK_ERRNOS`] says why, and `runkeep doctor` runs the same
//! probe.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::sys;

/// The errnos with which `link(2)` says "this filesystem has no hard
/// links" (or none between these two names): not permitted on this
/// filesystem, not supported, not implemented, across devices, or no more
/// links allowed. Any other error is a failure of the probe itself.
pub const NO_HARD_LINK_ERRNOS: &[Errno] = &[
    Errno::PERM,
    Errno::NOTSUP,
    Errno::OPNOTSUPP,
    Errno::NOSYS,
    Errno::XDEV,
    Errno::MLINK,
];

/// Whether an errno from `link(2)` means the filesystem has no hard links
/// (one of [`NO_HARD_LINK_ERRNOS`]).
pub fn is_no_hard_link_errno(code: i32) -> bool {
    NO_HARD_LINK_ERRNOS.contains(&Errno::from_raw_os_error(code))
}

/// What [`probe_hard_links`] found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HardLinks {
    /// A hard link could be made: runs can be claimed here.
    Supported,
    /// `link` answered with one of [`NO_HARD_LINK_ERRNOS`]: the directory
    /// store cannot publish a run claim on this filesystem.
    Unsupported {
        /// What `link` answered.
        errno: Errno,
    },
}

/// Why [`probe_hard_links`] could not tell.
#[derive(Debug)]
pub enum HardLinkProbeError {
    /// The probe file could not be created (a read-only volume, no
    /// permission, a missing directory): check that the directory exists
    /// and is writable by this user.
    CannotCreate(io::Error),
    /// `link` failed with an error that does not mean "no hard links"
    /// (e.g. `EIO`, `ENOSPC`): the disk, not the filesystem type, is the
    /// problem.
    Link(io::Error),
}

impl fmt::Display for HardLinkProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HardLinkProbeError::CannotCreate(e) => write!(
                f,
                "cannot create a probe file ({e}); check that the directory exists and is writable by this user"
            ),
            HardLinkProbeError::Link(e) => write!(
                f,
                "the hard-link probe failed ({e}); check the disk and retry"
            ),
        }
    }
}

impl std::error::Error for HardLinkProbeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HardLinkProbeError::CannotCreate(e) | HardLinkProbeError::Link(e) => Some(e),
        }
    }
}

/// A unique probe name in `dir` (`.runkeep-probe-…`: the doctor reports a
/// leftover of a process that died mid-probe).
fn probe_name(dir: &Path, suffix: &str) -> PathBuf {
    let (pid, n, r) = sys::unique_parts();
    dir.join(format!(".runkeep-probe-{pid}-{n}-{r}{suffix}"))
}

/// Creates a file in `dir` and a hard link to it, then removes both:
/// whether `dir`'s filesystem has hard links. Leaves nothing behind.
pub fn probe_hard_links(dir: &Path) -> Result<HardLinks, HardLinkProbeError> {
    use std::os::unix::fs::OpenOptionsExt;
    let a = probe_name(dir, "");
    let b = PathBuf::from(format!("{}-link", a.display()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(sys::FILE_MODE)
        .open(&a)
        .map_err(HardLinkProbeError::CannotCreate)?;
    let linked = sys::hard_link(&a, &b);
    let _ = std::fs::remove_file(&b);
    let _ = std::fs::remove_file(&a);
    match linked {
        Ok(()) => Ok(HardLinks::Supported),
        Err(e) => match e.raw_os_error() {
            Some(c) if is_no_hard_link_errno(c) => Ok(HardLinks::Unsupported {
                errno: Errno::from_raw_os_error(c),
            }),
            _ => Err(HardLinkProbeError::Link(e)),
        },
    }
}

/// Whether holdings can be published through `O_TMPFILE` + `linkat` in
/// `dir` (an unnamed file linked in whole); when not, they go through a
/// scratch name. Leaves nothing behind.
pub(crate) fn tmpfile_links_work(dir: &Path) -> bool {
    use rustix::fs::{linkat, openat, AtFlags, Mode, OFlags, CWD};
    use std::os::fd::AsRawFd;
    let Ok(fd) = openat(
        CWD,
        dir,
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(sys::FILE_MODE),
    ) else {
        return false;
    };
    let target = probe_name(dir, "-link");
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let ok = linkat(
        CWD,
        proc_path.as_str(),
        CWD,
        &target,
        AtFlags::SYMLINK_FOLLOW,
    )
    .is_ok();
    let _ = std::fs::remove_file(&target);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_local_directory_has_hard_links_and_the_probe_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe_hard_links(dir.path()).unwrap(), HardLinks::Supported);
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[test]
    fn a_missing_directory_cannot_be_probed() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        match probe_hard_links(&missing) {
            Err(HardLinkProbeError::CannotCreate(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("a missing directory was probed as {other:?}"),
        }
    }

    #[test]
    fn the_no_hard_link_errnos_are_the_filesystems_answers_not_disk_errors() {
        for e in [
            Errno::PERM,
            Errno::NOTSUP,
            Errno::OPNOTSUPP,
            Errno::NOSYS,
            Errno::XDEV,
            Errno::MLINK,
        ] {
            assert!(is_no_hard_link_errno(e.raw_os_error()), "{e:?}");
        }
        for e in [
            Errno::EXIST,
            Errno::IO,
            Errno::NOSPC,
            Errno::ACCESS,
            Errno::ROFS,
        ] {
            assert!(!is_no_hard_link_errno(e.raw_os_error()), "{e:?}");
        }
    }

    #[cfg(feature = "testing")]
    #[test]
    fn a_link_refused_as_unsupported_is_reported_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let _f = crate::testing::inject(
            crate::testing::FaultPoint::Link,
            dir.path(),
            Errno::XDEV.raw_os_error(),
        );
        assert_eq!(
            probe_hard_links(dir.path()).unwrap(),
            HardLinks::Unsupported { errno: Errno::XDEV }
        );
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[cfg(feature = "testing")]
    #[test]
    fn a_link_failing_for_another_reason_is_a_probe_error() {
        let dir = tempfile::tempdir().unwrap();
        let _f = crate::testing::inject(
            crate::testing::FaultPoint::Link,
            dir.path(),
            Errno::IO.raw_os_error(),
        );
        match probe_hard_links(dir.path()) {
            Err(HardLinkProbeError::Link(e)) => {
                assert_eq!(e.raw_os_error(), Some(Errno::IO.raw_os_error()))
            }
            other => panic!("an EIO from link was probed as {other:?}"),
        }
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }
}
