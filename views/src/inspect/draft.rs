//! `inspect draft`'s view: speculative decoding round by round — what the draft proposed, which
//! tokens the model kept, its own token, and its cache before the step, after the forward over
//! the drafts and after the rollback — as text, JSON and one self-contained HTML page.

use super::{rounds, Round};
use crate::render::axis_label;
use kvgpt_core::error::{Error, Result};
use kvgpt_core::speculative::Drafting;
use kvgpt_core::{Loaded, Sampling, Sequence};
use serde::Serialize;
use std::fmt::Write as _;

/// What the view shows, as text, JSON and in the page.
#[derive(Serialize)]
pub struct DraftView {
    pub model: String,
    pub draft: String,
    pub max_k: usize,
    pub prompt_ids: Vec<u32>,
    /// Every generated token: the first from the prompt's forward, then each round's.
    pub generated_ids: Vec<u32>,
    /// The cache after the prompt's forward (its last token is fed by round 1).
    pub prompt_cache: usize,
    pub rounds: Vec<Round>,
    /// Labels of every id that appears (`labels[id]` as a map).
    pub labels: std::collections::BTreeMap<u32, String>,
}

impl DraftView {
    /// Decodes `n` tokens (greedy) after `ids` with `drafting`'s draft proposing its most every
    /// round, recording each round.
    pub fn compute(loaded: &Loaded, ids: &[u32], drafting: &Drafting, n: usize) -> Result<DraftView> {
        let m = &loaded.model;
        let mut seq = Sequence::new(m, ids, n, Sampling::GREEDY)?;
        // Every round drafts the most it may (room permitting): the mechanism at work, the same
        // rounds every run (adaptive k would draft as measured costs say, here perhaps not at all).
        seq.speculate(drafting.config.speculation(seq.cache().capacity() + 1, None).fixed());
        let rounds = rounds(m, &mut seq, n)?;
        let mut labels = std::collections::BTreeMap::new();
        for &id in seq.ids().iter().chain(rounds.iter().flat_map(|r| &r.drafted)) {
            labels.entry(id).or_insert_with(|| loaded.tokenizer.token_label(id));
        }
        Ok(DraftView {
            model: loaded.files.name.clone(),
            draft: drafting.name.clone(),
            max_k: drafting.config.max_k,
            prompt_ids: ids.to_vec(),
            generated_ids: seq.generated().to_vec(),
            prompt_cache: ids.len(),
            rounds,
            labels,
        })
    }

    /// The rounds as the terminal shows them.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = write_text(&mut out, self); // writing into a String cannot fail
        out
    }

    /// The rounds as one self-contained HTML page.
    pub fn html(&self) -> Result<String> {
        page(self)
    }
}

fn as_error(e: serde_json::Error) -> Error {
    Error::Invalid(format!("the rounds as JSON: {e}"))
}

fn write_text(out: &mut String, v: &DraftView) -> std::fmt::Result {
    let label = |id: &u32| format!("{:?}", v.labels[id]);
    writeln!(
        out,
        "Speculative decoding of {} with the draft {} (up to {} tokens a round), greedy.\nEach round the model \
         runs its last token and the drafted ones in one forward, keeps the drafts it would have chosen itself, \
         adds its own token, and forgets the K/V of the rest: the answer is the model's own.\n",
        v.model, v.draft, v.max_k
    )?;
    writeln!(
        out,
        "token 1 {} came from the prompt's forward (cache 0 → {}).",
        label(&v.generated_ids[0]),
        v.prompt_cache
    )?;
    for (i, r) in v.rounds.iter().enumerate() {
        let d = r.drafted.len();
        writeln!(
            out,
            "round {}: cache {} → {} after the forward (1 + {d} drafted) → {} after the rollback",
            i + 1,
            r.cache_before,
            r.cache_fed,
            r.cache_after
        )?;
        if d > 0 {
            let marks: Vec<String> = r
                .drafted
                .iter()
                .enumerate()
                .map(|(j, id)| {
                    let mark = if j < r.accepted {
                        "✓"
                    } else if j == r.accepted {
                        "✗"
                    } else {
                        "·"
                    };
                    format!("{}{mark}", label(id))
                })
                .collect();
            writeln!(out, "   drafted  {}", marks.join(" "))?;
        }
        match r.p_rejected {
            Some(p) => writeln!(
                out,
                "   model    {} (p {}) instead of {} (p {}); {} accepted, {} never judged",
                label(&r.token),
                prob(r.p_token),
                label(&r.drafted[r.accepted]),
                prob(p),
                r.accepted,
                d - r.accepted - 1
            )?,
            None if d > 0 => {
                writeln!(out, "   model    all {d} accepted, then its own {} (p {})", label(&r.token), prob(r.p_token))?
            }
            None => writeln!(out, "   model    {} (p {}); no draft this round", label(&r.token), prob(r.p_token))?,
        }
    }
    let drafted: usize = v.rounds.iter().map(|r| r.drafted.len()).sum();
    let accepted: usize = v.rounds.iter().map(|r| r.accepted).sum();
    writeln!(
        out,
        "\n{} tokens in {} forwards ({:.2} a forward); {accepted} of {drafted} drafted tokens accepted ({:.0}%).",
        v.generated_ids.len(),
        v.rounds.len() + 1,
        v.generated_ids.len() as f64 / (v.rounds.len() + 1) as f64,
        100.0 * accepted as f64 / drafted.max(1) as f64
    )?;
    writeln!(out, "✓ accepted  ✗ rejected (the model's token replaces it)  · never judged (after a rejection)")?;
    Ok(())
}

