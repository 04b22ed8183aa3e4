//! `inspect attention` drawn: the terminal heatmap (fitted to a width, key labels downwards, the
//! ‹ column, the colour scale, the divider above the rows decoded with the KV cache on), one
//! query over every head, and the SVG — each against the fixture's HF attention, and the
//! terminal's colours against the SVG's (white for no weight, darker for more, in both).

mod common;

use common::views::*;
use common::*;
use serde_json::Value;
use std::process::Command;

#[test]
fn the_terminal_heatmap_fits_the_width_and_shows_hf_weights_labels_and_scale() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let r = Reference::load();
    let p = r.prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let hf = HfAttention::of("p2");
    let t = p.ids.len();
    let text = stdout(&[
        "inspect",
        "attention",
        &p.text,
        "--model",
        &m,
        "--layer",
        "0",
        "--head",
        "1",
        "--width",
        "80",
        "--color",
        "always",
    ]);
    let lines: Vec<&str> = text.lines().collect();
    // The heatmap's lines fit (the prose above it wraps as prose does).
    let grid = lines.iter().position(|l| *l == "layer 0 head 1").unwrap();
    for l in &lines[grid..] {
        assert!(console_width(&plain(l)) <= 80, "wider than 80 columns: {:?}", plain(l));
    }
    // The window note, then the heatmap of the last `shown` positions.
    let note = lines.iter().find(|l| l.starts_with("showing the last ")).expect("a window note");
    let shown: usize = note["showing the last ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(note.contains(&format!("of {t} positions (to fit --width 80)")), "{note}");
    assert!(shown > 5 && shown < t, "{note}");
    let start = t - shown;
    // The colour scale: five swatches with their values, white to dark blue.
    let scale = coloured_cells(lines.iter().find(|l| l.starts_with("scale ")).unwrap());
    assert_eq!(scale.iter().map(|c| c.1.as_str()).collect::<Vec<_>>(), ["0.00", "0.25", "0.50", "0.75", "1.00"]);
    assert!(scale.windows(2).all(|w| luma(w[1].0) < luma(w[0].0)), "{scale:?}");
    let legend = lines.iter().find(|l| l.starts_with("scale ")).unwrap();
    assert_eq!(masked_cells(legend), ["grey"], "the legend's grey swatch");
    assert!(plain(legend).ends_with("grey  is masked (a key after its query)"), "{legend:?}");
    // Key labels run downwards above their columns: read down each column, they are the tokens.
    let header = lines.iter().position(|l| l.contains("q\\k")).unwrap();
    let first_label = lines.iter().position(|l| *l == "layer 0 head 1").unwrap() + 1;
    let index_row: Vec<usize> =
        lines[header].split('│').nth(1).unwrap().split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    assert_eq!(index_row, (start..t).collect::<Vec<_>>(), "the ‹ column, then the window's positions");
    let tokens = axis_tokens(&p.text, &m);
    let bar = lines[header].find('│').unwrap() + '│'.len_utf8();
    for (i, k) in (start..t).enumerate() {
        // Column i's cell is the 4 characters after the bar and the ‹ cell.
        let at = bar + 4 * (i + 1);
        let down: String = lines[first_label..header]
            .iter()
            .map(|l| l.chars().skip(at - 2).take(4).collect::<String>().trim().to_string())
            .collect();
        let want: String = if tokens[k].chars().count() <= 6 {
            tokens[k].clone()
        } else {
            tokens[k].chars().take(5).chain(['…']).collect()
        };
        assert_eq!(down, want, "key {k}");
    }
    // Every row: its ‹ cell holds HF's weight on the keys before the window, every cell HF's
    // weight, each over the scale's colour for it (darker for more).
    let rows: Vec<&str> = lines[header + 1..].to_vec();
    assert_eq!(rows.len(), shown);
    let mut seen = Vec::new();
    for (r, line) in rows.iter().enumerate() {
        let q = start + r;
        assert!(plain(line).starts_with(&format!("{q:>4} ")), "{line:?}");
        let cells = coloured_cells(line);
        assert_eq!(cells.len(), 1 + r + 1, "row {q}: the ‹ cell and keys {start}..={q}");
        assert_eq!(masked_cells(line).len(), shown - (r + 1), "row {q}: the keys after it, grey as the legend says");
        let before: f32 = (0..start).map(|k| hf.w(0, 1, q, k)).sum();
        assert!((value(&cells[0].1) - before).abs() <= 0.0051, "row {q} ‹: {} vs {before}", cells[0].1);
        for (i, (rgb, v)) in cells[1..].iter().enumerate() {
            let w = hf.w(0, 1, q, start + i);
            assert!((value(v) - w).abs() <= 0.0051, "{q},{}: {v} vs {w}", start + i);
            seen.push((w, luma(*rgb)));
        }
    }
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(seen.windows(2).all(|p| p[1].1 <= p[0].1 + 1e-9), "more weight is never lighter");
    assert!(seen[0].1 > 230.0, "no weight is near white");

    // --last N picks the window; plain text without --color.
    let text = stdout(&["inspect", "attention", &p.text, "--model", &m, "--layer", "1", "--head", "0", "--last", "3"]);
    assert!(!text.contains('\x1b') && text.contains(&format!("showing the last 3 of {t} positions (--last 3)")));
    let rows: Vec<&str> = text.lines().skip_while(|l| !l.contains("q\\k")).skip(1).collect();
    assert_eq!(rows.len(), 3);
    let last: Vec<f32> = rows[2].split('│').nth(1).unwrap().split_whitespace().map(value).collect();
    let before: f32 = (0..t - 3).map(|k| hf.w(1, 0, t - 1, k)).sum();
    let want = [before, hf.w(1, 0, t - 1, t - 3), hf.w(1, 0, t - 1, t - 2), hf.w(1, 0, t - 1, t - 1)];
    for (got, want) in last.iter().zip(want) {
        assert!((got - want).abs() <= 0.0051, "{last:?} vs {want}");
    }
    // Not a terminal, no --width: the whole matrix.
    let text = stdout(&["inspect", "attention", &p.text, "--model", &m, "--layer", "0", "--head", "0"]);
    assert!(!text.contains("showing the last"));
    assert_eq!(text.lines().skip_while(|l| !l.contains("q\\k")).count(), 1 + t);
}

