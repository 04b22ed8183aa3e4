//! `kvgpt chat` through a pseudo-terminal (util-linux `script` runs it on one, as a user's shell
//! would): answers equal HF's greedy continuations of the same conversation ids
//! (tests/fixtures/sampling_reference.json), each turn reuses the cache of the ones before, /save
//! and /load carry a conversation to another session with the same next answer, Ctrl-C stops an
//! answer but not the session, and ends the session at an empty prompt; the line editor's keys,
//! history, joined lines, /regen, /undo and /system.

mod common;

use common::chat_session::Session;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

fn chat_reference() -> Vec<Value> {
    sampling_reference()["chat"].as_array().unwrap().clone()
}

/// The stats line of a turn: (reused, computed).
fn stats(text: &str) -> (usize, usize) {
    let line = text.lines().find(|l| l.contains("[kvgpt] reused ")).unwrap_or_else(|| panic!("no stats in {text:?}"));
    let num = |after: &str| -> usize {
        let rest = &line[line.find(after).unwrap() + after.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    (num("reused "), num("computed "))
}

#[test]
fn turns_keep_the_cache_and_answer_as_hf() {
    turns_as_hf(&[]);
}

/// With a draft the answers are HF's too, and the conversation holds exactly what was shown
/// (drafts accepted past the end of an answer's line are dropped: the reuse counts are the same).
#[test]
fn turns_with_a_draft_answer_as_hf_and_say_what_was_drafted() {
    for draft in ["self:w8a8", "lookup"] {
        turns_as_hf(&["--draft", draft, "--draft-min", "3"]);
    }
}

fn turns_as_hf(extra: &[&str]) {
    let m = fixture_dir().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("talk.kvc").to_string_lossy().into_owned();
    let turns = chat_reference();
    let args = [&["--model", &m, "-n", "8"][..], extra].concat();
    let mut s = Session::start(&args);
    s.wait_for("> ");
    let mut before = 0;
    for t in &turns {
        s.send(&format!("{}\n", t["line"].as_str().unwrap()));
        let text = s.wait_for("ended: ");
        // The answer as HF's greedy tokens decode, on the line after the echoed input.
        let answer = t["answer_text"].as_str().unwrap();
        assert!(text.contains(&format!("{answer}\r\n")), "{answer:?} in {text:?}");
        let turn_len = t["turn_ids"].as_array().unwrap().len();
        // Everything before this turn is reused but the last answer token (never fed), which is
        // computed with the turn's own tokens.
        let want = if before == 0 { (0, turn_len) } else { (before - 1, turn_len + 1) };
        assert_eq!(stats(&text), want, "{text}");
        assert!(text.contains("tok/s, sampling ") && text.contains(" ms/token"), "sampling timed: {text}");
        if let Some(draft) = extra.get(1) {
            assert!(text.contains(&format!(" | draft {draft}: accepted ")), "the drafts are reported: {text}");
            assert!(text.contains(" drafted tokens, drafting ") && text.contains(" ms |"), "drafting timed: {text}");
        }
        assert_eq!(t["ids_before_answer"].as_u64().unwrap() as usize, before + turn_len);
        before += turn_len + t["answer_ids"].as_array().unwrap().len();
        s.wait_for("> ");
    }
    s.send("/stats\n");
    let text = s.wait_for("positions left)");
    assert!(text.contains(&format!("({before} tokens in the conversation, {} with K/V cached", before - 1)), "{text}");
    s.wait_for("> ");
    s.send(&format!("/save {saved}\n"));
    s.wait_for(&format!("(saved {before} tokens and their K/V to {saved})"));
    s.wait_for("> ");
    s.send("And then?\n");
    let first = s.wait_for("ended: ");
    s.wait_for("> ");
    s.send("/quit\n");
    assert_eq!(s.exit_code(), Some(0));

    // Another session: /load the saved conversation, and the same turn gets the same answer,
    // reusing every saved position.
    let mut s = Session::start(&args);
    s.wait_for("> ");
    s.send(&format!("/load {saved}\n"));
    s.wait_for(&format!("(loaded {before} tokens and their K/V from {saved}"));
    s.wait_for("> ");
    s.send("And then?\n");
    let again = s.wait_for("ended: ");
    let answer = |t: &str| t.lines().nth(1).map(str::to_string);
    assert_eq!(answer(&again), answer(&first), "{again:?} vs {first:?}");
    // /save fed the last answer token, so both sessions reuse every position of the conversation.
    assert_eq!(stats(&first).0, before);
    assert_eq!(stats(&again), stats(&first));
    s.wait_for("> ");
    s.send("/reset\n");
    s.wait_for("(the conversation and its cache are cleared)");
    s.wait_for("> ");
    // Ctrl-C at the prompt ends the session, as in a shell.
    s.send("\x03");
    assert_eq!(s.exit_code(), Some(130));
}

/// A random GPT-2 with a long context and no way to end a line or the text (the rows of `wte`
/// for every token holding a newline, and for `<|endoftext|>`, are zero, so greedy never picks
/// them): its answers run on for thousands of tokens, seconds even on a fast CPU, long enough
/// to interrupt twice.
fn long_winded_model(dir: &std::path::Path) {
    let shape = random_model::Shape { n_embd: 128, n_layer: 2, n_head: 4, n_positions: 4096, seed: 0, endless: true };
    random_model::write(dir, shape);
}

#[test]
fn ctrl_c_stops_an_answer_not_the_session() {
    let dir = tempfile::tempdir().unwrap();
    long_winded_model(dir.path());
    let m = dir.path().to_string_lossy().into_owned();
    let mut s = Session::start(&["--model", &m, "-n", "4000", "-t", "1"]);
    s.wait_for("> ");
    // Each turn: type a line, and as soon as its answer streams, interrupt it.
    let interrupt = |s: &mut Session, line: &str| -> String {
        s.send(&format!("{line}\n"));
        s.wait_for(line); // the echo, then the line editor's end of line
        s.wait_for("\r\n");
        let start = Instant::now();
        while s.out.lock().unwrap().len() <= s.seen + 20 {
            assert!(start.elapsed() < Duration::from_secs(30), "no answer");
            std::thread::sleep(Duration::from_millis(2));
        }
        s.send("\x03");
        let text = s.wait_for("ended: Ctrl-C");
        assert!(text.contains(" [stopped]\r\n"), "{text:?}");
        text
    };
    let text = interrupt(&mut s, "Tell me everything");
    let (_, computed) = stats(&text);
    assert!(computed > 0);
    let answered = text.split("answer ").nth(1).unwrap().split(' ').next().unwrap().parse::<usize>().unwrap();
    assert!(answered < 4000 - 8, "the answer was cut short: {answered} tokens");
    // The session goes on: the next turn reuses the whole interrupted conversation.
    s.wait_for("> ");
    let text = interrupt(&mut s, "Go on");
    let (reused, _) = stats(&text);
    assert!(reused > answered, "{text}");
    s.wait_for("> ");
    s.send("/quit\n");
    assert_eq!(s.exit_code(), Some(0));
}

/// Two turns of 60-token answers: most of the fixture's 128 positions; then a third turn.
fn fill_two_turns(s: &mut Session) {
    s.wait_for("> ");
    for _ in 0..2 {
        s.send("Hello there\n");
        s.wait_for("ended: ");
        s.wait_for("> ");
    }
    s.send("One more\n");
}

#[test]
fn a_full_context_says_the_options_and_keep_re_prefills_the_tail() {
    let m = fixture_dir().to_string_lossy().into_owned();
    // Without --keep: once the 128 positions are used, a turn is refused with the options and
    // the session goes on.
    let mut s = Session::start(&["--model", &m, "-n", "60"]);
    fill_two_turns(&mut s);
    let text = s.wait_for("> ");
    assert!(
        text.contains("error: the context is full: this turn needs")
            && text.contains("/reset starts over; /save FILE keeps this conversation first; or restart with --keep N"),
        "{text}"
    );
    s.send("/reset\n");
    s.wait_for("> ");
    s.send("Hello again\n");
    let text = s.wait_for("ended: ");
    assert_eq!(stats(&text).0, 0, "{text}");
    s.wait_for("> ");
    s.send("/quit\n");
    assert_eq!(s.exit_code(), Some(0));
    // With --keep 40: the last 40 tokens are kept and computed again from position 0.
    let mut s = Session::start(&["--model", &m, "-n", "60", "--keep", "40"]);
    fill_two_turns(&mut s);
    let text = s.wait_for("ended: ");
    assert!(text.contains("the context was full: kept the last 40 tokens and computed their K/V again"), "{text}");
    assert_eq!(stats(&text).0, 40, "{text}");
    s.wait_for("> ");
    s.send("/quit\n");
    assert_eq!(s.exit_code(), Some(0));
}

/// Ids of `text` by the fixture's tokenizer (HF's ids, `tests/tokenizer.rs`).
fn tokens(text: &str) -> usize {
    load_fixture().tokenizer.encode(text).unwrap().len()
}

#[test]
fn the_line_editor_edits_recalls_and_joins_lines_and_regen_undo_go_back() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    let h = history.to_string_lossy().into_owned();
    let turn = &chat_reference()[0];
    let (line, answer) = (turn["line"].as_str().unwrap(), turn["answer_text"].as_str().unwrap());
    let turn_len = turn["turn_ids"].as_array().unwrap().len();
    let answer_len = turn["answer_ids"].as_array().unwrap().len();
    let args = ["--model", &m, "-n", "8", "--history", &h];
    let mut s = Session::start(&args);
    s.wait_for("> ");
    // Typed with a slip taken back by Backspace, and its last character typed after moving left
    // and right again: the turn is the line as edited (HF's answer), no key's bytes in it.
    let (head, last) = line.split_at(line.len() - 1);
    s.send(&format!("{head}xy\x7f\x7f\x1b[D\x1b[C{last}\r"));
    let text = s.wait_for("ended: ");
    assert!(text.contains(&format!("{answer}\r\n")), "{answer:?} in {text:?}");
    assert_eq!(stats(&text), (0, turn_len), "{text}");
    s.wait_for("> ");
    // /regen answers the turn again (greedy: the same answer), feeding only the turn's last token.
    s.send("/regen\r");
    let text = s.wait_for("ended: ");
    assert!(text.contains(&format!("{answer}\r\n")), "{answer:?} in {text:?}");
    assert_eq!(stats(&text), (turn_len - 1, 1), "{text}");
    s.wait_for("> ");
    // /undo takes the turn back, answer and all.
    s.send("/undo\r");
    s.wait_for(&format!("(took back the last turn: {} tokens; 0 tokens left)", turn_len + answer_len));
    s.wait_for("> ");
    s.send("/undo\r");
    s.wait_for("error: there is no turn to take back");
    // Ctrl-C clears a typed line and the session goes on; a line ending in \ goes on to the next.
    s.send("never sent\x03");
    s.send("first\\\r");
    s.wait_for("… "); // (typed ahead of its prompt, a line would be dropped, as in any raw-mode editor)
    s.send("second\r");
    let text = s.wait_for("ended: ");
    assert_eq!(stats(&text), (0, tokens("User: first\nsecond\nAssistant:")), "{text}");
    s.wait_for("> ");
    s.send("/quit\r");
    assert_eq!(s.exit_code(), Some(0));
    // The history file holds what was entered, as edited.
    let kept = std::fs::read_to_string(&history).unwrap();
    assert!(kept.contains(line) && kept.contains("/regen") && kept.contains("second"), "{kept:?}");
    assert!(!kept.contains("xy") && !kept.contains('\x1b') && !kept.contains("never sent"), "{kept:?}");

    // A new session recalls the first line from the history file with Up: five entries back
    // (`/undo` twice is kept once), one more Up for the two-line entry's first line. HF's answer
    // again.
    let mut s = Session::start(&args);
    s.wait_for("> ");
    s.send(&"\x1b[A".repeat(6));
    s.send("\r");
    let text = s.wait_for("ended: ");
    assert!(text.contains(&format!("{answer}\r\n")), "{answer:?} in {text:?}");
    assert_eq!(stats(&text), (0, turn_len), "{text}");
    s.wait_for("> ");
    // Ctrl-C on an empty line ends the session, on a line of its own.
    s.send("\x03");
    s.wait_for("\r\n");
    assert_eq!(s.exit_code(), Some(130));
}

#[test]
fn system_text_opens_the_conversation_and_moves_it_when_changed() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let mut s = Session::start(&["--model", &m, "-n", "6", "--no-history"]);
    s.wait_for("> ");
    s.send("/system\r");
    s.wait_for("(no system text; /system TEXT sets one)");
    s.send("/system You answer briefly.\r");
    s.wait_for("(the system text opens the conversation from the next turn)");
    s.wait_for("> ");
    s.send("Hi\r");
    let text = s.wait_for("ended: ");
    let (opening, turn) = (tokens("You answer briefly.\n\n"), tokens("User: Hi\nAssistant:"));
    assert_eq!(stats(&text), (0, opening + turn), "{text}");
    s.wait_for("> ");
    s.send("/stats\r");
    let before = s.wait_for("positions left)");
    let total: usize = before.split('(').nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    // A new system text replaces the opening: everything after it moved, so it is computed again.
    s.send("/system Be kind.\r");
    let moved = total - opening + tokens("Be kind.\n\n");
    s.wait_for(&format!("(the system text is set; the next turn computes {moved} positions again: they moved)"));
    s.send("/system\r");
    s.wait_for("(the system text: \"Be kind.\")");
    s.send("/stats\r");
    s.wait_for(&format!("({moved} tokens in the conversation, 0 with K/V cached"));
    s.wait_for("> ");
    // The shorter opening moved the turn: taking it back takes the whole conversation.
    s.send("/undo\r");
    s.wait_for(&format!("(took back the last turn: {moved} tokens; 0 tokens left)"));
    s.wait_for("> ");
    s.send("/quit\r");
    assert_eq!(s.exit_code(), Some(0));
}

