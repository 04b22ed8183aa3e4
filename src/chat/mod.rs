//! `kvgpt chat`: an interactive session that keeps the KV cache between turns.
//!
//! The turn template (GPT-2 has none; the same plain one as the server's chat endpoint): an
//! optional system text and a blank line, then per turn `User: <line>` and `Assistant:` on the
//! next line; the answer is the model's text up to the end of its line. Each turn's text (and the
//! opening) is tokenized on its own and appended to the conversation's ids.

mod answer;
mod input;

use crate::common::{load, ModelArgs, Outcome};
use answer::Answering;
use anyhow::{Context, Result};
use clap::Args;
use input::{Input, Line};
use kvgpt_core::chat::Chat;
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
}

const HELP: &str = "commands: /regen (answer the last turn again), /undo (take back the last turn), /system TEXT \
(the text that opens the conversation; /system alone shows it), /reset (start over), /save FILE, /load FILE (the \
conversation and its K/V, as --prompt-cache files), /stats, /help, /quit. A line ending in \\ goes on to the next; \
the arrow keys edit and recall earlier lines. Ctrl-C stops an answer or clears the line; on an empty line, Ctrl-C, \
Ctrl-D or /quit ends the session";

pub fn run(a: &ChatArgs) -> Result<Outcome> {
    let sampling = a.sampling.sampling()?;
    let loaded = load(&a.model)?;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let n = model.config.n_positions;
    if let Some(k) = a.keep.filter(|&k| k as usize >= n) {
        anyhow::bail!("--keep {k}: it must be below the model's context of {n} positions, to leave room for a turn");
    }
    let history = if a.no_history { None } else { a.history.clone().or_else(input::default_history) };
    let mut input = Input::open(history)?;
    // Ctrl-C during an answer stops the answer only. At the prompt the line editor reads it as
    // a key; when the input is not a terminal, a Ctrl-C there ends the session (as in a shell).
    let at_prompt = Arc::new(AtomicBool::new(true));
    let interrupted = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_shutdown(signal_hook::consts::SIGINT, 130, at_prompt.clone())
        .context("could not install the Ctrl-C handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone())
        .context("could not install the Ctrl-C handler")?;

    let drafting = a.draft.load(&a.model, &loaded)?;
    let mut chat = Chat::new(model, sampling);
    if let Some(d) = &drafting {
        chat.speculate(&d.config);
    }
    let answering = Answering {
        model,
        tok,
        interrupted: &interrupted,
        draft: drafting.as_ref().map(|d| d.name.as_str()),
        max_new: a.max_new_tokens as usize,
    };
    // The opening (system text and a blank line) goes before the first turn of an empty
    // conversation; `opening_len` is how many ids of the conversation it is once it has been.
    let opening_of = |s: &Option<String>| s.as_ref().map(|s| format!("{s}\n\n")).unwrap_or_default();
    let mut system = a.system.clone();
    let mut opening_len = 0usize;
    let mut line_open = false; // the last answer did not end its line
    errln!(
        "kvgpt chat: {} ({} positions of context, {}), {}. {HELP}",
        loaded.files.name,
        n,
        model.weights_dtype(),
        crate::common::sampler_words(&sampling)
    );
    loop {
        crate::out::flush()?;
        // Clearing the turn's flag first leaves no moment where a Ctrl-C is lost.
        interrupted.store(false, Ordering::SeqCst);
        at_prompt.store(true, Ordering::SeqCst);
        let read = input.read()?;
        at_prompt.store(false, Ordering::SeqCst);
        let line = match read {
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
        let line = line.trim_end_matches(['\n', '\r']);
        match line.split_once(' ').map_or((line, ""), |(c, r)| (c, r.trim())) {
            ("/quit" | "/exit", _) => return Ok(Outcome::Done),
            ("/help", _) => {
                outln!("{HELP}");
                continue;
            }
            ("/reset", _) => {
                chat.reset()?;
                (opening_len, line_open) = (0, false);
                outln!("(the conversation and its cache are cleared)");
                continue;
            }
            ("/undo", _) => {
                match chat.undo() {
                    Some(removed) => {
                        if chat.ids().is_empty() {
                            // Back to the start (the first turn holds the opening): the opening
                            // goes before the next turn again.
                            opening_len = 0;
                        }
                        line_open = !chat.ids().is_empty() && !tok.decode(chat.ids()).ends_with('\n');
                        outln!(
                            "(took back the last turn: {}; {} left)",
                            kvgpt_core::units::count(removed, "token"),
                            kvgpt_core::units::count(chat.ids().len(), "token")
                        );
                    }
                    None => errln!("error: there is no turn to take back (none since the start, /load or --keep)"),
                }
                continue;
            }
            ("/regen", _) => {
                let Some((_, answer_at)) = chat.last_turn() else {
                    errln!("error: there is no answer to generate again (none since the start, /load or --keep)");
                    continue;
                };
                let room = n - answer_at;
                line_open = !answering.stream(&mut chat, |c, max, f| c.regenerate(model, max, f), room)?;
                continue;
            }
            ("/system", "") => {
                match &system {
                    Some(s) => outln!("(the system text: {s:?})"),
                    None => outln!("(no system text; /system TEXT sets one)"),
                }
                continue;
            }
            ("/system", text) => {
                let wanted = Some(text.to_string());
                if chat.ids().is_empty() {
                    system = wanted;
                    outln!("(the system text opens the conversation from the next turn)");
                } else {
                    let new = tok.encode(&opening_of(&wanted))?;
                    match chat.replace_opening(opening_len, &new) {
                        Ok(()) => {
                            system = wanted;
                            let moved = chat.ids().len() - chat.cached();
                            opening_len = new.len();
                            outln!(
                                "(the system text is set; the next turn computes {} again: they moved)",
                                kvgpt_core::units::count(moved, "position")
                            );
                        }
                        Err(e) => errln!("error: {e}"),
                    }
                }
                continue;
            }
            ("/stats", _) => {
                outln!(
                    "({} tokens in the conversation, {} with K/V cached ({} bytes of {}), {} positions left)",
                    chat.ids().len(),
                    chat.cached(),
                    kvgpt_core::KvCache::bytes_per_position(&model.config) * chat.cached(),
                    kvgpt_core::KvCache::bytes_per_position(&model.config) * n,
                    chat.room(model)
                );
                continue;
            }
            ("/save", "") | ("/load", "") => {
                errln!("error: {line} needs a file name, e.g. {line} chat.kvc");
                continue;
            }
            ("/save", file) => {
                let path = PathBuf::from(file);
                match crate::common::refuse_input_path(&path, &loaded.files, None)
                    .and_then(|()| Ok(chat.save(model, &path)?))
                {
                    Ok(()) => outln!("(saved {} tokens and their K/V to {file})", chat.ids().len()),
                    Err(e) => errln!("error: {e}"),
                }
                continue;
            }
            ("/load", file) => {
                match chat.load(model, &PathBuf::from(file)) {
                    Ok(len) => {
                        // The loaded conversation has an opening of its own, if any: a /system
                        // from here goes before it.
                        (opening_len, system) = (0, None);
                        line_open = !tok.decode(chat.ids()).ends_with('\n');
                        outln!("(loaded {len} tokens and their K/V from {file}; the conversation goes on from there)");
                    }
                    Err(e) => errln!("error: {e}"),
                }
                continue;
            }
            ("", _) => continue,
            (c, _) if c.starts_with('/') => {
                errln!("error: unknown command {c}; {HELP}");
                continue;
            }
            _ => {}
        }
        // The opening and the turn are tokenized each on its own, so the opening's ids stay the
        // same whatever follows (what /system replaces).
        let first = chat.ids().is_empty();
        let opening_ids = if first { tok.encode(&opening_of(&system))? } else { Vec::new() };
        let text = format!("{}User: {line}\nAssistant:", if line_open { "\n" } else { "" });
        let new = [opening_ids.clone(), tok.encode(&text)?].concat();
        if new.len() + 1 > chat.room(model) {
            match a.keep {
                Some(keep) if new.len() < n - (keep as usize).min(chat.ids().len()) => {
                    let kept = chat.keep_last(model, keep as usize)?;
                    opening_len = 0;
                    errln!("[kvgpt] the context was full: kept the last {kept} tokens and computed their K/V again");
                }
                _ => {
                    errln!(
                        "error: the context is full: this turn needs {} positions and {} of {n} are left. /reset \
                         starts over; /save FILE keeps this conversation first; or restart with --keep N to keep \
                         the last N tokens (their K/V computed again: GPT-2's positions cannot be shifted)",
                        new.len() + 1,
                        chat.room(model)
                    );
                    continue;
                }
            }
        }
        if first {
            opening_len = opening_ids.len();
        }
        let room = chat.room(model) - new.len();
        line_open = !answering.stream(&mut chat, |c, max, f| c.turn(model, &new, max, f), room)?;
    }
}
