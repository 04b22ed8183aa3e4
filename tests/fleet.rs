//! kvgpt replicas behind real routers: vllm-router 0.1.17 and sglang-router 0.3.2 (PyPI), which
//! `.ci/run` installs into `.venv-router` with pip (or name another venv holding them in
//! `KVGPT_ROUTER_VENV`). Without them these tests print SKIPPED, unless `KVGPT_REQUIRE_ROUTER=1`
//! (as in `.ci/run`) makes that a failure.
//!
//! - Two replicas behind the router under each policy: every answer is the one a single server
//!   gives alone (and Hugging Face's greedy text for the fixture's prompts), and a shared-prefix
//!   workload finds more of its prompts in the fleet's prompt caches under `cache_aware` and
//!   under `kv_aware` (fed by kvgpt's KV-cache events, static and discovered) than under
//!   `round_robin`.
//! - sglang-router registers the replicas by what their `/server_info` says, and forwards
//!   completions and chat (re-serialized with its defaults) under `cache_aware` and
//!   `power_of_two` (which reads `/get_load`): Hugging Face's greedy text.
//! - A replica draining on SIGTERM says so on `/health`, refuses new work with 503 (the router
//!   sends it to the other replica), and finishes what it has.
//! - Two replicas sharing one Redis behind round robin serve each other's prefixes: the fleet's
//!   hit ratio is cache_aware's.
//! - The gauges the Inference Extension's endpoint picker reads (vLLM's names) agree with what
//!   the engine holds (no router needed).

mod common;

use common::server::{finish_stream, Server};
use common::Reference;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A router as a command: the venv's `vllm-router`, or its Python running sglang-router.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Vllm,
    Sglang,
}

fn router(kind: Kind) -> Option<Command> {
    let venv = std::env::var_os("KVGPT_ROUTER_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-router"));
    let (marker, mut cmd) = match kind {
        Kind::Vllm => (venv.join("bin/vllm-router"), Command::new(venv.join("bin/vllm-router"))),
        Kind::Sglang => (venv.join("bin/smg"), Command::new(venv.join("bin/python"))),
    };
    if kind == Kind::Sglang {
        cmd.args(["-m", "sglang_router.launch_router"]);
    }
    if marker.exists() {
        return Some(cmd);
    }
    assert!(
        std::env::var("KVGPT_REQUIRE_ROUTER").as_deref() != Ok("1"),
        "KVGPT_REQUIRE_ROUTER=1 but there is no {kind:?} router in {}",
        venv.display()
    );
    eprintln!(
        "SKIPPED: no {kind:?} router in {} (pip install vllm-router==0.1.17 sglang-router==0.3.2 there)",
        venv.display()
    );
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A vllm-router process in front of `workers`, killed when dropped.
struct Router {
    child: Child,
    base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Router {
    fn start(kind: Kind, workers: &[&Server], policy: &str, extra: &[String]) -> Router {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("router.log");
        let port = free_port();
        let mut cmd = router(kind).expect("checked by the caller");
        cmd.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--policy", policy]);
        cmd.arg("--worker-urls").args(workers.iter().map(|w| w.base.clone()));
        cmd.args(["--prometheus-port", &free_port().to_string(), "--worker-startup-check-interval", "1"]);
        cmd.args(["--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--log-level", "debug"]);
        let child = cmd
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(std::fs::File::create(dir.path().join("router.err")).unwrap()))
            .spawn()
            .unwrap();
        let r = Router { child, base: format!("http://127.0.0.1:{port}"), log, _dir: dir };
        let t0 = Instant::now();
        // Ready once it lists a model: a worker has registered.
        let listed = |r: &Router| ureq::get(&format!("{}/v1/models", r.base)).call().is_ok_and(|v| v.status() == 200);
        while !listed(&r) {
            assert!(t0.elapsed() < Duration::from_secs(60), "the router did not start:\n{}", r.log_text());
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(1500)); // kv_aware: the subscribers connect
        r
    }

