//! A LangGraph thread's pending writes on one checkpoint, and the rule that
//! merges a task's batch into them.
//!
//! The HTTP server keeps a thread in one run; the pending writes of a
//! thread checkpoint are one runkeep checkpoint (the *writes record*) that
//! every task of a step adds its batch to. Adding is read-modify-write, so
//! two batches arriving at once must not both start from the same old
//! record: the store runs [`merge`] inside
//! [`crate::CheckpointStore::update_checkpoint`], under its own lock or
//! transaction, and this module is the only place the rule is written.
//!
//! The rule:
//! - a write is keyed by `(task_id, idx)`; an ordinary write (`idx >= 0`)
//!   is kept as first written, a special channel's slot (`idx < 0`) is
//!   replaced by a repeat;
//! - `resume` answers the park that was open before the batch (at the
//!   batch's instant); an answered park stays as first answered;
//! - a resume answers only the interrupts the park held before the resume.
//!   A writer that names them (`resume_of`: the interrupt ids of the park
//!   its graph was resumed on, as it read them) is held to that: a resume
//!   naming none of the open park's interrupts was overtaken by the next
//!   question (LangGraph sends a `Command(resume=…)`'s write and the
//!   resumed node's next interrupt concurrently, so they can arrive in
//!   either order) and answers nothing; interrupts it does not name were
//!   asked after it (merged into the park first) and stay waiting, alone
//!   in the park. A resume naming nothing answers the open park whole;
//! - a batch's `park` equal to the stored one keeps the stored one; two open
//!   `langgraph-interrupt` parks (one per task of a step) merge into one
//!   whose `interrupts` are the union by interrupt `id` in arrival order,
//!   each entry carrying its `taskId`; any other park replaces the stored
//!   one.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checkpoint::Checkpoint;
use crate::id::CheckpointId;
use crate::park::PendingDecision;
use crate::time::Timestamp;

/// The state key that marks a thread record, and its kind.
pub const RECORD_KEY: &str = "threadRecord";
/// The kind of a writes record.
pub const KIND_WRITES: &str = "writes";
/// The request type of a LangGraph interrupt park.
pub const INTERRUPT_REQUEST: &str = "langgraph-interrupt";

/// One stored pending write (the `writes` array of a writes record).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingWrite {
    /// The task that wrote it.
    pub task_id: String,
    /// The task's path.
    pub task_path: String,
    /// Its index (negative: a special channel's slot).
    pub idx: i32,
    /// The channel.
    pub channel: String,
    /// The client's serialization tag.
    #[serde(rename = "type")]
    pub value_type: String,
    /// Base64 of the serialized value, or `None`.
    pub data: Option<String>,
}

/// One task's batch of writes on one thread checkpoint.
#[derive(Clone, PartialEq, Debug)]
pub struct WritesBatch {
    /// The thread's own id.
    pub thread: String,
    /// The checkpoint's namespace.
    pub ns: String,
    /// The thread checkpoint the writes belong to.
    pub checkpoint_id: String,
    /// The task writing (every write of the batch is this task's).
    pub task_id: String,
    /// The task's path.
    pub task_path: String,
    /// The writes as `(idx, channel, type, data)`.
    pub writes: Vec<(i32, String, String, Option<String>)>,
    /// A park the batch opens (an interrupt).
    pub park: Option<PendingDecision>,
    /// The decision that answers the park open before this batch.
    pub resume: Option<Value>,
    /// The interrupt ids of the park `resume` was made for (as the writer
    /// read it): the resume answers only those (`None`: whatever is open).
    pub resume_of: Option<Vec<String>>,
}

