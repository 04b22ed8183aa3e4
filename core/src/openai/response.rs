//! The answers: every choice collected into one JSON object, or streamed chunk by chunk; and
//! the usage both report.

use super::error::{ApiError, ApiResult};
use super::job::{Job, StreamHead};
use super::served::Served;
use crate::cache_report::Report;
use crate::engine::{Ended, Events, TextEvent, TextEvents, Usage};
use crate::logprobs::TokenLogprob;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;

impl Served {
    /// Waits for every choice of `job` and answers with one JSON object; also the usage of each
    /// sequence as the answer counts it (see [`StreamHead::usages`]).
    pub async fn collect(&self, job: Job) -> ApiResult<(Value, Vec<(usize, Usage)>)> {
        let (head, seqs) = job.split();
        let (ep, params) = (head.ep, &head.params);
        let mut choices = vec![];
        let mut ended = vec![];
        for (k, events) in seqs.into_iter().enumerate() {
            let mut text = if params.echo { head.prompt_texts[k / params.n].clone() } else { String::new() };
            let mut tokens: Vec<(u32, TokenLogprob)> = vec![];
            let mut stops = params.stop.clone();
            stops.dedup();
            let mut t = TextEvents::new(&self.tok, &self.engine, events, stops);
            let end = loop {
                match t.next().await {
                    Some(Ok(TextEvent::Delta(d))) => {
                        text.push_str(&d.text);
                        if let Some((id, Some(lp))) = d.token {
                            tokens.push((id, lp));
                        }
                    }
                    Some(Ok(TextEvent::End(end))) => break end,
                    Some(Err(e)) => return Err(ApiError::engine(e)),
                    None => return Err(ApiError::engine("the sequence ended early")),
                }
            };
            let logprobs = params.logprobs.map(|_| ep.logprobs(&self.tok, &tokens, 0));
            choices.push(ep.choice(k, &text, logprobs, end.finish_reason()));
            ended.push(end);
        }
        let usages = head.usages(&ended);
        let mut usage = usage_json(&usages);
        usage["prompt_cache"] = head.prompt_cache_json(&self.tok, &ended);
        // Created when answered (a stream's chunks carry the time it was submitted).
        let body = json!({"id": head.id, "object": ep.object(), "created": super::now_secs(), "model": head.model,
            "seed": params.sampling.seed, "choices": choices, "usage": usage});
        Ok((body, usages))
    }
}

