//! The names a server answers to: the guard against DNS rebinding for a loopback server.

use axum::extract::Request as HttpRequest;

/// Which `Host` (and `Origin`) names the server answers: a server on loopback answers only
/// loopback names unless told otherwise, so a web page whose name was rebound to 127.0.0.1
/// cannot reach it from a browser (DNS rebinding).
#[derive(Clone, Debug)]
pub enum Hosts {
    Any,
    Only(Vec<Name>),
}

/// One allowed name: exactly it, or (`*.example.com`) any name under it.
#[derive(Clone, Debug, PartialEq)]
pub enum Name {
    Exact(String),
    Under(String),
}

impl Name {
    /// An `--allowed-host` value: a host name or IP address, on any port, or `*.NAME`; a port, a
    /// scheme, a path or another wildcard is refused, saying what to give instead.
    fn parse(value: &str) -> Result<Name, String> {
        let v = value.trim().to_ascii_lowercase();
        let alone = |what: &str, name: &str| {
            format!("--allowed-host `{value}` {what}; give the host name alone (--allowed-host {name}), which is answered on any port")
        };
        if let Some((_, rest)) = v.split_once("://") {
            return Err(alone("is a URL", rest.split(['/', ':']).next().unwrap_or("")));
        }
        if v.contains('/') {
            return Err(alone("holds a path", v.split('/').next().unwrap_or("")));
        }
        let bare = v.trim_matches(['[', ']']);
        if bare.parse::<std::net::Ipv6Addr>().is_ok() {
            return Ok(Name::Exact(bare.to_string()));
        }
        if let Some((name, _)) = v.rsplit_once(':') {
            return Err(alone("names a port", name));
        }
        let (under, name) = match v.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, v.as_str()),
        };
        let label_ok =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name.split('.').all(label_ok) {
            return Err(format!(
                "--allowed-host `{value}` is not a host name or an IP address (letters, digits, `-` and `_` \
                 between dots; `*.NAME` for every name under NAME; `*` for any)"
            ));
        }
        Ok(if under { Name::Under(name.to_string()) } else { Name::Exact(name.to_string()) })
    }

    fn matches(&self, host: &str) -> bool {
        match self {
            Name::Exact(n) => host == n,
            Name::Under(n) => host.strip_suffix(n.as_str()).is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        }
    }
}

impl Hosts {
    /// The names allowed for a server bound to `bind`, plus `extra` (each value may list several,
    /// separated by commas; `*`: any), or why a value can never match a `Host` header.
    pub fn new(bind: &str, extra: &[String]) -> Result<Hosts, String> {
        let values: Vec<&str> = extra.iter().flat_map(|v| v.split(',')).collect();
        if values.iter().any(|h| h.trim() == "*") {
            return Ok(Hosts::Any);
        }
        let mut names = values.into_iter().map(Name::parse).collect::<Result<Vec<_>, _>>()?;
        let loopback = bind == "localhost"
            || bind.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if !loopback && names.is_empty() {
            return Ok(Hosts::Any); // bound to other interfaces: the names it is reached by are unknown
        }
        if loopback {
            names.extend(["localhost", "127.0.0.1", "::1"].map(|n| Name::Exact(n.into())));
        }
        Ok(Hosts::Only(names))
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            Hosts::Any => true,
            Hosts::Only(names) => {
                let host = strip_port(host).to_ascii_lowercase();
                names.iter().any(|n| n.matches(&host))
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