    /// The router's log, without its colours.
    fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(self.log.with_file_name("router.err")).unwrap_or_default();
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().find(|&c| c == 'm'); // ESC [ … m
            } else {
                out.push(c);
            }
        }
        out
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(&format!("{base}{path}")).set("content-type", "application/json").send_string(&body.to_string());
    let (code, r) = match r {
        Ok(r) => (r.status(), r),
        Err(ureq::Error::Status(code, r)) => (code, r),
        Err(e) => panic!("POST {base}{path}: {e}"),
    };
    let text = r.into_string().unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// G groups of K prompts of token ids: a group's 48-token system prompt, then a 6-token
/// question; in the order g0 q0, g1 q0, g2 q0, g0 q1, … (an odd G, so round robin over two
/// replicas sends every group to both).
fn shared_prefix_prompts(groups: usize, per_group: usize) -> Vec<Vec<u32>> {
    let mut x: u64 = 0x2545f4914f6cdd1d;
    let mut ids = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                1000 + (x >> 33) as u32 % 29000
            })
            .collect()
    };
    let systems: Vec<Vec<u32>> = (0..groups).map(|_| ids(48)).collect();
    let mut out = vec![];
    for _ in 0..per_group {
        for s in &systems {
            out.push([s.clone(), ids(6)].concat());
        }
    }
    out
}

/// Sends every prompt through `base`, one after another: the texts, and the fleet's hit ratio
/// (cached prompt tokens over prompt tokens, from each response's usage).
fn run(base: &str, prompts: &[Vec<u32>]) -> (Vec<String>, f64) {
    let (mut texts, mut cached, mut total) = (vec![], 0.0, 0.0);
    for p in prompts {
        let (code, v) = post(base, "/v1/completions", &json!({"prompt": p, "max_tokens": 6, "temperature": 0}));
        assert_eq!(code, 200, "{v}");
        texts.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64().unwrap();
        total += v["usage"]["prompt_tokens"].as_f64().unwrap();
    }
    (texts, cached / total)
}

/// The KV-event endpoint a replica printed ("publishing KV-cache events on tcp://…").
fn event_endpoints(s: &Server) -> (String, String) {
    let line = s.log_lines(1, |l| l.contains("publishing KV-cache events on")).remove(0);
    let after = |key: &str| line.split(key).nth(1).unwrap().split([' ', ')']).next().unwrap().to_string();
    (after("events on "), after("replay on "))
}

