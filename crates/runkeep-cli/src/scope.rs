//! The tenant/project/session scope from flags or environment.
//!
//! Defaults (`default`/`default`/`default`) make a quick start need no flag.
//! An explicitly empty project or session (`--session ''`) clears that level:
//! a listing then covers the wider prefix, while per-run commands still need
//! all three. A session without a project is a hole and is refused.

use runkeep::{ListingScope, ProjectId, RunId, RunScope, SessionId, TenantId};

use crate::error::{CliError, CliResult};

/// The scope as given, validated.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ScopeParts {
    /// Tenant (always required).
    pub tenant: TenantId,
    /// Project, unless cleared.
    pub project: Option<ProjectId>,
    /// Session, unless cleared.
    pub session: Option<SessionId>,
}

impl ScopeParts {
    /// Validates the raw flag values.
    pub fn parse(tenant: &str, project: &str, session: &str) -> CliResult<Self> {
        let bad = |e: runkeep::Error| {
            CliError::from(e).hint("set --tenant/--project/--session (or RUNKEEP_TENANT/RUNKEEP_PROJECT/RUNKEEP_SESSION) to ids of [A-Za-z0-9_-]")
        };
        if tenant.is_empty() {
            return Err(
                CliError::usage("the tenant is empty; every scope starts with a tenant")
                    .hint("pass --tenant ID or set RUNKEEP_TENANT (default: `default`)"),
            );
        }
        let parts = Self {
            tenant: tenant.parse().map_err(bad)?,
            project: (!project.is_empty())
                .then(|| project.parse())
                .transpose()
                .map_err(bad)?,
            session: (!session.is_empty())
                .then(|| session.parse())
                .transpose()
                .map_err(bad)?,
        };
        parts.listing()?;
        Ok(parts)
    }

    /// The listing scope (a contiguous prefix).
    pub fn listing(&self) -> CliResult<ListingScope> {
        ListingScope::from_parts(
            self.tenant.clone(),
            self.project.clone(),
            self.session.clone(),
        )
        .map_err(|e| CliError::from(e).hint("give --project whenever you give --session"))
    }

    /// The full address of one run.
    pub fn run(&self, run: &RunId, parent: Option<&RunId>) -> CliResult<RunScope> {
        let (Some(project), Some(session)) = (&self.project, &self.session) else {
            return Err(CliError::usage(format!(
                "run {run} needs a full scope, but {} is cleared",
                if self.project.is_none() {
                    "the project"
                } else {
                    "the session"
                }
            ))
            .hint("pass --project and --session (or leave them at their defaults)"));
        };
        let scope = RunScope::new(
            self.tenant.clone(),
            project.clone(),
            session.clone(),
            run.clone(),
        );
        Ok(match parent {
            Some(p) => scope.with_parent(p.clone()),
            None => scope,
        })
    }

    /// `tenant/project/session` as far as set.
    pub fn describe(&self) -> String {
        self.listing()
            .map(|l| l.to_string())
            .unwrap_or_else(|_| self.tenant.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_levels_widen_and_holes_are_refused() {
        let all = ScopeParts::parse("t", "p", "s").unwrap();
        assert_eq!(all.describe(), "t/p/s");
        let tenant = ScopeParts::parse("t", "", "").unwrap();
        assert_eq!(tenant.describe(), "t");
        assert!(tenant.run(&"run_a".parse().unwrap(), None).is_err());
        let hole = ScopeParts::parse("t", "", "s").unwrap_err();
        assert!(
            hole.message.contains("contiguous prefix"),
            "{}",
            hole.message
        );
        assert_eq!(
            ScopeParts::parse("../x", "p", "s").unwrap_err().exit.code(),
            64
        );
        assert_eq!(ScopeParts::parse("", "p", "s").unwrap_err().exit.code(), 64);
    }
}
