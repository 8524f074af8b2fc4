//! A tenant or project listing pages over runs sharing an id in several
//! sessions without losing one at a page boundary: the cursor carries the
//! row's project and session (the core's tie-break), and the SQL continues
//! after `(key, project, session)`. Mutation tried: `After::of_cursor`
//! continuing strictly after the key alone (as before the tie-break) —
//! pages of one lose the second and third `run_same`.

mod common;

use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ListOptions, ListOrder, ListingScope, RunScope,
    Timestamp,
};
use serde_json::Map;

fn scope(project: &str, session: &str, run: &str) -> RunScope {
    RunScope::new(
        "tnt_a".parse().unwrap(),
        project.parse().unwrap(),
        session.parse().unwrap(),
        run.parse().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_one_keep_every_run_sharing_an_id_across_sessions() {
    let Some(url) =
        common::url_or_skip("pages_of_one_keep_every_run_sharing_an_id_across_sessions")
    else {
        return;
    };
    let (store, _guard) = common::store(&url, "ties", None).await;
    let cp = Checkpoint::new(
        CheckpointId::new("cp_1").unwrap(),
        Timestamp::from_millis(10).unwrap(),
        Map::new(),
    );
    for (p, s, r) in [
        ("prj_b", "ses_a", "run_same"),
        ("prj_a", "ses_b", "run_same"),
        ("prj_a", "ses_a", "run_same"),
        ("prj_a", "ses_b", "run_z"),
    ] {
        store
            .write_checkpoint(&scope(p, s, r), &cp, None)
            .await
            .unwrap();
    }
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .list_runs(
                    &ListingScope::tenant("tnt_a".parse().unwrap()),
                    &ListOptions {
                        order,
                        limit: Some(1),
                        cursor: cursor.take(),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            for r in &page.entries {
                seen.push(format!(
                    "{}/{}/{}",
                    r.scope.project_id, r.scope.session_id, r.scope.run_id
                ));
            }
            match page.cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(
            seen,
            [
                "prj_a/ses_a/run_same",
                "prj_a/ses_b/run_same",
                "prj_b/ses_a/run_same",
                "prj_a/ses_b/run_z"
            ],
            "{order:?}"
        );
    }
}