impl StreamHead {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        // The first choice's seed (given or drawn), so a sampled answer can be asked for again.
        let mut v = json!({"id": self.id, "object": self.ep.chunk_object(), "created": self.created,
            "model": self.model, "seed": self.params.sampling.seed, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn choice_chunk(&self, k: usize, delta: Value, logprobs: Value, finish: Value) -> Value {
        self.chunk(json!([self.ep.chunk_choice(k, delta, logprobs, finish)]), None)
    }

    /// The closing chunk with the usage (with `stream_options.include_usage`), once every choice
    /// has ended.
    pub fn usage_chunk(&self, tok: &Tokenizer, ended: &[Ended]) -> Option<Value> {
        if !self.params.include_usage {
            return None;
        }
        let mut usage = usage_json(&self.usages(ended));
        usage["prompt_cache"] = self.prompt_cache_json(tok, ended);
        Some(self.chunk(json!([]), Some(usage)))
    }

    /// Usage counts each prompt once (its first choice's cache use), and every choice's tokens:
    /// `(prompt tokens counted, usage)` per sequence.
    pub fn usages(&self, ended: &[Ended]) -> Vec<(usize, Usage)> {
        ended.iter().enumerate().map(|(k, e)| self.counted(k, e.usage.clone())).collect()
    }

    /// Choice `k`'s usage as the response counts it: its prompt (and its cache use) with its
    /// prompt's first choice only.
    fn counted(&self, k: usize, mut u: Usage) -> (usize, Usage) {
        let n = self.params.n;
        if !k.is_multiple_of(n) {
            u.cached_tokens = 0;
            return (0, u);
        }
        (self.prompt_ids[k / n].len(), u)
    }

    /// Where reuse of the prompt cache stopped for each prompt (its first choice's lookup), and
    /// why: an object for one prompt, a list for several; null with the prompt cache off. With
    /// the request's `kvgpt.cache_diagnosis`, the text around each stop and a sentence too.
    fn prompt_cache_json(&self, tok: &Tokenizer, ended: &[Ended]) -> Value {
        let diagnosis = self.params.cache_diagnosis;
        let reports: Vec<Value> = self
            .prompt_ids
            .iter()
            .zip(ended.iter().step_by(self.params.n))
            .map(|(ids, e)| {
                e.usage.reuse.as_ref().map_or(Value::Null, |stop| json!(Report::new(tok, ids, stop, diagnosis)))
            })
            .collect();
        match <[Value; 1]>::try_from(reports) {
            Ok([one]) => one,
            Err(all) => json!(all),
        }
    }
}

/// One step of a streamed choice.
#[derive(Debug)]
pub enum Chunk {
    /// A chunk to send.
    Data(Value),
    /// The engine failed the sequence: this error object goes out, then nothing more (no usage,
    /// no `[DONE]`).
    Failed(Value),
    /// The choice has ended (its last chunk, with the finish reason, was the one before).
    End(Ended),
}

/// One choice's chunks: the opening (chat: the assistant's role; completions with `echo`: the
/// prompt), a chunk per piece of text or token logprob, and one with the finish reason.
pub struct ChoiceChunks<'t> {
    k: usize,
    head: Arc<StreamHead>,
    tok: &'t Tokenizer,
    text: TextEvents<'t>,
    ready: VecDeque<Chunk>,
    /// Byte offset of the next token in the choice's text (completions' `text_offset`).
    offset: usize,
    /// The answer's leading white space is still being dropped (chat).
    leading: bool,
}

impl<'t> ChoiceChunks<'t> {
    pub fn new(served: &'t Served, head: Arc<StreamHead>, k: usize, events: Events) -> ChoiceChunks<'t> {
        let ep = head.ep;
        let echo = head.params.echo.then(|| json!(head.prompt_texts[k / head.params.n]));
        let ready = ep
            .opening()
            .into_iter()
            .chain(echo)
            .map(|opening| Chunk::Data(head.choice_chunk(k, opening, Value::Null, Value::Null)))
            .collect();
        let text = TextEvents::new(&served.tok, &served.engine, events, head.params.stop.clone());
        ChoiceChunks { k, tok: &served.tok, text, ready, offset: 0, leading: ep.trims_start(), head }
    }

    /// What this choice consumed so far, as [`StreamHead::usages`] counts it (its prompt with its
    /// prompt's first choice): for a client that left before the end.
    pub fn so_far(&self) -> (usize, Usage) {
        self.text.so_far().map_or((0, Usage::default()), |u| self.head.counted(self.k, u))
    }

    /// The next chunk; None after [`Chunk::End`] or [`Chunk::Failed`].
    pub async fn next(&mut self) -> Option<Chunk> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Some(c);
            }
            match self.text.next().await? {
                Ok(TextEvent::Delta(d)) => self.delta(d.text, d.token.and_then(|(id, lp)| lp.map(|lp| (id, lp)))),
                Ok(TextEvent::End(end)) => {
                    let finish = json!(end.finish_reason());
                    let (k, ep) = (self.k, self.head.ep);
                    self.ready.push_back(Chunk::Data(self.head.choice_chunk(k, ep.delta(""), Value::Null, finish)));
                    self.ready.push_back(Chunk::End(end));
                }
                Err(e) => self.ready.push_back(Chunk::Failed(ApiError::engine(e).body())),
            }
        }
    }

    /// A piece of text and its token's logprob (when asked for): a chunk unless both are empty.
    fn delta(&mut self, mut text: String, logprob: Option<(u32, TokenLogprob)>) {
        let (k, ep) = (self.k, self.head.ep);
        if self.leading {
            text = text.trim_start().to_string();
            self.leading = text.is_empty();
        }
        let lp = match (logprob, self.head.params.logprobs) {
            (Some(l), Some(_)) => ep.logprobs(self.tok, &[l], self.offset),
            _ => Value::Null,
        };
        self.offset += text.len();
        if !(text.is_empty() && lp.is_null()) {
            self.ready.push_back(Chunk::Data(self.head.choice_chunk(k, ep.delta(&text), lp, Value::Null)));
        }
    }
}

fn usage_json(usages: &[(usize, Usage)]) -> Value {
    let prompt: usize = usages.iter().map(|(p, _)| p).sum();
    let completion: usize = usages.iter().map(|(_, u)| u.completion_tokens).sum();
    let cached: usize = usages.iter().map(|(_, u)| u.cached_tokens).sum();
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let prompt_ms: f64 = usages.iter().map(|(_, u)| ms(u.prompt_time)).sum();
    let predicted_ms: f64 = usages.iter().map(|(_, u)| ms(u.decode_time)).sum();
    let computed = prompt - cached;
    let drafted: usize = usages.iter().map(|(_, u)| u.drafted_tokens).sum();
    let accepted: usize = usages.iter().map(|(_, u)| u.accepted_tokens).sum();
    let per_s = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        // Speculative decoding (`--draft`), under OpenAI's names for predicted tokens; unlike
        // OpenAI's, rejected ones are not counted in `completion_tokens`.
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
        "timings": {
            "cache_n": cached,
            "prompt_n": computed,
            "prompt_ms": prompt_ms,
            "prompt_per_second": per_s(computed, prompt_ms),
            "predicted_n": completion,
            "predicted_ms": predicted_ms,
            "predicted_per_second": per_s(completion.saturating_sub(usages.len()), predicted_ms),
            "draft_n": drafted,
            "draft_n_accepted": accepted,
            "queue_ms": usages.iter().map(|(_, u)| ms(u.queue)).fold(0.0, f64::max),
        },
    })
}
