//! What the targets share: the fixture model, loaded once.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gpt2")
}

pub fn config() -> &'static kvgpt_core::Config {
    static C: OnceLock<kvgpt_core::Config> = OnceLock::new();
    C.get_or_init(|| kvgpt_core::Config::from_file(&fixture().join("config.json")).expect("the fixture's config"))
}

pub fn model() -> &'static kvgpt_core::Model {
    static M: OnceLock<kvgpt_core::Model> = OnceLock::new();
    M.get_or_init(|| {
        kvgpt_core::Model::load(&fixture().join("config.json"), &fixture().join("model.safetensors")).expect("the fixture")
    })
}
