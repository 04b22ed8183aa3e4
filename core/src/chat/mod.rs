//! Chat: the plain template that turns messages into a GPT-2 prompt (the server's chat
//! endpoint, `kvgpt chat` and Python's `chat_template` share it), and a [`Chat`] conversation
//! that keeps its KV cache between turns.

mod conversation;

pub use conversation::{Chat, Ended, Turn};

/// Where a chat answer ends even without a stop of the client's: the next turn's label.
pub const CHAT_STOP: &str = "\nUser:";

/// The message roles [`template`] takes.
pub const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

/// GPT-2 has no chat template of its own; this plain one (the server's, documented in README.md)
/// takes `(role, content)` messages: system (or developer) messages first, as paragraphs; then
/// `User: …` and `Assistant: …` lines; then `Assistant:` for the answer. Other roles are left out.
pub fn template<'a>(messages: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> String {
    let mut s = String::new();
    for (_, content) in messages.clone().filter(|(role, _)| *role == "system" || *role == "developer") {
        s.push_str(content.trim());
        s.push_str("\n\n");
    }
    for (role, content) in messages.filter(|(role, _)| *role == "user" || *role == "assistant") {
        s.push_str(if role == "user" { "User: " } else { "Assistant: " });
        s.push_str(content.trim());
        s.push('\n');
    }
    s.push_str("Assistant:");
    s
}