/// The pending writes a writes record holds (none for any other record, or
/// one whose `writes` cannot be read).
pub fn stored_writes(cp: &Checkpoint) -> Vec<PendingWrite> {
    if cp.state.get(RECORD_KEY).and_then(Value::as_str) != Some(KIND_WRITES) {
        return Vec::new();
    }
    cp.state
        .get("writes")
        .cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

/// The writes record `id` after `batch`, given the record stored now
/// (`None`: none yet; a checkpoint of another kind counts as none) and the
/// store's instant `now`. Pure: a store may call it again if it retries.
pub fn merge(
    id: &CheckpointId,
    existing: Option<&Checkpoint>,
    batch: &WritesBatch,
    now: Timestamp,
) -> Checkpoint {
    let existing =
        existing.filter(|cp| cp.state.get(RECORD_KEY).and_then(Value::as_str) == Some(KIND_WRITES));
    let mut writes = existing.map(stored_writes).unwrap_or_default();
    let old_pending = existing.and_then(|cp| cp.pending.clone());
    for (idx, channel, value_type, data) in &batch.writes {
        let slot = writes
            .iter()
            .position(|x| x.task_id == batch.task_id && x.idx == *idx);
        let stored = PendingWrite {
            task_id: batch.task_id.clone(),
            task_path: batch.task_path.clone(),
            idx: *idx,
            channel: channel.clone(),
            value_type: value_type.clone(),
            data: data.clone(),
        };
        match slot {
            Some(_) if *idx >= 0 => {}
            Some(i) => writes[i] = stored,
            None => writes.push(stored),
        }
    }
    let old_pending = match (old_pending, &batch.resume) {
        (Some(old), Some(decision)) if old.resolved_at.is_none() => {
            Some(answer(old, decision, batch.resume_of.as_deref(), now))
        }
        (old, _) => old,
    };
    let pending = match (old_pending, batch.park.clone()) {
        (Some(old), Some(new)) if old.request == new.request => Some(old),
        (Some(old), Some(new)) if old.resolved_at.is_none() && both_interrupts(&old, &new) => {
            Some(merge_interrupts(old, &new.request, &batch.task_id))
        }
        (_, Some(new)) => Some(with_task_ids(new, &batch.task_id)),
        (old, None) => old,
    };
    let mut s = Map::new();
    s.insert(RECORD_KEY.into(), KIND_WRITES.into());
    s.insert("thread".into(), batch.thread.clone().into());
    s.insert("ns".into(), batch.ns.clone().into());
    s.insert("checkpointId".into(), batch.checkpoint_id.clone().into());
    s.insert(
        "writes".into(),
        serde_json::to_value(&writes).unwrap_or(Value::Array(Vec::new())),
    );
    Checkpoint {
        id: id.clone(),
        created_at: now,
        run_created_at: None,
        pending,
        fence: None,
        state: s,
    }
}

/// The open park `old` after a resume `decision` made for the interrupts
/// `resume_of` (`None`: whatever is open): closed when it holds only
/// interrupts the resume was made for, left as it is when it holds none
/// of them (the resume's park was answered and gave way to a later
/// question before the resume arrived), and otherwise left open with only
/// the interrupts asked after the resume.
fn answer(
    mut old: PendingDecision,
    decision: &Value,
    resume_of: Option<&[String]>,
    now: Timestamp,
) -> PendingDecision {
    let entries = match old.request.get("interrupts") {
        Some(Value::Array(a)) if old.request_type() == INTERRUPT_REQUEST => Some(a),
        _ => None,
    };
    if let (Some(ids), Some(entries)) = (resume_of, entries) {
        let named = |e: &&Value| {
            e.get("id")
                .and_then(Value::as_str)
                .is_some_and(|id| ids.iter().any(|x| x == id))
        };
        if !entries.iter().any(|e| named(&e)) {
            return old;
        }
        let after: Vec<Value> = entries.iter().filter(|e| !named(e)).cloned().collect();
        if !after.is_empty() {
            old.request.insert("interrupts".into(), Value::Array(after));
            return old;
        }
    }
    old.resolved_at = Some(now);
    old.decision = Some(decision.clone());
    old
}

fn both_interrupts(a: &PendingDecision, b: &PendingDecision) -> bool {
    a.request_type() == INTERRUPT_REQUEST && b.request_type() == INTERRUPT_REQUEST
}

/// The request's `interrupts` entries, each carrying a `taskId` (the
/// request's own `taskId`, else `task_id`, when it has none).
fn interrupt_entries(request: &Map<String, Value>, task_id: &str) -> Vec<Value> {
    let task = request
        .get("taskId")
        .and_then(Value::as_str)
        .unwrap_or(task_id)
        .to_string();
    let entries = match request.get("interrupts") {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    entries
        .into_iter()
        .map(|mut e| {
            if let Value::Object(o) = &mut e {
                o.entry("taskId")
                    .or_insert_with(|| Value::String(task.clone()));
            }
            e
        })
        .collect()
}

/// A new park with `taskId` on each of its interrupts.
fn with_task_ids(mut p: PendingDecision, task_id: &str) -> PendingDecision {
    if p.request_type() == INTERRUPT_REQUEST
        && p.request.get("interrupts").is_some_and(Value::is_array)
    {
        let entries = interrupt_entries(&p.request, task_id);
        p.request.insert("interrupts".into(), Value::Array(entries));
    }
    p
}

/// The open park `old` with the interrupts of `new` added: the union by
/// interrupt `id` (an entry without an id by its whole value), in arrival
/// order.
fn merge_interrupts(
    mut old: PendingDecision,
    new: &Map<String, Value>,
    task_id: &str,
) -> PendingDecision {
    let mut merged = interrupt_entries(&old.request, task_id);
    for e in interrupt_entries(new, task_id) {
        let id = e.get("id").and_then(Value::as_str);
        let known = merged.iter().any(|m| match id {
            Some(id) => m.get("id").and_then(Value::as_str) == Some(id),
            None => *m == e,
        });
        if !known {
            merged.push(e);
        }
    }
    old.request
        .insert("interrupts".into(), Value::Array(merged));
    old
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(task: &str, writes: &[(i32, &str)]) -> WritesBatch {
        WritesBatch {
            thread: "t".into(),
            ns: String::new(),
            checkpoint_id: "c1".into(),
            task_id: task.into(),
            task_path: String::new(),
            writes: writes
                .iter()
                .map(|(i, ch)| (*i, (*ch).to_string(), "json".to_string(), None))
                .collect(),
            park: None,
            resume: None,
            resume_of: None,
        }
    }

    #[test]
    fn keeps_the_first_ordinary_write_and_replaces_a_special_slot() {
        let id = CheckpointId::new("tw-0-rc1").unwrap();
        let now = Timestamp::from_millis(5).unwrap();
        let one = merge(&id, None, &batch("a", &[(0, "x"), (-1, "s1")]), now);
        let two = merge(&id, Some(&one), &batch("a", &[(0, "y"), (-1, "s2")]), now);
        let three = merge(&id, Some(&two), &batch("b", &[(0, "z")]), now);
        let got: Vec<(String, i32, String)> = stored_writes(&three)
            .into_iter()
            .map(|w| (w.task_id, w.idx, w.channel))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), 0, "x".into()),
                ("a".into(), -1, "s2".into()),
                ("b".into(), 0, "z".into()),
            ]
        );
    }

    fn asks(task: &str, id: &str, q: &str) -> PendingDecision {
        let mut request = Map::new();
        request.insert("taskId".into(), task.into());
        request.insert(
            "interrupts".into(),
            serde_json::json!([{ "id": id, "value": { "q": q } }]),
        );
        PendingDecision::new(
            INTERRUPT_REQUEST,
            request,
            Timestamp::from_millis(1).unwrap(),
        )
    }

    fn resume(task: &str, value: &str, of: Option<&[&str]>) -> WritesBatch {
        WritesBatch {
            resume: Some(value.into()),
            resume_of: of.map(|ids| ids.iter().map(|i| (*i).to_string()).collect()),
            ..batch(task, &[(-3, "__resume__")])
        }
    }

    fn questions(cp: &Checkpoint) -> (bool, Vec<String>) {
        let p = cp.pending.as_ref().expect("a park");
        let qs = p.request["interrupts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["value"]["q"].as_str().unwrap().to_string())
            .collect();
        (p.resolved_at.is_some(), qs)
    }

    const NULL: &str = "00000000-0000-0000-0000-000000000000";

    /// `Command(resume="one")` on a node that asks twice: LangGraph sends
    /// the null task's resume and the node's next interrupt at once. Here
    /// the interrupt is stored first (the resume overtaken), in both
    /// savers' shapes: Python's node batch answers the first question
    /// itself, LangGraph.js's only asks (merged into the open park).
    #[test]
    fn a_resume_overtaken_by_the_next_question_answers_only_the_question_it_was_made_for() {
        let id = CheckpointId::new("tw-0-rc1").unwrap();
        let now = Timestamp::from_millis(5).unwrap();
        let first = WritesBatch {
            park: Some(asks("t", "i1", "first?")),
            ..batch("t", &[(-3, "__interrupt__")])
        };
        let p1 = merge(&id, None, &first, now);
        assert_eq!(questions(&p1), (false, vec!["first?".into()]));

        // Python: the node's batch carries its own answer to i1.
        let node = WritesBatch {
            park: Some(asks("t", "i2", "second?")),
            resume: Some("one".into()),
            resume_of: Some(vec!["i1".into()]),
            ..batch("t", &[(-3, "__interrupt__"), (-4, "__resume__")])
        };
        let p2 = merge(&id, Some(&p1), &node, now);
        assert_eq!(questions(&p2), (false, vec!["second?".into()]));
        let late = merge(&id, Some(&p2), &resume(NULL, "one", Some(&["i1"])), now);
        assert_eq!(
            questions(&late),
            (false, vec!["second?".into()]),
            "the late resume answers nothing"
        );
        let two = merge(&id, Some(&late), &resume(NULL, "two", Some(&["i2"])), now);
        assert_eq!(questions(&two), (true, vec!["second?".into()]));
        assert_eq!(two.pending.unwrap().decision, Some("two".into()));

        // LangGraph.js: the node's batch only asks; merged into the open park.
        let asks_only = WritesBatch {
            park: Some(asks("t", "i2", "second?")),
            ..batch("t", &[(-3, "__interrupt__")])
        };
        let merged = merge(&id, Some(&p1), &asks_only, now);
        assert_eq!(
            questions(&merged),
            (false, vec!["first?".into(), "second?".into()])
        );
        let late = merge(&id, Some(&merged), &resume(NULL, "one", Some(&["i1"])), now);
        assert_eq!(
            questions(&late),
            (false, vec!["second?".into()]),
            "the question asked after the resume stays waiting, alone"
        );
        let two = merge(&id, Some(&late), &resume(NULL, "two", Some(&["i2"])), now);
        assert_eq!(questions(&two), (true, vec!["second?".into()]));
    }

    #[test]
    fn a_resume_naming_the_open_park_or_nothing_closes_it_whole() {
        let id = CheckpointId::new("tw-0-rc1").unwrap();
        let now = Timestamp::from_millis(5).unwrap();
        let mut two = asks("a", "i1", "a?");
        two.request["interrupts"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({ "id": "i2", "value": { "q": "b?" }, "taskId": "b" }));
        let open = merge(
            &id,
            None,
            &WritesBatch {
                park: Some(two),
                ..batch("a", &[])
            },
            now,
        );
        for of in [None, Some(&["i1", "i2"][..]), Some(&["i2", "i1", "i0"][..])] {
            let closed = merge(&id, Some(&open), &resume(NULL, "yes", of), now);
            assert_eq!(
                questions(&closed),
                (true, vec!["a?".into(), "b?".into()]),
                "{of:?}"
            );
        }
        // An answered park keeps its first answer whatever a resume names.
        let closed = merge(&id, Some(&open), &resume(NULL, "yes", None), now);
        let again = merge(&id, Some(&closed), &resume(NULL, "no", Some(&["i1"])), now);
        assert_eq!(again.pending.unwrap().decision, Some("yes".into()));
    }
}
