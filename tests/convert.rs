//! `kvgpt convert` against llama.cpp's own files of the fixture (`scripts/fixtures/make_fixture_gguf.sh`):
//! its converter's f32, f16 and q8_0 GGUFs byte for byte, and `llama-quantize --pure`'s q4_0, q4_1,
//! q5_0 and q5_1 as kvgpt runs them (python/tests/test_convert.py compares those tensor by tensor
//! and field by field with gguf-py). Bad requests are refused and leave no file behind.

mod common;

use common::*;
use kvgpt_core::Model;
use std::path::Path;
use std::process::{Command, Output};

fn kvgpt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgpt")).args(args).output().unwrap()
}

fn convert(src: &Path, out: &Path, ty: &str) -> Output {
    let out = kvgpt(&["convert", src.to_str().unwrap(), out.to_str().unwrap(), "--type", ty, "--name", "Model"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn load(path: &Path) -> Model {
    let files = kvgpt_core::Locate::from_env(true).resolve(path.to_str().unwrap()).unwrap();
    kvgpt_core::load_holding(&files, None).unwrap().model
}

/// With the converter's name for the folder it was given, the file is the converter's, every byte.
#[test]
fn f32_f16_and_q8_0_are_llama_cpps_converter_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for ty in ["f32", "f16", "q8_0"] {
        let out = dir.path().join(format!("{ty}.gguf"));
        let said = String::from_utf8_lossy(&convert(&fixture_dir(), &out, ty).stdout).into_owned();
        let (mine, theirs) = (std::fs::read(&out).unwrap(), std::fs::read(gguf_fixture(ty)).unwrap());
        let first = mine.iter().zip(&theirs).position(|(a, b)| a != b);
        assert!(mine == theirs, "{ty}: {} bytes against {}, first difference at {first:?}", mine.len(), theirs.len());
        assert!(said.contains(&format!(" {ty})")) && said.contains("28 tensors: "), "{said}");
    }
}

/// The 4- and 5-bit files run as llama-quantize's do: the same weights held, the same logits.
#[test]
fn block_types_run_as_llama_quantizes_files_do() {
    let reference = Reference::load();
    let dir = tempfile::tempdir().unwrap();
    for ty in ["q4_0", "q4_1", "q5_0", "q5_1"] {
        let out = dir.path().join(format!("{ty}.gguf"));
        convert(&fixture_dir(), &out, ty);
        let (mine, theirs) = (load(&out), load(&gguf_fixture(ty)));
        assert_eq!(mine.weights_dtype(), ty);
        assert_eq!(mine.weight_bytes(), theirs.weight_bytes(), "{ty}: bytes held");
        assert_eq!(
            bits(&mine.h[1].c_fc.weight.unpack()),
            bits(&theirs.h[1].c_fc.weight.unpack()),
            "{ty}: h.1.mlp.c_fc"
        );
        for p in reference.prompts().iter().take(3) {
            assert_eq!(bits(&all_logits(&mine, &p.ids)), bits(&all_logits(&theirs, &p.ids)), "{ty} {}", p.key);
        }
    }
}

/// A GGUF converts too: an f32 one as its folder does; one of the type asked for keeps its blocks;
/// a block type into another is quantized again, and says so.
#[test]
fn a_gguf_converts_keeping_its_blocks_or_saying_it_quantizes_again() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    convert(&fixture_dir(), &p("from-folder.gguf"), "q4_0");
    convert(&gguf_fixture("f32"), &p("from-f32.gguf"), "q4_0");
    assert!(std::fs::read(p("from-folder.gguf")).unwrap() == std::fs::read(p("from-f32.gguf")).unwrap());
    // llama-quantize's q4_0 into q4_0: its blocks, not a second rounding.
    let out = convert(&gguf_fixture("q4_0"), &p("kept.gguf"), "q4_0");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("again"));
    let (kept, theirs) = (load(&p("kept.gguf")), load(&gguf_fixture("q4_0")));
    assert_eq!(bits(&kept.wte.column(17)), bits(&theirs.wte.column(17)));
    let out = convert(&gguf_fixture("q8_0"), &p("again.gguf"), "q4_0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: 9 tensors of ")
            && err.contains(
                "in another block type (blk.0.attn_qkv.weight as q8_0, …) are widened and quantized again as q4_0"
            ),
        "{err}"
    );
}

