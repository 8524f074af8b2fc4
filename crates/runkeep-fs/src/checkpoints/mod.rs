//! Checkpoints: the files (`checkpoints/<id>.json`), the per-run digest
//! that lets a listing build a row without parsing any checkpoint, and the
//! store's checkpoint operations.
//!
//! Where each part lives, top-down:
//!
//! - [`operations`]: what the store calls (write, read, list, delete,
//!   resolve a park, prune), each write on the fenced-write skeleton;
//! - [`digest`]: the digest, its freshness stamp, the writer's O(1)
//!   update under the lock and the rebuild after it;
//! - [`files`]: names, encoding and reads of the checkpoint files, the
//!   directory's entries, the sidecar a write starts with.

mod digest;
mod files;
mod operations;

pub(crate) use digest::{current_digest, fresh_digest, rebuild, Fresh};
pub(crate) use files::{
    check_schema, decode, entries, read_all, read_one, CHECKPOINTS_DIR, SCHEMA_VERSION,
};
pub(crate) use operations::{
    checkpoint_sidecar, delete_checkpoint, list_checkpoints, prune_checkpoints, publish_checkpoint,
    put_checkpoint, read_checkpoint, resolve_park, update_checkpoint, write_checkpoint,
};
