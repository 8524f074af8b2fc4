//! A tenant or project listing pages over runs of the same id in several
//! sessions without losing or repeating one at a page boundary: the row key
//! ends with the project and session, and the cursor carries them.

use runkeep::listing::{ListQuery, RowKey};
use runkeep::{
    Checkpoint, CheckpointId, CheckpointStore, ListOptions, ListOrder, ListingScope, MemoryStore,
    RunScope, Timestamp,
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

fn cp(id: &str) -> Checkpoint {
    Checkpoint::new(
        CheckpointId::new(id).unwrap(),
        Timestamp::from_millis(10).unwrap(),
        Map::new(),
    )
}

async fn walk(store: &MemoryStore, scope: &ListingScope, order: ListOrder) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(
                scope,
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
            out.push(format!(
                "{}/{}/{}",
                r.scope.project_id, r.scope.session_id, r.scope.run_id
            ));
        }
        match page.cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

/// Mutation tried: `is_after_cursor` comparing only `(rank, stamp, run_id,
/// parent)` (the key before the tie-break) loses the second and third
/// `run_same` here.
#[tokio::test]
async fn pages_of_one_keep_every_run_sharing_an_id_across_sessions() {
    let store = MemoryStore::new();
    for (p, s) in [("prj_b", "ses_a"), ("prj_a", "ses_b"), ("prj_a", "ses_a")] {
        store
            .write_checkpoint(&scope(p, s, "run_same"), &cp("cp_1"), None)
            .await
            .unwrap();
    }
    store
        .write_checkpoint(&scope("prj_a", "ses_b", "run_z"), &cp("cp_1"), None)
        .await
        .unwrap();
    for order in [ListOrder::RunId, ListOrder::CreatedAt] {
        let tenant = ListingScope::tenant("tnt_a".parse().unwrap());
        assert_eq!(
            walk(&store, &tenant, order).await,
            [
                "prj_a/ses_a/run_same",
                "prj_a/ses_b/run_same",
                "prj_b/ses_a/run_same",
                "prj_a/ses_b/run_z"
            ],
            "{order:?}"
        );
        let project = ListingScope::project("tnt_a".parse().unwrap(), "prj_a".parse().unwrap());
        assert_eq!(
            walk(&store, &project, order).await,
            [
                "prj_a/ses_a/run_same",
                "prj_a/ses_b/run_same",
                "prj_a/ses_b/run_z"
            ]
        );
    }
}

/// A key without a tie-break (what a single session's walk builds) is not
/// after a cursor at its own run; a cursor without one continues strictly
/// after its run, as cursors issued before the tie-break did; a bare key
/// encodes exactly as before.
#[test]
fn keys_and_cursors_without_a_tie_break_compare_as_before() {
    let run = "run_same".parse().unwrap();
    let bare = RowKey::new(ListOrder::RunId, &run, None, None);
    let tied = bare
        .clone()
        .in_session(&"prj_a".parse().unwrap(), &"ses_a".parse().unwrap());
    let later = bare
        .clone()
        .in_session(&"prj_a".parse().unwrap(), &"ses_b".parse().unwrap());
    let tenant = ListingScope::tenant("tnt_a".parse().unwrap());
    let after = |key: &RowKey| {
        let q = ListQuery::new(&tenant, &ListOptions::default()).unwrap();
        let c = q.encode_cursor(key);
        ListQuery::new(
            &tenant,
            &ListOptions {
                cursor: Some(c),
                ..Default::default()
            },
        )
        .unwrap()
    };
    assert!(after(&tied).is_after_cursor(&later));
    assert!(!after(&later).is_after_cursor(&tied));
    assert!(!after(&tied).is_after_cursor(&tied));
    assert!(!after(&tied).is_after_cursor(&bare));
    assert!(!after(&bare).is_after_cursor(&later));
    assert!(!after(&bare).is_after_cursor(&bare));
    let json = serde_json::to_value(&bare).unwrap();
    assert_eq!(
        json.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["rank", "stamp", "run_id", "parent"]
    );
    let q = ListQuery::new(&tenant, &ListOptions::default()).unwrap();
    assert_ne!(q.encode_cursor(&bare), q.encode_cursor(&tied));
}

/// `just_before` is below its key and above every key an id can make
/// below it: a cursor there continues with the key's own run. Checked
/// against every id of up to two characters of a small alphabet and the
/// extremes of the id alphabet.
#[test]
fn just_before_leaves_no_run_between_it_and_its_key() {
    let alphabet = ["-", "0", "9", "A", "Z", "_", "a", "z"];
    let mut ids: Vec<String> = Vec::new();
    for a in alphabet {
        ids.push(a.to_string());
        for b in alphabet {
            ids.push(format!("{a}{b}"));
        }
    }
    // Ids start with a letter or digit.
    ids.retain(|i| i.as_bytes()[0].is_ascii_alphanumeric());
    ids.sort();
    let key = |run: &str, parent: Option<&str>| {
        RowKey::new(
            ListOrder::RunId,
            &run.parse().unwrap(),
            parent.map(|p| p.parse().unwrap()).as_ref(),
            None,
        )
    };
    let mut all = Vec::new();
    for r in &ids {
        all.push(key(r, None));
        for p in ids.iter().take(12) {
            all.push(key(r, Some(p)));
        }
    }
    all.sort();
    for (i, k) in all.iter().enumerate() {
        let b = k.just_before();
        assert!(b < *k, "{k:?}");
        if i > 0 {
            assert!(all[i - 1] < b, "{:?} is not below {b:?}", all[i - 1]);
        }
    }
    let created = RowKey::new(
        ListOrder::CreatedAt,
        &"run_a".parse().unwrap(),
        None,
        Some(Timestamp::from_millis(5).unwrap()),
    );
    assert_eq!(created.just_before().stamp, 5);
    assert!(created.just_before() < created);
}
