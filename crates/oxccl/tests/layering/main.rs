//! The shape of the code, checked: layers that call only downward, no import circles, no
//! file too long to read, and a map (ARCHITECTURE.md) that names only what exists.
//!
//! * **Layers** (`crates/oxccl/src`): every top-level module sits in one layer; its code may
//!   depend on modules of lower layers, and on modules of its own layer only where
//!   [`SAME_LAYER`] allows it. A new top-level module must be placed in [`LAYERS`] first.
//! * **No circles**, in every crate of the workspace: no two files depend on each other,
//!   directly or through others (`super::` paths and a `mod.rs` that calls its children
//!   included; see [`graph`] for what a dependency is).
//! * Inside a crate, an item is named by its module (`crate::error::Error`), not through the
//!   crate root's re-export (`crate::Error`): the root is the front door, not a hallway.
//! * No source file is over [`MAX_LINES`] lines.
//!
//! Code under `#[cfg(test)]` (test modules, `tests.rs`) and comments (doc links included)
//! are not code of their layer and are skipped.
//!
//! Why a source test rather than separate crates: the layers share private items (the
//! engines' `pub(crate)` helpers, the vocabulary's internals) that separate crates would
//! have to publish, which is the opposite of the narrow public surface we want; and a
//! reading of the paths catches exactly the mistake we fear (a backend reaching up to the
//! front door) with a message that names the file and line.

use std::path::{Path, PathBuf};

use graph::Crate;

mod graph;
mod map;
mod source;

/// Top-level modules by layer, bottom (0) to top.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "error",
            "dtype",
            "reduce_op",
            "device",
            "algorithm",
            "op_kind",
            "fingerprint",
            "names",
            "sync",
            "clock",
            "config",
        ],
    ),
    ("shared below the backends", &["backend", "bootstrap", "staging", "topology"]),
    ("backends", &["cpu", "mpi", "xccl"]),
    ("observability", &["perf"]),
    ("front door", &["communicator", "tensor", "mesh", "tuning"]),
    ("construction", &["init", "testing", "info"]),
];

/// Same-layer references that are allowed: (from, to).
const SAME_LAYER: &[(&str, &str)] = &[
    // The vocabulary, bottom up: the kinds of operation; algorithms (which apply to which
    // kind); fingerprints (a kind, dtype, op and algorithm); errors (they carry fingerprints);
    // then what reports errors: parsing names, overriding algorithms, devices and settings.
    ("algorithm", "op_kind"),
    ("fingerprint", "op_kind"),
    ("fingerprint", "dtype"),
    ("fingerprint", "reduce_op"),
    ("fingerprint", "algorithm"),
    ("error", "op_kind"),
    ("error", "fingerprint"),
    ("algorithm", "error"),
    ("names", "algorithm"),
    ("names", "dtype"),
    ("names", "reduce_op"),
    ("names", "error"),
    ("device", "error"),
    ("config", "error"),
    ("config", "algorithm"),
    ("config", "op_kind"),
    // Tensors and meshes are views over communicators.
    ("tensor", "communicator"),
    ("mesh", "communicator"),
    // The GPU backends run their host side (bootstrap, fingerprint checks, point-to-point
    // envelopes, liveness) over a cpu communicator, as torch runs gloo beside nccl.
    ("xccl", "cpu"),
    // The pinned pool's memlock error (staging/pinned/) quotes the host's limit as the
    // topology reads it.
    ("staging", "topology"),
    // Staging rewrites an operation's buffers (backend's Op, RawBuf) and runs its chunks to a
    // backend's Completion.
    ("staging", "backend"),
    // A backend may be made through a caller's store (`BackendFactory::create_rendezvous`
    // takes the bootstrap's `Rendezvous`).
    ("backend", "bootstrap"),
    // The doctor reports what `init` would choose from (each backend's availability).
    ("info", "init"),
];

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS.iter().enumerate().find_map(|(i, (name, mods))| mods.contains(&module).then_some((i, *name)))
}

/// The longest a source file may be, in lines.
const MAX_LINES: usize = 1000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate target of the workspace (and the Python extension): `(src folder, root file)`.
const CRATES: &[(&str, &str)] = &[
    ("crates/oxccl/src", "lib.rs"),
    ("crates/oxccl-cli/src", "main.rs"),
    ("crates/oxccl-conformance/src", "lib.rs"),
    ("crates/oxccl-conformance/src", "bin/oxccl-conformance.rs"),
    ("crates/oxccl-conformance/src", "bin/oxccl-failure-probe.rs"),
    ("python/src", "lib.rs"),
];

