//! The cases, grouped by the rule they check. Each is `async fn(store,
//! declared_version)` and panics with a message naming what broke.

mod checkpoints;
mod claims;
mod evidence;
mod fencing;
mod listing;
mod parks;
mod queue;

pub use checkpoints::*;
pub use claims::*;
pub use evidence::*;
pub use fencing::*;
pub use listing::*;
pub use parks::*;
pub use queue::*;
