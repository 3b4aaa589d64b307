//! Property tests ("fuzzing") of the JSON member scanner on what an upstream may send:
//! nested values of every JSON type, compact or pretty printed, the member anywhere, any
//! bytes before the object and any start offset, and arbitrary bytes. Bounded in CI;
//! `LLMREPLAY_FUZZ_CASES=N` runs `N` cases per property (`bench/fuzz.sh`). The SSE observer
//! around it is fuzzed in `observer_props.rs`.

use proptest::prelude::*;
use proxy::recording::jsonscan::member_removal_range;
use serde_json::Value;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        Just(Value::String("}\",{\\\"usage\\\":1".into())),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,6}|usage", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(wire::testing::fuzz_cases(512)))]

    /// Cutting the range the scanner returns leaves the object without its top-level
    /// `usage` member and every other member as it was; no range when there is none.
    #[test]
    fn removal_leaves_the_object_without_the_member(
        members in prop::collection::vec(("[a-z]{1,6}", value()), 0..6),
        usage in prop::option::of((value(), any::<prop::sample::Index>())),
        pretty in any::<bool>(),
        prefix in "[ -~]{0,8}",
    ) {
        let mut members: Vec<(String, Value)> = members
            .into_iter()
            .filter(|(k, _)| k != "usage")
            .collect();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members.dedup_by(|a, b| a.0 == b.0);
        let mut with_usage = members.clone();
        if let Some((u, at)) = &usage {
            with_usage.insert(at.index(with_usage.len() + 1), ("usage".into(), u.clone()));
        }
        // Written by hand to keep the member order (serde_json's Map sorts keys).
        let sep = if pretty { ",\n  " } else { "," };
        let colon = if pretty { ": " } else { ":" };
        let body = with_usage
            .iter()
            .map(|(k, v)| format!("{}{colon}{}", Value::String(k.clone()), v))
            .collect::<Vec<_>>()
            .join(sep);
        let wrap = |body: String| if pretty { format!("{{ {body} }}") } else { format!("{{{body}}}") };
        let text = wrap(body);
        // What is left must be the object written without the member, byte for byte.
        let want = wrap(
            members
                .iter()
                .map(|(k, v)| format!("{}{colon}{}", Value::String(k.clone()), v))
                .collect::<Vec<_>>()
                .join(sep),
        );
        let buf = format!("{prefix}{text}");
        let start = prefix.len();
        match member_removal_range(buf.as_bytes(), start, b"usage") {
            Some((a, b)) => {
                prop_assert!(usage.is_some());
                prop_assert!(start <= a && a <= b && b <= buf.len());
                let cut = format!("{}{}", &buf[start..a], &buf[b..]);
                serde_json::from_str::<Value>(&cut).expect("valid JSON after the cut");
                prop_assert_eq!(cut, want);
            }
            // A pretty-printed object spans lines: the scanner refuses it (SSE data is one line).
            None => prop_assert!(usage.is_none() || pretty, "{}", buf),
        }
    }

    /// Any bytes at any start: no panic, and a range stays inside the buffer.
    #[test]
    fn any_bytes_at_any_start(
        buf in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            prop::collection::vec(
                prop_oneof![
                    Just(b"{".to_vec()), Just(b"}".to_vec()), Just(b"\"usage\"".to_vec()),
                    Just(b":".to_vec()), Just(b",".to_vec()), Just(b"[".to_vec()),
                    Just(b"]".to_vec()), Just(b"\"".to_vec()), Just(b"\\".to_vec()),
                    Just(b" ".to_vec()), Just(b"1e5".to_vec()), Just(b"null".to_vec()),
                ],
                0..48,
            ).prop_map(|v| v.concat()),
        ],
        start in any::<usize>(),
    ) {
        let start = start % (buf.len() + 2);
        if let Some((a, b)) = member_removal_range(&buf, start, b"usage") {
            prop_assert!(start <= a && a <= b && b <= buf.len());
        }
    }
}
