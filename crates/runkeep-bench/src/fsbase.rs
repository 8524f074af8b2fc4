//! The directory backend's physical baselines: what the disk does for a 4
//! KiB write with no store around it, in the same directory tree.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::stats::Sample;
use crate::work::Context;

/// Which baseline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FsBase {
    /// `pwrite` of 4 KiB over one file, then `fsync`.
    WriteFsync,
    /// The atomic publish a power-loss store pays at least: create a
    /// temporary file, write 4 KiB, `fsync` it, rename it over the target,
    /// `fsync` the directory.
    Publish,
    /// The atomic publish without any `fsync` (what survives a process
    /// crash): create, write 4 KiB, rename.
    PublishNoSync,
}

/// Runs `base` one after the other in `dir` for `budget` (blocking).
pub fn measure(base: FsBase, dir: &Path, budget: Duration) -> Result<Sample, String> {
    std::fs::create_dir_all(dir).ctx(&format!("create {}", dir.display()))?;
    let block = vec![b'x'; 4096];
    let fixed = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("block"))
        .ctx("open the block file")?;
    let dir_handle = File::open(dir).ctx("open the directory")?;
    let op = |i: u64| -> Result<(), String> {
        match base {
            FsBase::WriteFsync => {
                fixed.write_all_at(&block, 0).ctx("pwrite")?;
                fixed.sync_all().ctx("fsync")?;
            }
            FsBase::Publish | FsBase::PublishNoSync => {
                let tmp = dir.join(format!(".tmp-{i}"));
                let mut f = File::create(&tmp).ctx("create")?;
                f.write_all(&block).ctx("write")?;
                if base == FsBase::Publish {
                    f.sync_all().ctx("fsync")?;
                }
                drop(f);
                std::fs::rename(&tmp, dir.join(format!("published-{}", i % 64))).ctx("rename")?;
                if base == FsBase::Publish {
                    dir_handle.sync_all().ctx("fsync the directory")?;
                }
            }
        }
        Ok(())
    };
    op(0)?;
    op(1)?;
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut i = 2;
    while started.elapsed() < budget || latencies.len() < 5 {
        let t = Instant::now();
        op(i)?;
        latencies.push(t.elapsed().as_secs_f64() * 1e6);
        i += 1;
    }
    Ok(Sample {
        units: latencies.len() as f64,
        secs: started.elapsed().as_secs_f64(),
        latencies_us: latencies,
    })
}
