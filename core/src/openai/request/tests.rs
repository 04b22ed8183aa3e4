//! Request bodies built at random from the fields the API knows, with values of every JSON
//! type: the parsers return parameters or an OpenAI error naming a field, never panic.
use super::*;
use proptest::prelude::*;
use serde_json::json;

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        prop::num::f64::ANY.prop_map(|x| json!(x)),
        "[ -~é\\n]{0,12}".prop_map(Value::String),
        prop::sample::select(vec!["user", "system", "assistant", "text", "x"]).prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(
                (prop::sample::select(vec!["role", "content", "type", "text", "k", "cache_diagnosis"]), inner),
                0..3
            )
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = Map<String, Value>> {
    let keys = prop::sample::select(vec![
        "model",
        "kvgpt",
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "echo",
        "logprobs",
        "top_logprobs",
        "n",
        "ignore_eos",
        "stream",
        "stream_options",
        "cache_prompt",
        "no_stop_trim",
        "skip_special_tokens",
        "data_parallel_rank",
        "text",
        "tokens",
        "unknown",
    ]);
    prop::collection::vec((keys, value()), 0..8)
        .prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Real request bodies (as the tests and the openai client send them), mutated byte by byte.
fn mutated_body() -> impl Strategy<Value = Vec<u8>> {
    let bodies = prop::sample::select(vec![
        r#"{"prompt": "The cat", "max_tokens": 4, "temperature": 0, "stop": ["\n"], "logprobs": 2}"#,
        r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}}"#,
        r#"{"prompt": [464, 3797], "n": 2, "seed": 1, "top_p": 0.9, "top_k": 5, "echo": true}"#,
        r#"{"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}], "max_completion_tokens": 3}"#,
    ]);
    let edit = (
        0.0..1.0f64,
        prop::sample::select(vec!["", "0", "-1", "1e999", "\"", "[", "]", "{", "}", ",", ":", "null", "é"]),
    );
    (bodies, prop::collection::vec(edit, 1..4), prop::collection::vec((0.0..1.0f64, 0..4usize), 0..3)).prop_map(
        |(b, inserts, deletes)| {
            let mut v = b.as_bytes().to_vec();
            for (at, text) in inserts {
                let i = (at * v.len() as f64) as usize;
                v.splice(i..i, text.bytes());
            }
            for (at, n) in deletes {
                let i = (at * v.len() as f64) as usize;
                v.drain(i..(i + n).min(v.len()));
            }
            v
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_real_bodies_never_panic(bytes in mutated_body()) {
        match object(&bytes) {
            Ok(m) => {
                for r in [completion(&m).map(drop), chat(&m).map(drop)] {
                    if let Err(e) = r {
                        prop_assert!(!e.message.is_empty() && e.status.is_client_error());
                    }
                }
            }
            Err(e) => prop_assert!(e.message.contains("JSON")),
        }
    }

    #[test]
    fn request_bodies_never_panic(m in body(), raw in prop::collection::vec(any::<u8>(), 0..64)) {
        for r in [completion(&m).map(drop), chat(&m).map(drop), text_field(&m).map(drop), tokens_field(&m).map(drop)] {
            if let Err(e) = r {
                prop_assert!(!e.message.is_empty());
                prop_assert!(e.status.is_client_error(), "{} {}", e.status, e.message);
            }
        }
        let bytes = serde_json::to_vec(&m).unwrap();
        prop_assert!(object(&bytes).is_ok());
        if let Err(e) = object(&raw) {
            prop_assert!(!e.message.is_empty());
        }
    }
}

/// The bodies vllm-router 0.1.17 and sglang-router 0.3.2 forward, as a worker receives them
/// (captured from both routers on loopback): accepted, each added field at its default; a value
/// kvgpt cannot honour is refused naming the field.
#[test]
fn the_defaults_routers_add_are_accepted_and_other_values_refused() {
    let completion_body = json!({"model": "m", "prompt": "Hello world", "max_tokens": 5, "temperature": 0.5,
        "stream": false, "echo": false, "no_stop_trim": false, "ignore_eos": false, "skip_special_tokens": true,
        "return_hidden_states": false});
    let chat_body = json!({"messages": [{"role": "user", "content": "hi"}], "model": "m", "logprobs": false,
        "max_completion_tokens": 5, "stream": false, "temperature": 0.5, "no_stop_trim": false, "ignore_eos": false,
        "continue_final_message": false, "skip_special_tokens": true, "separate_reasoning": true,
        "stream_reasoning": true, "return_hidden_states": false, "include_reasoning": true, "data_parallel_rank": 0});
    let obj = |v: &Value| v.as_object().unwrap().clone();
    assert_eq!(completion(&obj(&completion_body)).unwrap().max_tokens, Some(5));
    assert_eq!(chat(&obj(&chat_body)).unwrap().max_tokens, Some(5));
    for (key, value) in [
        ("no_stop_trim", json!(true)),
        ("skip_special_tokens", json!(false)),
        ("return_hidden_states", json!(true)),
        ("continue_final_message", json!(true)),
        ("data_parallel_rank", json!(1)),
        ("separate_reasoning", json!("yes")),
    ] {
        let mut m = obj(&chat_body);
        m.insert(key.into(), value);
        let e = chat(&m).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(key)), "{}", e.message);
    }
}
