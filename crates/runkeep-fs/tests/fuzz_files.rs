//! Property test: whatever bytes sit in a run's files — checkpoints,
//! holdings, transcript, audit, run record, messages, digest, index — every
//! read answers (a value or an error naming the run) and never panics; a
//! claim still works or refuses; nothing a read does changes the tree.

mod common;

use common::*;
use proptest::prelude::*;
use runkeep::{
    CheckpointStore, EvidenceStore, Integrity, ListOptions, ReadEventsOptions, Timestamp,
};

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        // Near-miss JSON: the shapes the readers expect, damaged.
        prop_oneof![
            Just(br#"{"holder":"w","expiresAt":1e400}"#.to_vec()),
            Just(br#"{"holder":5,"expiresAt":"x"}"#.to_vec()),
            Just(br#"{"id":"cp_x","createdAt":-1,"schemaVersion":99}"#.to_vec()),
            Just(br#"{"id":"../x","createdAt":1}"#.to_vec()),
            Just(br#"{"type":"x","seq":0}"#.to_vec()),
            Just(b"{\"type\":\"x\",\"seq\":2}\n{\"type\":\"y\",\"seq\":1}\n{\"type\":".to_vec()),
            Just(br#"{"format":"namzu.run-message-snapshot.v1","throughEventSeq":-1,"messages":{}}"#.to_vec()),
            Just(br#"[1,2,3]"#.to_vec()),
            Just(br#"{"format":"runkeep.run-digest.v1","stamp":{},"digest":{"checkpointCount":"x"}}"#.to_vec()),
            Just(vec![0xff, 0xfe, 0x00, b'\n']),
        ],
    ]
}

const FILES: [&str; 9] = [
    "checkpoints/cp_fuzz.json",
    "claims/7.json",
    "claims/8.json",
    "transcript.jsonl",
    "audit.jsonl",
    "run.json",
    "messages.json",
    ".runkeep/digest.json",
    ".runkeep/transcript.idx",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn reads_never_panic_on_damaged_files(contents in prop::collection::vec((0usize..FILES.len(), bytes()), 1..6)) {
        let dir = tempdir();
        let base = dir.path().join("runs");
        let store = open(&base);
        let rt = rt();
        let s = scope("run_fuzz");
        rt.block_on(store.write_checkpoint(&s, &cp("cp_ok", 1), None)).unwrap();
        rt.block_on(store.append_events(&s, &[runkeep::NewEvent::new("x", Default::default())], None)).unwrap();
        let run_dir = store.run_dir(&s);
        for (i, body) in &contents {
            let path = run_dir.join(FILES[*i]);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, body).unwrap();
        }
        let before = tree(&base);
        let _ = rt.block_on(store.list_checkpoints(&s));
        let _ = rt.block_on(store.read_checkpoint(&s, &"cp_fuzz".parse().unwrap()));
        let page = rt.block_on(store.list_runs(&runkeep::ListingScope::tenant(tenant()), &ListOptions::default()));
        prop_assert!(page.is_ok(), "a damaged run must be a flagged row, not a failed page: {:?}", page);
        prop_assert_eq!(page.unwrap().entries.len(), 1);
        let _ = rt.block_on(store.read_events(&s, &ReadEventsOptions::default()));
        let _ = rt.block_on(store.read_events(&s, &ReadEventsOptions { integrity: Integrity::Strict, ..Default::default() }));
        let _ = rt.block_on(store.read_events(&s, &ReadEventsOptions { since_seq: 1, ..Default::default() }));
        let _ = rt.block_on(store.read_messages(&s));
        let _ = rt.block_on(store.read_run_record(&s));
        let _ = rt.block_on(store.read_report(&s));
        let _ = rt.block_on(store.read_audit(&s, 0));
        let _ = rt.block_on(store.lease(&s, Timestamp::now()));
        let _ = store.diagnose(Timestamp::now());
        prop_assert_eq!(tree(&base), before, "a read changed the tree");
        // A claim over damaged holdings takes a fence above them (or refuses
        // with a clear error); it never panics and never grants below them.
        match rt.block_on(store.claim(&s, &opts("w", 60_000, now_ms()))) {
            Ok(runkeep::ClaimOutcome::Acquired(l)) => {
                let highest = contents
                    .iter()
                    .filter_map(|(i, _)| FILES[*i].strip_prefix("claims/")?.strip_suffix(".json")?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0);
                prop_assert!(l.fence.get() > highest, "fence {} issued at or below holding {highest}", l.fence);
            }
            Ok(runkeep::ClaimOutcome::Held(_)) => {}
            Ok(other) => prop_assert!(false, "a never-finished run answered {:?}", other),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        let _ = rt.block_on(store.append_events(&s, &[runkeep::NewEvent::new("after", Default::default())], None));
    }
}
