//! `inspect attention`: per-head weights as heatmaps, SVG and HTML.

#[allow(unused_imports)]
use super::*;

pub(super) fn selected(sel: Option<usize>, n: usize, what: &str) -> Result<Vec<usize>> {
    match sel {
        Some(i) if i >= n => bail!("--{what} {i} is out of range: the model has {n} {what}s (0..{})", n - 1),
        Some(i) => Ok(vec![i]),
        None => Ok((0..n).collect()),
    }
}

pub(super) fn attention(
    c: &Common,
    sel: &Select,
    generate: usize,
    svg: Option<&Path>,
    html: Option<&Path>,
) -> Result<()> {
    let s = Session::open(c)?;
    let m = &s.loaded.model;
    let cfg = &m.config;
    let layers = selected(sel.layer, cfg.n_layer, "layer")?;
    let heads = selected(sel.head, cfg.n_head, "head")?;
    let spec = TraceSpec { generate, want: |p| matches!(p, Point::AttnProbs(_)), all_logits: false };
    let tr = trace(m, &s.ids, &spec)?;
    let n = tr.len();
    let per_layer: Vec<Vec<f32>> = layers
        .iter()
        .map(|&l| tr.attention(l).map(|(_, a)| a).context("attention weights were not recorded"))
        .collect::<Result<_>>()?;
    let matrix = |li: usize, h: usize| &per_layer[li][h * n * n..(h + 1) * n * n];
    let labels = s.labels(&tr.ids);

    let mut selected_data = Vec::with_capacity(layers.len() * heads.len() * n * n);
    for li in 0..layers.len() {
        for &h in &heads {
            selected_data.extend_from_slice(matrix(li, h));
        }
    }
    let title = format!(
        "attention of {} ({} prompt tokens{})",
        s.loaded.files.name,
        tr.prompt_len,
        if generate > 0 { format!(" + {generate} decoded with the KV cache") } else { String::new() }
    );
    let mats: Vec<Matrix> = layers
        .iter()
        .enumerate()
        .flat_map(|(li, &l)| heads.iter().map(move |&h| (li, l, h)))
        .map(|(li, l, h)| Matrix { layer: l, head: h, weights: matrix(li, h) })
        .collect();
    if let Some(p) = svg {
        write_text(p, &render::svg(&mats, &labels, &title))?;
        errln!("[kvgpt] wrote {} ({} heatmaps)", p.display(), mats.len());
    }
    if let Some(p) = html {
        write_text(p, &render::html(&mats, &labels, &title))?;
        errln!("[kvgpt] wrote {} ({} heatmaps)", p.display(), mats.len());
    }
    if c.io.json {
        let nested: Vec<Vec<Vec<&[f32]>>> =
            (0..layers.len()).map(|li| heads.iter().map(|&h| matrix(li, h).chunks(n).collect()).collect()).collect();
        print_json(&json!({
            "ids": tr.ids,
            "tokens": labels,
            "prompt_len": tr.prompt_len,
            "generated": generate,
            "layers": layers,
            "heads": heads,
            "attention": nested,
        }))?;
    } else {
        let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        outln!("{title}; rows are queries, columns keys");
        for mat in &mats {
            outln!("\nlayer {} head {}", mat.layer, mat.head);
            out!("{}", render::heatmap(mat, &labels, color));
        }
    }
    do_export(
        c,
        &[Named { name: "attention".into(), shape: vec![layers.len(), heads.len(), n, n], data: &selected_data }],
    )
}
