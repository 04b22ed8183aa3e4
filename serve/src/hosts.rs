//! The names a server answers to: the guard against DNS rebinding for a loopback server.

use axum::extract::Request as HttpRequest;

/// Which `Host` (and `Origin`) names the server answers: a server on loopback answers only
/// loopback names unless told otherwise, so a web page whose name was rebound to 127.0.0.1
/// cannot reach it from a browser (DNS rebinding).
#[derive(Clone, Debug)]
pub enum Hosts {
    Any,
    Only(Vec<String>),
}

impl Hosts {
    /// The names allowed for a server bound to `bind`, plus `extra` (`*`: any).
    pub fn new(bind: &str, extra: &[String]) -> Hosts {
        if extra.iter().any(|h| h == "*") {
            return Hosts::Any;
        }
        let loopback = bind == "localhost"
            || bind.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback && extra.is_empty() {
            return Hosts::Any; // bound to other interfaces: the names it is reached by are unknown
        }
        let mut names: Vec<String> = extra.iter().map(|h| h.to_ascii_lowercase()).collect();
        if loopback {
            names.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
        }
        Hosts::Only(names)
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            Hosts::Any => true,
            Hosts::Only(names) => {
                let name = strip_port(host).to_ascii_lowercase();
                names.contains(&name)
            }
        }
    }

    /// The header that names a host this server does not answer, if any.
    pub fn refused(&self, req: &HttpRequest) -> Option<(&'static str, String)> {
        let header = |h: &str| req.headers().get(h).map(|v| v.to_str().unwrap_or("(not text)").to_string());
        if let Some(host) = header("host").filter(|h| !self.allows(h)) {
            return Some(("Host", host));
        }
        let origin = header("origin")?;
        let host = origin.split_once("://").map_or("", |(_, rest)| rest);
        (!self.allows(host)).then_some(("Origin", origin))
    }
}

/// `name:port` → `name`, `[::1]:8080` → `::1`.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}
