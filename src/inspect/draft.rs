//! `inspect draft`: speculative decoding round by round — what the draft proposed, which tokens
//! the model kept, its own token, and its cache before the step, after the forward over the
//! drafts and after the rollback; in the terminal, as JSON, or as one self-contained HTML page.

use super::session::{write_text, Common, Session};
use crate::common::print_json;
use crate::draft::DraftArgs;
use anyhow::{bail, Result};
use clap::Args;
use kvgpt_core::{Sampling, Sequence};
use kvgpt_views::inspect::{rounds, Round};
use kvgpt_views::render::axis_label;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct DraftViewArgs {
    #[command(flatten)]
    pub draft: DraftArgs,
    /// Tokens to decode (greedy) after the prompt; each round drafts --draft-max of them.
    #[arg(long, short = 'n', default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..))]
    pub generate: u32,
    /// Also write the rounds as one self-contained HTML page (no network).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// What the view shows, as text, JSON and in the page.
#[derive(Serialize)]
struct View {
    model: String,
    draft: String,
    max_k: usize,
    prompt_ids: Vec<u32>,
    /// Every generated token: the first from the prompt's forward, then each round's.
    generated_ids: Vec<u32>,
    /// The cache after the prompt's forward (its last token is fed by round 1).
    prompt_cache: usize,
    rounds: Vec<Round>,
    /// Labels of every id that appears (`labels[id]` as a map).
    labels: std::collections::BTreeMap<u32, String>,
}

pub(super) fn draft(c: &Common, a: &DraftViewArgs) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let Some(drafting) = a.draft.load(&c.io.model, &s.loaded)? else {
        bail!("inspect draft shows a draft at work: give one with --draft lookup|self:w8a8|self:q8 or --draft-model M");
    };
    let n = a.generate as usize;
    let mut seq = Sequence::new(m, &s.ids, n, Sampling::GREEDY)?;
    // Every round drafts --draft-max tokens (room permitting): the mechanism at work, the same
    // rounds every run (adaptive k would draft as measured costs say, here perhaps not at all).
    seq.speculate(drafting.config.speculation(seq.cache().capacity() + 1).fixed());
    let rounds = rounds(m, &mut seq, n)?;
    let mut labels = std::collections::BTreeMap::new();
    for &id in seq.ids().iter().chain(rounds.iter().flat_map(|r| &r.drafted)) {
        labels.entry(id).or_insert_with(|| s.label(id));
    }
    let view = View {
        model: s.loaded.files.name.clone(),
        draft: drafting.name.clone(),
        max_k: drafting.config.max_k,
        prompt_ids: s.ids.clone(),
        generated_ids: seq.generated().to_vec(),
        prompt_cache: s.ids.len(),
        rounds,
        labels,
    };
    if let Some(path) = &a.html {
        write_text(path, &page(&view)?)?;
        errln!("[kvgpt] wrote {}", path.display());
    }
    if c.io.json {
        return print_json(&serde_json::to_value(&view)?);
    }
    if a.html.is_some() {
        return Ok(()); // the page is the answer, as with every view's pictures
    }
    terminal(&view)
}

fn terminal(v: &View) -> Result<()> {
    let label = |id: &u32| format!("{:?}", v.labels[id]);
    outln!(
        "Speculative decoding of {} with the draft {} (up to {} tokens a round), greedy.\nEach round the model \
         runs its last token and the drafted ones in one forward, keeps the drafts it would have chosen itself, \
         adds its own token, and forgets the K/V of the rest: the answer is the model's own.\n",
        v.model,
        v.draft,
        v.max_k
    );
    outln!("token 1 {} came from the prompt's forward (cache 0 → {}).", label(&v.generated_ids[0]), v.prompt_cache);
    for (i, r) in v.rounds.iter().enumerate() {
        let d = r.drafted.len();
        outln!(
            "round {}: cache {} → {} after the forward (1 + {d} drafted) → {} after the rollback",
            i + 1,
            r.cache_before,
            r.cache_fed,
            r.cache_after
        );
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
            outln!("   drafted  {}", marks.join(" "));
        }
        match r.p_rejected {
            Some(p) => outln!(
                "   model    {} (p {:.3}) instead of {} (p {p:.3}); {} accepted, {} never judged",
                label(&r.token),
                r.p_token,
                label(&r.drafted[r.accepted]),
                r.accepted,
                d - r.accepted - 1
            ),
            None if d > 0 => {
                outln!("   model    all {d} accepted, then its own {} (p {:.3})", label(&r.token), r.p_token)
            }
            None => outln!("   model    {} (p {:.3}); no draft this round", label(&r.token), r.p_token),
        }
    }
    let drafted: usize = v.rounds.iter().map(|r| r.drafted.len()).sum();
    let accepted: usize = v.rounds.iter().map(|r| r.accepted).sum();
    outln!(
        "\n{} tokens in {} forwards ({:.2} a forward); {accepted} of {drafted} drafted tokens accepted ({:.0}%).",
        v.generated_ids.len(),
        v.rounds.len() + 1,
        v.generated_ids.len() as f64 / (v.rounds.len() + 1) as f64,
        100.0 * accepted as f64 / drafted.max(1) as f64
    );
    outln!("✓ accepted  ✗ rejected (the model's token replaces it)  · never judged (after a rejection)");
    Ok(())
}

/// The page: each round as a row of the cache's positions (kept, accepted, rejected, the model's
/// token) and the drafted tokens, with the data inline.
fn page(v: &View) -> Result<String> {
    let data = serde_json::to_string(v)?.replace('<', "\\u003c");
    let labels: std::collections::BTreeMap<u32, String> = v.labels.iter().map(|(k, l)| (*k, axis_label(l))).collect();
    let labels = serde_json::to_string(&labels)?.replace('<', "\\u003c");
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
    'the model\\'s own token, p ' + r.p_token.toFixed(3)));
  div.appendChild(cells);
  root.appendChild(div);
});
";
