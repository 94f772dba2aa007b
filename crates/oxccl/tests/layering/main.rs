//! The layers of `crates/oxccl/src` call only downward (ARCHITECTURE.md draws them).
//!
//! Every top-level module sits in one layer; its code may name (`crate::x`) modules of lower
//! layers, and modules of its own layer only where [`SAME_LAYER`] allows it. Test modules
//! (`#[cfg(test)] mod tests`, `tests.rs`, `*_tests.rs`) and comments (doc links included) are not code
//! of the layer and are skipped. A new top-level module must be placed in [`LAYERS`] first.
//!
//! Why a source test rather than separate crates: the layers share private items (the
//! engines' `pub(crate)` helpers, the vocabulary's internals) that separate crates would
//! have to publish, which is the opposite of the narrow public surface we want; and a
//! grep over `crate::` paths catches exactly the mistake we fear (a backend reaching up to
//! the front door) with a message that names the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod graph;
mod source;

/// Top-level modules by layer, bottom (0) to top.
const LAYERS: &[(&str, &[&str])] = &[
    ("vocabulary", &["error", "dtype", "reduce_op", "device", "algorithm", "fingerprint", "sync", "clock", "config"]),
    ("shared below the backends", &["backend", "bootstrap", "pinned", "topology"]),
    ("backends", &["cpu", "mpi", "xccl"]),
    ("observability", &["perf"]),
    ("front door", &["communicator", "tensor", "mesh", "tuning"]),
    ("construction", &["init", "testing", "info"]),
];

