//! `inspect embeddings`: wte and wpe rows and their sum per position.

use super::session::{do_export, Common, Session};
use crate::common::print_json;
use anyhow::{Context, Result};
use kvgpt_core::export::Named;
use kvgpt_core::Point;
use kvgpt_views::inspect::{trace, TraceSpec};
use serde::Serialize;

pub(super) fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

pub(super) fn embeddings(c: &Common, dims: usize) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let ch = cfg.n_embd;
    let spec = TraceSpec { generate: 0, want: |p| p == Point::Embed, all_logits: false, prefill: None };
    let tr = trace(m, &s.ids, &spec)?;
    let (_, sum) = tr.rows(Point::Embed).context("the forward pass reported no embeddings")?;
    let t = s.ids.len();
    let wte_rows: Vec<f32> = s.ids.iter().flat_map(|&id| m.wte.column(id as usize)).collect();
    let wpe_rows: Vec<f32> = m.wpe[..t * ch].to_vec();
    let d = dims.min(ch);
    let view = EmbeddingsView {
        ids: s.ids.clone(),
        tokens: s.labels(&s.ids),
        n_embd: ch,
        dims: d,
        positions: (0..t)
            .map(|i| {
                let (a, b, x) = (&wte_rows[i * ch..][..ch], &wpe_rows[i * ch..][..ch], &sum[i * ch..][..ch]);
                Row {
                    position: i,
                    id: s.ids[i],
                    token: s.label(s.ids[i]),
                    wte: a[..d].to_vec(),
                    wte_norm: norm(a),
                    wpe: b[..d].to_vec(),
                    wpe_norm: norm(b),
                    sum: x[..d].to_vec(),
                    sum_norm: norm(x),
                }
            })
            .collect(),
    };
    if c.io.json {
        print_json(&serde_json::to_value(&view)?)?;
    } else {
        outln!("x = wte[id] + wpe[position]: each row has {ch} numbers; the first {d} and the L2 norm of all {ch}:");
        for r in &view.positions {
            outln!("pos {} id {} {:?}", r.position, r.id, r.token);
            for (name, first, n) in
                [("wte", &r.wte, r.wte_norm), ("wpe", &r.wpe, r.wpe_norm), ("sum", &r.sum, r.sum_norm)]
            {
                let first: String = first.iter().map(|x| format!("{x:>8.4}")).collect();
                outln!("  {name:<4}{first} | norm {n:.4}");
            }
        }
    }
    do_export(
        c,
        &[
            Named { name: "embed".into(), shape: vec![t, ch], data: &sum },
            Named { name: "wte_rows".into(), shape: vec![t, ch], data: &wte_rows },
            Named { name: "wpe_rows".into(), shape: vec![t, ch], data: &wpe_rows },
        ],
    )
}

/// What `inspect embeddings` shows, as text or JSON.
#[derive(Serialize)]
pub(super) struct EmbeddingsView {
    ids: Vec<u32>,
    tokens: Vec<String>,
    n_embd: usize,
    dims: usize,
    positions: Vec<Row>,
}

/// One position: the first `dims` numbers of each row and the L2 norm of all of it.
#[derive(Serialize)]
pub(super) struct Row {
    position: usize,
    id: u32,
    token: String,
    wte: Vec<f32>,
    wte_norm: f64,
    wpe: Vec<f32>,
    wpe_norm: f64,
    sum: Vec<f32>,
    sum_norm: f64,
}