fn library() -> Crate {
    Crate::read(&root().join("crates/oxccl/src"), "lib.rs")
}

/// The top-level module a file of the library belongs to (`None`: the crate root).
fn top_module(file: &Path) -> Option<String> {
    let first = file.iter().next()?.to_string_lossy().into_owned();
    (first != "lib.rs").then(|| first.trim_end_matches(".rs").to_string())
}

#[test]
fn layers_call_only_downward() {
    let lib = library();
    let mut problems = Vec::new();
    let mut seen = 0;
    let mut used: std::collections::BTreeSet<&(&str, &str)> = std::collections::BTreeSet::new();
    for file in lib.files() {
        let Some(m) = top_module(file) else { continue };
        if layer_of(&m).is_none() {
            problems.push(format!("{}: top-level module `{m}` is in no layer; add it to LAYERS", file.display()));
        }
    }
    for (from_file, targets) in lib.edges() {
        let Some(from) = top_module(&from_file) else { continue }; // the root re-exports every layer
        for (to_file, edge) in targets {
            let Some(to) = top_module(&to_file) else { continue };
            let (Some((from_layer, from_name)), Some((to_layer, to_name))) = (layer_of(&from), layer_of(&to)) else {
                continue;
            };
            seen += 1;
            let pair = SAME_LAYER.iter().find(|(a, b)| *a == from && *b == to);
            used.extend(pair);
            let allowed = from == to || to_layer < from_layer || (to_layer == from_layer && pair.is_some());
            if !allowed {
                problems.push(format!(
                    "{}:{}: `{from}` ({from_name}) names `{}` in `{to}` ({to_name}): layers call only downward",
                    from_file.display(),
                    edge.line,
                    edge.path
                ));
            }
        }
    }
    for pair in SAME_LAYER {
        if !used.contains(pair) {
            problems.push(format!("SAME_LAYER allows {pair:?}, which no file needs any more: remove it"));
        }
    }
    problems.sort();
    assert!(problems.is_empty(), "layering violations:\n{}", problems.join("\n"));
    assert!(seen > 500, "the test must see the dependencies it rules on ({seen})");
}

#[test]
fn no_file_level_import_cycles() {
    let (mut problems, mut files) = (Vec::new(), 0);
    for (src, root_file) in CRATES {
        let c = Crate::read(&root().join(src), root_file);
        files += c.files().count();
        let edges = c.edges();
        for cycle in graph::cycles(&edges) {
            let mut lines = vec![format!("{src}: a circle of {} files:", cycle.len())];
            for a in &cycle {
                for b in &cycle {
                    if let Some(e) = edges.get(a).and_then(|m| m.get(b)) {
                        lines.push(format!("  {}:{} names `{}` of {}", a.display(), e.line, e.path, b.display()));
                    }
                }
            }
            problems.push(lines.join("\n"));
        }
    }
    assert!(files > 250, "the test reads every crate ({files} files)");
    assert!(
        problems.is_empty(),
        "import circles (move what both sides use to a file below both, or merge the two halves):\n{}",
        problems.join("\n")
    );
}

#[test]
fn items_are_named_by_their_module_not_the_crate_root() {
    let mut problems = Vec::new();
    for (src, root_file) in CRATES {
        let c = Crate::read(&root().join(src), root_file);
        for (file, line, path) in c.paths_through_root_reexports() {
            problems.push(format!("{src}/{}:{line}: `{path}`", file.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "paths through the crate root's re-exports (name the module: `crate::error::Error`):\n{}",
        problems.join("\n")
    );
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable folder") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_too_long_to_read() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates/oxccl/src", "crates/oxccl/tests", "crates/oxccl/examples", "crates/oxccl/benches"]
        .into_iter()
        .chain(["crates/oxccl-cli/src", "crates/oxccl-cli/tests", "crates/oxccl-conformance/src"])
        .chain(["crates/oxccl-conformance/tests", "python/src"])
    {
        if root.join(dir).is_dir() {
            rust_files(&root.join(dir), &mut files);
        }
    }
    assert!(files.len() > 250, "the scan sees the sources ({} files)", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.strip_prefix(&root).unwrap_or(f).display()))
        })
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines (split them by concept): {long:?}");
}