#[test]
fn the_divider_sits_above_the_first_row_decoded_with_the_cache() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let p = &Reference::load().prompts()[0];
    let t = p.ids.len();
    let text =
        stdout(&["inspect", "attention", &p.text, "--model", &m, "--layer", "0", "--head", "0", "--generate", "3"]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.contains('┼') && l.contains("decoded")).expect("a divider");
    assert!(lines[at - 1].starts_with(&format!("{:>4} ", t - 1)), "{text}");
    assert!(lines[at + 1].starts_with(&format!("{t:>4} ")), "{text}");
    assert_eq!(text.matches('┼').count(), 1);
}

#[test]
fn one_query_over_every_head_equals_hf_rows() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let r = Reference::load();
    let p = &r.prompts()[1];
    let hf = HfAttention::of("p1");
    let t = p.ids.len();
    let v: Value =
        serde_json::from_str(&stdout(&["inspect", "attention", &p.text, "--model", &m, "--query", "-1", "--json"]))
            .unwrap();
    assert_eq!(v["query"], t - 1);
    for l in 0..2 {
        for h in 0..4 {
            let row: Vec<f32> =
                v["weights"][l][h].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            let want: Vec<f32> = (0..t).map(|k| hf.w(l, h, t - 1, k)).collect();
            assert_close(&format!("layer {l} head {h}"), &row, &want, 1e-4);
        }
    }
    // As text: per layer, the heads are the rows, keys 0..=query the columns.
    let text =
        stdout(&["inspect", "attention", &p.text, "--model", &m, "--query", "5", "--layer", "1", "--width", "200"]);
    assert!(text.contains("rows are heads, columns keys"));
    let lines: Vec<&str> = text.lines().skip_while(|l| !(l.starts_with("head") && l.contains('│'))).collect();
    let index: Vec<&str> = lines[0].split('│').nth(1).unwrap().split_whitespace().collect();
    assert_eq!(index, ["0", "1", "2", "3", "4", "5"]);
    for h in 0..4 {
        let cells: Vec<f32> = lines[1 + h].split('│').nth(1).unwrap().split_whitespace().map(value).collect();
        assert!(lines[1 + h].starts_with(&format!("{h:>4} ")));
        assert_eq!(cells.len(), 6);
        for (k, c) in cells.iter().enumerate() {
            assert!((c - hf.w(1, h, 5, k)).abs() <= 0.0051, "head {h} key {k}");
        }
    }
}

