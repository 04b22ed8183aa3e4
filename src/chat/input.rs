//! The chat's input line: a line editor (rustyline) with history kept in a file, lines joined
//! by a trailing `\`, and Ctrl-C that clears the line being typed or, on an empty one, ends the
//! session.

use anyhow::{Context, Result};
use kvgpt_core::files::{self, Inputs};
use rustyline::error::ReadlineError;
use rustyline::{Cmd, ConditionalEventHandler, Event, EventContext, EventHandler, KeyEvent, Movement, RepeatCount};
use std::path::{Path, PathBuf};

/// The largest history file read: rustyline keeps the last 100 entries.
const HISTORY_MAX: u64 = 16 << 20;

/// What reading a line gave.
pub enum Line {
    Text(String),
    /// Ctrl-C on an empty line.
    Interrupted,
    /// Ctrl-D on an empty line, or the end of the input.
    End,
}

/// Ctrl-C: clears the line if it holds text, else interrupts (rustyline's own Ctrl-C).
struct ClearOrInterrupt;

impl ConditionalEventHandler for ClearOrInterrupt {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, ctx: &EventContext) -> Option<Cmd> {
        (!ctx.line().is_empty()).then_some(Cmd::Kill(Movement::WholeBuffer))
    }
}

pub struct Input {
    editor: rustyline::DefaultEditor,
    history: Option<PathBuf>,
}

/// Where the history is kept unless --history says: `$XDG_STATE_HOME/kvgpt/chat_history`, or
/// `~/.local/state/kvgpt/chat_history`; None without a home.
pub fn default_history() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| Path::new(&h).join(".local/state")))?;
    Some(state.join("kvgpt").join("chat_history"))
}

impl Input {
    /// An editor with the history of `history` (a missing file starts one); a history that
    /// cannot be read, or that is one of the files the run reads (`inputs`), is said, and the
    /// session goes on without one.
    pub fn open(history: Option<PathBuf>, inputs: &Inputs) -> Result<Input> {
        let mut editor = rustyline::DefaultEditor::new().context("could not set up the line editor")?;
        editor.bind_sequence(KeyEvent::ctrl('C'), EventHandler::Conditional(Box::new(ClearOrInterrupt)));
        let history = history.filter(|path| match load(&mut editor, path, inputs) {
            Ok(()) => true,
            Err(e) => {
                errln!("warning: {e:#}; this session keeps no history (--no-history says so quietly)");
                false
            }
        });
        Ok(Input { editor, history })
    }

    /// The file the history is kept in, if any.
    pub fn history(&self) -> Option<&Path> {
        self.history.as_deref()
    }

    /// Reads one input: a line, or several joined where a line ends with `\` (the backslash
    /// becomes a newline). Each is kept in the history.
    pub fn read(&mut self) -> Result<Line> {
        let mut text = String::new();
        loop {
            let prompt = if text.is_empty() { "> " } else { "… " };
            match self.editor.readline(prompt) {
                Ok(line) => match line.strip_suffix('\\') {
                    Some(part) => {
                        text.push_str(part);
                        text.push('\n');
                    }
                    None => {
                        text.push_str(&line);
                        self.remember(&text)?;
                        return Ok(Line::Text(text));
                    }
                },
                // Ctrl-C on an empty line: on a first line it ends the session; after a `\` it
                // drops what was typed, as on a line of text.
                Err(ReadlineError::Interrupted) if text.is_empty() => return Ok(Line::Interrupted),
                Err(ReadlineError::Interrupted) => return Ok(Line::Text(String::new())),
                Err(ReadlineError::Eof) if text.is_empty() => return Ok(Line::End),
                // Ctrl-D after a `\`: what was typed is the input.
                Err(ReadlineError::Eof) => {
                    self.remember(&text)?;
                    return Ok(Line::Text(text.trim_end_matches('\n').to_string()));
                }
                Err(e) => return Err(e).context("could not read the input line"),
            }
        }
    }

    /// Keeps `text` in the history, and in its file; a file that cannot be written is said once
    /// and the session goes on without it.
    fn remember(&mut self, text: &str) -> Result<()> {
        if text.trim().is_empty() {
            return Ok(());
        }
        self.editor.add_history_entry(text).context("could not keep the line in the history")?;
        if let Some(path) = &self.history {
            if let Err(e) = self.editor.append_history(path) {
                errln!(
                    "warning: could not write the chat history {} ({e}); this session keeps none on disk",
                    path.display()
                );
                self.history = None;
            }
        }
        Ok(())
    }
}

/// Reads the history file at `path` into the editor, making its folder first; a missing file is
/// an empty history. It is written to as well, so it must be none of the run's `inputs`; it must
/// be a regular file of at most [`HISTORY_MAX`] bytes.
fn load(editor: &mut rustyline::DefaultEditor, path: &Path, inputs: &Inputs) -> Result<()> {
    inputs.refuse_as_output(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("could not make {} for the chat history", dir.display()))?;
    }
    if path.exists() {
        files::check(path, "the chat history", HISTORY_MAX, files::Kinds::RegularOnly)?;
    }
    match editor.load_history(path) {
        Err(ReadlineError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.with_context(|| format!("could not read the chat history {}", path.display())),
    }
}
