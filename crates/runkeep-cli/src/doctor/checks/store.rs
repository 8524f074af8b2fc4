//! The `store` checks every backend answers: reachable, writable.

use super::*;

pub(super) async fn reachable(env: &Env) -> CliResult<Outcome> {
    let opened = match env.store() {
        Ok(opened) => opened,
        Err(e) => {
            return Ok(Outcome::fail(e.message).remedy(
                e.hint
                    .unwrap_or_else(|| "check --store and the directory's permissions".into()),
            ))
        }
    };
    if let Some((_, target)) = opened.postgres() {
        // The server answers before anything is asked of the schema: a
        // missing or foreign schema is store.schema-version's finding.
        match runkeep_postgres::PgStore::schema_version(target.address.url(), &target.options)
            .await
        {
            Ok(v) if v != runkeep_postgres::SCHEMA_VERSION => {
                return Ok(Outcome::pass(format!(
                    "{} answered (schema {} is at version {v}: see store.schema-version)",
                    env.address, target.options.schema
                )))
            }
            Ok(_) => {}
            Err(e) => {
                return Ok(Outcome::fail(format!(
                    "cannot reach {}: {}",
                    env.address,
                    CliError::from(e).message
                ))
                .remedy("check that the server runs and the URL's host, port, user and database; with a password, that it is right"))
            }
        }
    }
    let listing = env.scope.listing()?;
    let options = ListOptions {
        limit: Some(100),
        now: Some(env.now),
        ..ListOptions::default()
    };
    match opened.store.list_runs(&listing, &options).await {
        Ok(page) => Ok(Outcome::pass(format!(
            "{} answered a listing of {listing}: {}{} run(s)",
            env.address,
            page.entries.len(),
            if page.cursor.is_some() { "+" } else { "" }
        ))),
        Err(e) => Ok(Outcome::fail(format!(
            "listing {listing} failed: {}",
            CliError::from(e).message
        ))
        .remedy("check that the store exists and this user can read it")),
    }
}

pub(super) async fn writable(env: &Env) -> CliResult<Outcome> {
    let scratch = match env.store()?.scratch() {
        Ok(s) => s,
        Err(e) => {
            return Ok(
                Outcome::fail(format!("cannot open a scratch location: {}", e.message))
                    .remedy("check that this user can create directories in the store"),
            )
        }
    };
    let probed = probe(scratch.store.as_ref(), &scratch.scope).await;
    if let Err(e) = scratch.clean_up().await {
        return Ok(Outcome::warn(format!(
            "the probe passed, but its run could not be removed: {}",
            e.message
        ))
        .remedy(format!("delete the probe run {} by hand", scratch.scope)));
    }
    match probed {
        Ok(()) => Ok(Outcome::pass(format!(
            "wrote, read back, claimed, released, appended and deleted a probe run in {}",
            scratch.describe()
        ))),
        Err(e) => Ok(Outcome::fail(format!(
            "probe in {} failed: {}",
            scratch.describe(),
            CliError::from(e).message
        ))
        .remedy("check free space, permissions and that the volume is not read-only")),
    }
}

/// One of everything a worker does, in a scratch location, then cleaned up.
pub(super) async fn probe(store: &dyn RunStore, scope: &RunScope) -> runkeep::Result<()> {
    let id = CheckpointId::new("cp_doctor_probe")?;
    let nonce = runkeep::id::random_suffix(12);
    let mut state = Map::new();
    state.insert("probe".into(), json!(nonce));
    let written = Checkpoint::new(id.clone(), Timestamp::now(), state);
    store.write_checkpoint(scope, &written, None).await?;
    let back = store.read_checkpoint(scope, &id).await?;
    if back.as_ref().map(|c| &c.state) != Some(&written.state) {
        return Err(runkeep::Error::corrupted(
            "the probe checkpoint read back differently from what was written",
        ));
    }
    let lease = store
        .claim(
            scope,
            &ClaimOptions::new(Holder::unique("runkeep-doctor"), Ttl::from_millis(30_000)?),
        )
        .await?
        .lease()
        .ok_or_else(|| {
            runkeep::Error::corrupted("the probe run was reported held by someone else")
        })?;
    let mut payload = Map::new();
    payload.insert("probe".into(), json!(nonce));
    store
        .append_events(
            scope,
            &[NewEvent::new("doctor_probe", payload)],
            Some(lease.fence),
        )
        .await?;
    let events = store
        .read_events(scope, &ReadEventsOptions::default())
        .await?;
    if events.events.last().and_then(|e| e.payload.get("probe")) != Some(&json!(nonce)) {
        return Err(runkeep::Error::corrupted(
            "the probe event read back differently from what was appended",
        ));
    }
    if !store.release(scope, lease.fence).await? {
        return Err(runkeep::Error::corrupted(
            "the probe lease could not be released",
        ));
    }
    store.delete_checkpoint(scope, &id, None).await?;
    if store.read_checkpoint(scope, &id).await?.is_some() {
        return Err(runkeep::Error::corrupted(
            "the probe checkpoint is still there after delete",
        ));
    }
    Ok(())
}
