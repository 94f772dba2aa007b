//! Reading ARCHITECTURE.md's paths, so that a test can hold the map to the tree.
//!
//! In the map's "Rooms" block a line indented by two spaces opens a top-level room
//! (`cpu/`, `lib.rs`) and one indented by four a room inside it (`    agree/`): the paths
//! named on that line and the lines after it (`engine/`, `recovery.rs`, `tcp/links.rs`)
//! are looked for below that room. Everywhere else in the map a path is looked for in the
//! whole repository (`docs/`, `crates/oxccl-cli`). A path is found when some file or folder
//! there ends with it. Rooms are relative to the crate's folder.

use std::path::{Path, PathBuf};

/// One path the map names: where it is looked for (relative to the crate), the path, and
/// the map's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub room: PathBuf,
    pub path: String,
    pub line: usize,
}

/// The paths-like words of `text`: `a.rs`, `x/y.rs`, `SETTINGS.md`, `store/`.
fn path_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)))
        .map(|w| w.trim_start_matches("./").trim_end_matches('.'))
        .filter(|w| {
            let word_chars =
                |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-/".contains(c));
            let file = [".rs", ".md"].iter().any(|e| w.strip_suffix(e).is_some_and(word_chars));
            let folder = w.len() > 1
                && w.ends_with('/')
                && !w.starts_with('/')
                && w[..w.len() - 1].chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '/');
            (file || folder) && !w.starts_with("..") && !w.contains("//")
        })
        .map(str::to_string)
        .collect()
}

/// Every path the map `text` names, with the room it is looked for in.
pub fn named_paths(text: &str) -> Vec<Named> {
    let mut out = Vec::new();
    let (mut in_block, mut in_rooms) = (false, false);
    let mut heading = String::new();
    let (mut top, mut sub): (Option<String>, Option<String>) = (None, None);
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("```") {
            in_block = !in_block;
            in_rooms = in_block && heading == "Rooms";
            (top, sub) = (None, None);
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.trim().to_string();
            continue;
        }
        let mut words = path_words(line);
        if in_rooms {
            let indent = line.len() - line.trim_start().len();
            let first = line.split_whitespace().next().unwrap_or("");
            let opens = words.first().is_some_and(|w| w == first);
            if opens && indent == 2 {
                (top, sub) = (first.ends_with('/').then(|| first.to_string()), None);
                words.remove(0);
                out.push(Named { room: PathBuf::from("src"), path: first.to_string(), line: i + 1 });
            } else if opens && indent == 4 && first.ends_with('/') {
                sub = Some(first.to_string());
                words.remove(0);
                let room = PathBuf::from("src").join(top.clone().unwrap_or_default());
                out.push(Named { room, path: first.to_string(), line: i + 1 });
            }
            let room = if indent == 0 {
                PathBuf::from(".") // the block's own root line, `src/`
            } else {
                PathBuf::from("src").join(top.clone().unwrap_or_default()).join(sub.clone().unwrap_or_default())
            };
            out.extend(words.into_iter().map(|path| Named { room: room.clone(), path, line: i + 1 }));
        } else {
            out.extend(words.into_iter().map(|path| Named { room: PathBuf::from("../.."), path, line: i + 1 }));
        }
    }
    out.dedup();
    out
}

/// Every file and folder below `dir`, as paths relative to `dir` (folders end in `/`).
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            let rel = path.strip_prefix(base).unwrap_or(&path).to_string_lossy().into_owned();
            if path.is_dir() {
                out.push(format!("{rel}/"));
                walk(base, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}

/// Whether some entry of `tree` is `path` or ends with `/path`.
pub fn found(tree: &[String], path: &str) -> bool {
    tree.iter().any(|t| t == path || t.ends_with(&format!("/{path}")))
}
