//! huggingface_hub's environment, read as its `constants.py` reads it, into a [`Locate`].
//!
//! Honoured: `HF_ENDPOINT` (a mirror's base URL; a trailing `/` dropped), `HF_HUB_CACHE` (else
//! the legacy `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`), `HF_HOME` (else
//! `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`), `HF_HUB_OFFLINE` (else
//! `TRANSFORMERS_OFFLINE`), `HF_TOKEN` (else the legacy `HUGGING_FACE_HUB_TOKEN`, else the file
//! `HF_TOKEN_PATH`, else `$HF_HOME/token`), `HF_HUB_DISABLE_IMPLICIT_TOKEN` (send no token),
//! `HF_HUB_DISABLE_PROGRESS_BARS` and `HF_HUB_USER_AGENT_ORIGIN`. A true value is 1, ON, YES or
//! TRUE in any case; an empty value counts as unset; a leading `~` in a path is the home folder.

use super::Locate;
use std::path::PathBuf;

impl Locate {
    /// Reads huggingface_hub's environment (see the module's list); offline when `offline` or
    /// the environment says so. The one place kvgpt reads the environment for the Hub.
    pub fn from_env(offline: bool) -> Locate {
        Locate::from_vars(offline, |k| std::env::var(k).ok())
    }

    /// As [`Locate::from_env`], each variable looked up with `var`.
    pub fn from_vars(offline: bool, var: impl Fn(&str) -> Option<String>) -> Locate {
        let var = |k: &str| var(k).filter(|v| !v.is_empty());
        let truthy = |v: Option<String>| {
            v.is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
        };
        let home = var("HOME").or_else(|| var("USERPROFILE")).map(PathBuf::from).or_else(std::env::home_dir);
        let path = |v: String| match (v.strip_prefix('~'), &home) {
            (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with(['/', '\\']) => {
                home.join(rest.trim_start_matches(['/', '\\']))
            }
            _ => PathBuf::from(v),
        };
        let hf_home = var("HF_HOME").map(path).unwrap_or_else(|| {
            let cache =
                var("XDG_CACHE_HOME").map(path).unwrap_or_else(|| home.clone().unwrap_or_default().join(".cache"));
            cache.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")).map(path);
        let clean = |t: String| Some(t.trim().to_string()).filter(|t| !t.is_empty());
        let token = if truthy(var("HF_HUB_DISABLE_IMPLICIT_TOKEN")) {
            None
        } else {
            var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")).and_then(clean).or_else(|| {
                let file = var("HF_TOKEN_PATH").map(path).unwrap_or_else(|| hf_home.join("token"));
                std::fs::read_to_string(file).ok().and_then(clean)
            })
        };
        Locate {
            offline: offline || truthy(var("HF_HUB_OFFLINE").or_else(|| var("TRANSFORMERS_OFFLINE"))),
            cache_dir: cache_dir.unwrap_or_else(|| hf_home.join("hub")),
            endpoint: var("HF_ENDPOINT").map(|e| e.trim_end_matches('/').to_string()),
            token,
            progress: !truthy(var("HF_HUB_DISABLE_PROGRESS_BARS")),
            user_agent_origin: var("HF_HUB_USER_AGENT_ORIGIN"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn locate(vars: &[(&str, &str)]) -> Locate {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Locate::from_vars(false, |k| map.get(k).cloned())
    }

    #[test]
    fn the_endpoint_is_hf_endpoint_without_its_trailing_slash_and_else_the_public_hub() {
        assert_eq!(
            locate(&[("HF_ENDPOINT", "http://mirror.internal:8080/")]).endpoint.as_deref(),
            Some("http://mirror.internal:8080")
        );
        assert_eq!(
            locate(&[("HF_ENDPOINT", "https://hf-mirror.example/base")]).endpoint.as_deref(),
            Some("https://hf-mirror.example/base")
        );
        // Unset or empty: hf-hub's own default, whose URLs are the public Hub's (no network here).
        for vars in [&[][..], &[("HF_ENDPOINT", "")][..]] {
            let loc = locate(vars);
            assert_eq!(loc.endpoint, None);
            let url = loc.api().unwrap().model("someone/tiny-gpt2".into()).url("config.json");
            let default = hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new("/nowhere".into()))
                .build()
                .unwrap()
                .model("someone/tiny-gpt2".into())
                .url("config.json");
            assert_eq!(url, default);
            assert!(
                url.starts_with("https://") && url.ends_with("/someone/tiny-gpt2/resolve/main/config.json"),
                "{url}"
            );
        }
        let url = locate(&[("HF_ENDPOINT", "http://127.0.0.1:9/")]).api().unwrap().model("a/b".into()).url("f.json");
        assert_eq!(url, "http://127.0.0.1:9/a/b/resolve/main/f.json");
        let err = locate(&[("HF_ENDPOINT", "mirror.internal")]).api().unwrap_err().to_string();
        assert!(err.contains("HF_ENDPOINT") && err.contains("mirror.internal") && err.contains("http"), "{err}");
    }

    #[test]
    fn the_cache_folder_as_huggingface_hub_finds_it() {
        let cache = |vars: &[(&str, &str)]| locate(vars).cache_dir;
        assert_eq!(cache(&[("HOME", "/home/u")]), PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(cache(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x")]), PathBuf::from("/x/huggingface/hub"));
        assert_eq!(
            cache(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/x"), ("HF_HOME", "~/hf")]),
            PathBuf::from("/home/u/hf/hub")
        );
        let legacy = [("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/legacy")];
        assert_eq!(cache(&legacy), PathBuf::from("/legacy"));
        assert_eq!(cache(&[legacy[0], legacy[1], ("HF_HUB_CACHE", "/c")]), PathBuf::from("/c"));
        assert_eq!(cache(&[("HF_HOME", "/hf"), ("HF_HUB_CACHE", "")]), PathBuf::from("/hf/hub"));
    }

    #[test]
    fn the_token_from_hf_token_else_the_token_file_and_none_when_implicit_tokens_are_off() {
        let home = tempfile::tempdir().unwrap();
        let hf_home = home.path().display().to_string();
        let token = |vars: &[(&str, &str)]| {
            let mut all = vec![("HF_HOME", hf_home.as_str())];
            all.extend_from_slice(vars);
            locate(&all).token
        };
        assert_eq!(token(&[]), None);
        std::fs::write(home.path().join("token"), "  hf_file\n").unwrap();
        assert_eq!(token(&[]).as_deref(), Some("hf_file"));
        let other = home.path().join("other");
        std::fs::write(&other, "hf_other").unwrap();
        let other = other.display().to_string();
        assert_eq!(token(&[("HF_TOKEN_PATH", &other)]).as_deref(), Some("hf_other"));
        assert_eq!(token(&[("HUGGING_FACE_HUB_TOKEN", "hf_legacy")]).as_deref(), Some("hf_legacy"));
        assert_eq!(
            token(&[("HUGGING_FACE_HUB_TOKEN", "hf_legacy"), ("HF_TOKEN", "hf_env\n")]).as_deref(),
            Some("hf_env")
        );
        assert_eq!(token(&[("HF_TOKEN", "hf_env"), ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")]), None);
        // Never in a debug print.
        let loc = locate(&[("HF_TOKEN", "hf_secret")]);
        assert!(!format!("{loc:?}").contains("hf_secret"));
    }

    #[test]
    fn offline_progress_and_user_agent_switches() {
        for v in ["1", "true", "YES", "On"] {
            assert!(locate(&[("HF_HUB_OFFLINE", v)]).offline, "{v}");
            assert!(locate(&[("TRANSFORMERS_OFFLINE", v)]).offline, "{v}");
            assert!(!locate(&[("HF_HUB_DISABLE_PROGRESS_BARS", v)]).progress, "{v}");
        }
        for v in ["0", "false", "no", ""] {
            assert!(!locate(&[("HF_HUB_OFFLINE", v)]).offline, "{v}");
            assert!(locate(&[("HF_HUB_DISABLE_PROGRESS_BARS", v)]).progress, "{v}");
        }
        // As huggingface_hub: HF_HUB_OFFLINE, when set, decides over TRANSFORMERS_OFFLINE.
        assert!(!locate(&[("HF_HUB_OFFLINE", "0"), ("TRANSFORMERS_OFFLINE", "1")]).offline);
        assert!(Locate::from_vars(true, |_| None).offline);
        assert_eq!(locate(&[("HF_HUB_USER_AGENT_ORIGIN", "acme")]).user_agent_origin.as_deref(), Some("acme"));
    }
}