/// The page: each round as a row of the cache's positions (kept, accepted, rejected, the model's
/// token) and the drafted tokens, with the data inline.
fn page(v: &DraftView) -> Result<String> {
    let data = serde_json::to_string(v).map_err(as_error)?.replace('<', "\\u003c");
    let labels: std::collections::BTreeMap<u32, String> = v.labels.iter().map(|(k, l)| (*k, axis_label(l))).collect();
    let labels = serde_json::to_string(&labels).map_err(as_error)?.replace('<', "\\u003c");
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>kvgpt: speculative decoding, \
         round by round</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n<h1>Speculative decoding, round by round</h1>\n\
         <p class=\"how\">Each round the model runs its last token and the drafted ones in one forward pass, keeps \
         the drafts it would have chosen itself (green), puts its own token at the first one it would not (red: \
         rejected, blue: the model's), and forgets the K/V of every rejected position. Grey cells are positions \
         already in the cache. Hover a cell for its token and position. “·” is a space.</p>\n\
         <div id=\"rounds\"></div>\n<script type=\"application/json\" id=\"kvgpt-data\">{data}</script>\n\
         <script type=\"application/json\" id=\"kvgpt-labels\">{labels}</script>\n<script>\n{JS}</script>\n</body>\n</html>\n"
    ))
}

const CSS: &str = "body { font: 14px system-ui, sans-serif; margin: 1.5em; }
.round { margin: 0.6em 0; }
.cells { display: flex; flex-wrap: wrap; gap: 1px; margin-top: 0.2em; }
.cell { min-width: 1.2em; padding: 1px 3px; border: 1px solid #ccc; font-family: monospace; font-size: 12px; }
.cached { background: #eee; color: #888; }
.accepted { background: #c8f0c8; }
.rejected { background: #f6c6c6; text-decoration: line-through; }
.unjudged { background: #fbe3e3; color: #999; text-decoration: line-through; }
.model { background: #c6d8f6; font-weight: bold; }
.how { max-width: 60em; color: #333; }
";

const JS: &str = "const v = JSON.parse(document.getElementById('kvgpt-data').textContent);
const labels = JSON.parse(document.getElementById('kvgpt-labels').textContent);
const root = document.getElementById('rounds');
const ids = v.prompt_ids.concat(v.generated_ids);
function cell(cls, id, pos, note) {
  const c = document.createElement('span');
  c.className = 'cell ' + cls;
  c.textContent = labels[id];
  c.title = 'position ' + pos + ': ' + labels[id] + ' (id ' + id + ') ' + note;
  return c;
}
v.rounds.forEach((r, i) => {
  const div = document.createElement('div');
  div.className = 'round';
  const d = r.drafted.length;
  div.textContent = 'round ' + (i + 1) + ': cache ' + r.cache_before + ' \\u2192 ' + r.cache_fed +
    ' after the forward (1 + ' + d + ' drafted) \\u2192 ' + r.cache_after + ' after the rollback; ' +
    r.accepted + ' of ' + d + ' accepted';
  const cells = document.createElement('div');
  cells.className = 'cells';
  for (let p = Math.max(0, r.cache_before - 8); p <= r.cache_before; p++) {
    cells.appendChild(cell('cached', ids[p], p, p < r.cache_before ? 'in the cache' : 'fed this round'));
  }
  r.drafted.forEach((id, j) => {
    const cls = j < r.accepted ? 'accepted' : j == r.accepted ? 'rejected' : 'unjudged';
    cells.appendChild(cell(cls, id, r.cache_before + 1 + j, cls));
  });
  cells.appendChild(cell('model', r.token, r.cache_before + 1 + r.accepted,
    'the model\\'s own token, p ' + (r.p_token >= 0.001 ? r.p_token.toFixed(3) : r.p_token.toPrecision(2))));
  div.appendChild(cells);
  root.appendChild(div);
});
";

/// A probability as read: three decimals, or two significant digits below 0.001 (a random model's
/// near-uniform choice is 2.0e-5, not 0.000).
fn prob(p: f64) -> String {
    if p >= 1e-3 || p == 0.0 {
        format!("{p:.3}")
    } else {
        format!("{p:.1e}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_small_probability_keeps_its_digits() {
        assert_eq!(super::prob(0.0283), "0.028");
        assert_eq!(super::prob(1.0 / 50257.0), "2.0e-5", "a near-uniform choice over GPT-2's vocabulary");
        assert_eq!(super::prob(0.0), "0.000");
    }
}