#[test]
fn bad_requests_are_refused_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let m = fixture_dir().to_string_lossy().into_owned();
    let err = |o: &Output| {
        assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stdout));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let out = dir.path().join("x.gguf").to_string_lossy().into_owned();
    let e = err(&kvgpt(&["convert", &m, &out, "--type", "q4_k"]));
    assert!(
        e.contains("one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, not q4_k") && e.contains("llama-quantize"),
        "{e}"
    );
    let e = String::from_utf8_lossy(&kvgpt(&["convert", &m, &out, "--type", "q3"]).stderr).into_owned();
    assert!(e.contains("`q3` is not a type; a GGUF is written as one of f32, f16"), "{e}");
    // The input is never the output, and keeps its bytes.
    let copy = dir.path().join("in.gguf");
    std::fs::copy(gguf_fixture("q4_0"), &copy).unwrap();
    let c = copy.to_string_lossy().into_owned();
    let e = err(&kvgpt(&["convert", &c, &c, "--type", "q8_0"]));
    assert!(e.contains("is the model's weights") && e.contains("choose another output file"), "{e}");
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(gguf_fixture("q4_0")).unwrap());
    // A folder that does not exist, or a folder as the output: said before any work.
    let missing = dir.path().join("no/such/dir/x.gguf").to_string_lossy().into_owned();
    let e = err(&kvgpt(&["convert", &m, &missing, "--type", "f16"]));
    assert!(e.contains("no/such/dir does not exist; make it first, or write x.gguf elsewhere"), "{e}");
    let folder = dir.path().to_string_lossy().into_owned();
    let e = err(&kvgpt(&["convert", &m, &folder, "--type", "f16"]));
    assert!(e.contains("is a folder; name the GGUF file to write"), "{e}");
    let e = err(&kvgpt(&["convert", &m, &out, "--type", "w8a8"]));
    assert!(e.contains("not w8a8 (it is kvgpt's own layout, which llama.cpp does not read)"), "{e}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("in.gguf")], "only the copied input is left");
}

