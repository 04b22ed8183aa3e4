//! `kvgpt chat`: an interactive session that keeps the KV cache between turns, on a terminal:
//! the line editor (`input`), each answer streamed (`answer`), Ctrl-C; the session itself (the
//! conversation, its opening and what each command does) is `kvgpt_views::chat`.

mod answer;
mod input;

use crate::common::{load, ModelArgs, Outcome};
use answer::Answering;
use anyhow::{Context, Result};
use clap::Args;
use input::{Input, Line};
use kvgpt_core::files::Inputs;
use kvgpt_views::chat::{Command, Session, HELP};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text that opens the conversation, before the first turn.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per answer at most.
    #[arg(long, short = 'n', default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_new_tokens: u32,
    #[command(flatten)]
    pub sampling: crate::common::SamplingArgs,
    #[command(flatten)]
    pub draft: crate::draft::DraftArgs,
    /// When the context is full, keep the last N tokens and compute their K/V again (GPT-2's
    /// learned positions cannot be shifted), instead of stopping with the options.
    #[arg(long, value_name = "N")]
    pub keep: Option<u32>,
    /// Keep the input history in FILE (default: $XDG_STATE_HOME/kvgpt/chat_history, or
    /// ~/.local/state/kvgpt/chat_history).
    #[arg(long, value_name = "FILE", conflicts_with = "no_history")]
    pub history: Option<PathBuf>,
    /// Keep no input history on disk.
    #[arg(long)]
    pub no_history: bool,
    #[command(flatten)]
    pub kv_disk: crate::kv_disk::KvDiskArgs,
}

pub fn run(a: &ChatArgs) -> Result<Outcome> {
    let sampling = a.sampling.sampling()?;
    let loaded = load(&a.model)?;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let keep = a.keep.map(|k| k as usize);
    let mut session = Session::new(model, tok, sampling, a.system.clone(), keep).map_err(anyhow::Error::msg)?;
    if let Some(store) = a.kv_disk.open(model)? {
        session.chat.keep_in(Arc::new(store)); // a conversation starts from what the directory holds
    }
    let drafting = a.draft.load(&a.model, &loaded)?;
    let mut inputs = crate::draft::inputs(&a.model, &loaded.files, Some(&a.draft), &[])?;
    let history = if a.no_history { None } else { a.history.clone().or_else(input::default_history) };
    let mut input = Input::open(history, &inputs)?;
    if let Some(history) = input.history() {
        inputs = inputs.with(history, "the chat's input history");
    }
    let keys = Keys::install()?;
    if let Some(d) = &drafting {
        session.chat.speculate(&d.config);
    }
    let answering = Answering {
        model,
        tok,
        interrupted: &keys.interrupted,
        draft: drafting.as_ref().map(|d| d.name.as_str()),
        max_new: a.max_new_tokens as usize,
    };
    let banner = format!(
        "kvgpt chat: {} ({} positions of context, {}), {}. {HELP}",
        loaded.files.name,
        model.config.n_positions,
        model.weights_dtype(),
        crate::common::sampler_words(&sampling)
    );
    // Broken at spaces to the terminal's width, where the terminal would break words.
    errln!("{}", kvgpt_views::render::term::wrap(&banner, terminal_width()));
    loop {
        crate::out::flush()?;
        let line = match keys.read(&mut input)? {
            Line::Text(t) => t,
            Line::End => {
                outln!("");
                return Ok(Outcome::Done);
            }
            Line::Interrupted => {
                outln!("");
                std::process::exit(130);
            }
        };
        match Command::parse(line.trim_end_matches(['\n', '\r'])) {
            Ok(Command::Quit) => return Ok(Outcome::Done),
            Ok(command) => apply(&mut session, command, &answering, &inputs)?,
            Err(e) => errln!("error: {e}"),
        }
    }
}

/// Does what `command` asks of the session, saying what it did on stdout, or why not on stderr.
fn apply(s: &mut Session, command: Command, answering: &Answering, inputs: &Inputs) -> Result<()> {
    let said = match command {
        Command::Quit | Command::Nothing => return Ok(()),
        Command::Help => Ok(HELP.to_string()),
        Command::Reset => Ok(s.reset()?),
        Command::Undo => s.undo(),
        Command::ShowSystem => Ok(s.show_system()),
        Command::SetSystem(text) => s.set_system(&text)?,
        Command::Stats => Ok(s.stats()),
        Command::Save(path) => s.save(&path, inputs),
        Command::Load(path) => s.load(&path),
        Command::Regen => {
            let model = answering.model;
            match s.regen_room() {
                Ok(room) => {
                    let ended_line = answering.stream(&mut s.chat, |c, max, f| c.regenerate(model, max, f), room)?;
                    s.answered(ended_line);
                    return Ok(());
                }
                Err(e) => Err(e),
            }
        }
        Command::Turn(line) => return turn(s, &line, answering),
    };
    match said {
        Ok(text) => outln!("{text}"),
        Err(e) => errln!("error: {e}"),
    }
    Ok(())
}

/// A turn: its ids made to fit the context, then its answer streamed.
fn turn(s: &mut Session, line: &str, answering: &Answering) -> Result<()> {
    let next = match s.next_turn(line)? {
        Ok(next) => next,
        Err(e) => {
            errln!("error: {e}");
            return Ok(());
        }
    };
    if let Some(note) = &next.note {
        errln!("[kvgpt] {note}");
    }
    let model = answering.model;
    let ended_line = answering.stream(&mut s.chat, |c, max, f| c.turn(model, &next.ids, max, f), next.room)?;
    s.answered(ended_line);
    Ok(())
}

/// Ctrl-C: during an answer it stops the answer only. At the prompt the line editor reads it as
/// a key; when the input is not a terminal, a Ctrl-C there ends the session (as in a shell).
struct Keys {
    at_prompt: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

impl Keys {
    fn install() -> Result<Keys> {
        let keys = Keys { at_prompt: Arc::new(AtomicBool::new(true)), interrupted: Arc::new(AtomicBool::new(false)) };
        signal_hook::flag::register_conditional_shutdown(signal_hook::consts::SIGINT, 130, keys.at_prompt.clone())
            .context("could not install the Ctrl-C handler")?;
        signal_hook::flag::register(signal_hook::consts::SIGINT, keys.interrupted.clone())
            .context("could not install the Ctrl-C handler")?;
        Ok(keys)
    }

    /// Reads a line at the prompt.
    fn read(&self, input: &mut Input) -> Result<Line> {
        // Clearing the turn's flag first leaves no moment where a Ctrl-C is lost.
        self.interrupted.store(false, Ordering::SeqCst);
        self.at_prompt.store(true, Ordering::SeqCst);
        let read = input.read();
        self.at_prompt.store(false, Ordering::SeqCst);
        read
    }
}

/// The width of the terminal the session writes to: its own size, else $COLUMNS; None when neither
/// says (a pipe, a terminal of no size).
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    let own = std::io::stderr().is_terminal().then(|| console::Term::stderr().size_checked()).flatten();
    let columns = || std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok());
    own.map(|(_, w)| w as usize).or_else(columns).filter(|&w: &usize| w >= 20)
}
