//! Checkpoints: the checkpoint body, its write, read and prune.

use super::*;

/// The `limit` of a checkpoint listing that gives none.
pub const DEFAULT_CHECKPOINTS_PAGE: usize = 100;
/// The largest `limit` a checkpoint listing accepts (400 above it).
pub const MAX_CHECKPOINTS_PAGE: usize = 1000;

/// A checkpoint: its header and the host's state, apart.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointBody {
    /// Id; writing an existing id replaces it.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub id: String,
    /// Written at, epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub created_at: i64,
    /// Run start, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub run_created_at: Option<i64>,
    /// The park, when the run parks here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingBody>,
    /// The fence it was written under (set by the store; ignored on input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
    /// The host's state, kept as given. Absent in a listing's `summary`
    /// form (read the checkpoint by id for it).
    #[serde(default)]
    #[schema(schema_with = checkpoint_state)]
    pub state: Object,
}

impl From<&Checkpoint> for CheckpointBody {
    fn from(c: &Checkpoint) -> Self {
        Self {
            id: c.id.to_string(),
            created_at: ms(c.created_at),
            run_created_at: c.run_created_at.map(ms),
            pending: c.pending.as_ref().map(Into::into),
            fence: c.fence.map(Fence::get),
            state: c.state.clone(),
        }
    }
}

impl From<Checkpoint> for CheckpointBody {
    /// Moves the state (an answer's checkpoint is not copied).
    fn from(mut c: Checkpoint) -> Self {
        let state = std::mem::take(&mut c.state);
        Self {
            state,
            ..Self::from(&c)
        }
    }
}

impl CheckpointBody {
    /// The core checkpoint, moving the state (a request's checkpoint is not
    /// copied); `field` names it in errors.
    pub fn into_checkpoint(self, field: &str) -> Result<Checkpoint, Problem> {
        let mut cp = self.clone_header().to_checkpoint(field)?;
        cp.state = self.state;
        Ok(cp)
    }

    fn clone_header(&self) -> Self {
        Self {
            id: self.id.clone(),
            created_at: self.created_at,
            run_created_at: self.run_created_at,
            pending: self.pending.clone(),
            fence: self.fence,
            state: Map::new(),
        }
    }

    /// The core checkpoint; `field` names it in errors.
    pub fn to_checkpoint(&self, field: &str) -> Result<Checkpoint, Problem> {
        let f = |n: &str| format!("{field}.{n}");
        Ok(Checkpoint {
            id: CheckpointId::new(&self.id).map_err(|e| bad(&f("id"), e))?,
            created_at: instant(&f("createdAt"), self.created_at)?,
            run_created_at: opt_instant(&f("runCreatedAt"), self.run_created_at)?,
            pending: self
                .pending
                .as_ref()
                .map(|p| p.to_pending(&f("pending")))
                .transpose()?,
            fence: opt_fence(&f("fence"), self.fence)?,
            state: self.state.clone(),
        })
    }
}

/// A checkpoint write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteCheckpointBody {
    /// The checkpoint.
    pub checkpoint: CheckpointBody,
    /// The holding it is written under (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// A checkpoint (or none).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeCheckpoint {
    /// The checkpoint, `null` when there is none.
    pub checkpoint: Option<CheckpointBody>,
}

/// Prune: keep the newest `keepLast`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PruneBody {
    /// How many to keep (unanswered parks are always kept).
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub keep_last: usize,
    /// The holding; absent: an operator's prune.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// The ids a prune deleted.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
pub struct Pruned {
    /// Deleted checkpoint ids.
    #[schema(schema_with = pruned_ids)]
    pub deleted: Vec<String>,
}

/// [`CheckpointBody::state`]'s schema: an object without the store's keys
/// ([`runkeep::checkpoint::RESERVED_CHECKPOINT_KEYS`]). A `runId` key is
/// allowed only when it is the run's own id, so the document refuses it
/// too.
fn checkpoint_state() -> utoipa::openapi::Schema {
    let mut keys = runkeep::checkpoint::RESERVED_CHECKPOINT_KEYS.to_vec();
    keys.push("runId");
    crate::openapi::object_refusing_keys(
        &format!(
            "The host's state, kept as given. It may not use the store's keys ({}); a `runId` key is allowed only when it is the run's own id, so the document leaves it out.",
            runkeep::checkpoint::RESERVED_CHECKPOINT_KEYS.map(|k| format!("`{k}`")).join(", ")
        ),
        &keys,
    )
}

/// [`Pruned::deleted`]'s schema: checkpoint ids.
fn pruned_ids() -> utoipa::openapi::Schema {
    use utoipa::openapi::RefOr;
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(RefOr::T(crate::openapi::id_schema()))
        .description(Some("Deleted checkpoint ids."))
        .build()
        .into()
}