#[test]
fn replicas_behind_vllm_router_answer_as_one_server_and_prefix_aware_policies_beat_round_robin() {
    if router(Kind::Vllm).is_none() {
        return;
    }
    let events = ["--kv-events", "tcp://127.0.0.1:0", "--kv-events-replay", "tcp://127.0.0.1:0"];
    let replicas = [Server::start(&events), Server::start(&events)];
    let workers: Vec<&Server> = replicas.iter().collect();
    let alone = Server::start(&[]);
    let prompts = shared_prefix_prompts(3, 6);
    let (want, _) = run(&alone.base, &prompts);

    let mut static_sources = vec!["--kv-event-model".to_string(), "fixture".to_string()];
    for r in &replicas {
        let (live, replay) = event_endpoints(r);
        static_sources.extend(["--kv-event-source".into(), format!("{}={live}", r.base)]);
        static_sources.extend(["--kv-event-replay-source".into(), format!("{}={replay}", r.base)]);
    }
    let reference = Reference::load();
    let mut ratios = vec![];
    for (policy, extra) in [
        ("round_robin", vec![]),
        ("cache_aware", vec![]),
        ("kv_aware", vec![]), // discovery: /server_info and /kv_event_sources
        ("kv_aware", static_sources.clone()),
    ] {
        for r in &replicas {
            let (code, v) = post(&r.base, "/flush_cache", &json!({}));
            assert_eq!(code, 200, "{v}");
        }
        let router = Router::start(Kind::Vllm, &workers, policy, &extra);
        let (texts, ratio) = run(&router.base, &prompts);
        for (i, (got, want)) in texts.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "{policy}: prompt {i} was answered otherwise than by a server alone");
        }
        // Hugging Face's greedy continuations, through the router (text prompts: the router
        // asks each replica to render them into ids first).
        for p in reference.prompts() {
            let body = json!({"model": "tiny-gpt2", "prompt": p.text, "max_tokens": p.greedy_ids.len(),
                "temperature": 0, "ignore_eos": true});
            let (code, v) = post(&router.base, "/v1/completions", &body);
            assert_eq!(code, 200, "{v}");
            assert_eq!(v["choices"][0]["text"], p.greedy_text, "{policy}: {}", p.key);
        }
        if policy == "kv_aware" {
            let log = router.log_text();
            assert!(log.contains("credited_prefix_tokens=48"), "the router credited no cached blocks:\n{log}");
            // It subscribed after the replicas had published (the flush's batches): the batches
            // before its first one came from the replay socket.
            assert!(log.contains("replay sequence advanced"), "the router replayed nothing:\n{log}");
        }
        eprintln!("{policy} {}: fleet prompt-cache hit ratio {ratio:.3}", if extra.is_empty() { "" } else { "static" });
        ratios.push((policy, ratio));
    }
    // Round robin sends every group to both replicas: each computes the group's prefix once.
    let rr = ratios[0].1;
    let expected_rr = (48.0 / 54.0) * (6.0 - 2.0) / 6.0;
    assert!((rr - expected_rr).abs() < 0.02, "round robin's hit ratio {rr:.3}, expected about {expected_rr:.3}");
    for &(policy, ratio) in &ratios[1..] {
        assert!(ratio > rr + 0.1, "{policy}: hit ratio {ratio:.3} does not beat round robin's {rr:.3}");
    }
}

/// Two replicas sharing one Redis (a real `redis-server` on loopback) behind round robin: a
/// replica serves from Redis a system prompt the other computed (its usage says `redis`), so the
/// fleet's hit ratio is cache_aware's without a prefix-aware router, and every answer is a
/// single server's.
#[test]
fn replicas_sharing_redis_behind_round_robin_serve_each_others_prefixes() {
    let Some(redis) = common::redis::Redis::start() else { return };
    if router(Kind::Vllm).is_none() {
        return;
    }
    let shared = ["--kv-redis", &redis.url()];
    let replicas = [Server::start(&shared), Server::start(&shared)];
    let alone = Server::start(&[]);
    let prompts = shared_prefix_prompts(3, 6);
    let (want, _) = run(&alone.base, &prompts);
    let router = Router::start(Kind::Vllm, &replicas.iter().collect::<Vec<_>>(), "round_robin", &[]);
    let (mut cached, mut total, mut from_redis) = (0.0, 0.0, 0);
    for (p, want) in prompts.iter().zip(&want) {
        let (code, v) = post(&router.base, "/v1/completions", &json!({"prompt": p, "max_tokens": 6, "temperature": 0}));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want, "answered otherwise than by a server alone");
        cached += v["usage"]["prompt_tokens_details"]["cached_tokens"].as_f64().unwrap();
        total += v["usage"]["prompt_tokens"].as_f64().unwrap();
        from_redis += usize::from(v["usage"]["prompt_cache"]["tiers"]["redis"] == 48);
    }
    // Each group's 48-token prefix (three whole blocks) is computed once in the fleet: the first
    // question of a group computes it, the other five reuse it from RAM or Redis.
    let ratio = cached / total;
    let cache_aware = (48.0 / 54.0) * 5.0 / 6.0;
    assert!((ratio - cache_aware).abs() < 0.02, "hit ratio {ratio:.3}, cache_aware's would be {cache_aware:.3}");
    assert!(from_redis >= 3, "{from_redis} requests took their prefix from Redis");
}

