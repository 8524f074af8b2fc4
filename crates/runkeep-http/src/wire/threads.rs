//! The wire shapes of the thread routes: a LangGraph-style checkpoint
//! chain kept in one run.
//!
//! A *thread* is one run. Inside it, *thread checkpoints* are keyed by
//! `(ns, checkpointId)` (a namespace: `""` for the root graph, one per
//! subgraph), each with its parent id, the checkpoint document without its
//! channel values, its metadata, and the channel values it changed
//! (`blobs`, one per `(channel, version)`). *Writes* (a checkpoint's
//! pending writes) are keyed by `(taskId, idx)` per checkpoint. The server
//! keeps all of it as ordinary runkeep checkpoints of the run (one for a
//! thread checkpoint, one for its writes), so every write is fenced like
//! any other and the run's lease is the thread's write ownership.
//!
//! Values (`data`) are opaque to the server: base64 of the client's
//! serialized bytes, with the client's `type` tag (`null` data for a value
//! without bytes).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

type Object = Map<String, Value>;

/// One channel value at one version (a "blob").
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadBlobBody {
    /// The channel.
    pub channel: String,
    /// The version, as text (an integer version as its decimal digits): it
    /// is matched against the checkpoint's `channel_versions` entry for the
    /// channel, a string as itself and a number as its JSON text.
    pub version: String,
    /// The client's serialization tag (e.g. `msgpack`, `json`, `empty`).
    #[serde(rename = "type")]
    pub value_type: String,
    /// Base64 of the serialized value; `null` for a value without bytes.
    #[serde(default)]
    pub data: Option<String>,
}

/// Writes a thread checkpoint (replacing one with the same `ns` and
/// `checkpointId`) and the channel values it changed.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutThreadCheckpointBody {
    /// The thread's own id as the client names it (any string; the run id
    /// is the client's encoding of it). Returned by cross-thread listings.
    #[schema(min_length = 1)]
    pub thread: String,
    /// The namespace (`""`: the root graph).
    #[serde(default)]
    pub ns: String,
    /// The checkpoint's id. Ids of one namespace order the chain: the
    /// latest checkpoint is the greatest id (byte order).
    #[schema(min_length = 1)]
    pub checkpoint_id: String,
    /// The parent checkpoint's id (same namespace), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The checkpoint document without its channel values (kept as given;
    /// its `channel_versions` member, when an object, says which blob each
    /// channel reads back).
    #[schema(value_type = Object)]
    pub checkpoint: Object,
    /// The checkpoint's metadata (kept as given; what `filter` matches).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: Object,
    /// The channel values this checkpoint changed (its new versions).
    #[serde(default)]
    pub blobs: Vec<ThreadBlobBody>,
    /// The holding it is written under (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// One pending write of a task.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadWriteBody {
    /// Its index in the task's writes: `>= 0` for an ordinary write (a
    /// repeated `(taskId, idx)` is ignored: the first write stays), `< 0`
    /// for a special channel's fixed slot (a repeat replaces it).
    #[schema(minimum = -2_147_483_648_i64, maximum = 2147483647)]
    pub idx: i32,
    /// The channel written.
    pub channel: String,
    /// The client's serialization tag.
    #[serde(rename = "type")]
    pub value_type: String,
    /// Base64 of the serialized value; `null` for a value without bytes.
    #[serde(default)]
    pub data: Option<String>,
}

/// The park a batch of writes opens on its checkpoint (an interrupt): the
/// run parks there, with `request` for whoever answers it.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadParkBody {
    /// The human-facing request; carries a string `type`.
    #[schema(schema_with = super::parks::park_request)]
    pub request: Object,
    /// Deadline, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline_at: Option<i64>,
}

