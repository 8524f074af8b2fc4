//! The soak's effect sink: a stand-in for an external system (a payment API,
//! a mailer) that the workers' tools act on. It keeps one log per run and
//! applies the fence rule of [`runkeep_worker::admit_fence`] across
//! processes: under an exclusive `flock` of the run's log it reads the
//! highest fence seen (admitted effects and new holders' announcements) and
//! refuses an effect presenting a lower one.
//!
//! The audit replays every log independently, so an effect that got in
//! without the check (a broken worker) is caught there.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use runkeep::{Fence, RunId};
use runkeep_worker::admit_fence;
use rustix::fs::{flock, FlockOperation};
use serde::{Deserialize, Serialize};

/// One line of a run's effect log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SinkEntry {
    /// A new holder announced its fence when it took the run.
    Observe {
        /// The fence.
        fence: u64,
        /// Who.
        holder: String,
    },
    /// An effect was admitted and performed.
    Accepted {
        /// The fence presented.
        fence: u64,
        /// The run's step the effect belongs to.
        step: u64,
        /// Who.
        holder: String,
        /// True when the sink's check was bypassed (a broken worker).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        unchecked: bool,
    },
    /// An effect was refused: a higher fence had been seen.
    Refused {
        /// The fence presented.
        fence: u64,
        /// The highest fence seen.
        highest: u64,
        /// The step.
        step: u64,
        /// Who.
        holder: String,
    },
}

/// The sink, rooted at a directory.
#[derive(Clone, Debug)]
pub struct EffectSink {
    dir: PathBuf,
}

/// A refused effect.
#[derive(Debug)]
pub struct Refused {
    /// The highest fence the sink had seen.
    pub highest: Fence,
}

impl EffectSink {
    /// A sink keeping its logs in `dir` (created if missing).
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, run: &RunId) -> PathBuf {
        self.dir.join(format!("{run}.jsonl"))
    }

    fn locked(&self, run: &RunId) -> std::io::Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(self.path(run))?;
        flock(&file, FlockOperation::LockExclusive)?;
        Ok(file)
    }

    fn append(file: &mut File, entry: &SinkEntry) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        file.write_all(&line)
    }

    /// A new holder announces its fence.
    pub fn observe(&self, run: &RunId, fence: Fence, holder: &str) -> std::io::Result<()> {
        let mut file = self.locked(run)?;
        Self::append(
            &mut file,
            &SinkEntry::Observe {
                fence: fence.get(),
                holder: holder.to_string(),
            },
        )
    }

    /// Admits and records an effect, or refuses it. With `checked = false`
    /// the rule is skipped (only a deliberately broken worker does that).
    pub fn apply(
        &self,
        run: &RunId,
        fence: Fence,
        step: u64,
        holder: &str,
        checked: bool,
    ) -> std::io::Result<Result<(), Refused>> {
        let mut file = self.locked(run)?;
        file.seek(SeekFrom::Start(0))?;
        let highest = read_entries(&file)?
            .iter()
            .filter_map(|e| match e {
                SinkEntry::Observe { fence, .. } | SinkEntry::Accepted { fence, .. } => {
                    Some(*fence)
                }
                SinkEntry::Refused { .. } => None,
            })
            .max()
            .and_then(|f| Fence::new(f).ok());
        if checked && !admit_fence(highest, fence) {
            let highest = highest.unwrap_or(fence);
            Self::append(
                &mut file,
                &SinkEntry::Refused {
                    fence: fence.get(),
                    highest: highest.get(),
                    step,
                    holder: holder.to_string(),
                },
            )?;
            return Ok(Err(Refused { highest }));
        }
        Self::append(
            &mut file,
            &SinkEntry::Accepted {
                fence: fence.get(),
                step,
                holder: holder.to_string(),
                unchecked: !checked,
            },
        )?;
        Ok(Ok(()))
    }

    /// Every run's log: `(run id, entries, torn lines)`.
    pub fn logs(&self) -> std::io::Result<Vec<(String, Vec<SinkEntry>, usize)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(run) = name.strip_suffix(".jsonl") else {
                continue;
            };
            let file = File::open(&path)?;
            let (entries, torn) = read_entries_counting(&file)?;
            out.push((run.to_string(), entries, torn));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn read_entries(file: &File) -> std::io::Result<Vec<SinkEntry>> {
    Ok(read_entries_counting(file)?.0)
}

/// Lines that do not parse are torn writes of a killed process: the effect
/// they describe never returned, so they are counted, not trusted.
fn read_entries_counting(file: &File) -> std::io::Result<(Vec<SinkEntry>, usize)> {
    let mut entries = Vec::new();
    let mut torn = 0;
    for line in BufReader::new(file).lines() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(e) => entries.push(e),
            Err(_) => torn += 1,
        }
    }
    Ok((entries, torn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_fence_below_the_highest_seen_and_records_it() {
        let dir = tempfile::tempdir().unwrap();
        let sink = EffectSink::new(dir.path()).unwrap();
        let run = RunId::new("run_a").unwrap();
        let f = |n| Fence::new(n).unwrap();
        sink.apply(&run, f(1), 1, "w1", true).unwrap().unwrap();
        sink.observe(&run, f(3), "w2").unwrap();
        let refused = sink.apply(&run, f(1), 2, "w1", true).unwrap().unwrap_err();
        assert_eq!(refused.highest, f(3));
        sink.apply(&run, f(3), 2, "w2", true).unwrap().unwrap();
        sink.apply(&run, f(1), 3, "zombie", false).unwrap().unwrap();
        let logs = sink.logs().unwrap();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].1.len(), 5);
    }
}