#[test]
fn the_svg_labels_both_axes_and_uses_the_terminals_colours() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let r = Reference::load();
    let p = &r.prompts()[1];
    let hf = HfAttention::of("p1");
    let t = p.ids.len();
    let s = t + 3;
    let dir = tempfile::tempdir().unwrap();
    let (svg, html) = (dir.path().join("a.svg"), dir.path().join("a.html"));
    let args = ["inspect", "attention", &p.text, "--model", &m, "--generate", "3"];
    let files =
        ["--svg", svg.to_str().unwrap(), "--html", html.to_str().unwrap(), "--color", "always", "--width", "400"];
    assert_eq!(stdout(&[&args[..], &files[..]].concat()), "", "pictures asked for: nothing on the terminal");
    let text = stdout(&[&args[..], &files[4..]].concat());
    let src = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&src).expect("the SVG is well-formed XML");
    let panels: Vec<_> = doc.descendants().filter(|n| n.attribute("class") == Some("grid")).collect();
    assert_eq!(panels.len(), 2 * 4);
    // Layer 1 head 2: a cell per query and key at or before it, HF's weights in the prompt rows.
    let cells = svg_cells(&doc, "layer 1 head 2");
    assert_eq!(cells.len(), s * (s + 1) / 2);
    let mut i = 0;
    for q in 0..s {
        for k in 0..=q {
            if q < t {
                assert!((cells[i].1 - hf.w(1, 2, q, k)).abs() < 1e-4, "{q},{k}");
            }
            i += 1;
        }
    }
    // The same colours as the terminal's cells, row by row.
    let block: Vec<&str> =
        text.split("layer 1 head 2\n").nth(1).unwrap().lines().skip_while(|l| !l.contains("q\\k")).skip(1).collect();
    let term: Vec<[u8; 3]> = block
        .iter()
        .filter(|l| !l.contains('┼'))
        .take(s)
        .flat_map(|l| coloured_cells(l).into_iter().map(|c| c.0))
        .collect();
    assert_eq!(term, cells.iter().map(|c| c.0).collect::<Vec<_>>(), "terminal and SVG colour each cell alike");
    let mut by_weight = cells.clone();
    by_weight.sort_by(|a, b| a.1.total_cmp(&b.1));
    assert!(by_weight.windows(2).all(|p| luma(p[1].0) <= luma(p[0].0) + 1e-9), "darker for more weight");
    // Both axes labelled with every position and its token.
    let panel = panels.iter().find(|n| n.attribute("data-title") == Some("layer 1 head 2")).unwrap();
    let texts = |class: &str| -> Vec<String> {
        panel
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .map(|n| n.text().unwrap().to_string())
            .collect()
    };
    let tokens = axis_tokens(&p.text, &m);
    let v: Value = serde_json::from_str(&stdout(&[&args[..], &["--json"]].concat())).unwrap();
    let mut all = tokens.clone();
    all.extend(v["tokens"].as_array().unwrap()[t..].iter().map(|x| x.as_str().unwrap().replace(' ', "·")));
    let want: Vec<String> = all.iter().enumerate().map(|(i, tok)| format!("{i} {tok}")).collect();
    assert_eq!(texts("col"), want);
    assert_eq!(texts("row"), want);
    // The divider is at the top edge of the first decoded row.
    let divider = panel.descendants().find(|n| n.attribute("class") == Some("divider")).expect("a divider");
    let first_decoded =
        panel.descendants().filter(|n| n.attribute("class") == Some("cell")).nth(t * (t + 1) / 2).unwrap();
    assert_eq!(divider.attribute("y1"), first_decoded.attribute("y"));
    // The colour bar runs white to dark blue over 100 steps.
    let steps: Vec<_> = doc
        .descendants()
        .filter(|n| n.parent().and_then(|p| p.attribute("class")) == Some("scale") && n.has_tag_name("rect"))
        .collect();
    assert_eq!(steps.len(), 100);
    // The HTML page: self-contained, its data HF's weights (the browser test drives it).
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    assert!(!page.contains(" src=") && !page.contains(" href=") && !page.contains("<link"), "nothing to fetch");
    let data = page
        .split("<script type=\"application/json\" id=\"kvgpt-data\">")
        .nth(1)
        .unwrap()
        .split("</script>")
        .next()
        .unwrap();
    let data: Value = serde_json::from_str(data).unwrap();
    let row = data["attn"][1][2][t - 1].as_array().unwrap();
    assert_eq!(row.len(), t);
    for (k, w) in row.iter().enumerate() {
        assert!((w.as_f64().unwrap() as f32 - hf.w(1, 2, t - 1, k)).abs() < 1e-4);
    }
}

