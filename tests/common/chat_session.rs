//! `kvgpt chat` on a pseudo-terminal (util-linux `script` runs it on one, as a user's shell would),
//! for the chat's tests.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `kvgpt chat` on a pseudo-terminal, and everything it has written so far.
pub struct Session {
    /// The session's `XDG_STATE_HOME`, where its input history goes unless --history says.
    _state: tempfile::TempDir,
    child: Child,
    stdin: ChildStdin,
    pub out: Arc<Mutex<Vec<u8>>>,
    /// How much of `out` earlier waits consumed.
    pub seen: usize,
}

impl Session {
    pub fn start(args: &[&str]) -> Session {
        Session::start_sized(args, None)
    }

    /// [`Session::start`] on a terminal `columns` wide.
    pub fn start_sized(args: &[&str], columns: Option<u16>) -> Session {
        // `exec`: the shell `script` starts must not stay as kvgpt's parent in the terminal's
        // process group, where a Ctrl-C would kill it (dash, CI's /bin/sh, does not exec by itself).
        let size = columns.map_or(String::new(), |c| format!("stty rows 40 cols {c}; "));
        let mut cmd = vec![format!("{size}exec"), env!("CARGO_BIN_EXE_kvgpt").to_string(), "chat".into()];
        cmd.extend(args.iter().map(|a| format!("'{a}'")));
        let state = tempfile::tempdir().unwrap();
        let mut child = Command::new("script")
            .args(["-qfec", &cmd.join(" "), "/dev/null"])
            .env("XDG_STATE_HOME", state.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux `script` runs a command on a pseudo-terminal");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Session { _state: state, child, stdin, out, seen: 0 }
    }

    /// Waits until the output after what was seen holds `what`; returns the text up to its end.
    pub fn wait_for(&mut self, what: &str) -> String {
        let start = Instant::now();
        loop {
            let text = String::from_utf8_lossy(&self.out.lock().unwrap()[self.seen..]).into_owned();
            if let Some(at) = text.find(what) {
                self.seen += at + what.len();
                return text[..at + what.len()].to_string();
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no {what:?} in {text:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn send(&mut self, text: &str) {
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn exit_code(mut self) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(start.elapsed() < Duration::from_secs(30), "the session did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
