//! `runkeep seed`: demo runs in every state an operator meets, so the other
//! commands have something to show (`memory:` stores start empty).

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use runkeep::{
    Checkpoint, CheckpointId, ClaimOptions, Fence, Holder, NewAuditEvent, NewEvent, ParkResolution,
    PendingDecision, RunId, RunScope, RunStore, Timestamp, Ttl,
};
use serde_json::{json, Map, Value};

use crate::commands::run_exists;
use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, Table};

/// `runkeep seed`.
#[derive(Args, Debug)]
pub struct SeedArgs {
    /// How many runs to write (they cycle through the six kinds).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    runs: u32,
    /// Run ids are run_PREFIX_001, run_PREFIX_002, …
    #[arg(long, default_value = "demo")]
    prefix: String,
}

/// The kinds of demo run, in the order they cycle.
const KINDS: [(&str, &str); 6] = [
    (
        "completed",
        "finished: 3 checkpoints, transcript, record and report",
    ),
    (
        "parked",
        "waiting on a human: outstanding tool_review, due in 1h",
    ),
    (
        "park-expired",
        "waiting on a human past its deadline (expired 1h ago)",
    ),
    (
        "claimed",
        "held by worker-a for 10m, written under its fence",
    ),
    ("answered", "its park was answered (approve)"),
    (
        "lease-expired",
        "claimed by worker-b, whose lease lapsed unreclaimed",
    ),
];

