//! The server's prompt-cache diagnosis (`usage.prompt_cache`) on the paths the openai client's
//! checks (scripts/openai/openai_cache_checks.py) do not take: several prompts in one request, `n` > 1,
//! the chat endpoint, the cache turned off, and bad `kvgpt` options. Where reuse must stop comes
//! from Hugging Face's `tokenizers` library reading the fixture's tokenizer.json, not from kvgpt.

mod common;

use common::server::Server;
use common::*;
use serde_json::{json, Value};

fn hf_ids(tok: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

const STORY: &str = "The keeper of the lighthouse counted the boats each evening and wrote their names in a book";

#[test]
fn usage_reports_each_prompt_each_endpoint_and_nothing_with_the_cache_off() {
    let tok = tokenizers::Tokenizer::from_file(fixture_dir().join("tokenizer.json")).unwrap();
    let s = Server::start(&[]);
    let warm = s.complete(&json!({"prompt": STORY, "max_tokens": 2, "temperature": 0}));
    assert_eq!(warm["usage"]["prompt_cache"]["reused"], 0);

    // Two prompts in one request: a list, one report per prompt, in order.
    let changed = STORY.replace("boats", "ships");
    let fresh = "Zebras do not read lighthouse books";
    let r = s.complete(&json!({"prompt": [changed, fresh], "max_tokens": 2, "temperature": 0}));
    let list = r["usage"]["prompt_cache"].as_array().expect("a list for several prompts");
    assert_eq!(list.len(), 2);
    let (a, b) = (hf_ids(&tok, STORY), hf_ids(&tok, &changed));
    let stop = first_difference(&a, &b);
    assert_eq!(list[0]["reused"].as_u64(), Some(stop as u64));
    assert_eq!(list[0]["reason"], "differs");
    assert_eq!(list[0]["cached_token"]["id"].as_u64(), Some(u64::from(a[stop])));
    assert_eq!(list[0]["new_token"]["id"].as_u64(), Some(u64::from(b[stop])));
    assert_eq!(list[1]["reused"], 0, "{}", list[1]);
    assert_eq!(list[1]["new_token"]["id"].as_u64(), Some(u64::from(hf_ids(&tok, fresh)[0])));
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(stop as u64));

    // n = 2: one prompt, one report (its first choice's lookup).
    let r = s.complete(&json!({"prompt": STORY, "max_tokens": 2, "n": 2, "temperature": 0.7, "seed": 3}));
    let pc = &r["usage"]["prompt_cache"];
    assert!(pc.is_object(), "{pc}");
    assert_eq!((pc["reused"].as_u64(), pc["reason"].as_str()), (Some(a.len() as u64 - 1), Some("last_token")));

    // Chat: the rendered prompt the second time is reused to its last token.
    let chat = json!({"messages": [{"role": "user", "content": STORY}], "max_tokens": 2,
                      "kvgpt": {"cache_diagnosis": true}});
    let (code, first) = s.post("/v1/chat/completions", &chat);
    assert_eq!(code, 200, "{first}");
    let (_, again) = s.post("/v1/chat/completions", &chat);
    let pc = &again["usage"]["prompt_cache"];
    let n = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!((pc["reused"].as_u64(), pc["reason"].as_str()), (Some(n - 1), Some("last_token")));
    assert!(pc["context"]["explanation"].as_str().unwrap().contains("the last is always computed"));

    // Bad options: an error object naming the field, and the server keeps serving.
    for (kvgpt, param) in [(json!(5), "kvgpt"), (json!({"diagnosis": true}), "kvgpt.diagnosis")] {
        let (code, v) = s.post("/v1/completions", &json!({"prompt": "x", "kvgpt": kvgpt}));
        assert_eq!(code, 400, "{v}");
        assert_eq!(v["error"]["param"], param);
    }
    let (code, v) = s.post("/v1/completions", &json!({"prompt": "x", "kvgpt": {"cache_diagnosis": "yes"}}));
    assert_eq!((code, v["error"]["param"].as_str()), (400, Some("kvgpt.cache_diagnosis")));
    assert_eq!(s.complete(&json!({"prompt": "x", "max_tokens": 1}))["usage"]["prompt_tokens"], 1);

    // With the prompt cache off there is no diagnosis to give.
    let off = Server::start(&["--cache-mb", "0"]);
    let r = off.complete(&json!({"prompt": STORY, "max_tokens": 1, "kvgpt": {"cache_diagnosis": true}}));
    assert_eq!(r["usage"]["prompt_cache"], Value::Null);
    assert_eq!(off.metric("kvgpt_prompt_cache_reuse_stop_position_count"), 0.0);
}
