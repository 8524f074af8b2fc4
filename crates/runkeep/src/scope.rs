//! Run scope (the address of one run) and listing scope (a prefix addressing a
//! set of runs).
//!
//! A listing scope is tenant → project → session as a *contiguous prefix*. The
//! type cannot express a hole (a session without its project); input that
//! would (from a CLI flag or JSON) is refused by [`ListingScope::from_parts`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::id::{ProjectId, RunId, SessionId, TenantId};

/// The full address of one run.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunScope {
    /// Tenant.
    pub tenant_id: TenantId,
    /// Project.
    pub project_id: ProjectId,
    /// Session.
    pub session_id: SessionId,
    /// Run.
    pub run_id: RunId,
    /// The parent run, for sub-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<RunId>,
}

impl RunScope {
    /// A top-level run.
    pub fn new(tenant: TenantId, project: ProjectId, session: SessionId, run: RunId) -> Self {
        Self {
            tenant_id: tenant,
            project_id: project,
            session_id: session,
            run_id: run,
            parent_run_id: None,
        }
    }

    /// The same scope as a sub-run of `parent`.
    pub fn with_parent(mut self, parent: RunId) -> Self {
        self.parent_run_id = Some(parent);
        self
    }

    /// The session this run belongs to, as a listing scope.
    pub fn session_scope(&self) -> ListingScope {
        ListingScope::session(
            self.tenant_id.clone(),
            self.project_id.clone(),
            self.session_id.clone(),
        )
    }

    /// True if this run lies inside `scope`.
    pub fn is_within(&self, scope: &ListingScope) -> bool {
        if self.tenant_id != scope.tenant_id {
            return false;
        }
        match &scope.narrow {
            Narrow::Tenant => true,
            Narrow::Project(p) => &self.project_id == p,
            Narrow::Session(p, s) => &self.project_id == p && &self.session_id == s,
        }
    }
}

impl fmt::Debug for RunScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for RunScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.tenant_id, self.project_id, self.session_id, self.run_id
        )?;
        if let Some(p) = &self.parent_run_id {
            write!(f, " (parent {p})")?;
        }
        Ok(())
    }
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Narrow {
    Tenant,
    Project(ProjectId),
    Session(ProjectId, SessionId),
}

/// A contiguous prefix of tenant → project → session.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ListingScope {
    tenant_id: TenantId,
    narrow: Narrow,
}

impl ListingScope {
    /// Every run of a tenant.
    pub fn tenant(tenant: TenantId) -> Self {
        Self {
            tenant_id: tenant,
            narrow: Narrow::Tenant,
        }
    }

    /// Every run of one project.
    pub fn project(tenant: TenantId, project: ProjectId) -> Self {
        Self {
            tenant_id: tenant,
            narrow: Narrow::Project(project),
        }
    }

    /// Every run of one session.
    pub fn session(tenant: TenantId, project: ProjectId, session: SessionId) -> Self {
        Self {
            tenant_id: tenant,
            narrow: Narrow::Session(project, session),
        }
    }

    /// Builds a scope from optional parts, refusing a hole.
    pub fn from_parts(
        tenant: TenantId,
        project: Option<ProjectId>,
        session: Option<SessionId>,
    ) -> Result<Self> {
        match (project, session) {
            (None, None) => Ok(Self::tenant(tenant)),
            (Some(p), None) => Ok(Self::project(tenant, p)),
            (Some(p), Some(s)) => Ok(Self::session(tenant, p, s)),
            (None, Some(s)) => Err(Error::invalid(format!(
                "listing scope has a hole: sessionId {s} was supplied without `projectId` (tenant {tenant}); a listing scope must be a contiguous prefix of tenant → project → session"
            ))),
        }
    }

    /// The tenant.
    pub fn tenant_id(&self) -> &TenantId {
        &self.tenant_id
    }

    /// The project, when narrowed to one.
    pub fn project_id(&self) -> Option<&ProjectId> {
        match &self.narrow {
            Narrow::Tenant => None,
            Narrow::Project(p) | Narrow::Session(p, _) => Some(p),
        }
    }

    /// The session, when narrowed to one.
    pub fn session_id(&self) -> Option<&SessionId> {
        match &self.narrow {
            Narrow::Session(_, s) => Some(s),
            _ => None,
        }
    }
}

impl fmt::Debug for ListingScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for ListingScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.tenant_id)?;
        if let Some(p) = self.project_id() {
            write!(f, "/{p}")?;
        }
        if let Some(s) = self.session_id() {
            write!(f, "/{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> TenantId {
        TenantId::new("tnt_a").unwrap()
    }

    #[test]
    fn a_scope_with_a_hole_is_refused() {
        let err = ListingScope::from_parts(t(), None, Some(SessionId::new("ses_a").unwrap()))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("contiguous prefix"), "{msg}");
        assert!(msg.contains("without `projectId`"), "{msg}");
        assert!(matches!(err, Error::InvalidInput { .. }));
    }

    #[test]
    fn runs_match_prefixes() {
        let p = ProjectId::new("prj_a").unwrap();
        let s = SessionId::new("ses_a").unwrap();
        let run = RunScope::new(t(), p.clone(), s.clone(), RunId::new("run_a").unwrap());
        assert!(run.is_within(&ListingScope::tenant(t())));
        assert!(run.is_within(&ListingScope::project(t(), p.clone())));
        assert!(run.is_within(&ListingScope::session(t(), p.clone(), s)));
        assert!(!run.is_within(&ListingScope::project(
            t(),
            ProjectId::new("prj_b").unwrap()
        )));
        assert!(!run.is_within(&ListingScope::session(
            t(),
            p,
            SessionId::new("ses_b").unwrap()
        )));
        assert!(!run.is_within(&ListingScope::tenant(TenantId::new("tnt_b").unwrap())));
    }
}
