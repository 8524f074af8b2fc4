//! The run's documents (record, message snapshot, report): writes and
//! reads.

use serde_json::Value;

use runkeep::evidence::{check_document_size, check_json_document};
use runkeep::{Error, Fence, MessageSnapshot, Result, RunRecord, RunScope};

use crate::pipeline::{Param, Stmt};
use crate::row::{corrupted, i64_of, Key, KEY_WHERE};
use crate::store::PgStore;
use crate::tx::Opening;

impl PgStore {
    /// Sets one document column (`record` or `report`).
    pub(crate) fn document_stmt(key: &Key, column: &str, value: Param) -> Stmt {
        Stmt::new(
            "write a document",
            format!("UPDATE runs SET {column} = $6 WHERE {KEY_WHERE}"),
            key.owned(vec![value]),
        )
    }

    pub(crate) fn messages_stmt(
        &self,
        key: &Key,
        messages: &[Value],
        through: u64,
    ) -> Result<Stmt> {
        let v = Value::Array(messages.to_vec());
        self.check_json("message snapshot", &v)?;
        Ok(Stmt::new(
            "write the message snapshot",
            format!("UPDATE runs SET messages = $6, messages_through = $7 WHERE {KEY_WHERE}"),
            key.owned(vec![Box::new(v), Box::new(i64_of(through))]),
        ))
    }
}

pub(crate) async fn write_run_record(
    store: &PgStore,
    scope: &RunScope,
    record: &RunRecord,
    fence: Option<Fence>,
) -> Result<()> {
    let v = serde_json::to_value(record).map_err(|e| Error::invalid(format!("run record: {e}")))?;
    check_json_document("run record", record, record.values())?;
    store.check_json("run record", &v)?;
    let key = Key::of(scope);
    let what = "write_run_record";
    let opening = Opening {
        create: fence.is_none(),
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    o.state.unwrap_or_default().check(scope, what, fence)?;
    store
        .commit(
            tx,
            what,
            vec![PgStore::document_stmt(&key, "record", Box::new(v))],
        )
        .await
}

pub(crate) async fn read_run_record(
    store: &PgStore,
    scope: &RunScope,
) -> Result<Option<RunRecord>> {
    let key = Key::of(scope);
    let c = store.conn("read_run_record").await?;
    let r = store
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
    store: &PgStore,
    scope: &RunScope,
    messages: &[Value],
    through_event_seq: u64,
    fence: Option<Fence>,
) -> Result<()> {
    check_json_document("message snapshot", messages, messages)?;
    let key = Key::of(scope);
    let what = "write_messages";
    let write = store.messages_stmt(&key, messages, through_event_seq)?;
    let opening = Opening {
        create: fence.is_none(),
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    o.state.unwrap_or_default().check(scope, what, fence)?;
    store.commit(tx, what, vec![write]).await
}

pub(crate) async fn read_messages(store: &PgStore, scope: &RunScope) -> Result<MessageSnapshot> {
    let key = Key::of(scope);
    let c = store.conn("read_messages").await?;
    let r = store
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
    store: &PgStore,
    scope: &RunScope,
    report: &str,
    fence: Option<Fence>,
) -> Result<()> {
    check_document_size("report", report.len())?;
    store.check_payload("report", report.len())?;
    if report.contains('\0') {
        return Err(Error::invalid(
            "report contains a NUL character, which PostgreSQL text cannot store",
        ));
    }
    let key = Key::of(scope);
    let what = "write_report";
    let opening = Opening {
        create: fence.is_none(),
        ..Opening::default()
    };
    let (tx, o) = store.open(what, scope, &key, opening).await?;
    o.state.unwrap_or_default().check(scope, what, fence)?;
    store
        .commit(
            tx,
            what,
            vec![PgStore::document_stmt(
                &key,
                "report",
                Box::new(report.to_string()),
            )],
        )
        .await
}

pub(crate) async fn read_report(store: &PgStore, scope: &RunScope) -> Result<Option<String>> {
    let key = Key::of(scope);
    let c = store.conn("read_report").await?;
    let r = store
        .row_opt(
            &c,
            "read the report",
            &format!("SELECT report FROM runs WHERE {KEY_WHERE}"),
            &key.params(),
        )
        .await?;
    Ok(r.and_then(|r| r.get(0)))
}