#[test]
fn a_history_that_cannot_be_kept_is_said_and_the_chat_goes_on() {
    // The history's folder would have to be made inside a regular file.
    let m = fixture_dir().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let h = file.join("kvgpt/history").to_string_lossy().into_owned();
    let mut s = Session::start(&["--model", &m, "-n", "4", "--history", &h]);
    s.wait_for("warning: could not make ");
    s.wait_for("this session keeps no history");
    s.wait_for("> ");
    s.send("Hi\r");
    let text = s.wait_for("ended: ");
    assert_eq!(stats(&text), (0, tokens("User: Hi\nAssistant:")), "{text}");
    s.wait_for("> ");
    // Nor does a /save onto one of the model's files end it: refused, the file untouched.
    let config = fixture_dir().join("config.json");
    let before = std::fs::read(&config).unwrap();
    s.send(&format!("/save {}\r", config.display()));
    s.wait_for("is the model's config");
    s.wait_for("> ");
    s.send("/stats\r");
    s.wait_for("positions left)");
    s.send("/quit\r");
    assert_eq!(s.exit_code(), Some(0));
    assert_eq!(std::fs::read(&config).unwrap(), before);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a folder");
}

/// `chat --kv-disk`: a conversation computed once is found by the next session that says the
/// same (the directory `serve` and `generate` keep too): its first turn reuses all but its last
/// token, and the answer is still HF's.
#[test]
fn a_chat_starts_from_what_the_kv_disk_holds() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_string_lossy().into_owned();
    let t = &chat_reference()[0];
    let turn_len = t["turn_ids"].as_array().unwrap().len();
    for (run, want) in [("first", (0, turn_len)), ("second", (turn_len - 1, 1))] {
        let mut s = Session::start(&["--model", &m, "-n", "8", "--kv-disk", &d]);
        s.wait_for("> ");
        s.send(&format!("{}\n", t["line"].as_str().unwrap()));
        let text = s.wait_for("ended: ");
        let answer = t["answer_text"].as_str().unwrap();
        assert!(text.contains(&format!("{answer}\r\n")), "{run}: {answer:?} in {text:?}");
        assert_eq!(stats(&text), want, "{run} session: {text}");
        s.wait_for("> ");
        s.send("/quit\n");
        assert_eq!(s.exit_code(), Some(0));
    }
}