#[test]
fn markup_in_tokens_stays_text_in_every_picture() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let (svg, html) = (dir.path().join("a.svg"), dir.path().join("a.html"));
    let prompt = "Hello, <world> & \"friends\" </script>";
    stdout(&[
        "inspect",
        "attention",
        prompt,
        "--model",
        &m,
        "--svg",
        svg.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let src = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&src).expect("well-formed");
    assert!(doc.descendants().any(|n| n.text() == Some("2 ·<")), "a token `<` is drawn as text");
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(page.matches("</script>").count(), 2, "the data and the script, nothing from the prompt");
}

#[test]
fn on_a_terminal_the_heatmap_fits_its_width_in_colour_unless_no_color() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let p = Reference::load().prompts().into_iter().find(|p| p.key == "p2").unwrap();
    let args = ["inspect", "attention", &p.text, "--model", &m, "--layer", "0", "--head", "0"];
    let text = on_terminal(100, &args, &[]);
    assert!(text.contains("(to fit the terminal's width)"), "{text}");
    assert!(text.contains("\x1b[48;5;"), "colour on a terminal (256 colours without COLORTERM)");
    let grid: Vec<&str> = text.lines().skip_while(|l| *l != "layer 0 head 0").collect();
    assert!(grid.len() > 10);
    for l in &grid {
        assert!(console_width(&plain(l)) <= 100, "wider than the terminal: {:?}", plain(l));
    }
    // The widest window that fits: one more position (its label may be wider) would not.
    let header = grid.iter().find(|l| l.contains("q\\k")).unwrap();
    let shown = plain(header).split('│').nth(1).unwrap().split_whitespace().count() - 1;
    let tokens = axis_tokens(&p.text, &m);
    let t = tokens.len();
    let label = tokens[t - shown - 1..].iter().map(|l| l.chars().count().min(12)).max().unwrap();
    assert!(4 + 1 + label + 2 + 4 * (shown + 2) > 100, "{shown} shown: {header:?}");
    let text = on_terminal(100, &args, &[("NO_COLOR", "1")]);
    assert!(!text.contains('\x1b') && text.contains("(to fit the terminal's width)"));
}