/// Writes the demo runs.
pub async fn run(ctx: &Ctx, args: SeedArgs) -> CliResult<Exit> {
    let ids = (1..=args.runs)
        .map(|i| RunId::new(format!("run_{}_{i:03}", args.prefix)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::from(e).hint("--prefix may only use [A-Za-z0-9_-]"))?;
    let opened = ctx.store_creating().await?;
    let store = opened.store.as_ref();
    let first = ctx.scope.run(&ids[0], None)?;
    if run_exists(store, &first).await? {
        return Err(CliError::failed(format!(
            "run {} already exists in {}",
            ids[0],
            ctx.scope.describe()
        ))
        .hint("seed writes new runs only: pass another --prefix or --session"));
    }
    let bar = ProgressBar::new(ids.len() as u64).with_message("seeding");
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} runs ({eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let now = Timestamp::now();
    let mut written = Vec::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        let scope = ctx.scope.run(id, None)?;
        let kind = KINDS[i % KINDS.len()];
        if let Err(e) = seed_one(store, &scope, i, kind.0, now).await {
            bar.finish_and_clear();
            return Err(CliError::from(e).context(format!("seed {id}")));
        }
        written.push((id.clone(), kind));
        bar.inc(1);
    }
    bar.finish_and_clear();
    if ctx.json() {
        let runs: Vec<Value> = written
            .iter()
            .map(|(id, (kind, _))| json!({"runId": id, "kind": kind}))
            .collect();
        emit_json(
            &json!({"store": opened.address.to_string(), "scope": ctx.scope.describe(), "runs": runs}),
        )?;
    } else {
        let mut table = Table::new(&["RUN", "KIND", "WHAT"]);
        for (id, (kind, what)) in &written {
            table.row(vec![id.to_string().into(), (*kind).into(), (*what).into()]);
        }
        emit(&table.render(&ctx.style))?;
        emit(&format!(
            "seeded {} run(s) into {} ({})\n",
            written.len(),
            opened.address,
            ctx.scope.describe()
        ))?;
    }
    Ok(Exit::Ok)
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn cp_id(n: u32) -> CheckpointId {
    CheckpointId::new(format!("cp_{n}")).unwrap_or_else(|_| CheckpointId::generate())
}

async fn seed_one(
    store: &dyn RunStore,
    scope: &RunScope,
    i: usize,
    kind: &str,
    now: Timestamp,
) -> runkeep::Result<()> {
    let minutes = |m: i64| m * 60_000;
    let started = now.offset(-minutes(10 + (i as i64 * 7) % 50));
    let mut fence: Option<Fence> = None;
    match kind {
        "claimed" => {
            let lease = store
                .claim(
                    scope,
                    &ClaimOptions::new(Holder::new("worker-a")?, Ttl::from_millis(600_000)?)
                        .at(now),
                )
                .await?
                .lease();
            fence = lease.map(|l| l.fence);
        }
        "lease-expired" => {
            let lease = store
                .claim(
                    scope,
                    &ClaimOptions::new(Holder::new("worker-b")?, Ttl::from_millis(300_000)?)
                        .at(now.offset(-minutes(20))),
                )
                .await?
                .lease();
            fence = lease.map(|l| l.fence);
        }
        _ => {}
    }
    let checkpoints = if kind == "completed" { 3 } else { 2 };
    for n in 1..=checkpoints {
        let at = started.offset(minutes(i64::from(n)));
        let mut cp = Checkpoint::new(
            cp_id(n),
            at,
            obj(json!({"iteration": n, "messages": n * 4})),
        )
        .with_run_created_at(started);
        if n == checkpoints {
            let request = obj(json!({"tool": "bash", "command": "rm -rf build/"}));
            match kind {
                "parked" | "answered" => {
                    cp = cp.with_pending(
                        PendingDecision::new("tool_review", request, at)
                            .with_deadline(now.offset(minutes(60))),
                    );
                }
                "park-expired" => {
                    cp = cp.with_pending(
                        PendingDecision::new("tool_review", request, now.offset(-minutes(120)))
                            .with_deadline(now.offset(-minutes(60))),
                    );
                }
                _ => {}
            }
        }
        store.write_checkpoint(scope, &cp, fence).await?;
    }
    if kind == "answered" {
        let answer = ParkResolution::Answer(json!({"action": "approve", "by": "alice"}));
        store
            .resolve_park(scope, &cp_id(checkpoints), answer, now, fence)
            .await?;
    }
    let mut events = vec![
        NewEvent::new(
            "run_started",
            obj(json!({"goal": "tidy the build directory"})),
        ),
        NewEvent::new(
            "tool_completed",
            obj(json!({"toolUseId": "tu_1", "toolName": "ls", "result": "build/ src/"})),
        ),
    ];
    match kind {
        "completed" => {
            events.push(NewEvent::new(
                "tool_completed",
                obj(json!({"toolUseId": "tu_2", "toolName": "bash", "result": "ok"})),
            ));
            events.push(NewEvent::new(
                "run_completed",
                obj(json!({"stopReason": "end_turn"})),
            ));
        }
        "parked" | "park-expired" | "answered" => {
            events.push(NewEvent::new(
                "run_parked",
                obj(json!({"requestType": "tool_review"})),
            ));
        }
        _ => {}
    }
    store.append_events(scope, &events, fence).await?;
    let status = match kind {
        "completed" => "completed",
        "parked" | "park-expired" => "parked",
        _ => "running",
    };
    store
        .write_run_record(scope, &obj(json!({"status": status, "kind": kind})), fence)
        .await?;
    if kind == "completed" {
        store
            .write_report(
                scope,
                "# Report\n\nThe build directory was tidied.\n",
                fence,
            )
            .await?;
    }
    store
        .append_audit(
            scope,
            &[NewAuditEvent::new("runkeep seed", "seeded demo run", "ok")],
            fence,
        )
        .await?;
    if kind == "completed" {
        finish_completed(store, scope, now).await?;
    }
    Ok(())
}

/// Finishes the completed demo run (contract v2: a claim, then `finish`), so
/// it leaves the queue. A store that keeps no lifecycle yet leaves it as it
/// was written (active, as contract v1 had every run).
async fn finish_completed(
    store: &dyn RunStore,
    scope: &RunScope,
    now: Timestamp,
) -> runkeep::Result<()> {
    match store.lifecycle(scope).await {
        Err(runkeep::Error::Unsupported { .. }) => return Ok(()),
        other => other?,
    };
    let lease = store
        .claim(
            scope,
            &ClaimOptions::new(Holder::new("worker-c")?, Ttl::from_millis(60_000)?).at(now),
        )
        .await?
        .lease()
        .ok_or_else(|| runkeep::Error::corrupted("the new demo run was reported held"))?;
    store
        .finish(
            scope,
            lease.fence,
            &runkeep::Outcome::completed(Some(json!({"tidied": "build/"}))),
        )
        .await?;
    Ok(())
}
