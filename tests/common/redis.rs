//! A real Redis server (Debian's `redis-server`) on loopback for the shared K/V tier's tests:
//! no persistence, a free port, killed when dropped. Without `redis-server` these tests print
//! SKIPPED, unless `KVGPT_REQUIRE_REDIS=1` (`.ci/run` sets it and installs the server).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Redis {
    /// A server on a free port, or None (the test skips) when there is no `redis-server`.
    pub fn start() -> Option<Redis> {
        let installed = Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success());
        if !installed {
            assert!(
                std::env::var("KVGPT_REQUIRE_REDIS").as_deref() != Ok("1"),
                "KVGPT_REQUIRE_REDIS=1 but there is no redis-server (apt-get install redis-server)"
            );
            eprintln!("SKIPPED: no redis-server on this machine (apt-get install redis-server)");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Some(Redis::start_on(port))
    }

    /// A server on `port` (a restart of one that was stopped there).
    pub fn start_on(port: u16) -> Redis {
        Redis::start_with(port, &[])
    }

    /// A server on a free port with these extra settings (e.g. `--maxmemory 1mb`); None as
    /// [`Redis::start`].
    pub fn start_configured(extra: &[&str]) -> Option<Redis> {
        let port = Redis::start()?.port; // checks the server exists; stopped when dropped here
        std::thread::sleep(Duration::from_millis(100));
        Some(Redis::start_with(port, extra))
    }

    fn start_with(port: u16, extra: &[&str]) -> Redis {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { child, port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Keys the server holds (`redis-cli DBSIZE`).
    pub fn keys(&self) -> usize {
        self.keys_as(&[])
    }

    /// Keys the server holds, asked with these `redis-cli` options (a password, a database).
    #[allow(dead_code)] // not every test binary signs in
    pub fn keys_as(&self, options: &[&str]) -> usize {
        let out = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(options).arg("DBSIZE").output();
        let out = out.unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Stops the server (SIGSTOP) or lets it go on (SIGCONT): a Redis that hangs, its
    /// connections open and unanswered.
    #[allow(dead_code)] // not every test binary hangs one
    pub fn hang(&self, hung: bool) {
        let signal = if hung { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal}");
    }

    /// Kills the server at once, as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
