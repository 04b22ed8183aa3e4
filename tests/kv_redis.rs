//! The shared tier under the pool (issue #35): replicas that name one Redis (a real
//! `redis-server` on loopback) serve each other's prefixes — replica B answers a prompt replica A
//! computed from Redis, token exact, with HF's greedy answer — and a Redis that dies mid-run
//! fails no request: the server serves from RAM, says the tier is down, and reconnects when it
//! is back.

mod common;

use common::redis::Redis;
use common::server::{ids_of, Server};
use common::{RefPrompt, Reference};
use serde_json::json;
use std::time::{Duration, Instant};

fn prompts() -> Vec<RefPrompt> {
    Reference::load().prompts()
}

/// The server's greedy answer to `p` and how many prompt tokens it did not compute.
fn ask(s: &Server, p: &RefPrompt) -> (Vec<u32>, u64) {
    let n = p.greedy_ids.len();
    let v = s.complete(&json!({"prompt": p.ids, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 1}));
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    (ids_of(&v["choices"][0]["logprobs"]["token_ids"]), cached)
}

/// Waits (up to 10 s) until `metric` of `s` is `want`.
fn wait_metric(s: &Server, metric: &str, want: f64) {
    let t0 = Instant::now();
    while s.metric(metric) != want {
        assert!(t0.elapsed() < Duration::from_secs(10), "{metric} stayed {} (want {want})", s.metric(metric));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The keys Redis holds once no write has come for 300 ms (at most 10 s).
fn settled(redis: &Redis) -> usize {
    let (t0, mut last, mut since) = (Instant::now(), redis.keys(), Instant::now());
    while since.elapsed() < Duration::from_millis(300) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(30));
        let now = redis.keys();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

#[test]
fn a_replica_serves_from_redis_the_prefix_another_computed() {
    let Some(redis) = Redis::start() else { return };
    let p = prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let a = Server::start(&["--kv-redis", &redis.url()]);
    assert_eq!(ask(&a, &p), (p.greedy_ids.clone(), 0));
    // The prompt's 5 whole blocks and its partial sixth, then the answer's blocks (at its end).
    let t0 = Instant::now();
    while redis.keys() < 9 {
        assert!(t0.elapsed() < Duration::from_secs(10), "A wrote {} blocks to Redis", redis.keys());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(redis.keys(), 9);
    let b = Server::start(&["--kv-redis", &redis.url()]);
    let n = p.greedy_ids.len();
    let body = json!({"prompt": p.ids, "max_tokens": n, "temperature": 0, "ignore_eos": true, "logprobs": 3});
    let v = b.complete(&body);
    assert_eq!(ids_of(&v["choices"][0]["logprobs"]["token_ids"]), p.greedy_ids);
    let cold = Server::start(&[]).complete(&body);
    assert_eq!(v["choices"][0]["logprobs"], cold["choices"][0]["logprobs"], "the same bits as computed cold");
    let tiers = json!({"ram": 0, "disk": 0, "redis": 87, "verified": 0});
    assert_eq!(v["usage"]["prompt_cache"]["tiers"], tiers, "B reuses all but the last prompt token, from Redis");
    assert_eq!(b.metric("kvgpt_kv_store_hit_blocks_total{tier=\"redis\"}"), 6.0);
    assert_eq!(b.metric("kvgpt_kv_store_up{tier=\"redis\"}"), 1.0);
}

#[test]
fn redis_killed_mid_run_fails_no_request_and_comes_back() {
    let Some(redis) = Redis::start() else { return };
    let port = redis.port;
    let ps = prompts();
    let s = Server::start(&["--kv-redis", &redis.url()]);
    assert_eq!(ask(&s, &ps[0]), (ps[0].greedy_ids.clone(), 0));
    redis.kill();
    for p in &ps[1..4] {
        assert_eq!(ask(&s, p).0, p.greedy_ids, "{}: answered with Redis down", p.key);
    }
    wait_metric(&s, "kvgpt_kv_store_up{tier=\"redis\"}", 0.0);
    assert!(s.log_lines(1, |l| l.contains("redis") && l.contains("is down")).len() == 1, "one warning");
    let redis = Redis::start_on(port);
    std::thread::sleep(Duration::from_millis(1100)); // past the reconnect's back-off
    assert_eq!(ask(&s, &ps[4]).0, ps[4].greedy_ids);
    wait_metric(&s, "kvgpt_kv_store_up{tier=\"redis\"}", 1.0);
    let t0 = Instant::now();
    while redis.keys() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "nothing written after the reconnect");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A full Redis (`--maxmemory 1mb`, `noeviction`: it refuses writes past that) costs no answer:
/// the writes it refuses are counted as skipped and the tier stays up for reads.
#[test]
fn a_full_redis_refuses_writes_and_costs_no_answer() {
    let Some(redis) = Redis::start_configured(&["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let s = Server::start(&["--kv-redis", &redis.url()]);
    for p in &prompts()[..3] {
        assert_eq!(ask(&s, p).0, p.greedy_ids, "{}", p.key);
    }
    wait_metric(&s, "kvgpt_kv_store_up{tier=\"redis\"}", 1.0);
    let t0 = Instant::now();
    while s.metric("kvgpt_kv_store_skipped_blocks_total{tier=\"redis\"}") == 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no write was refused");
        assert_eq!(ask(&s, &prompts()[3]).0, prompts()[3].greedy_ids);
    }
    // Said when Redis starts refusing (again, after it took a write in between), not per write.
    let said = s.log_lines(1, |l| l.contains("refused a command")).len() as f64;
    let skipped = s.metric("kvgpt_kv_store_skipped_blocks_total{tier=\"redis\"}");
    assert!(said >= 1.0 && (said < skipped || skipped == 1.0), "{said} warnings for {skipped} refused writes");
}

/// A Redis that asks for a password, on another database than 0: the URL's password and database
/// are used by every connection (the bulk reads that load blocks too), and a wrong password costs
/// no answer (the tier is down, said once).
#[test]
fn a_redis_with_a_password_and_a_database_is_signed_into_by_every_connection() {
    let Some(redis) = Redis::start_configured(&["--requirepass", "s3cret"]) else { return };
    let p = prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let url = format!("redis://:s3cret@127.0.0.1:{}/3", redis.port);
    let a = Server::start(&["--kv-redis", &url]);
    assert_eq!(ask(&a, &p), (p.greedy_ids.clone(), 0));
    let t0 = Instant::now();
    while redis.keys_as(&["--no-auth-warning", "-a", "s3cret", "-n", "3"]) < 9 {
        assert!(t0.elapsed() < Duration::from_secs(10), "A did not write its 9 blocks to database 3");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(redis.keys_as(&["--no-auth-warning", "-a", "s3cret"]), 0, "nothing in database 0");
    let b = Server::start(&["--kv-redis", &url]);
    assert_eq!(ask(&b, &p), (p.greedy_ids.clone(), 87), "B loads A's blocks from database 3");
    assert_eq!(b.metric("kvgpt_kv_store_hit_blocks_total{tier=\"redis\"}"), 6.0);
    let wrong = Server::start(&["--kv-redis", &format!("redis://:wrong@127.0.0.1:{}/3", redis.port)]);
    assert_eq!(ask(&wrong, &p), (p.greedy_ids.clone(), 0), "nothing from a Redis it cannot sign into");
    assert_eq!(wrong.metric("kvgpt_kv_store_up{tier=\"redis\"}"), 0.0);
}

/// A Redis that hangs (stopped: its connections open, nothing answered) costs no answer: each
/// lookup waits for the tier's timeout at most, the tier is said to be down, and when Redis goes
/// on the server uses it again — what it computed meanwhile is written, and another replica loads it.
#[test]
fn a_hung_redis_fails_no_request_and_is_used_again_when_it_answers() {
    let Some(redis) = Redis::start() else { return };
    let ps = prompts();
    let s = Server::start(&["--kv-redis", &redis.url()]);
    assert_eq!(ask(&s, &ps[0]), (ps[0].greedy_ids.clone(), 0));
    let before = settled(&redis);
    assert!(before > 0, "nothing written");
    redis.hang(true);
    for p in &ps[1..3] {
        assert_eq!(ask(&s, p).0, p.greedy_ids, "{}: answered with Redis hung", p.key);
    }
    wait_metric(&s, "kvgpt_kv_store_up{tier=\"redis\"}", 0.0);
    assert!(s.log_lines(1, |l| l.contains("redis") && l.contains("is down")).len() == 1, "said once");
    redis.hang(false);
    std::thread::sleep(Duration::from_millis(1100)); // past the reconnect's back-off
    assert_eq!(ask(&s, &ps[3]).0, ps[3].greedy_ids);
    wait_metric(&s, "kvgpt_kv_store_up{tier=\"redis\"}", 1.0);
    assert!(settled(&redis) > before, "what was computed after Redis went on never reached it");
    let b = Server::start(&["--kv-redis", &redis.url()]);
    let (ids, cached) = ask(&b, &ps[3]);
    assert_eq!((ids, cached as usize), (ps[3].greedy_ids.clone(), ps[3].ids.len() - 1), "B loads A's blocks");
}
