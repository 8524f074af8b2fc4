//! Property tests: the parsers at the store boundary never panic on any
//! input, and what they accept satisfies the rules they enforce.

use proptest::prelude::*;
use runkeep::listing::{ListOptions, ListQuery};
use runkeep::{
    Checkpoint, CheckpointId, Fence, Holder, ListingScope, PersistedEvent, RunId, Timestamp, Ttl,
};
use serde_json::{Map, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("cp_a"),
            Just("run_a"),
            Just("../x"),
            Just("tool_review"),
            Just("")
        ]
        .prop_map(|s| Value::String(s.to_string())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("id".to_string()),
                        Just("createdAt".to_string()),
                        Just("runCreatedAt".to_string()),
                        Just("pending".to_string()),
                        Just("fence".to_string()),
                        Just("request".to_string()),
                        Just("type".to_string()),
                        Just("parkedAt".to_string()),
                        Just("seq".to_string()),
                        Just("timestamp".to_string()),
                        Just("generation".to_string()),
                        "[a-z]{1,6}",
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn checkpoint_parsing_never_panics_and_round_trips_what_it_accepts(v in json_value()) {
        if let Value::Object(obj) = v {
            if let Ok(cp) = Checkpoint::from_json(obj) {
                let again = Checkpoint::from_json(cp.to_json()).expect("a parsed checkpoint re-parses");
                prop_assert_eq!(again, cp);
            }
        }
    }

    #[test]
    fn event_line_parsing_never_panics(v in json_value(), pos in 1u64..1000) {
        if let Value::Object(obj) = v {
            if let Ok(e) = PersistedEvent::from_json(obj, pos) {
                prop_assert!(e.seq > 0);
                let again = PersistedEvent::from_json(e.to_json(), pos).expect("re-parses");
                prop_assert_eq!(again, e);
            }
        }
    }

    #[test]
    fn ids_accept_only_the_safe_alphabet(s in ".{0,140}") {
        let ok = RunId::new(s.clone()).is_ok();
        let rule = !s.is_empty()
            && s.len() <= runkeep::id::MAX_ID_LEN
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && s.as_bytes()[0].is_ascii_alphanumeric();
        prop_assert_eq!(ok, rule);
        prop_assert_eq!(CheckpointId::new(s.clone()).is_ok(), rule);
        let _ = Holder::new(s);
    }

    #[test]
    fn numbers_at_the_boundary_never_panic(f in any::<f64>(), i in any::<i64>(), u in any::<u64>(), s in ".{0,20}") {
        let _ = Ttl::from_f64_millis(f);
        let _ = Ttl::from_millis(u);
        let _ = Timestamp::from_f64(f);
        let _ = Timestamp::from_millis(i);
        let _ = Fence::new(u);
        let _ = s.parse::<Fence>();
        if let Ok(t) = Ttl::from_f64_millis(f) {
            prop_assert!(t.as_millis() > 0);
        }
    }

    #[test]
    fn forged_cursors_are_refused_never_panic(c in ".{0,200}") {
        let scope = ListingScope::tenant("tnt_a".parse().unwrap());
        let r = ListQuery::new(&scope, &ListOptions { cursor: Some(c), ..Default::default() });
        prop_assert!(r.is_err());
    }

    #[test]
    fn edited_cursors_are_refused(flip in 4usize..200, byte in any::<u8>()) {
        let scope = ListingScope::tenant("tnt_a".parse().unwrap());
        let q = ListQuery::new(&scope, &ListOptions::default()).unwrap();
        let key = runkeep::listing::RowKey::new(runkeep::ListOrder::RunId, &"run_b".parse().unwrap(), None, None);
        let good = q.encode_cursor(&key);
        let mut bytes = good.clone().into_bytes();
        let i = flip % bytes.len();
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        if let Ok(edited) = String::from_utf8(bytes) {
            let r = ListQuery::new(&scope, &ListOptions { cursor: Some(edited.clone()), ..Default::default() });
            // An edit either breaks the cursor or (base64 slack bits) decodes
            // to the very same position; it never moves it.
            if let Ok(q2) = r {
                prop_assert_eq!(q2.after, Some(key));
            }
        }
    }
}