/// llama.cpp's `llama-server` (from $KVGPT_LLAMA_SERVER, or on PATH; skipped, saying so, where the
/// machine has none) loads each converted file, tokenizes as Hugging Face does and continues a
/// prompt greedily with the text kvgpt gives from the same file.
#[test]
fn llama_cpp_loads_the_files_and_agrees_where_present() {
    let Some(server) =
        std::env::var_os("KVGPT_LLAMA_SERVER").map(std::path::PathBuf::from).or_else(|| on_path("llama-server"))
    else {
        println!(
            "skipped: no llama-server on PATH or in $KVGPT_LLAMA_SERVER (llama.cpp's; build its llama-server target)"
        );
        return;
    };
    let reference = Reference::load();
    let prompt = reference.prompts().into_iter().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for ty in ["f32", "q8_0", "q4_0"] {
        let file = dir.path().join(format!("{ty}.gguf"));
        convert(&fixture_dir(), &file, ty);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let _server = Kill(
            Command::new(&server)
                .args(["-m", file.to_str().unwrap(), "--port", &port.to_string(), "-t", "2", "-c", "128"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let base = format!("http://127.0.0.1:{port}");
        let post = |path: &str, body: serde_json::Value| -> serde_json::Value {
            for _ in 0..300 {
                if let Ok(r) = ureq::post(&format!("{base}{path}")).send_json(body.clone()) {
                    return r.into_json().unwrap();
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            panic!("llama-server did not answer {path} on {file:?}");
        };
        let ids = post("/tokenize", serde_json::json!({"content": prompt.text}));
        let body = serde_json::json!({"prompt": prompt.text, "n_predict": 8, "temperature": 0, "cache_prompt": false});
        let theirs = post("/completion", body)["content"].as_str().unwrap().to_string();
        let ids: Vec<u32> = serde_json::from_value(ids["tokens"].clone()).unwrap();
        assert_eq!(ids, prompt.ids, "{ty}: llama.cpp's tokens of {:?} against Hugging Face's", prompt.text);
        // f32 the whole way; a block type's activations are rounded to int8 by each engine in
        // its own order, so on this random model their greedy paths may part at a near tie
        // after the first tokens (q4_0 did at the third).
        let n = if ty == "f32" { "8" } else { "2" };
        let ours = kvgpt(&["generate", "-m", file.to_str().unwrap(), "-n", n, "--ignore-eos", "--json", &prompt.text]);
        let ours: serde_json::Value = serde_json::from_slice(&ours.stdout).unwrap();
        let ours: Vec<u32> = serde_json::from_value(ours["generated_ids"].clone()).unwrap();
        let theirs_ids: Vec<u32> =
            serde_json::from_value(post("/tokenize", serde_json::json!({"content": theirs}))["tokens"].clone())
                .unwrap();
        assert_eq!(ours[..], theirs_ids[..ours.len()], "{ty}: greedy continuations ({theirs:?} from llama.cpp)");
        println!("{ty}: llama-server read it; its greedy {theirs:?} starts with kvgpt's {n} tokens");
    }
}

fn on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// A child process killed when the test ends, passed or not.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Bytes of `n` elements of ggml type `ty` (F32, Q4_0, Q8_0: the types these files hold).
fn tensor_bytes(ty: u32, n: u64) -> usize {
    (match ty {
        0 => 4 * n,
        2 => n / 32 * 18,
        8 => n / 32 * 34,
        _ => panic!("type {ty}"),
    }) as usize
}

/// A GGUF of mixed block types, as llama-quantize writes without --pure (its tied token embedding
/// kept in a larger type): each tensor quantized again is counted in the note, not only the
/// file's main type; and the source's token types are kept, not rebuilt from its tokenizer.
#[test]
fn a_mixed_gguf_is_noted_per_tensor_and_keeps_its_token_types() {
    use common::gguf_edit::GgufFile;
    let (mut g, q8) = (GgufFile::read(&gguf_fixture("q4_0")), GgufFile::read(&gguf_fixture("q8_0")));
    let slice = |f: &GgufFile, name: &str| -> (u32, Vec<u8>) {
        let t = f.tensors.iter().find(|t| t.name == name).unwrap();
        let n = tensor_bytes(t.ty, t.dims.iter().product());
        (t.ty, f.data[t.offset as usize..t.offset as usize + n].to_vec())
    };
    let parts: Vec<(u32, Vec<u8>)> =
        g.tensors.iter().map(|t| slice(if t.name == "token_embd.weight" { &q8 } else { &g }, &t.name)).collect();
    g.data.clear();
    for (t, (ty, bytes)) in g.tensors.iter_mut().zip(parts) {
        (t.ty, t.offset) = (ty, g.data.len() as u64);
        g.data.extend(bytes);
        g.data.resize(g.data.len().next_multiple_of(32), 0);
    }
    // Token 100 made USER_DEFINED (4), 200 UNUSED (5): types a tokenizer.json would not give back.
    let types = g.get("tokenizer.ggml.token_type");
    for (id, ty) in [(100usize, 4i32), (200, 5)] {
        types.raw[12 + 4 * id..16 + 4 * id].copy_from_slice(&ty.to_le_bytes());
    }
    let edited_types = types.raw.clone();
    let dir = tempfile::tempdir().unwrap();
    let (mixed, out) = (dir.path().join("mixed.gguf"), dir.path().join("out.gguf"));
    g.write(&mixed);
    let said = convert(&mixed, &out, "q4_0");
    let err = String::from_utf8_lossy(&said.stderr);
    assert!(err.contains("note: 1 tensor of ") && err.contains("(token_embd.weight as q8_0) are widened"), "{err}");
    let mut written = GgufFile::read(&out);
    assert!(written.get("tokenizer.ggml.token_type").raw == edited_types, "the source's token types");
    assert_eq!(written.tensors.iter().filter(|t| t.ty == 2).count(), 9, "every matrix in q4_0");
}

/// Ctrl-C while the file is written stops the run with status 130 and leaves nothing behind.
#[test]
fn an_interrupted_run_leaves_nothing() {
    let (model, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let shape = random_model::Shape { n_embd: 512, n_layer: 2, n_head: 8, n_positions: 128, seed: 3, endless: false };
    random_model::write(model.path(), shape);
    let out = dir.path().join("big.gguf");
    let child = Command::new(env!("CARGO_BIN_EXE_kvgpt"))
        .args(["convert", model.path().to_str().unwrap(), out.to_str().unwrap(), "--type", "q4_0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The partial file is made after the handler is in place: signal once it is there.
    let t = std::time::Instant::now();
    while std::fs::read_dir(dir.path()).unwrap().next().is_none() {
        assert!(t.elapsed().as_secs() < 60, "no partial file appeared");
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{err}");
    assert!(err.contains("big.gguf was complete; nothing was written"), "{err}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left in the output's folder");
}
