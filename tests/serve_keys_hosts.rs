//! Keys and host names that could never match (issue #33 item 8). On e3c743f `KVGPT_API_KEY=""`,
//! `"   "`, `--api-key ''` and a non-ASCII key started a server that answered 401 to everything,
//! and `--allowed-host` values such as `evil.com:8080` or `http://site.com` started one on which
//! that host still got 403. Now one rule refuses such keys at start, wherever they come from; a
//! host value is honoured (`a.com,b.com`, `*.evil.com`) or refused at start saying what to give.

mod common;

use common::server::*;
use common::*;

/// `kvgpt serve` with `args` and `env`, which must refuse to start.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let m = model();
    let out = kvgpt_within(&[&["serve", "--model", &m, "--port", "0"], args].concat(), env, "");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {err}");
    assert!(!err.contains("listening on"), "refused before it listens: {err}");
    err
}

#[test]
fn keys_that_can_never_match_are_refused_wherever_they_come_from() {
    let dir = tempfile::tempdir().unwrap();
    let spaces = dir.path().join("spaces");
    std::fs::write(&spaces, "   \n").unwrap();
    let s = spaces.display().to_string();
    let says = "the API key (--api-key, KVGPT_API_KEY or the first line of --api-key-file)";
    for (args, env, why) in [
        (vec![], vec![("KVGPT_API_KEY", "")], "is empty"),
        (vec![], vec![("KVGPT_API_KEY", "   ")], "holds white space"),
        (vec!["--api-key", ""], vec![], "is empty"),
        (vec!["--api-key", "two words"], vec![], "holds white space"),
        (vec!["--api-key-file", s.as_str()], vec![], "is empty"),
        (vec!["--api-key", "clé"], vec![], "holds 'é', which is not printable ASCII"),
    ] {
        let err = refused(&args, &env);
        assert!(err.contains(&format!("{says} {why}")), "{args:?} {env:?}: {err}");
    }
}

#[test]
fn host_values_that_can_never_match_are_refused_at_start() {
    for (value, says) in [
        ("evil.com:8080", "names a port; give the host name alone (--allowed-host evil.com)"),
        ("http://site.com", "is a URL; give the host name alone (--allowed-host site.com)"),
        ("site.com/", "holds a path; give the host name alone (--allowed-host site.com)"),
        ("a*.com", "is not a host name or an IP address"),
        ("", "is not a host name or an IP address"),
    ] {
        let err = refused(&["--allowed-host", value], &[]);
        assert!(err.contains(&format!("--allowed-host `{value}` {says}")), "{value}: {err}");
    }
}

/// (status of GET /v1/models with `Host: host`) on the server at `base`.
fn status_for(base: &str, host: &str) -> u16 {
    raw(base, &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\n"), "").0
}

#[test]
fn lists_and_wildcards_are_honoured() {
    let s =
        Server::start(&["--allowed-host", "a.com, b.com", "--allowed-host", "*.evil.com", "--allowed-host", "[::2]"]);
    for host in ["a.com", "b.com:8080", "x.evil.com", "deep.x.evil.com:1", "localhost", "[::2]:80", "A.COM"] {
        assert_eq!(status_for(&s.base, host), 200, "{host} is allowed");
    }
    for host in ["evil.com", "xevil.com", "c.com", "a.com.evil.org", "[::3]"] {
        assert_eq!(status_for(&s.base, host), 403, "{host} is not");
    }
}
