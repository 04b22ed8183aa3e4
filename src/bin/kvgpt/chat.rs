//! `kvgpt chat`: an interactive session that keeps the KV cache between turns.
//!
//! The turn template (GPT-2 has none; the same plain one as the server's chat endpoint): an
//! optional system text and a blank line, then per turn `User: <line>` and `Assistant:` on the
//! next line; the answer is the model's text up to the end of its line. Each turn's text is
//! tokenized on its own and appended to the conversation's ids.

use crate::common::{load, ModelArgs, Outcome};
use anyhow::{Context, Result};
use clap::Args;
use kvgpt::chat::{Chat, Ended};
use kvgpt::{Step, StreamDecoder};
use std::io::BufRead;
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
}

const HELP: &str = "commands: /reset (start over), /save FILE, /load FILE (the conversation and its K/V, \
as --prompt-cache files), /stats, /help, /quit; Ctrl-C stops an answer, Ctrl-D or /quit ends the session";

pub fn run(a: &ChatArgs) -> Result<Outcome> {
    let sampling = a.sampling.sampling()?;
    let loaded = load(&a.model)?;
    let (model, tok) = (&loaded.model, &loaded.tokenizer);
    let n = model.config.n_positions;
    if let Some(k) = a.keep.filter(|&k| k as usize >= n) {
        anyhow::bail!("--keep {k}: it must be below the model's context of {n} positions, to leave room for a turn");
    }
    // Ctrl-C: at the prompt it ends the session (as in a shell); during an answer it stops the
    // answer only.
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
    let mut opening = a.system.as_ref().map(|s| format!("{s}\n\n")).unwrap_or_default();
    let mut line_open = false; // the last answer did not end its line
    errln!(
        "kvgpt chat: {} ({} positions of context, {}), {}. {HELP}",
        loaded.files.name,
        n,
        model.weights_dtype(),
        crate::common::sampler_words(&sampling)
    );
    let stdin = std::io::stdin();
    let mut input = String::new();
    loop {
        out!("> ");
        crate::out::flush()?;
        input.clear();
        // A Ctrl-C from here to the end of the line ends the session; from then on it stops the
        // turn. Clearing the turn's flag first leaves no moment where one is lost.
        interrupted.store(false, Ordering::SeqCst);
        at_prompt.store(true, Ordering::SeqCst);
        let read = stdin.lock().read_line(&mut input).context("could not read standard input")?;
        at_prompt.store(false, Ordering::SeqCst);
        if read == 0 {
            outln!("");
            return Ok(Outcome::Done);
        }
        let line = input.trim_end_matches(['\n', '\r']);
        match line.split_once(' ').map_or((line, ""), |(c, r)| (c, r.trim())) {
            ("/quit" | "/exit", _) => return Ok(Outcome::Done),
            ("/help", _) => {
                outln!("{HELP}");
                continue;
            }
            ("/reset", _) => {
                chat.reset()?;
                opening = a.system.as_ref().map(|s| format!("{s}\n\n")).unwrap_or_default();
                line_open = false;
                outln!("(the conversation and its cache are cleared)");
                continue;
            }
            ("/stats", _) => {
                outln!(
                    "({} tokens in the conversation, {} with K/V cached ({} bytes of {}), {} positions left)",
                    chat.ids().len(),
                    chat.cached(),
                    kvgpt::KvCache::bytes_per_position(&model.config) * chat.cached(),
                    kvgpt::KvCache::bytes_per_position(&model.config) * n,
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
                crate::common::refuse_input_path(&path, &loaded.files, None)?;
                match chat.save(model, &path) {
                    Ok(()) => outln!("(saved {} tokens and their K/V to {file})", chat.ids().len()),
                    Err(e) => errln!("error: {e}"),
                }
                continue;
            }
            ("/load", file) => {
                match chat.load(model, &PathBuf::from(file)) {
                    Ok(len) => {
                        opening.clear();
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
        let text = format!("{opening}{}User: {line}\nAssistant:", if line_open { "\n" } else { "" });
        let new = tok.encode(&text)?;
        if new.len() + 1 > chat.room(model) {
            match a.keep {
                Some(keep) if new.len() < n - (keep as usize).min(chat.ids().len()) => {
                    let kept = chat.keep_last(model, keep as usize)?;
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
        opening.clear();
        let max_new = (a.max_new_tokens as usize).min(chat.room(model) - new.len());
        let mut stream = StreamDecoder::default();
        let mut shown = String::new();
        let eos = model.config.eos_token_id;
        let mut ended_line = false;
        let drafts_before = chat.drafts().unwrap_or_default();
        let turn = chat.turn(model, &new, max_new, &mut |id| {
            if interrupted.load(Ordering::SeqCst) {
                return Ok(Step::Stop);
            }
            if id == eos {
                return Ok(Step::Go);
            }
            let piece = stream.push(tok.token_bytes(id));
            let (text, stop) = match piece.find('\n') {
                Some(at) => (&piece[..at], true),
                None => (&piece[..], false),
            };
            shown.push_str(text);
            crate::out::text(format_args!("{text}"))
                .and_then(|()| crate::out::flush())
                .map_err(|e| kvgpt::Error::Invalid(format!("{e:#}")))?;
            ended_line |= stop;
            Ok(if stop { Step::Stop } else { Step::Go })
        })?;
        line_open = !ended_line;
        outln!("{}", if turn.ended == Ended::Stopped && !ended_line { " [stopped]" } else { "" });
        let why = match turn.ended {
            Ended::Stopped if ended_line => "end of line",
            Ended::Stopped => "Ctrl-C",
            Ended::Eos => "end of text",
            Ended::Length if max_new < a.max_new_tokens as usize => "the context is full",
            Ended::Length => "--max-new-tokens",
            Ended::ContextFull => "the context is full",
        };
        // Decode steps include choosing their tokens; sampling is also shown alone.
        let decoded = turn.answer.len().saturating_sub(1); // the tokens after the first
        let tps = if decoded > 0 { decoded as f64 / turn.decode_time.as_secs_f64() } else { 0.0 };
        let draft = match (&drafting, chat.drafts()) {
            (Some(d), Some(now)) => format!(
                " | draft {}: accepted {} of {} drafted tokens",
                d.name,
                now.accepted - drafts_before.accepted,
                now.drafted - drafts_before.drafted
            ),
            _ => String::new(),
        };
        let sample_ms = turn.sample_time.as_secs_f64() * 1e3 / turn.answer.len().max(1) as f64;
        errln!(
            "[kvgpt] reused {} cached positions, computed {} ({:.1} ms) | answer {} tokens, decode {tps:.1} tok/s, \
             sampling {sample_ms:.3} ms/token{draft} | context {}/{n} | ended: {why}",
            turn.reused,
            turn.prefilled,
            turn.prefill_time.as_secs_f64() * 1e3,
            turn.answer.len(),
            chat.ids().len()
        );
    }
}