/// Stores a task's pending writes on a thread checkpoint.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutThreadWritesBody {
    /// The thread's own id (as in [`PutThreadCheckpointBody::thread`]).
    #[schema(min_length = 1)]
    pub thread: String,
    /// The namespace of the checkpoint written to.
    #[serde(default)]
    pub ns: String,
    /// The checkpoint the writes belong to.
    #[schema(min_length = 1)]
    pub checkpoint_id: String,
    /// The task writing.
    #[schema(min_length = 1)]
    pub task_id: String,
    /// The task's path (sorts writes).
    #[serde(default)]
    pub task_path: String,
    /// The writes, each keyed by `(taskId, idx)`.
    pub writes: Vec<ThreadWriteBody>,
    /// Parks the run on this checkpoint (an interrupt). A park already
    /// open there with the same request is kept; an answered one is
    /// replaced by a new one. Two open `langgraph-interrupt` requests
    /// (one per task of a step) merge: the stored request's `interrupts`
    /// becomes the union by interrupt `id`, in arrival order, each entry
    /// keeping its `taskId` (the batch's `taskId` when it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ThreadParkBody>,
    /// Closes the checkpoint's outstanding park in the same write
    /// (resolved at the store's clock, this value its decision): how
    /// `Command(resume=…)` in code answers an interrupt. Ignored when the
    /// park is already answered or there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Value>,
    /// The interrupt ids of the park `resume` was made for, as the writer
    /// read it (the park its graph was resumed on): the resume answers
    /// only those. When the open park holds none of them, the resume was
    /// overtaken by a question asked after it and answers nothing; the
    /// park's other interrupts (asked after it) stay waiting, alone in the
    /// park. Absent: the resume answers the open park whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_of: Option<Vec<String>>,
    /// The holding it is written under (absent: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// A stored pending write.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoredThreadWrite {
    /// The task that wrote it.
    pub task_id: String,
    /// The task's path.
    pub task_path: String,
    /// Its index (negative: a special channel's slot).
    #[schema(minimum = -2_147_483_648_i64, maximum = 2147483647)]
    pub idx: i32,
    /// The channel.
    pub channel: String,
    /// The client's serialization tag.
    #[serde(rename = "type")]
    pub value_type: String,
    /// Base64 of the serialized value, or `null`.
    pub data: Option<String>,
}

/// A thread checkpoint as read back: the checkpoint, its channel values
/// rebuilt from its `channel_versions`, and its pending writes.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadCheckpointBody {
    /// The thread's own id (as the writer named it).
    pub thread: String,
    /// The run that keeps the thread.
    pub run: String,
    /// The namespace.
    pub ns: String,
    /// The checkpoint id.
    pub checkpoint_id: String,
    /// The parent's id.
    pub parent_id: Option<String>,
    /// The checkpoint document as written.
    #[schema(value_type = Object)]
    pub checkpoint: Object,
    /// The metadata as written.
    #[schema(value_type = Object)]
    pub metadata: Object,
    /// For each channel of `channel_versions` whose value at that version
    /// was written (by this checkpoint or an earlier one of the namespace):
    /// that value. A channel whose blob was never written is absent.
    pub values: Vec<ThreadBlobBody>,
    /// The pending writes, in `(taskPath, taskId, idx)` order.
    pub writes: Vec<StoredThreadWrite>,
    /// The fence it was written under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
    /// Written at (the store's clock), epoch ms.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub created_at: i64,
    /// The runkeep checkpoint that holds this checkpoint's writes and its
    /// park, when one was opened there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ThreadParkState>,
}

/// The park opened on a thread checkpoint by its writes.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadParkState {
    /// The runkeep checkpoint id holding the park (what the console and
    /// `resolve_park` name).
    pub checkpoint: String,
    /// The park.
    pub pending: crate::wire::PendingBody,
}

/// A thread checkpoint, or none.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct MaybeThreadCheckpoint {
    /// The checkpoint; `null` when there is none.
    pub checkpoint: Option<ThreadCheckpointBody>,
}

/// Thread checkpoints, newest first (greatest checkpoint id first).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
pub struct ThreadCheckpointList {
    /// The checkpoints.
    pub checkpoints: Vec<ThreadCheckpointBody>,
}

/// A thread deleted.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadDeleted {
    /// How many runkeep checkpoints (thread checkpoints and write records)
    /// were deleted.
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub checkpoint_count: u64,
}

/// One thread checkpoint named for deletion.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThreadCheckpointRef {
    /// The namespace (`""`: the root graph).
    #[serde(default)]
    pub ns: String,
    /// The checkpoint id.
    #[schema(min_length = 1)]
    pub checkpoint_id: String,
}

/// Deletes chosen checkpoints of a thread (LangGraph's `prune` and
/// `delete_for_runs`): each checkpoint record and its writes record.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeleteThreadCheckpointsBody {
    /// The checkpoints to delete (at most 10 000).
    #[schema(max_items = 10000)]
    pub checkpoints: Vec<ThreadCheckpointRef>,
    /// The holding the delete is made under (absent or `null`: unfenced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 999_999_999_999_999_i64)]
    pub fence: Option<u64>,
}

/// Thread checkpoints deleted.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ThreadCheckpointsDeleted {
    /// How many of the named thread checkpoints existed and were deleted.
    #[schema(maximum = 9_007_199_254_740_991_i64)]
    pub deleted: u64,
}
