//! A hub id's files: from the HF cache, or downloaded into it with hf-hub (from `HF_ENDPOINT`
//! when set), with a progress bar on a terminal.

use super::{assemble, Locate, ModelFiles};
use crate::error::{Error, Result};
use hf_hub::api::sync::{Api, ApiRepo};
use std::io::IsTerminal;
use std::path::PathBuf;

impl Locate {
    /// The files of hub model `id`, from the cache or (online) downloaded into it.
    pub(super) fn hub(&self, id: &str) -> Result<ModelFiles> {
        let cache = hf_hub::Cache::new(self.cache_dir.clone()).model(id.to_string());
        let api = if self.offline { None } else { Some(self.api()?.model(id.to_string())) };
        let bar = self.progress && std::io::stderr().is_terminal();
        let fetch = |file: &str| -> Result<PathBuf> {
            if let Some(p) = cache.get(file) {
                return Ok(p);
            }
            let Some(repo) = &api else {
                return Err(Error::NotCached { id: id.into(), file: file.into(), cache_dir: self.cache_dir.clone() });
            };
            self.download(repo, id, file, bar)
        };
        assemble(id.to_string(), fetch)
    }

    /// The hf-hub client for this endpoint, token and cache.
    pub(crate) fn api(&self) -> Result<Api> {
        // Not `ApiBuilder::new()`: it panics without a home folder, and reads its token from
        // beside the cache folder, where huggingface_hub does not look.
        let mut b = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(self.cache_dir.clone()))
            .with_progress(false)
            .with_token(self.token.clone())
            .with_user_agent("kvgpt", env!("CARGO_PKG_VERSION"));
        if let Some(e) = &self.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(Error::Hub(format!(
                    "HF_ENDPOINT is {e:?}, not an http:// or https:// URL; set it to the base URL of the Hub or \
                     its mirror, as for huggingface_hub"
                )));
            }
            b = b.with_endpoint(e.clone());
        }
        if let Some(o) = &self.user_agent_origin {
            b = b.with_user_agent("origin", o);
        }
        b.build().map_err(|e| Error::Hub(format!("could not set up the Hugging Face Hub client: {e}")))
    }

    /// Where downloads come from, for messages.
    fn source(&self) -> String {
        match &self.endpoint {
            Some(e) => format!("{e} (HF_ENDPOINT)"),
            None => "the Hugging Face Hub".into(),
        }
    }

    /// Downloads `file` into the cache.
    fn download(&self, repo: &ApiRepo, id: &str, file: &str, bar: bool) -> Result<PathBuf> {
        let got = match bar {
            true => repo.download_with_progress(file, DownloadBar::default()),
            false => repo.download_with_progress(file, ()),
        };
        got.map_err(|e| Error::HubFetch {
            id: id.into(),
            file: file.into(),
            from: self.source(),
            reason: e.to_string(),
        })
    }
}

/// Download progress on stderr.
#[derive(Default)]
struct DownloadBar(Option<indicatif::ProgressBar>);

impl hf_hub::api::Progress for DownloadBar {
    fn init(&mut self, size: usize, filename: &str) {
        let bar = self.0.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::new(size as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_message(filename.to_string());
            bar
        });
        bar.set_length(size as u64);
        bar.set_position(0);
    }
    fn update(&mut self, size: usize) {
        if let Some(b) = &self.0 {
            b.inc(size as u64);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hf_hub::api::Progress as _;

    #[test]
    fn the_bar_counts_to_the_announced_size() {
        let mut bar = DownloadBar::default();
        bar.init(1000, "model.safetensors");
        bar.0.as_ref().unwrap().set_draw_target(indicatif::ProgressDrawTarget::hidden());
        bar.update(300);
        bar.update(700);
        let b = bar.0.clone().unwrap();
        assert_eq!((b.position(), b.length()), (1000, Some(1000)));
        assert_eq!(b.message(), "model.safetensors");
        bar.finish();
        assert!(b.is_finished() && bar.0.is_none());
    }
}
