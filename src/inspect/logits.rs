//! `inspect logits`: next-token distributions, the prompt's actual next token, the logit lens
//! (`kvgpt_views::inspect::logits`).

use super::session::{do_export, Common, Session};
use crate::common::print_json;
use anyhow::Result;
use kvgpt_core::export::Named;
use kvgpt_views::inspect::logits::{logits as report, LogitsAsk};

pub(super) fn logits(c: &Common, k: usize, position: Option<usize>, all: bool, lens: bool) -> Result<()> {
    let s = Session::open(c)?;
    let cfg = &s.loaded.model.config;
    let t = s.ids.len();
    let positions = if all { (0..t).collect() } else { vec![position.unwrap_or(t - 1)] };
    let r = report(&s.loaded, &s.ids, &LogitsAsk { top_k: k, positions, lens })?;
    if c.io.json {
        let v = if all { serde_json::to_value(&r.views)? } else { serde_json::to_value(&r.views[0])? };
        print_json(&v)?;
    } else {
        for view in &r.views {
            outln!("{}", view.text());
        }
    }
    let mut tensors = vec![Named { name: "logits".into(), shape: vec![t, cfg.vocab_size], data: &r.logits }];
    if let Some(hidden) = &r.hidden {
        tensors.push(Named { name: "hidden".into(), shape: vec![cfg.n_layer + 1, t, cfg.n_embd], data: hidden });
    }
    do_export(c, &tensors)
}