/// Same-layer references that are allowed: (from, to).
const SAME_LAYER: &[(&str, &str)] = &[
    // The vocabulary's types refer to each other (an error carries fingerprints, a
    // fingerprint names its dtype, op and algorithm; every file returns errors).
    ("dtype", "error"),
    ("reduce_op", "error"),
    ("reduce_op", "dtype"),
    ("algorithm", "error"),
    ("algorithm", "fingerprint"),
    ("fingerprint", "error"),
    ("fingerprint", "dtype"),
    ("fingerprint", "reduce_op"),
    ("fingerprint", "algorithm"),
    ("error", "fingerprint"),
    ("config", "error"),
    ("config", "algorithm"),
    ("config", "fingerprint"),
    ("device", "error"),
    // Tensors and meshes are views over communicators.
    ("tensor", "communicator"),
    ("mesh", "communicator"),
    // The GPU backends run their host side (bootstrap, fingerprint checks, point-to-point
    // envelopes, liveness) over a cpu communicator, as torch runs gloo beside nccl.
    ("xccl", "cpu"),
    // The pinned pool's memlock error quotes the host's limit as the topology reads it.
    ("pinned", "topology"),
    // Staging device buffers (backend/staging.rs) leases its host temporaries from the pool.
    ("backend", "pinned"),
    // A backend may be made through a caller's store (`BackendFactory::create_rendezvous`
    // takes the bootstrap's `Rendezvous`).
    ("backend", "bootstrap"),
    // The doctor reports what `init` would choose from (each backend's availability).
    ("info", "init"),
];

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS.iter().enumerate().find_map(|(i, (name, mods))| mods.contains(&module).then_some((i, *name)))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without its test module.
fn code_of(text: &str) -> String {
    // The test module: `#[cfg(test)]` then a line declaring `mod tests` (maybe `pub(crate)`).
    let cut = text.match_indices("#[cfg(test)]\n").map(|(i, m)| (i, i + m.len())).find(|&(_, after)| {
        let next = text[after..].lines().next().unwrap_or("");
        next.trim_start().trim_start_matches("pub(crate) ").starts_with("mod tests")
    });
    let text = match cut {
        Some((i, _)) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal is rare in this crate; URLs live in comments.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::` paths in `code`.
fn named_modules(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `oxccl_crate::`, ...
        }
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            // `crate::{a, b}`: every name in the braces.
            if let Some(inner) = rest.strip_prefix('{') {
                let end = inner.find('}').unwrap_or(inner.len());
                for item in inner[..end].split(',') {
                    let n: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !n.is_empty() {
                        out.push(n);
                    }
                }
            }
        } else {
            out.push(name);
        }
    }
    out
}

#[test]
fn layers_call_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<(String, String), usize> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if parts.last().is_some_and(|f| f == "tests.rs" || f.ends_with("_tests.rs")) {
            continue;
        }
        let from = if parts.len() == 1 { parts[0].trim_end_matches(".rs").to_string() } else { parts[0].clone() };
        if from == "lib" {
            continue; // the crate root re-exports every layer
        }
        let Some((from_layer, _)) = layer_of(&from) else {
            problems.push(format!("{}: top-level module `{from}` is in no layer; add it to LAYERS", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        for to in named_modules(&code_of(&text)) {
            if to == from {
                continue;
            }
            // Names re-exported at the crate root (`crate::Error`, `crate::Communicator`)
            // count as the module that defines them.
            let to = match to.as_str() {
                "Error" | "Result" => "error".to_string(),
                "DType" | "Element" => "dtype".to_string(),
                "ReduceOp" => "reduce_op".to_string(),
                "Device" => "device".to_string(),
                "Algorithm" => "algorithm".to_string(),
                "Fingerprint" | "OpKind" => "fingerprint".to_string(),
                "Config" => "config".to_string(),
                "Communicator" | "Batch" | "Work" | "Scope" | "work" => "communicator".to_string(),
                "Tensor" => "tensor".to_string(),
                "DeviceMesh" => "mesh".to_string(),
                "MessageInfo" => "backend".to_string(),
                "local" | "select" => "init".to_string(),
                "bf16" | "f16" => continue,
                other => other.to_string(),
            };
            let Some((to_layer, to_name)) = layer_of(&to) else {
                problems.push(format!("{}: names `crate::{to}`, which is in no layer", rel.display()));
                continue;
            };
            *edges.entry((from.clone(), to.clone())).or_default() += 1;
            let allowed =
                to_layer < from_layer || (to_layer == from_layer && SAME_LAYER.contains(&(from.as_str(), to.as_str())));
            if !allowed {
                let (_, from_name) = layer_of(&from).expect("placed above");
                problems.push(format!(
                    "{}: `{from}` ({from_name}) names `crate::{to}` ({to_name}): layers call only downward",
                    rel.display()
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "layering violations:\n{}", problems.join("\n"));
    // The test must see the references it rules on.
    assert!(edges.contains_key(&("cpu".into(), "backend".into())), "{edges:?}");
    assert!(edges.contains_key(&("communicator".into(), "backend".into())), "{edges:?}");
}

#[test]
fn the_scanner_sees_paths_braces_and_skips_comments_and_tests() {
    let code = code_of(
        "use crate::backend::Op;\nuse crate::{error::Error, dtype};\n// crate::communicator\n\
         let x = $crate::cpu; /// [`C`](crate::Communicator)\n#[cfg(test)]\nmod tests { use crate::init; }",
    );
    assert_eq!(named_modules(&code), vec!["backend", "error", "dtype"]);
}

/// The repository's text files (sources, scripts, docs, manifests) below `dir`, without
/// build outputs, caches and hidden folders.
fn repo_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the repository is readable") {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            let skipped = ["target", "gpu-bin", "gpu-check-out", "__pycache__", "node_modules"];
            if !name.starts_with('.') && !skipped.contains(&name) {
                repo_files(&path, out);
            }
        } else if ["rs", "md", "sh", "py", "toml", "c", "cu", "awk", "txt"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
            || name == "run"
        {
            out.push(path);
        }
    }
}

/// The repository stands alone: no file points outside it to the workplace's shared notes
/// folder beside it (what a GPU user needs is in docs/gpu.md).
#[test]
fn no_file_points_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    repo_files(&root, &mut files);
    files.push(root.join(".ci/run"));
    let needle = ["..", "/shared/"].concat();
    let bad: Vec<String> = files
        .iter()
        .filter(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(&needle)))
        .map(|p| p.strip_prefix(&root).unwrap_or(p).display().to_string())
        .collect();
    assert!(files.len() > 100, "the scan sees the repository ({} files)", files.len());
    assert!(bad.is_empty(), "files that point to {needle}: {bad:?}");
}

#[test]
fn dump_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (src, file) in [("crates/oxccl/src", "lib.rs"), ("crates/oxccl-cli/src", "main.rs"), ("crates/oxccl-conformance/src", "lib.rs")] {
        let c = graph::Crate::read(&root.join(src), file);
        let edges = c.edges();
        println!("{src}: {} files, {} with edges", c.files().count(), edges.len());
        for scc in graph::cycles(&edges) {
            println!("CYCLE {}", scc.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "));
            for a in &scc { for b in &scc { if let Some(e) = edges.get(a).and_then(|m| m.get(b)) {
                println!("   {} -> {} : {}:{}", a.display(), b.display(), e.line, e.path);
            }}}
        }
        for (f, l, p) in c.paths_through_root_reexports() { println!("ROOT {}:{l} {p}", f.display()); }
    }
}
