//! The `store` checks of a directory store's volume: hard links, and the
//! session index's watch budget.

use super::*;

pub(super) fn hard_links(env: &Env) -> CliResult<Outcome> {
    let Some(base_dir) = env.base_dir() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a directory store: it does not publish claims by hard link",
            env.address
        )));
    };
    // The store's own probe (and its list of the errnos that mean "this
    // volume has no hard links"), so the doctor and the store agree.
    match runkeep_fs::probe_hard_links(&base_dir) {
        Ok(runkeep_fs::HardLinks::Supported) => {
            Ok(Outcome::pass(format!("{} supports hard links", env.address)))
        }
        Ok(runkeep_fs::HardLinks::Unsupported { errno }) => Ok(Outcome::fail(format!(
            "{} cannot hard-link ({errno}): the directory store cannot publish a run claim there",
            base_dir.display()
        ))
        .remedy("claims need hard-link support to keep a single writer per run; move the store to ext4, xfs, btrfs or tmpfs")),
        Err(e @ runkeep_fs::HardLinkProbeError::CannotCreate(_)) => Err(CliError::failed(format!(
            "hard-link test in {}: {e}",
            base_dir.display()
        ))
        .hint("see store.writable")),
        Err(e) => Err(CliError::failed(format!(
            "hard-link test in {} failed: {e}",
            base_dir.display()
        ))),
    }
}

/// Whether a process listing this directory store can use the session
/// index (O(page) per listing) or walks every run (O(runs) per page), and
/// how much of the user's inotify watch budget the index takes.
pub(super) fn listing_index(env: &Env) -> CliResult<Outcome> {
    let opened = env.store()?;
    let Some(outlook) = opened.index_outlook() else {
        return Ok(Outcome::skipped(format!(
            "{} is not a directory store: it has no session index",
            env.address
        )));
    };
    let o = outlook?;
    verdict_of_index(&o, runkeep_fs::IndexOutlook::watch_limit())
}

/// [`listing_index`]'s verdict on an outlook and a watch limit.
pub(super) fn verdict_of_index(
    o: &runkeep_fs::IndexOutlook,
    limit: Option<u64>,
) -> CliResult<Outcome> {
    if let Some(why) = &o.refused {
        return Ok(Outcome::warn(format!(
            "listings walk every run directory (O(runs) per page): {why}"
        ))
        .remedy("correct either way; for listings that do not slow down with the store, keep it on a local filesystem"));
    }
    let Some(limit) = limit else {
        return Ok(Outcome::inconclusive(format!(
            "cannot read fs.inotify.max_user_watches; the session index needs {} watches for {} run directories",
            o.watches, o.run_dirs
        )));
    };
    let suggest = (o.watches * 2 + 8192).next_power_of_two();
    let raise = format!(
        "raise the limit, e.g. `sysctl fs.inotify.max_user_watches={suggest}` (and in /etc/sysctl.d/ to keep it); each watch costs about 1 KiB of kernel memory"
    );
    let budget = runkeep_fs::IndexOutlook::budget_of(limit);
    if o.watches > budget {
        let swept = o.run_dirs - o.run_dirs * budget / o.watches;
        return Ok(Outcome::warn(format!(
            "the session index needs {} inotify watches for {} run directories, over its budget of {budget} (half of this user's limit of {limit}): about {swept} run directories are swept by stamp instead of watched, so other processes' changes to them reach a listing within seconds rather than at once, and the sweeper thread takes CPU",
            o.watches, o.run_dirs
        ))
        .remedy(raise));
    }
    Ok(Outcome::pass(format!(
        "the session index needs {} inotify watches for {} run directories, within its budget of {budget} (half of this user's limit of {limit})",
        o.watches, o.run_dirs
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_index_verdict_follows_the_watch_budget() {
        use crate::doctor::Status;
        let o = |watches: u64, refused: Option<&str>| runkeep_fs::IndexOutlook {
            run_dirs: watches / 4,
            watches,
            refused: refused.map(str::to_owned),
        };
        let v = |o: &runkeep_fs::IndexOutlook, limit| verdict_of_index(o, limit).unwrap();
        assert_eq!(v(&o(4_001, None), Some(192_530)).status, Status::Pass);
        assert_eq!(v(&o(96_265, None), Some(192_530)).status, Status::Pass);
        // Over half the limit: the index's budget; some runs are swept.
        let over = v(&o(400_000, None), Some(192_530));
        assert_eq!(over.status, Status::Warn, "{}", over.message);
        assert!(
            over.message
                .contains("about 75934 run directories are swept"),
            "{}",
            over.message
        );
        let remedy = over.remediation.clone().unwrap_or_default();
        assert!(
            remedy.contains("fs.inotify.max_user_watches=1048576"),
            "{remedy}"
        );
        let remote = v(&o(5, Some("on NFS")), Some(192_530));
        assert_eq!(remote.status, Status::Warn);
        assert!(remote.message.contains("on NFS"));
        assert_eq!(v(&o(5, None), None).status, Status::Inconclusive);
    }

    #[test]
    fn the_listing_index_outlook_counts_what_the_index_watches() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        // A run with checkpoints/ and claims/, one bare, one with a sub-run
        // (children/ plus the child's own checkpoints/), and a non-run.
        std::fs::create_dir_all(base.join("run_a/checkpoints")).unwrap();
        std::fs::create_dir_all(base.join("run_a/claims")).unwrap();
        std::fs::create_dir_all(base.join("run_b")).unwrap();
        std::fs::create_dir_all(base.join("run_c/children/run_k/checkpoints")).unwrap();
        std::fs::create_dir_all(base.join("other/checkpoints")).unwrap();
        let o = runkeep_fs::IndexOutlook::of(base);
        assert_eq!(o.run_dirs, 4);
        // base 1 + run_a 3 + run_b 1 + run_c 2 (itself, children/) + run_k 2.
        assert_eq!(o.watches, 9);
        assert_eq!(o.refused, None);
    }
}
