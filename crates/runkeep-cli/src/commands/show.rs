//! `runkeep show RUN`: one run at a glance.

use clap::Args;
use runkeep::park::park_precedence;
use runkeep::{Checkpoint, MessageSnapshot, Timestamp};
use serde_json::{json, Value};

use crate::cli::RunArg;
use crate::commands::{claim_cell, event_head, lifecycle, park_cell, read_error, unknown_run};
use crate::context::Ctx;
use crate::error::{CliResult, Exit};
use crate::output::{emit, emit_json, fields, when, Cell, Color};

/// `runkeep show`.
#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    run: RunArg,
}

/// Shows one run.
pub async fn run(ctx: &Ctx, args: ShowArgs) -> CliResult<Exit> {
    let scope = ctx.run_scope(&args.run)?;
    let opened = ctx.store_read_only().await?;
    let store = opened.store.as_ref();
    let now = Timestamp::now();
    let cps = store.list_checkpoints(&scope).await.map_err(read_error)?;
    let lease = store.lease(&scope, now).await?;
    let last_seq = event_head(store, &scope).await?;
    let audit = store.read_audit(&scope, 0).await?.len();
    let record = store.read_run_record(&scope).await?;
    let messages = store.read_messages(&scope).await?;
    let report = store.read_report(&scope).await?;
    // A backend that keeps no lifecycle says so; show does not guess one.
    let lifecycle = match store.lifecycle(&scope).await {
        Ok(l) => Ok(l),
        Err(e @ runkeep::Error::Unsupported { .. }) => Err(e.to_string()),
        Err(e) => return Err(read_error(e)),
    };
    if cps.is_empty()
        && lease.is_none()
        && last_seq == 0
        && record.is_none()
        && audit == 0
        && report.is_none()
    {
        return Err(unknown_run(&scope));
    }
    let headers: Vec<_> = cps.iter().map(Checkpoint::header).collect();
    let park = park_precedence(&headers, &runkeep::checkpoint::history_of(&cps), now);
    let latest = cps.last();
    let run_created_at = cps.iter().filter_map(|c| c.run_created_at).min();
    let (messages_kind, through, message_count) = match &messages {
        MessageSnapshot::Available {
            through_event_seq,
            messages,
        } => ("available", Some(*through_event_seq), messages.len()),
        MessageSnapshot::LegacyUnverified { messages } => {
            ("legacy-unverified", None, messages.len())
        }
        _ => ("unavailable", None, 0),
    };
    if ctx.json() {
        emit_json(&json!({
            "scope": scope,
            "runCreatedAt": run_created_at,
            "checkpointCount": cps.len(),
            "latestCheckpoint": latest.map(|c| json!({
                "id": c.id, "createdAt": c.created_at, "fence": c.fence,
            })),
            "park": park,
            "lease": lease,
            "lifecycle": lifecycle.as_ref().ok(),
            "lifecycleUnavailable": lifecycle.as_ref().err(),
            "unreadableHolding": opened.unreadable_holding(&scope),
            "events": {"lastSeq": last_seq},
            "audit": {"count": audit},
            "record": record,
            "messages": {"kind": messages_kind, "throughEventSeq": through, "count": message_count},
            "report": report.as_ref().map(|r| json!({"bytes": r.len()})).unwrap_or(Value::Null),
        }))?;
        return Ok(Exit::Ok);
    }
    let mut rows: Vec<(&str, Cell)> = vec![
        ("run", scope.run_id.to_string().into()),
        (
            "scope",
            format!(
                "{}/{}/{}",
                scope.tenant_id, scope.project_id, scope.session_id
            )
            .into(),
        ),
    ];
    if let Some(p) = &scope.parent_run_id {
        rows.push(("parent", p.to_string().into()));
    }
    rows.push((
        "created",
        run_created_at.map_or("-".into(), |t| when(t, now)).into(),
    ));
    rows.push((
        "checkpoints",
        match latest {
            Some(c) => format!(
                "{} (latest {} at {}{})",
                cps.len(),
                c.id,
                when(c.created_at, now),
                c.fence.map(|f| format!(", fence {f}")).unwrap_or_default()
            ),
            None => "0".into(),
        }
        .into(),
    ));
    match &lifecycle {
        Ok(l) => rows.extend(lifecycle::show_rows(l, now)),
        Err(why) => rows.push((
            "status",
            Cell::colored(format!("unknown: {why}"), Color::Yellow),
        )),
    }
    rows.push(("park", park_cell(park.as_ref(), now)));
    if let Some(p) = &park {
        rows.push((
            "",
            format!("on {} · parked {}", p.checkpoint_id, when(p.parked_at, now)).into(),
        ));
    }
    rows.push(("lease", claim_cell(&opened, &scope, lease.as_ref(), now)));
    if let Some(l) = lease.as_ref().filter(|l| !l.holder.is_empty()) {
        rows.push(("", format!("until {}", when(l.expires_at, now)).into()));
    }
    rows.push(("events", format!("{last_seq} (last seq {last_seq})").into()));
    rows.push(("audit", format!("{audit} record(s)").into()));
    rows.push((
        "record",
        match &record {
            Some(r) => match r.get("status").and_then(Value::as_str) {
                Some(s) => format!("present (status {s})"),
                None => format!("present ({} field(s))", r.len()),
            },
            None => "none".into(),
        }
        .into(),
    ));
    rows.push((
        "messages",
        match through {
            Some(t) => format!("{message_count} through event {t}"),
            None if messages_kind == "unavailable" => "none".into(),
            None => format!("{message_count} ({messages_kind})"),
        }
        .into(),
    ));
    rows.push((
        "report",
        report
            .map_or("none".into(), |r| format!("{} bytes", r.len()))
            .into(),
    ));
    emit(&fields(&rows, &ctx.style))?;
    Ok(Exit::Ok)
}
