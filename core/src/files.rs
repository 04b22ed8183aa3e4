//! The run's own files (issue #33): how one is read — only a regular file (or, where the reader
//! says so, a pipe such as `<(…)`), only up to the size its reader states — and the one rule for
//! every file a front end writes: never onto a file the run reads (`ModelFiles::inputs` names a
//! model's). The CLI, the chat, the server's key file and the Python package all go through these.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// What a reader takes besides a regular file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    RegularOnly,
    /// Also a pipe: `--api-key-file <(pass show key)` is how secrets are handed over.
    RegularOrPipe,
}

/// What the file at `path` is, in words, when it is not a regular file.
fn not_regular(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    Some(match () {
        _ if t.is_file() => return None,
        _ if t.is_dir() => "a folder",
        _ if t.is_fifo() => "a pipe (FIFO)",
        _ if t.is_char_device() || t.is_block_device() => "a device",
        _ if t.is_socket() => "a socket",
        _ => "not a regular file",
    })
}

/// Errors unless `path` (followed through symlinks) is a regular file of at most `max` bytes, or
/// a pipe where `kinds` allows one; `what` names it in the error ("the chat history").
/// Nothing is opened, so a FIFO no one writes to cannot hang the check.
pub fn check(path: &Path, what: &str, max: u64, kinds: Kinds) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let pipe_ok = kinds == Kinds::RegularOrPipe && meta.file_type().is_fifo();
    if let Some(kind) = not_regular(meta.file_type()).filter(|_| !pipe_ok) {
        return Err(Error::Invalid(format!("{}: {what} must be a regular file, and this is {kind}", path.display())));
    }
    if meta.len() > max {
        return Err(too_large(path, what, max));
    }
    Ok(())
}

fn too_large(path: &Path, what: &str, max: u64) -> Error {
    Error::Invalid(format!("{}: {what} is larger than {max} bytes, the most kvgpt reads of one", path.display()))
}

/// The bytes of `path`, [`check`]ed first and read to at most `max` bytes (a file that grows
/// while it is read is refused too).
pub fn read(path: &Path, what: &str, max: u64, kinds: Kinds) -> Result<Vec<u8>> {
    check(path, what, max, kinds)?;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    f.take(max + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_large(path, what, max));
    }
    Ok(bytes)
}

/// The files a run reads, each with what it is: no output may be written onto one.
#[derive(Clone, Debug, Default)]
pub struct Inputs(Vec<(PathBuf, String)>);

impl Inputs {
    /// Adds the files of `other`.
    pub fn and(mut self, other: Inputs) -> Inputs {
        self.0.extend(other.0);
        self
    }

    /// Adds one file the run reads (`what`: "the prompt file").
    pub fn with(mut self, path: &Path, what: &str) -> Inputs {
        self.0.push((path.to_path_buf(), what.to_string()));
        self
    }

    /// The rule for every output path: errors if `out` is one of these files (the same file
    /// through a symlink or a hard link counts). A file that does not exist yet is no input.
    pub fn refuse_as_output(&self, out: &Path) -> Result<()> {
        let Some(target) = identity(out) else { return Ok(()) };
        let Some((input, what)) = self.0.iter().find(|(input, _)| identity(input) == Some(target)) else {
            return Ok(());
        };
        let via = if input == out { String::new() } else { format!(" ({})", input.display()) };
        Err(Error::Invalid(format!(
            "{} is {what}{via}, which this run reads; choose another output file",
            out.display()
        )))
    }
}

/// The file `path` resolves to: its device and inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