#[test]
fn the_reader_sees_paths_groups_and_scopes_and_skips_comments_and_tests() {
    let code = source::code_of(
        "use crate::backend::Op;\nuse crate::{error::Error, dtype};\n// crate::communicator\n\
         pub use self::child::{A as B, c::*};\nmod child;\nmod inner { use super::x::Y; }\n\
         fn f() { let s = \"crate::nope\"; $crate::cpu; crate::tensor::Tensor::new(); child::go(); }\n\
         #[cfg(test)]\nmod tests { use crate::init; }\n#[cfg(doc)]\nuse crate::mesh;\n\
         macro_rules! local { () => {} }\n#[macro_export]\n#[doc(hidden)]\nmacro_rules! shared { () => {} }",
    );
    let r = source::read(&code);
    let paths: Vec<(String, bool, bool, String, Vec<String>)> =
        r.named.iter().map(|n| (n.segs.join("::"), n.in_use, n.reexport, n.bound.clone(), n.inline.clone())).collect();
    let s = |x: &str| x.to_string();
    assert_eq!(
        paths,
        vec![
            (s("crate::backend::Op"), true, false, s("Op"), vec![]),
            (s("crate::error::Error"), true, false, s("Error"), vec![]),
            (s("crate::dtype"), true, false, s("dtype"), vec![]),
            (s("self::child::A"), true, true, s("B"), vec![]),
            (s("self::child::c::*"), true, true, s("*"), vec![]),
            (s("super::x::Y"), true, false, s("Y"), vec![s("inner")]),
            (s("crate::tensor::Tensor::new"), false, false, s("new"), vec![]),
            (s("child::go"), false, false, s("go"), vec![]),
        ]
    );
    assert_eq!(r.mods, vec![(vec![], s("child"), true), (vec![], s("inner"), false)]);
    assert!(r.defines.contains(&s("f")) && r.defines.contains(&s("local")));
    assert_eq!(r.exported_macros, vec![s("shared")]);
}

#[test]
fn cycles_are_found_and_chains_are_not() {
    use std::collections::BTreeMap;
    let edge = || graph::Edge { line: 1, path: String::new() };
    let p = |x: &str| PathBuf::from(x);
    let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, graph::Edge>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")] {
        edges.entry(p(a)).or_default().insert(p(b), edge());
    }
    assert_eq!(graph::cycles(&edges), vec![vec![p("a"), p("b"), p("c")]]);
    edges.get_mut(&p("c")).unwrap().remove(&p("a"));
    assert!(graph::cycles(&edges).is_empty());
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
    let root = root();
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

/// ARCHITECTURE.md names only files and folders that exist, and names every folder of the
/// library (a new room goes on the map).
#[test]
fn the_map_matches_the_tree() {
    let krate = root().join("crates/oxccl");
    let text = std::fs::read_to_string(krate.join("ARCHITECTURE.md")).expect("the map is readable");
    let named = map::named_paths(&text);
    assert!(named.len() > 150, "the map's paths are read ({})", named.len());
    let mut problems = Vec::new();
    for n in &named {
        if !map::found(&map::tree(&krate.join(&n.room)), &n.path) {
            problems.push(format!("line {}: `{}` is not in {}/", n.line, n.path, n.room.display()));
        }
    }
    for folder in map::tree(&krate.join("src")).iter().filter(|p| p.ends_with('/')) {
        let name = folder.trim_end_matches('/').rsplit('/').next().unwrap_or_default().to_string() + "/";
        if !named.iter().any(|n| n.path.starts_with(&name) || n.path.contains(&format!("/{name}"))) {
            problems.push(format!("src/{folder} is on no line of the map"));
        }
    }
    assert!(problems.is_empty(), "ARCHITECTURE.md is out of date:\n{}", problems.join("\n"));
}

#[test]
fn the_map_reader_scopes_paths_by_room() {
    let text = "## Rooms\n```text\nsrc/\n  lib.rs   the API\n  cpu/     engine/ (mod.rs), dispatch.rs\n\
                \x20   agree/   protocol.rs\n  mpi/     setup.rs\n```\nSee `config/registry.rs`.\n";
    let got: Vec<(String, String)> =
        map::named_paths(text).into_iter().map(|n| (n.room.display().to_string(), n.path)).collect();
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        got,
        vec![
            s(".", "src/"),
            s("src", "lib.rs"),
            s("src", "cpu/"),
            s("src/cpu/", "engine/"),
            s("src/cpu/", "mod.rs"),
            s("src/cpu/", "dispatch.rs"),
            s("src/cpu/", "agree/"),
            s("src/cpu/agree/", "protocol.rs"),
            s("src", "mpi/"),
            s("src/mpi/", "setup.rs"),
            s("../..", "config/registry.rs"),
        ]
    );
    let tree = vec!["cpu/".to_string(), "cpu/agree/".to_string(), "cpu/agree/wire.rs".to_string()];
    assert!(map::found(&tree, "agree/wire.rs") && map::found(&tree, "wire.rs") && !map::found(&tree, "gree/wire.rs"));
}
