//! Locating models: local folders, and hub ids resolved through an HF cache laid out on disk
//! exactly as huggingface_hub writes it (offline), plus the message when the Hub is unreachable.

mod common;

use common::*;
use kvgpt_core::{Locate, TokenizerFiles};

/// An HF cache folder holding the fixture as `org/name` at some revision.
fn fake_cache(repo: &str) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join(format!("models--{}", repo.replace('/', "--")));
    let hash = "0123456789abcdef0123456789abcdef01234567";
    let snap = folder.join("snapshots").join(hash);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(folder.join("refs")).unwrap();
    std::fs::write(folder.join("refs/main"), hash).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture_dir().join(f), snap.join(f)).unwrap();
    }
    root
}

#[test]
fn hub_ids_resolve_from_the_cache_offline() {
    let cache = fake_cache("someone/tiny-gpt2");
    let loc = Locate { offline: true, ..Locate::new(cache.path()) };
    let files = loc.resolve("someone/tiny-gpt2").unwrap();
    assert!(matches!(files.tokenizer, TokenizerFiles::Json(_)));
    let loaded = kvgpt_core::load(&files).unwrap();
    let p = &Reference::load().prompts()[0];
    assert_eq!(loaded.tokenizer.encode(&p.text).unwrap(), p.ids);
    let err = loc.resolve("someone/other-model").unwrap_err().to_string();
    assert!(
        err.contains("not in the local Hugging Face cache")
            && err.contains("use a local model folder")
            && !err.contains("--"),
        "{err}"
    );
}

#[test]
fn an_unreachable_hub_says_so_and_shows_the_local_folder_option() {
    // An empty cache and a repository that cannot be fetched: whether the network is absent
    // (these machines) or present (the repo does not exist), the error must say what to do.
    let cache = tempfile::tempdir().unwrap();
    let loc = Locate::new(cache.path());
    match loc.resolve("kvgpt-test/definitely-not-a-real-repo-4242") {
        Ok(_) => panic!("a repository that does not exist resolved"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("could not fetch") && msg.contains("use a local model folder") && !msg.contains("--"),
                "{msg}"
            );
        }
    }
}

#[test]
fn local_folders_and_paths() {
    let loc = Locate { offline: true, ..Locate::new(std::env::temp_dir()) };
    assert!(loc.resolve(fixture_dir().to_str().unwrap()).is_ok());
    let err = loc.resolve("./no/such/dir").unwrap_err().to_string();
    assert!(err.contains("not found"), "{err}");
    let err = loc.resolve(fixture_dir().join("config.json").to_str().unwrap()).unwrap_err().to_string();
    assert!(err.contains("is a file"), "{err}");
}

// Downloads through `HF_ENDPOINT`, end to end: the real binary against a local server that speaks
// the Hub's file protocol (tests/common/hub_server.rs), into an empty HF cache.

use common::hub_server::{sha256_hex, Fault, HubServer, COMMIT};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const REPO: &str = "someone/tiny-gpt2";
const FILES: &[&str] = &["config.json", "model.safetensors", "tokenizer.json", "vocab.json", "merges.txt"];
const TOKEN: &str = "hf_test_token";

/// A home folder of its own (so no token or cache of the machine's is read) for each run.
struct Home(tempfile::TempDir);

impl Home {
    fn new() -> Home {
        Home(tempfile::tempdir().unwrap())
    }
    fn cache(&self) -> PathBuf {
        self.0.path().join("hub")
    }
    /// `models--someone--tiny-gpt2` in the cache.
    fn repo_dir(&self) -> PathBuf {
        self.cache().join(format!("models--{}", REPO.replace('/', "--")))
    }
    fn snapshot(&self, file: &str) -> PathBuf {
        self.repo_dir().join("snapshots").join(COMMIT).join(file)
    }
    /// The HF environment of a download from `server` into this cache, with the token.
    fn env(&self, server: &HubServer) -> Vec<(&'static str, String)> {
        vec![
            ("HF_ENDPOINT", format!("{}/", server.endpoint)),
            ("HF_HUB_CACHE", self.cache().display().to_string()),
            ("HF_TOKEN", TOKEN.into()),
        ]
    }
}

/// `kvgpt generate` of the first reference prompt on `model`, in an environment holding only
/// `HOME` and `env` (no proxy, no HF variable of the caller's).
fn generate(home: &Home, model: &str, env: &[(&str, String)], extra: &[&str]) -> Output {
    let reference = Reference::load();
    let p = &reference.prompts()[0];
    let n = p.greedy_ids.len().to_string();
    Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["generate", &p.text, "--model", model, "-n", &n, "--ignore-eos", "-t", "2"])
        .args(extra)
        .env_clear()
        .env("HOME", home.0.path())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[track_caller]
