//! Standard output without panics: every write error comes back as an error that names it.

use std::io::Write;

/// A write to standard output failed (the source says how: a closed pipe, a full disk…).
#[derive(Debug, thiserror::Error)]
#[error("could not write to standard output")]
pub struct StdoutError(#[source] pub std::io::Error);

pub fn error(e: std::io::Error) -> anyhow::Error {
    StdoutError(e).into()
}

pub fn text(args: std::fmt::Arguments) -> anyhow::Result<()> {
    std::io::stdout().lock().write_fmt(args).map_err(error)
}

pub fn line(args: std::fmt::Arguments) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(args).and_then(|()| o.write_all(b"\n")).map_err(error)
}

pub fn flush() -> anyhow::Result<()> {
    std::io::stdout().lock().flush().map_err(error)
}

/// Fails if standard output was closed (`>&-`): writes to it would vanish without an error.
pub fn check_open() -> anyhow::Result<()> {
    if kvgpt_process::stdout_closed_at_start() {
        anyhow::bail!("standard output is closed; redirect it, e.g. to a file or /dev/null");
    }
    Ok(())
}
