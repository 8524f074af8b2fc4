//! `runkeep token create | list | revoke`: the bearer tokens of `runkeep
//! serve`.
//!
//! Tokens live in the token file (`--tokens`, default
//! `./runkeep-tokens.json`, the same default as `runkeep serve`), hashed:
//! a token's secret is printed once, by `create`, and never again. A
//! running server sees a revocation within its `--token-reload` interval
//! (1 s by default), without a restart. See `runkeep_server::tokens`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use runkeep_server::auth::Role;
use runkeep_server::tokens::{Revoked, TokenError, TokenFile, TokenRecord};
use serde_json::json;

use crate::context::Ctx;
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json, iso, Cell, Color, Table};

/// Where the tokens are (`runkeep serve` and `runkeep token` share it).
#[derive(Args, Debug, Clone)]
pub struct TokenFileArg {
    /// The token file (hashed tokens; created with mode 0600).
    #[arg(
        long,
        env = "RUNKEEP_TOKENS",
        default_value = "runkeep-tokens.json",
        value_name = "PATH"
    )]
    pub tokens: PathBuf,
}

/// `runkeep token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token for --tenant with a role; prints the secret once.
    Create(CreateArgs),
    /// List the tokens (never their secrets).
    List(ListArgs),
    /// Revoke a token by id; a running server refuses it within --token-reload.
    Revoke(RevokeArgs),
}

/// The roles as the command line spells them.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum RoleArg {
    /// Reads: listings, summaries, checkpoints, events, documents, audit.
    Reader,
    /// Also claims, renews, releases its own lease, writes with its fence.
    Worker,
    /// Also answers parks, releases any lease, reopens, prunes.
    Operator,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Self {
        match r {
            RoleArg::Reader => Role::Reader,
            RoleArg::Worker => Role::Worker,
            RoleArg::Operator => Role::Operator,
        }
    }
}

/// `runkeep token create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// What the token may do in its tenant (--tenant).
    #[arg(long, value_enum)]
    pub role: RoleArg,
    /// A note for people ("ci", "alice's laptop").
    #[arg(long)]
    pub label: Option<String>,
    #[command(flatten)]
    pub file: TokenFileArg,
}

/// `runkeep token list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub file: TokenFileArg,
}

/// `runkeep token revoke`.
#[derive(Args, Debug)]
pub struct RevokeArgs {
    /// The token's id (`runkeep token list` shows it; it is the part after
    /// `rk_` of the token).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub file: TokenFileArg,
}

/// A token file error as the command reports it.
pub fn token_error(e: TokenError) -> CliError {
    match e {
        TokenError::UnknownToken(_) => {
            CliError::failed(e.to_string()).hint("`runkeep token list` shows the ids")
        }
        TokenError::Invalid(_) => CliError::usage(e.to_string()),
        // The message names the file, its mode and `chmod 600`.
        TokenError::Permissions { .. } => CliError::config(e.to_string()),
        TokenError::Corrupt { .. } => CliError::config(e.to_string())
            .hint("restore the token file from a backup, or move it away and create tokens again"),
        _ => CliError::failed(e.to_string())
            .hint("check --tokens / RUNKEEP_TOKENS and this user's permissions on its directory"),
    }
}

/// The JSON shape of a token (never its hash or secret).
fn record_json(t: &TokenRecord) -> serde_json::Value {
    json!({
        "id": t.id,
        "tenant": t.tenant,
        "role": t.role,
        "label": t.label,
        "createdAt": t.created_at,
        "revokedAt": t.revoked_at,
    })
}

/// Runs `runkeep token …`.
pub async fn run(ctx: &Ctx, command: TokenCommand) -> CliResult<Exit> {
    match command {
        TokenCommand::Create(args) => create(ctx, args),
        TokenCommand::List(args) => list(ctx, args),
        TokenCommand::Revoke(args) => revoke(ctx, args),
    }
}

fn create(ctx: &Ctx, args: CreateArgs) -> CliResult<Exit> {
    let file = TokenFile::new(&args.file.tokens);
    let created = file
        .create(&ctx.scope.tenant, args.role.into(), args.label.as_deref())
        .map_err(token_error)?;
    let r = &created.record;
    if ctx.json() {
        let mut v = record_json(r);
        v["token"] = json!(created.secret());
        emit_json(&v)?;
        return Ok(Exit::Ok);
    }
    emit(&format!(
        "created token {} ({} of tenant {}{}) in {}; it is shown only now, keep it secret:\n{}\n",
        r.id,
        r.role,
        r.tenant,
        r.label
            .as_deref()
            .map(|l| format!(", label {l:?}"))
            .unwrap_or_default(),
        file.path().display(),
        created.secret()
    ))?;
    Ok(Exit::Ok)
}

fn list(ctx: &Ctx, args: ListArgs) -> CliResult<Exit> {
    let file = TokenFile::new(&args.file.tokens);
    let tokens = file.list().map_err(token_error)?;
    if ctx.json() {
        emit_json(&tokens.iter().map(record_json).collect::<Vec<_>>())?;
        return Ok(Exit::Ok);
    }
    if tokens.is_empty() {
        emit(&format!(
            "no tokens in {} (create one with `runkeep token create --tenant T --role worker|operator|reader`)\n",
            file.path().display()
        ))?;
        return Ok(Exit::Ok);
    }
    let mut table = Table::new(&["ID", "TENANT", "ROLE", "LABEL", "CREATED", "STATUS"]);
    for t in &tokens {
        table.row(vec![
            Cell::from(t.id.clone()),
            Cell::from(t.tenant.to_string()),
            Cell::from(t.role.to_string()),
            Cell::from(t.label.clone().unwrap_or_else(|| "-".into())),
            Cell::from(iso(t.created_at)),
            match t.revoked_at {
                None => Cell::colored("active", Color::Green),
                Some(at) => Cell::colored(format!("revoked {}", iso(at)), Color::Dim),
            },
        ]);
    }
    emit(&table.render(&ctx.style))?;
    Ok(Exit::Ok)
}

fn revoke(ctx: &Ctx, args: RevokeArgs) -> CliResult<Exit> {
    let file = TokenFile::new(&args.file.tokens);
    let outcome = file.revoke(&args.id).map_err(token_error)?;
    let (record, now) = match &outcome {
        Revoked::Now(r) => (r, true),
        Revoked::Already(r) => (r, false),
    };
    if ctx.json() {
        let mut v = record_json(record);
        v["changed"] = json!(now);
        emit_json(&v)?;
        return Ok(Exit::Ok);
    }
    let what = if now {
        "revoked; a running `runkeep serve` refuses it within its --token-reload interval (1 s by default)"
    } else {
        "was already revoked; nothing changed"
    };
    emit(&format!(
        "token {} ({} of tenant {}) {what}\n",
        record.id, record.role, record.tenant
    ))?;
    Ok(Exit::Ok)
}
