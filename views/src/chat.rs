//! `kvgpt chat`'s session: a conversation (the core's [`Chat`]) with the text that opens it, and
//! what each line typed at the prompt asks of it, parsed into a [`Command`]. The terminal (the
//! line editor, the streamed answer, Ctrl-C) is the binary's; everything a command changes or
//! says is here.
//!
//! The turn template (GPT-2 has none; the same plain one as the server's chat endpoint): an
//! optional system text and a blank line, then per turn `User: <line>` and `Assistant:` on the
//! next line; the answer is the model's text up to the end of its line. Each turn's text (and the
//! opening) is tokenized on its own and appended to the conversation's ids.

use kvgpt_core::chat::Chat;
use kvgpt_core::error::Result;
use kvgpt_core::files::Inputs;
use kvgpt_core::units::count;
use kvgpt_core::{KvCache, Model, Sampling, Tokenizer};
use std::path::PathBuf;

pub const HELP: &str = "commands: /regen (answer the last turn again), /undo (take back the last turn), /system TEXT \
(the text that opens the conversation; /system alone shows it), /reset (start over), /save FILE, /load FILE (the \
conversation and its K/V, as --prompt-cache files), /stats, /help, /quit. A line ending in \\ goes on to the next; \
the arrow keys edit and recall earlier lines. Ctrl-C stops an answer or clears the line; on an empty line, Ctrl-C, \
Ctrl-D or /quit ends the session";

/// What a line typed at the prompt asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Quit,
    Help,
    Reset,
    Undo,
    Regen,
    ShowSystem,
    SetSystem(String),
    Stats,
    Save(PathBuf),
    Load(PathBuf),
    /// A turn: the user's text.
    Turn(String),
    /// Nothing to do (an empty line).
    Nothing,
}

impl Command {
    /// A line (without its newline); an error says what was wrong with a command.
    pub fn parse(line: &str) -> std::result::Result<Command, String> {
        Ok(match line.split_once(' ').map_or((line, ""), |(c, r)| (c, r.trim())) {
            ("/quit" | "/exit", _) => Command::Quit,
            ("/help", _) => Command::Help,
            ("/reset", _) => Command::Reset,
            ("/undo", _) => Command::Undo,
            ("/regen", _) => Command::Regen,
            ("/system", "") => Command::ShowSystem,
            ("/system", text) => Command::SetSystem(text.to_string()),
            ("/stats", _) => Command::Stats,
            ("/save", "") | ("/load", "") => return Err(format!("{line} needs a file name, e.g. {line} chat.kvc")),
            ("/save", file) => Command::Save(file.into()),
            ("/load", file) => Command::Load(file.into()),
            ("", _) => Command::Nothing,
            (c, _) if c.starts_with('/') => return Err(format!("unknown command {c}; {HELP}")),
            _ => Command::Turn(line.to_string()),
        })
    }
}

/// What a command says: a note for the conversation's transcript, or why it did nothing.
pub type Reply = std::result::Result<String, String>;

/// A turn ready to be answered: its ids, the tokens its answer may take, and what had to give
/// way for it (a note on the context kept, with `keep`).
pub struct NextTurn {
    pub ids: Vec<u32>,
    pub room: usize,
    pub note: Option<String>,
}

/// A chat session.
pub struct Session<'m> {
    model: &'m Model,
    tok: &'m Tokenizer,
    pub chat: Chat,
    /// The text that opens the conversation, and how many of its ids it is once it has gone in.
    system: Option<String>,
    opening_len: usize,
    /// The last answer did not end its line.
    line_open: bool,
    /// When the context is full, keep this many of the last tokens.
    keep: Option<usize>,
}

