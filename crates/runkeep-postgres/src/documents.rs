//! The run's documents (record, message snapshot, report): writes and
//! reads.

use serde_json::Value;

use runkeep::evidence::{check_document_size, check_json_document};
use runkeep::{Error, Fence, MessageSnapshot, Result, RunRecord, RunScope};

use crate::db::pipeline::{Param, Stmt};
use crate::db::row::{corrupted, i64_of, Key, KEY_COLS, KEY_WHERE};
use crate::db::tx::{Opening, Verdict, Writes};
use crate::db::Db;

/// The values of the `messages` and `messages_through` columns for a
/// snapshot of `messages` through event `through`, checked for size.
pub(crate) fn messages_values(db: &Db, messages: &[Value], through: u64) -> Result<(Param, Param)> {
    let v = Value::Array(messages.to_vec());
    db.check_json("message snapshot", &v)?;
    Ok((Box::new(v), Box::new(i64_of(through))))
}

pub(crate) async fn write_run_record(
    db: &Db,
    scope: &RunScope,
    record: &RunRecord,
    fence: Option<Fence>,
) -> Result<()> {
    let v = serde_json::to_value(record).map_err(|e| Error::invalid(format!("run record: {e}")))?;
    check_json_document("run record", record, record.values())?;
    db.check_json("run record", &v)?;
    write_document(
        db,
        "write_run_record",
        scope,
        fence,
        &["record"],
        vec![Box::new(v)],
    )
    .await
}

pub(crate) async fn read_run_record(db: &Db, scope: &RunScope) -> Result<Option<RunRecord>> {
    let key = Key::of(scope);
    let c = db.conn("read_run_record").await?;
    let r = db
        .row_opt(
            &c,
            "read the run record",
            &format!("SELECT record FROM runs WHERE {KEY_WHERE}"),
            &key.params(),
        )
        .await?;
    match r.and_then(|r| r.get::<_, Option<Value>>(0)) {
        None => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| corrupted(scope, "the run record", e)),
    }
}

pub(crate) async fn write_messages(
    db: &Db,
    scope: &RunScope,
    messages: &[Value],
    through_event_seq: u64,
    fence: Option<Fence>,
) -> Result<()> {
    check_json_document("message snapshot", messages, messages)?;
    let v = Value::Array(messages.to_vec());
    db.check_json("message snapshot", &v)?;
    let values: Vec<Param> = vec![Box::new(v), Box::new(i64_of(through_event_seq))];
    write_document(
        db,
        "write_messages",
        scope,
        fence,
        &["messages", "messages_through"],
        values,
    )
    .await
}

pub(crate) async fn read_messages(db: &Db, scope: &RunScope) -> Result<MessageSnapshot> {
    let key = Key::of(scope);
    let c = db.conn("read_messages").await?;
    let r = db
        .row_opt(
            &c,
            "read the message snapshot",
            &format!("SELECT messages, messages_through FROM runs WHERE {KEY_WHERE}"),
            &key.params(),
        )
        .await?;
    let Some(r) = r else {
        return Ok(MessageSnapshot::Unavailable);
    };
    let messages: Option<Value> = r.get(0);
    let through: Option<i64> = r.get(1);
    match messages {
        None => Ok(MessageSnapshot::Unavailable),
        Some(Value::Array(messages)) => Ok(MessageSnapshot::Available {
            through_event_seq: u64::try_from(through.unwrap_or(0)).unwrap_or(0),
            messages,
        }),
        Some(other) => Err(corrupted(
            scope,
            "the message snapshot",
            format!("not an array: {other}"),
        )),
    }
}

pub(crate) async fn write_report(
    db: &Db,
    scope: &RunScope,
    report: &str,
    fence: Option<Fence>,
) -> Result<()> {
    check_document_size("report", report.len())?;
    db.check_payload("report", report.len())?;
    if report.contains('\0') {
        return Err(Error::invalid(
            "report contains a NUL character, which PostgreSQL text cannot store",
        ));
    }
    write_document(
        db,
        "write_report",
        scope,
        fence,
        &["report"],
        vec![Box::new(report.to_string())],
    )
    .await
}

pub(crate) async fn read_report(db: &Db, scope: &RunScope) -> Result<Option<String>> {
    let key = Key::of(scope);
    let c = db.conn("read_report").await?;
    let r = db
        .row_opt(
            &c,
            "read the report",
            &format!("SELECT report FROM runs WHERE {KEY_WHERE}"),
            &key.params(),
        )
        .await?;
    Ok(r.and_then(|r| r.get(0)))
}

/// A document write: `columns` set to `values` (`$6`, `$7`, …).
///
/// Fenced, or unfenced while acting for a principal (`runkeep::acting`: the
/// holding on top must not be another principal's): under the row lock and
/// the write rule (a fenced write's row exists: a fence needs a holding; an
/// unfenced one creates it). Unfenced and acting for no one: nothing to
/// judge, so one statement on its own, an upsert that creates the run's row
/// when absent (one round trip; its reply is its commit).
async fn write_document(
    db: &Db,
    what: &'static str,
    scope: &RunScope,
    fence: Option<Fence>,
    columns: &[&str],
    values: Vec<Param>,
) -> Result<()> {
    let key = Key::of(scope);
    if fence.is_none() && runkeep::acting::current().is_none() {
        let names = columns.join(", ");
        let slots: Vec<String> = (6..6 + columns.len()).map(|i| format!("${i}")).collect();
        let set: Vec<String> = columns
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect();
        let upsert = Stmt::new(
            "write a document",
            format!(
                "INSERT INTO runs ({KEY_COLS}, {names}) VALUES ($1, $2, $3, $4, $5, {}) ON CONFLICT ({KEY_COLS}) DO UPDATE SET {}",
                slots.join(", "),
                set.join(", ")
            ),
            key.owned(values),
        );
        return db.write_alone(what, upsert).await;
    }
    let set: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} = ${}", i + 6))
        .collect();
    let opening = Opening {
        create: fence.is_none(),
        ..Opening::default()
    };
    let update = Stmt::new(
        "write a document",
        format!("UPDATE runs SET {} WHERE {KEY_WHERE}", set.join(", ")),
        key.owned(values),
    );
    db.write_locked(what, scope, opening, |l| {
        l.run.check(scope, what, fence)?;
        Ok(Verdict::Write((), Writes::default().stmt(update)))
    })
    .await
}