fn succeeded(out: &Output) -> String {
    let (o, e) = text(out);
    assert!(out.status.success(), "kvgpt failed: {e}");
    o
}

/// What the same command prints on the fixture folder.
fn wanted() -> String {
    let home = Home::new();
    succeeded(&generate(&home, fixture_dir().to_str().unwrap(), &[], &[]))
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The files in the cache's blobs folder, by name.
fn blobs(home: &Home) -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir(home.repo_dir().join("blobs")) else { return vec![] };
    dir.map(|e| e.unwrap()).map(|e| (e.file_name().into_string().unwrap(), len(&e.path()))).collect()
}

#[test]
fn hf_endpoint_downloads_into_an_empty_cache_and_offline_then_uses_it() {
    let want = wanted();
    let (home, server) = (Home::new(), HubServer::start(REPO, FILES));
    let out = generate(&home, REPO, &home.env(&server), &[]);
    assert_eq!(succeeded(&out), want);
    // The cache as huggingface_hub lays it out: refs/main names the commit, the snapshot's files
    // are links to blobs named by their ETag (the weights' is their sha256).
    let repo_dir = home.repo_dir();
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(), COMMIT);
    assert_eq!(
        server.etag("model.safetensors"),
        sha256_hex(&std::fs::read(fixture_dir().join("model.safetensors")).unwrap())
    );
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        let link = home.snapshot(f);
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "{f}");
        let blob = repo_dir.join("blobs").join(server.etag(f));
        assert_eq!(std::fs::canonicalize(&link).unwrap(), std::fs::canonicalize(blob).unwrap(), "{f}");
        assert!(std::fs::read(&link).unwrap() == std::fs::read(fixture_dir().join(f)).unwrap(), "{f}");
    }
    assert!(blobs(&home).iter().all(|(name, _)| !name.ends_with(".part")), "{:?}", blobs(&home));
    // The server was asked for each file at the mirror (one slash: the trailing one is dropped),
    // the weights through the LFS redirect, every request with the token; tokenizer.json was
    // there, so vocab.json was never asked for.
    let seen = server.seen();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(seen.iter().any(|s| s.method == "GET" && s.path == server.resolve_path(f)), "{f}: {seen:#?}");
    }
    let blob_path = format!("/blobs/{}", server.etag("model.safetensors"));
    assert!(seen.iter().any(|s| s.path == blob_path && s.status == 206 && s.range.as_deref() == Some("bytes=0-")));
    assert!(seen.iter().all(|s| s.authorization.as_deref() == Some(&format!("Bearer {TOKEN}")[..])), "{seen:#?}");
    assert!(!seen.iter().any(|s| s.path.contains("vocab.json")), "{seen:#?}");
    // Without a terminal there is no progress bar in stderr.
    assert!(!text(&out).1.contains("MiB/"), "{}", text(&out).1);

    // The server gone, --offline runs from the cache.
    let dead = server.endpoint.clone();
    drop(server);
    let env = [("HF_ENDPOINT", dead), ("HF_HUB_CACHE", home.cache().display().to_string())];
    assert_eq!(succeeded(&generate(&home, REPO, &env, &["--offline"])), want);
}

#[test]
fn a_repo_without_tokenizer_json_falls_back_to_vocab_and_merges_with_the_token_file_of_hf_home() {
    let want = wanted();
    let server = HubServer::start(REPO, &["config.json", "model.safetensors", "vocab.json", "merges.txt"]);
    let home = Home::new();
    // HF_HOME instead of HF_HUB_CACHE: the cache is HF_HOME/hub, the token HF_HOME/token.
    std::fs::write(home.0.path().join("token"), "hf_from_the_file\n").unwrap();
    let env = [("HF_ENDPOINT", server.endpoint.clone()), ("HF_HOME", home.0.path().display().to_string())];
    assert_eq!(succeeded(&generate(&home, REPO, &env, &[])), want);
    let seen = server.seen();
    let tok = seen.iter().find(|s| s.path == server.resolve_path("tokenizer.json")).expect("tokenizer.json asked for");
    assert_eq!(tok.status, 404);
    for f in ["vocab.json", "merges.txt"] {
        assert!(home.snapshot(f).is_file(), "{f}");
    }
    assert!(seen.iter().all(|s| s.authorization.as_deref() == Some("Bearer hf_from_the_file")), "{seen:#?}");
}