impl<'m> Session<'m> {
    /// A new session; `keep` must leave room for a turn.
    pub fn new(
        model: &'m Model,
        tok: &'m Tokenizer,
        sampling: Sampling,
        system: Option<String>,
        keep: Option<usize>,
    ) -> std::result::Result<Session<'m>, String> {
        let n = model.config.n_positions;
        if let Some(k) = keep.filter(|&k| k >= n) {
            return Err(format!(
                "--keep {k}: it must be below the model's context of {n} positions, to leave room for a turn"
            ));
        }
        let chat = Chat::new(model, sampling);
        Ok(Session { model, tok, chat, system, opening_len: 0, line_open: false, keep })
    }

    fn opening(system: &Option<String>) -> String {
        system.as_ref().map(|s| format!("{s}\n\n")).unwrap_or_default()
    }

    /// The last answer ended its line (false: the next turn starts on a new one).
    pub fn answered(&mut self, ended_line: bool) {
        self.line_open = !ended_line;
    }

    pub fn reset(&mut self) -> Result<String> {
        self.chat.reset()?;
        (self.opening_len, self.line_open) = (0, false);
        Ok("(the conversation and its cache are cleared)".into())
    }

    pub fn undo(&mut self) -> Reply {
        let Some(removed) = self.chat.undo() else {
            return Err("there is no turn to take back (none since the start, /load or --keep)".into());
        };
        if self.chat.ids().is_empty() {
            // Back to the start (the first turn holds the opening): the opening goes before the
            // next turn again.
            self.opening_len = 0;
        }
        self.line_open = !self.chat.ids().is_empty() && !self.tok.decode(self.chat.ids()).ends_with('\n');
        Ok(format!(
            "(took back the last turn: {}; {} left)",
            count(removed, "token"),
            count(self.chat.ids().len(), "token")
        ))
    }

    /// The tokens an answer of the last turn again may take, if there is a turn to answer again.
    pub fn regen_room(&self) -> std::result::Result<usize, String> {
        match self.chat.last_turn() {
            Some((_, answer_at)) => Ok(self.model.config.n_positions - answer_at),
            None => Err("there is no answer to generate again (none since the start, /load or --keep)".into()),
        }
    }

    pub fn show_system(&self) -> String {
        match &self.system {
            Some(s) => format!("(the system text: {s:?})"),
            None => "(no system text; /system TEXT sets one)".into(),
        }
    }

    /// Sets the opening text: before the next turn of an empty conversation, or in place of the
    /// one it has (what follows moves, and is computed again).
    pub fn set_system(&mut self, text: &str) -> Result<Reply> {
        let wanted = Some(text.to_string());
        if self.chat.ids().is_empty() {
            self.system = wanted;
            return Ok(Ok("(the system text opens the conversation from the next turn)".into()));
        }
        let new = self.tok.encode(&Self::opening(&wanted))?;
        Ok(match self.chat.replace_opening(self.opening_len, &new) {
            Ok(()) => {
                self.system = wanted;
                self.opening_len = new.len();
                let moved = self.chat.ids().len() - self.chat.cached();
                Ok(format!(
                    "(the system text is set; the next turn computes {} again: they moved)",
                    count(moved, "position")
                ))
            }
            Err(e) => Err(e.to_string()),
        })
    }

    pub fn stats(&self) -> String {
        let per_position = KvCache::bytes_per_position_as(&self.model.config, self.model.kv().kv_type());
        format!(
            "({} tokens in the conversation, {} with K/V cached ({} bytes of {}), {} positions left)",
            self.chat.ids().len(),
            self.chat.cached(),
            per_position * self.chat.cached(),
            per_position * self.model.config.n_positions,
            self.chat.room(self.model)
        )
    }

    /// Saves the conversation and its K/V to `path` (never onto one of the files the run reads,
    /// `inputs`).
    pub fn save(&mut self, path: &std::path::Path, inputs: &Inputs) -> Reply {
        let saved = inputs.refuse_as_output(path).and_then(|()| self.chat.save(self.model, path));
        match saved {
            Ok(()) => Ok(format!("(saved {} tokens and their K/V to {})", self.chat.ids().len(), path.display())),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Goes on from the conversation `path` holds.
    pub fn load(&mut self, path: &std::path::Path) -> Reply {
        let len = self.chat.load(self.model, path).map_err(|e| e.to_string())?;
        // The loaded conversation has an opening of its own, if any: a /system from here goes
        // before it.
        (self.opening_len, self.system) = (0, None);
        self.line_open = !self.tok.decode(self.chat.ids()).ends_with('\n');
        Ok(format!("(loaded {len} tokens and their K/V from {}; the conversation goes on from there)", path.display()))
    }

    /// The ids of a turn saying `line` (with the opening before the first turn), made to fit:
    /// with `keep`, a full context keeps its last tokens; without, a full context is refused.
    pub fn next_turn(&mut self, line: &str) -> Result<std::result::Result<NextTurn, String>> {
        let n = self.model.config.n_positions;
        // The opening and the turn are tokenized each on its own, so the opening's ids stay the
        // same whatever follows (what /system replaces).
        let first = self.chat.ids().is_empty();
        let opening_ids = if first { self.tok.encode(&Self::opening(&self.system))? } else { Vec::new() };
        let text = format!("{}User: {line}\nAssistant:", if self.line_open { "\n" } else { "" });
        let ids = [opening_ids.clone(), self.tok.encode(&text)?].concat();
        let mut note = None;
        if ids.len() + 1 > self.chat.room(self.model) {
            match self.keep {
                Some(keep) if ids.len() < n - keep.min(self.chat.ids().len()) => {
                    let kept = self.chat.keep_last(self.model, keep)?;
                    self.opening_len = 0;
                    note =
                        Some(format!("the context was full: kept the last {kept} tokens and computed their K/V again"));
                }
                _ => {
                    return Ok(Err(format!(
                        "the context is full: this turn needs {} positions and {} of {n} are left. /reset starts over; \
                         /save FILE keeps this conversation first; or restart with --keep N to keep the last N tokens \
                         (their K/V computed again: GPT-2's positions cannot be shifted)",
                        ids.len() + 1,
                        self.chat.room(self.model)
                    )))
                }
            }
        }
        if first {
            self.opening_len = opening_ids.len();
        }
        let room = self.chat.room(self.model) - ids.len();
        Ok(Ok(NextTurn { ids, room, note }))
    }
}