#[test]
fn a_draining_replica_refuses_new_work_and_the_router_sends_it_to_another() {
    let draining = Server::start(&["--parallel", "1"]);
    let other = Server::start(&[]);
    let router = router(Kind::Vllm).map(|_| Router::start(Kind::Vllm, &[&draining, &other], "round_robin", &[]));
    // Work in flight: eight choices of 120 tokens, one after another in its one slot.
    let stream = draining.open_stream(&json!({"prompt": "The cat", "max_tokens": 120, "n": 8, "ignore_eos": true,
        "stream": true}));
    draining.sigterm();
    let t0 = Instant::now();
    while draining.get("/health").0 != 503 {
        assert!(t0.elapsed() < Duration::from_secs(5), "/health did not say the replica is draining");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(draining.get("/health").1, r#"{"status":"draining"}"#);
    let (code, v) = draining.post("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!((code, v["error"]["code"].as_str()), (503, Some("draining")), "{v}");
    assert_eq!(draining.metric("kvgpt_draining"), 1.0);
    if let Some(router) = &router {
        // Whatever the router picks, the draining replica's 503 sends the request on.
        for i in 0..6 {
            let (code, v) =
                post(&router.base, "/v1/completions", &json!({"prompt": format!("x {i}"), "max_tokens": 2}));
            assert_eq!(code, 200, "{v}");
        }
    }
    finish_stream(stream, 8);
    assert!(draining.terminate().success());
}

#[test]
fn replicas_behind_sglang_router_register_by_their_server_info_and_answer_as_hf() {
    if router(Kind::Sglang).is_none() {
        return;
    }
    let replicas = [Server::start(&[]), Server::start(&[])];
    let workers: Vec<&Server> = replicas.iter().collect();
    let reference = Reference::load();
    for policy in ["cache_aware", "power_of_two"] {
        let router = Router::start(Kind::Sglang, &workers, policy, &[]);
        let models: Value = ureq::get(&format!("{}/v1/models", router.base)).call().unwrap().into_json().unwrap();
        assert_eq!(models["data"][0]["id"], "tiny-gpt2", "registered under the served name of /server_info");
        for p in reference.prompts() {
            let n = p.greedy_ids.len();
            let body = json!({"model": "tiny-gpt2", "prompt": p.text, "max_tokens": n, "temperature": 0,
                "ignore_eos": true});
            let (code, v) = post(&router.base, "/v1/completions", &body);
            assert_eq!(code, 200, "{v}");
            assert_eq!(v["choices"][0]["text"], p.greedy_text, "{policy}: {}", p.key);
        }
        // Chat, with the fields sglang-router adds (and max_tokens renamed): as a replica alone.
        let body = json!({"model": "tiny-gpt2", "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 8, "temperature": 0});
        let (code, routed) = post(&router.base, "/v1/chat/completions", &body);
        assert_eq!(code, 200, "{routed}");
        let alone = replicas[0].post("/v1/chat/completions", &body).1;
        assert_eq!(routed["choices"][0]["message"], alone["choices"][0]["message"]);
    }
    for r in &replicas {
        assert!(r.metric("kvgpt_requests_total{endpoint=\"/server_info\",status=\"200\"}") >= 1.0);
    }
    assert!(replicas[0].metric("kvgpt_requests_total{endpoint=\"/get_load\",status=\"200\"}") >= 1.0);
}

/// The gauges the Inference Extension's endpoint picker reads, under vLLM's names, agree with
/// what the engine holds while a request runs: its one slot running, three choices waiting, the K/V
/// usage as the pool's blocks in use over all of them, and the pool's blocks: `--kv-mb 0.125` is
/// 128 KiB, 8 blocks of 16 positions of the tiny model's 1 KiB per position.
#[test]
fn the_inference_extension_gauges_agree_with_what_the_engine_holds() {
    let s = Server::start(&["--parallel", "1", "--kv-block-size", "16", "--kv-mb", "0.125"]);
    let stream = s.open_stream(&json!({"prompt": "The cat", "max_tokens": 120, "n": 4, "ignore_eos": true,
        "stream": true}));
    let value = |text: &str, name: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let t0 = Instant::now();
    let text = loop {
        let (_, text) = s.get("/metrics");
        if value(&text, "vllm:num_requests_running") == 1.0 && value(&text, "vllm:num_requests_waiting") > 0.0 {
            break text;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "never saw the request running:\n{text}");
    };
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"] {
        assert!(text.contains(&format!("# TYPE {name} gauge")), "{name} is typed as a gauge");
    }
    assert_eq!(value(&text, "kvgpt_requests_running"), 1.0);
    assert_eq!(value(&text, "vllm:num_requests_waiting"), value(&text, "kvgpt_requests_waiting"));
    let usage = value(&text, "vllm:kv_cache_usage_perc");
    assert!(usage > 0.0 && usage <= 1.0, "{usage}");
    assert_eq!(usage, value(&text, "kvgpt_kv_blocks_used") / 8.0);
    assert_eq!(value(&text, "kvgpt_kv_cache_limit_bytes"), 131072.0);
    assert!(text.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"8\"} 1"), "{text}");
    assert!(text.contains("vllm:lora_requests_info{max_lora=\"0\""), "{text}");
    finish_stream(stream, 4);
}

/// What routers read, without a router: render gives the ids a completion prefills (its usage
/// counts them; chat through the template), `/model_info` names GPT-2, `/kv_event_sources` is a
/// 404 without events and advertises `tcp://*:PORT` for events bound on every interface (as
/// deploy/kvgpt.yaml binds them), and events without a prompt cache are refused at start.
#[test]
fn render_model_info_and_event_sources_answer_as_routers_read_them() {
    let s = Server::start(&["--kv-events", "tcp://*:0"]);
    let (code, v) = s.post("/v1/completions/render", &json!({"prompt": "The cat sat on"}));
    assert_eq!(code, 200, "{v}");
    let ids = common::server::ids_of(&v[0]["token_ids"]);
    let reference = Reference::load();
    assert_eq!(ids, reference.prompts().into_iter().find(|p| p.text == "The cat sat on").map(|p| p.ids).unwrap());
    let chat = json!({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2});
    let (_, rendered) = s.post("/v1/chat/completions/render", &chat);
    let (_, answered) = s.post("/v1/chat/completions", &chat);
    assert_eq!(rendered["token_ids"].as_array().unwrap().len() as u64, answered["usage"]["prompt_tokens"]);
    let (_, info) = s.get("/model_info");
    assert!(info.contains("\"architectures\":[\"GPT2LMHeadModel\"]"), "{info}");
    let (_, sources) = s.get("/kv_event_sources");
    let sources: Value = serde_json::from_str(&sources).unwrap();
    let endpoint = sources["0"]["endpoint"].as_str().unwrap();
    assert!(endpoint.starts_with("tcp://*:") && !endpoint.ends_with(":0"), "{endpoint}");
    assert_eq!(sources["0"]["schema_version"], 1);
    // The one route table gives each route its method: a wrong one gets a 405 naming it.
    let (code, v) = s.post("/server_info", &json!({}));
    assert_eq!(code, 405);
    assert!(v["error"]["message"].as_str().unwrap().ends_with("send it as GET"), "{v}");
    let (code, v) = s.post("/v1/nothing", &json!({}));
    assert_eq!(code, 404);
    assert!(v["error"]["message"].as_str().unwrap().contains("POST /v1/completions/render"), "{v}");

    let plain = Server::start(&[]);
    let (code, _) = plain.get("/kv_event_sources");
    assert_eq!(code, 404);
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["serve", "--model", common::fixture_dir().to_str().unwrap(), "--port", "0"])
        .args(["--kv-events", "tcp://127.0.0.1:0", "--cache-mb", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cache-mb 0 turns it off"));
}
