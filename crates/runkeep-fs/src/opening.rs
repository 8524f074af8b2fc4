//! Opening a session's `runs/` directory: refusing what is not one (a
//! root, a file), creating it unless read-only, and the one-time probe of
//! hard links (the lease needs them) and of `O_TMPFILE` publishes.

use std::path::Path;

use runkeep::{Error, Result};

use crate::claims;
use crate::hard_links::{self, HardLinkProbeError, HardLinks};
use crate::inner::Inner;
use crate::options::FsOptions;
use crate::root;
use crate::sys::{self, Ctx};

/// The state of a store opened on `base_dir` (see [`crate::FsStore::open`]).
pub(crate) fn open(base_dir: &Path, options: FsOptions) -> Result<Inner> {
    let ctx = Ctx::store("open");
    let base = std::path::absolute(base_dir).unwrap_or_else(|_| base_dir.to_path_buf());
    root::refuse_root_as_session(&base)?;
    if options.read_only {
        match std::fs::metadata(&base) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(not_a_directory(&base)),
            Err(e) if sys::is_not_found(&e) => {
                return Err(Error::NotFound {
                    what: format!(
                        "a directory store at {} (opened read-only, so it is not created; the first write creates it)",
                        base.display()
                    ),
                })
            }
            Err(e) => return Err(ctx.io("open the store directory", &base, e)),
        }
        return Ok(Inner::new(base, options, false));
    }
    if let Err(e) = sys::ensure_dir(&base, options.durability) {
        if !base.is_dir() {
            return Err(ctx.io("create the store directory", &base, e));
        }
    }
    if !base.is_dir() {
        return Err(not_a_directory(&base));
    }
    let tmpfile = probe_links(&base, &ctx)?;
    Ok(Inner::new(base, options, tmpfile))
}

fn not_a_directory(base: &Path) -> Error {
    Error::invalid(format!(
        "{} is not a directory; open the store on a session's runs/ directory",
        base.display()
    ))
}

/// Probes the store directory once: a volume without hard links is
/// refused; one that cannot be written opens for reading (every write will
/// say why it failed). Answers whether `O_TMPFILE` + `linkat` publishes
/// work.
fn probe_links(base: &Path, ctx: &Ctx) -> Result<bool> {
    match hard_links::probe_hard_links(base) {
        Ok(HardLinks::Supported) => Ok(hard_links::tmpfile_links_work(base)),
        Ok(HardLinks::Unsupported { errno }) => {
            Err(claims::no_hard_links(ctx, base, errno.raw_os_error()))
        }
        Err(HardLinkProbeError::CannotCreate(e)) => {
            tracing::debug!("{}: cannot probe hard links: {e}", base.display());
            Ok(false)
        }
        Err(HardLinkProbeError::Link(e)) => Err(ctx.io("probe hard links in", base, e)),
    }
}
