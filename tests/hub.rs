//! Locating models: local folders, and hub ids resolved through an HF cache laid out on disk
//! exactly as huggingface_hub writes it (offline), plus the message when the Hub is unreachable.

mod common;

use common::*;
use kvgpt::{Locate, TokenizerFiles};

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
    let loaded = kvgpt::load(&files).unwrap();
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
