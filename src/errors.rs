//! How a failed command reports: the exit status of a closed pipe, and what the user can do about
//! a library error, in terms of the command's own flags.

/// The exit status of a process that a closed pipe ended (128 + SIGPIPE), as the shell reports
/// for Unix tools: `kvgpt … | head` stops quietly with it.
pub const BROKEN_PIPE_EXIT: u8 = 141;

/// Did the reader of stdout (or stderr) go away?
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// What the user can do about a library error, in terms of this command's flags.
pub fn hint(e: &anyhow::Error, flag: Option<&str>) -> Option<String> {
    match e.downcast_ref::<kvgpt_core::Error>()? {
        kvgpt_core::Error::ContextOverflow { room, .. } if *room > 0 => match flag {
            Some(flag) => Some(format!("shorten the prompt or lower {flag} to at most {room}")),
            None => Some("shorten the prompt".into()),
        },
        kvgpt_core::Error::ContextOverflow { n_positions, .. } => {
            Some(format!("shorten the prompt to at most {n_positions} tokens"))
        }
        kvgpt_core::Error::NotCached { .. } => Some(format!(
            "run once without --offline (and HF_HUB_OFFLINE unset), or pass --model /path/to/folder{}",
            bundled_model_hint()
        )),
        kvgpt_core::Error::HubFetch { .. } | kvgpt_core::Error::NotAModel { .. } => Some(format!(
            "pass a local folder with --model /path/to/folder (config.json, model.safetensors, tokenizer.json){}",
            bundled_model_hint()
        )),
        kvgpt_core::Error::WhichTensor { .. } => Some("name it with --tensor NAME".into()),
        _ => None,
    }
}

/// The small model bundled with the source (random weights, the real tokenizer), as a way to try
/// every command without the Hub: named relative to the working directory when it is there,
/// else by the source folder's path when that still exists.
fn bundled_model_hint() -> String {
    const REL: &str = "tests/fixtures/tiny-gpt2";
    let abs = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-gpt2");
    let path = if std::path::Path::new(REL).join("config.json").is_file() {
        REL
    } else if std::path::Path::new(abs).join("config.json").is_file() {
        abs
    } else {
        return String::new();
    };
    format!("; to try every command now, use the small bundled model: --model {path} (random weights, the real GPT-2 tokenizer)")
}