#[test]
fn in_256_colours_more_weight_is_darker_too() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let p = &Reference::load().prompts()[1];
    let out = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["inspect", "attention", &p.text, "--model", &m, "--color", "always", "--width", "200"])
        .env_remove("COLORTERM")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let (mut seen, mut masked) = (Vec::new(), 0);
    for line in text.lines().filter(|l| l.contains('│')) {
        for piece in line.split("\x1b[0m") {
            let Some(at) = piece.find("\x1b[48;5;") else { continue };
            let rest = &piece[at + 7..];
            let i: u8 = rest[..rest.find('m').unwrap()].parse().unwrap();
            let v = plain(&rest[rest.find('m').unwrap() + 1..]).trim().to_string();
            if v.is_empty() {
                assert_eq!(xterm(i), [0xda; 3], "a masked cell is the grey ramp's 253");
                masked += 1;
                continue;
            }
            seen.push((value(&v), luma(xterm(i))));
        }
    }
    assert_eq!(seen.len(), 8 * 14 * 15 / 2, "every cell of every head is coloured");
    assert_eq!(masked, 8 * 14 * 13 / 2, "and every masked one grey");
    // Cells printed alike may straddle a step of the ramp: among them, the lighter first.
    seen.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    for pair in seen.windows(2) {
        assert!(pair[1].1 <= pair[0].1, "more weight must not be lighter: {pair:?}");
    }
    assert!(seen[0].1 > 250.0 && seen.last().unwrap().1 < 60.0, "white to dark: {:?} … {:?}", seen[0], seen.last());
}

#[test]
fn a_narrow_width_shortens_the_divider_and_wraps_the_prose() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let p = &Reference::load().prompts()[0];
    let text = stdout(&[
        "inspect",
        "attention",
        &p.text,
        "--model",
        &m,
        "--layer",
        "0",
        "--head",
        "0",
        "--generate",
        "2",
        "--width",
        "40",
    ]);
    for l in text.lines() {
        // A word longer than the width stays whole (the model's path); nothing else is wider.
        assert!(console_width(l) <= 40 || !l.contains(' '), "wider than 40: {l:?}");
    }
    assert!(text.lines().any(|l| l.contains("┼─ decoded, KV cache on ─")), "{text}");
}

#[test]
fn long_prompts_keep_every_label_in_the_svg_and_the_page_fetches_nothing() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let p = Reference::load().prompts().into_iter().find(|p| p.key == "p5").unwrap();
    let t = p.ids.len();
    assert!(t > 100);
    let dir = tempfile::tempdir().unwrap();
    let (svg, html) = (dir.path().join("a.svg"), dir.path().join("a.html"));
    stdout(&[
        "inspect",
        "attention",
        &p.text,
        "--model",
        &m,
        "--layer",
        "1",
        "--head",
        "3",
        "--svg",
        svg.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let src = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&src).unwrap();
    let tokens = axis_tokens(&p.text, &m);
    let want: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, tok)| {
            let tok: String =
                if tok.chars().count() > 12 { tok.chars().take(11).chain(['…']).collect() } else { tok.clone() };
            format!("{i} {tok}")
        })
        .collect();
    for class in ["col", "row"] {
        let got: Vec<String> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .map(|n| n.text().unwrap().to_string())
            .collect();
        assert_eq!(got, want, "{class} labels");
    }
    // No way to reach the network: no external references, no fetching calls, one namespace
    // name (the SVG's, which is never fetched).
    let page = std::fs::read_to_string(&html).unwrap();
    for needle in
        ["url(", "@import", "fetch(", "XMLHttpRequest", "src=", "href=", "<link", "<iframe", "<img", "WebSocket"]
    {
        assert!(!page.contains(needle), "the page holds {needle:?}");
    }
    let addresses: Vec<&str> = page.match_indices("http").map(|(i, _)| &page[i..(i + 26).min(page.len())]).collect();
    assert!(addresses.iter().all(|a| a.starts_with("http://www.w3.org/2000/svg")), "{addresses:?}");
}
