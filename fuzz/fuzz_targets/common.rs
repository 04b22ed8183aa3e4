//! What the targets share: the fixture model, loaded once.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gpt2")
}

pub fn config() -> &'static kvgpt::Config {
    static C: OnceLock<kvgpt::Config> = OnceLock::new();
    C.get_or_init(|| kvgpt::Config::from_file(&fixture().join("config.json")).expect("the fixture's config"))
}

pub fn model() -> &'static kvgpt::Model {
    static M: OnceLock<kvgpt::Model> = OnceLock::new();
    M.get_or_init(|| {
        kvgpt::Model::load(&fixture().join("config.json"), &fixture().join("model.safetensors")).expect("the fixture")
    })
}