/// Serves model.safetensors with `fault` and checks the run fails, saying the file was truncated,
/// what to do and each of `also`, with nothing of it in the snapshot.
fn refused_as_truncated(home: &Home, server: &HubServer, fault: Fault, also: &[&str]) {
    server.set_fault("model.safetensors", Some(fault));
    let out = generate(home, REPO, &home.env(server), &[]);
    let err = text(&out).1;
    assert!(!out.status.success(), "{err}");
    for part in ["model.safetensors", "truncated", "run the command again"].iter().chain(also) {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    assert!(!home.snapshot("model.safetensors").exists(), "a truncated file is in the snapshot");
}

#[test]
fn a_short_body_the_client_cannot_see_is_refused_and_never_left_looking_complete() {
    let want = wanted();
    let (home, server) = (Home::new(), HubServer::start(REPO, FILES));
    // No Content-Length and 1 MiB of the 12.7: only the announced size shows the loss.
    let full = len(&fixture_dir().join("model.safetensors"));
    let got = format!("got {} of the {full} bytes", 1 << 20);
    refused_as_truncated(&home, &server, Fault::Unframed(1 << 20), &[&got, &server.endpoint]);
    assert!(!blobs(&home).iter().any(|(_, n)| *n == 1 << 20), "{:?}", blobs(&home));
    // So offline it is simply not there, rather than a damaged file.
    let env = [("HF_HUB_CACHE", home.cache().display().to_string())];
    let err = text(&generate(&home, REPO, &env, &["--offline"])).1;
    assert!(err.contains("not in the local Hugging Face cache"), "{err}");
    // The mirror mended, the same command downloads it whole.
    server.set_fault("model.safetensors", None);
    assert_eq!(succeeded(&generate(&home, REPO, &home.env(&server), &[])), want);
    assert_eq!(len(&home.snapshot("model.safetensors")), full);
}

#[test]
fn a_dropped_connection_is_resumed_in_the_same_run() {
    let want = wanted();
    let (home, server) = (Home::new(), HubServer::start(REPO, FILES));
    // The full Content-Length announced, the connection closed after 1 MiB, once.
    server.set_fault("model.safetensors", Some(Fault::DropOnce(1 << 20)));
    assert_eq!(succeeded(&generate(&home, REPO, &home.env(&server), &[])), want);
    let blob_path = format!("/blobs/{}", server.etag("model.safetensors"));
    let resumed = format!("bytes={}-", 1 << 20);
    assert!(
        server.seen().iter().any(|s| s.path == blob_path && s.range.as_deref() == Some(&resumed[..])),
        "{:#?}",
        server.seen()
    );
}

#[test]
fn a_connection_that_keeps_dropping_is_refused_clearly_and_the_next_run_resumes() {
    let want = wanted();
    let (home, server) = (Home::new(), HubServer::start(REPO, FILES));
    let full = len(&fixture_dir().join("model.safetensors"));
    refused_as_truncated(&home, &server, Fault::Drop(1 << 20), &["connection closed"]);
    // What came is kept as a .part (never in the snapshot), and the next run goes on from it.
    let part = blobs(&home).into_iter().find(|(n, _)| n.ends_with(".part")).expect("a partial download");
    assert!(part.1 > 0 && part.1 < full, "{part:?}");
    server.set_fault("model.safetensors", None);
    assert_eq!(succeeded(&generate(&home, REPO, &home.env(&server), &[])), want);
    let resumed = format!("bytes={}-", part.1);
    assert!(server.seen().iter().any(|s| s.range.as_deref() == Some(&resumed[..])), "{:#?}", server.seen());
}

#[test]
fn the_download_draws_a_progress_bar_on_a_terminal_unless_disabled() {
    // `script` (util-linux) runs kvgpt on a pseudo-terminal and copies what it draws to stdout.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("skipped: no `script` here to give kvgpt a terminal");
        return;
    }
    let server = HubServer::start(REPO, FILES);
    let size = indicatif::HumanBytes(len(&fixture_dir().join("model.safetensors"))).to_string();
    let run = |disable: Option<&str>| {
        let home = Home::new();
        let cmd = format!("{} info --model {REPO}", env!("CARGO_BIN_EXE_kvgpt"));
        let mut c = Command::new("script");
        c.args(["-qefc", &cmd, "/dev/null"]).env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
        c.env("HOME", home.0.path()).env("TERM", "xterm").envs(home.env(&server));
        if let Some(v) = disable {
            c.env("HF_HUB_DISABLE_PROGRESS_BARS", v);
        }
        let out = c.stdin(Stdio::null()).output().unwrap();
        let (o, e) = text(&out);
        assert!(out.status.success(), "{o}{e}");
        assert!(home.snapshot("model.safetensors").is_file());
        o
    };
    let drawn = run(None);
    assert!(drawn.contains("model.safetensors") && drawn.contains(&format!("{size}/{size}")), "{drawn}");
    let quiet = run(Some("1"));
    assert!(!quiet.contains(&format!("/{size}")), "{quiet}");
}
