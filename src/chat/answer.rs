//! One answer on the terminal: its tokens streamed to the end of its line, then the turn's
//! report (what the cache gave, what was computed, the speed and why the answer ended).

use anyhow::Result;
use kvgpt_core::chat::{Chat, Ended, Turn};
use kvgpt_core::stop::TextStream;
use kvgpt_core::{Model, Step, Tokenizer};
use std::sync::atomic::{AtomicBool, Ordering};

/// What every answer of a session shares.
pub struct Answering<'a> {
    pub model: &'a Model,
    pub tok: &'a Tokenizer,
    /// Set by Ctrl-C: stops the answer.
    pub interrupted: &'a AtomicBool,
    /// The draft's name, if the chat speculates.
    pub draft: Option<&'a str>,
    /// --max-new-tokens.
    pub max_new: usize,
}

impl Answering<'_> {
    /// Runs `answer` (a turn, or the last one again) on `chat`, streaming its tokens; returns
    /// whether the answer ended its line.
    pub fn stream(
        &self,
        chat: &mut Chat,
        answer: impl FnOnce(&mut Chat, usize, &mut dyn FnMut(u32) -> kvgpt_core::Result<Step>) -> kvgpt_core::Result<Turn>,
        room: usize,
    ) -> Result<bool> {
        let max_new = self.max_new.min(room);
        // The answer is its text up to the end of its line: the core's text of a completion,
        // with the newline as its stop. End-of-text shows nothing (not even a character it cut
        // short); the turn ends on it.
        let eos = self.model.config.eos_token_id;
        let mut stream = TextStream::new(self.tok, None, vec!["\n".into()]);
        let mut ended_line = false;
        let drafts_before = chat.drafts().unwrap_or_default();
        let turn = answer(chat, max_new, &mut |id| {
            if self.interrupted.load(Ordering::SeqCst) {
                return Ok(Step::Stop);
            }
            if id == eos {
                return Ok(Step::Go);
            }
            let (text, stop) = stream.push(id);
            crate::out::text(format_args!("{text}"))
                .and_then(|()| crate::out::flush())
                .map_err(|e| kvgpt_core::Error::Invalid(format!("{e:#}")))?;
            ended_line |= stop;
            Ok(if stop { Step::Stop } else { Step::Go })
        })?;
        outln!("{}", if turn.ended == Ended::Stopped && !ended_line { " [stopped]" } else { "" });
        let why = match turn.ended {
            Ended::Stopped if ended_line => "end of line",
            Ended::Stopped => "Ctrl-C",
            Ended::Eos => "end of text",
            Ended::Length if max_new < self.max_new => "the context is full",
            Ended::Length => "--max-new-tokens",
            Ended::ContextFull => "the context is full",
        };
        // Decode steps include choosing their tokens; sampling is also shown alone.
        let decoded = turn.answer.len().saturating_sub(1); // the tokens after the first
        let tps = if decoded > 0 { decoded as f64 / turn.decode_time.as_secs_f64() } else { 0.0 };
        let draft = match (self.draft, chat.drafts()) {
            // Drafting is inside the decode figure and shown apart.
            (Some(name), Some(now)) => format!(
                " | draft {name}: accepted {} of {} drafted tokens, drafting {:.1} ms",
                now.accepted - drafts_before.accepted,
                now.drafted - drafts_before.drafted,
                turn.draft_time.as_secs_f64() * 1e3
            ),
            _ => String::new(),
        };
        let sample_ms = turn.sample_time.as_secs_f64() * 1e3 / turn.answer.len().max(1) as f64;
        errln!(
            "[kvgpt] reused {} cached positions, computed {} ({:.1} ms) | answer {} tokens, decode {tps:.1} tok/s, \
             sampling {sample_ms:.3} ms/token{draft} | context {}/{} | ended: {why}",
            turn.reused,
            turn.prefilled,
            turn.prefill_time.as_secs_f64() * 1e3,
            turn.answer.len(),
            chat.ids().len(),
            self.model.config.n_positions
        );
        Ok(ended_line)
    }
}