/// Typeahead is kept: two lines sent at once (typed while the session starts or an answer
/// streams), and a line ending in `\` sent with the next, are each read in order — the second
/// turn's answer is HF's for the same conversation, and the joined lines are one turn.
#[test]
fn lines_typed_ahead_are_read_in_order_not_lost() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let turns = chat_reference();
    let (first, second) = (turns[0]["line"].as_str().unwrap(), turns[1]["line"].as_str().unwrap());
    let mut s = Session::start(&["--model", &m, "-n", "8", "--no-history"]);
    s.send(&format!("{first}\r{second}\r"));
    for t in &turns[..2] {
        let text = s.wait_for("ended: ");
        let answer = t["answer_text"].as_str().unwrap();
        assert!(text.contains(&format!("{answer}\r\n")), "{answer:?} in {text:?}");
    }
    s.wait_for("> ");
    s.send("/reset\r");
    s.wait_for("> ");
    s.send("one \\\rtwo\r");
    let text = s.wait_for("ended: ");
    assert!(text.contains("… ") && text.contains("two"), "{text}");
    s.wait_for("> ");
    // One turn: taking it back leaves nothing.
    s.send("/undo\r");
    s.wait_for("tokens; 0 tokens left)");
    s.send("/quit\r");
    assert_eq!(s.exit_code(), Some(0));
}

/// The banner is broken at spaces to the terminal's width (60 columns here), not mid-word by the
/// terminal.
#[test]
fn the_banner_fits_the_terminal_without_breaking_words() {
    let m = fixture_dir().to_string_lossy().into_owned();
    let mut s = Session::start_sized(&["--model", &m, "--no-history"], Some(60));
    let text = s.wait_for("ends the session");
    let banner = &text[text.find("kvgpt chat:").unwrap()..];
    let lines: Vec<&str> = banner.split("\r\n").collect();
    assert!(lines.len() > 5 && lines.iter().all(|l| l.chars().count() <= 60), "{lines:#?}");
    assert!(lines.join(" ").contains("commands: /regen (answer the last turn again), /undo (take back"), "{lines:#?}");
    s.send("/quit\r");
    assert_eq!(s.exit_code(), Some(0));
}
