//! Retention: the operator's prune of finished runs
//! (`runkeep::scheduling::retention`).

use runkeep::scheduling::{PruneReport, RetentionPolicy};
use runkeep::Ttl;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{instant, RunAddress};
use crate::problem::Problem;

/// One batch of `prune_finished` under the tenant (or one project or
/// session of it).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PruneFinishedBody {
    /// Only this project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only this session (needs `project`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
    /// Keep a finished run this long after its finish, ms (a run's own
    /// retention wins).
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub keep_finished_for_ms: u64,
    /// Judge at this instant (epoch ms); absent: the store's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub now: Option<i64>,
    /// At most this many runs (1 to 10 000).
    #[schema(minimum = 1, maximum = 10_000)]
    pub limit: u32,
}

impl super::ObjectRule for PruneFinishedBody {
    fn rule() -> (&'static str, serde_json::Value) {
        super::session_needs_project()
    }
}

impl PruneFinishedBody {
    /// The policy and instant it asks for.
    pub fn policy(&self) -> Result<(RetentionPolicy, Option<runkeep::Timestamp>), Problem> {
        let keep = Ttl::from_millis(self.keep_finished_for_ms)
            .map_err(|e| Problem::invalid("keepFinishedForMs", e.to_string()))?;
        let now = self.now.map(|t| instant("now", t)).transpose()?;
        Ok((RetentionPolicy::keep_for(keep), now))
    }
}

/// What one batch did.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PruneReportBody {
    /// The top-level runs deleted.
    pub deleted: Vec<RunAddress>,
    /// Their sub-runs deleted with them.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub sub_runs_deleted: u64,
    /// Top-level finished runs looked at.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub scanned: u64,
    /// The batch stopped at its limit: call again.
    pub more: bool,
}

impl From<&PruneReport> for PruneReportBody {
    fn from(r: &PruneReport) -> Self {
        Self {
            deleted: r.deleted.iter().map(Into::into).collect(),
            sub_runs_deleted: r.sub_runs_deleted,
            scanned: r.scanned,
            more: r.more,
        }
    }
}

impl PruneReportBody {
    /// The core's report (each address validated).
    pub fn to_report(&self) -> Result<PruneReport, Problem> {
        Ok(PruneReport {
            deleted: self
                .deleted
                .iter()
                .map(|a| a.to_scope("deleted"))
                .collect::<Result<_, _>>()?,
            sub_runs_deleted: self.sub_runs_deleted,
            scanned: self.scanned,
            more: self.more,
        })
    }
}
