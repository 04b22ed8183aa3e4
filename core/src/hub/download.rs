//! A hub id's files: from the HF cache, or downloaded into it with hf-hub (from `HF_ENDPOINT`
//! when set), with a progress bar on a terminal, a dropped connection resumed, and a file that
//! came shorter (or longer) than the server announced refused and removed, never left in the
//! cache to look complete.

use super::{assemble, Locate, ModelFiles};
use crate::error::{Error, Result};
use hf_hub::api::sync::{Api, ApiError, ApiRepo};
use std::cell::Cell;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// How many times a dropped connection is resumed before giving up.
const RESUMES: usize = 3;

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

    /// Downloads `file` into the cache: a dropped connection is resumed (from the part already
    /// written) up to [`RESUMES`] times; a file whose size is not the one the server announced is
    /// removed from the cache and refused.
    fn download(&self, repo: &ApiRepo, id: &str, file: &str, bar: bool) -> Result<PathBuf> {
        let url = repo.url(file);
        let mut bar = bar.then(DownloadBar::default);
        let truncated =
            |got, want, next: String| Error::HubTruncated { file: file.into(), url: url.clone(), got, want, next };
        let mut attempt = 0;
        loop {
            let seen = Watch::default();
            let got = repo.download_with_progress(file, Progress { seen: &seen, bar: bar.as_mut() });
            match got {
                Ok(path) => {
                    let got = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
                    return match seen.announced.get() {
                        Some(want) if got != want => Err(truncated(got, want, remove(&path))),
                        _ => Ok(path),
                    };
                }
                Err(e) if dropped(&e) && attempt < RESUMES => {
                    std::thread::sleep(Duration::from_millis(200 << attempt));
                    attempt += 1;
                }
                Err(e) if dropped(&e) => {
                    if let Some(b) = &mut bar {
                        b.abandon();
                    }
                    let (got, want) = (seen.received.get(), seen.announced.get().unwrap_or(0));
                    return Err(truncated(
                        got,
                        want,
                        format!(
                            "the connection closed early {} times; what came is kept as a partial download \
                             the next run resumes: run the command again, and if it keeps failing check the \
                             network or {}",
                            RESUMES + 1,
                            self.source()
                        ),
                    ));
                }
                Err(ApiError::InvalidResume) => {
                    return Err(Error::Hub(format!(
                        "a partial download of {id}/{file} in {} is longer than the file {url} is now; delete \
                         the *.part files there and run the command again",
                        self.cache_dir.join(format!("models--{}", id.replace('/', "--"))).join("blobs").display()
                    )))
                }
                Err(e) => {
                    return Err(Error::HubFetch {
                        id: id.into(),
                        file: file.into(),
                        from: self.source(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    }
}

/// Removes a downloaded file from the cache (its snapshot link and its blob) and says so, for
/// the error message.
fn remove(path: &std::path::Path) -> String {
    let blob = std::fs::canonicalize(path).ok();
    let link = std::fs::remove_file(path);
    if let Some(b) = blob.filter(|b| b != path) {
        let _ = std::fs::remove_file(b);
    }
    match link {
        Ok(()) => "it was removed from the cache: run the command again to download it anew, and if it comes \
                   short again check the mirror or proxy it comes through"
            .into(),
        Err(e) => {
            format!("it could not be removed from the cache ({e}): delete {} and run the command again", path.display())
        }
    }
}

/// A body that ended before the announced length (ureq reports it as an early EOF), or a
/// connection that broke: worth resuming. A local disk error is not.
fn dropped(e: &ApiError) -> bool {
    use std::io::ErrorKind::*;
    matches!(e, ApiError::IoError(io) if matches!(io.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | TimedOut))
}

/// What hf-hub reported of one download: the size the server announced and the bytes in the
/// partial file.
#[derive(Default)]
struct Watch {
    announced: Cell<Option<u64>>,
    received: Cell<u64>,
}

/// hf-hub's progress callbacks: recorded in a [`Watch`], drawn on the bar if there is one.
struct Progress<'a> {
    seen: &'a Watch,
    bar: Option<&'a mut DownloadBar>,
}

impl hf_hub::api::Progress for Progress<'_> {
    fn init(&mut self, size: usize, filename: &str) {
        // hf-hub calls it before each request, then `update` with the bytes already on disk.
        self.seen.announced.set(Some(size as u64));
        self.seen.received.set(0);
        if let Some(b) = &mut self.bar {
            b.init(size, filename);
        }
    }
    fn update(&mut self, size: usize) {
        self.seen.received.set(self.seen.received.get() + size as u64);
        if let Some(b) = &mut self.bar {
            b.update(size);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = &mut self.bar {
            b.finish();
        }
    }
}

/// Download progress on stderr: one bar per file, kept across resumed attempts.
#[derive(Default)]
struct DownloadBar(Option<indicatif::ProgressBar>);

impl DownloadBar {
    fn abandon(&mut self) {
        if let Some(b) = self.0.take() {
            b.abandon();
        }
    }
}

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
    fn the_bar_counts_to_the_announced_size_across_a_resume() {
        let mut bar = DownloadBar::default();
        bar.init(1000, "model.safetensors");
        bar.0.as_ref().unwrap().set_draw_target(indicatif::ProgressDrawTarget::hidden());
        bar.update(300);
        // A resume: hf-hub starts again and reports the 300 bytes already on disk first.
        bar.init(1000, "model.safetensors");
        bar.update(300);
        bar.update(700);
        let b = bar.0.clone().unwrap();
        assert_eq!((b.position(), b.length()), (1000, Some(1000)));
        assert_eq!(b.message(), "model.safetensors");
        bar.finish();
        assert!(b.is_finished() && bar.0.is_none());
    }

    #[test]
    fn the_watch_records_the_announced_size_and_the_bytes_on_disk() {
        let seen = Watch::default();
        let mut p = Progress { seen: &seen, bar: None };
        p.init(1000, "f");
        p.update(400);
        p.init(1000, "f");
        p.update(400);
        p.update(100);
        assert_eq!((seen.announced.get(), seen.received.get()), (Some(1000), 500));
    }
}
