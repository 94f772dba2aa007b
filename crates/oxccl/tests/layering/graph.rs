//! A crate's module tree and its file-level import graph.
//!
//! A file depends on another when its code names an item defined there, by any path:
//! `crate::a::B`, `super::B`, `self::a::B`, a child module's `a::B`, or through a module it
//! imported (`use crate::a; a::B`); a `#[macro_export]` macro, named `crate::m`, is an item
//! of the file that defines it. Re-exports are followed to the file that defines the item,
//! so a module's facade (`pub use child::B` in `mod.rs`) is not itself a dependency, unless
//! the file also uses the name it re-exports. `mod child;` declares, it does not
//! depend. Code under `#[cfg(test)]` is left out (see [`super::source`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::source::{code_of, read, Named, Reading};

/// A module path from the crate root: `["cpu", "transport", "tcp"]`.
pub type ModPath = Vec<String>;

/// One crate target (a library or a binary), read from its root file down.
pub struct Crate {
    /// The folder that holds the root file.
    pub src: PathBuf,
    /// The root file (`lib.rs`, `main.rs`, `bin/x.rs`), relative to `src`.
    pub root: PathBuf,
    /// Every module that has a file, and its file (relative to `src`).
    files: BTreeMap<ModPath, PathBuf>,
    /// Every module, inline ones (`mod a { … }`) included.
    modules: BTreeSet<ModPath>,
    /// Each file's module path and what it declares and names.
    readings: BTreeMap<PathBuf, (ModPath, Reading)>,
}

/// What a path leads to.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    Module(ModPath),
    Item(ModPath, String),
}

/// One dependency of a file on another, with the first place that shows it.
#[derive(Clone, Debug)]
pub struct Edge {
    pub line: usize,
    pub path: String,
}

impl Crate {
    /// Reads the crate whose root file is `src/root`, following its `mod` declarations.
    pub fn read(src: &Path, root: &str) -> Crate {
        let mut c = Crate {
            src: src.to_path_buf(),
            root: PathBuf::from(root),
            files: BTreeMap::new(),
            modules: BTreeSet::new(),
            readings: BTreeMap::new(),
        };
        c.add_file(Vec::new(), PathBuf::from(root));
        c
    }

    fn add_file(&mut self, module: ModPath, rel: PathBuf) {
        let text = std::fs::read_to_string(self.src.join(&rel))
            .unwrap_or_else(|e| panic!("{}: {e}", self.src.join(&rel).display()));
        let reading = read(&code_of(&text));
        // A `mod.rs`, `lib.rs`, `main.rs` (or a binary's root) keeps its children beside it;
        // `a.rs` keeps them in `a/`.
        let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let dir = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let children_dir = if module.is_empty() || stem == "mod" { dir } else { dir.join(&stem) };
        let children: Vec<(ModPath, PathBuf, bool)> = reading
            .mods
            .iter()
            .map(|(inline, name, has_file)| {
                let mut m = module.clone();
                m.extend(inline.iter().cloned());
                m.push(name.clone());
                let mut d = children_dir.clone();
                d.extend(inline.iter());
                let file = if self.src.join(d.join(format!("{name}.rs"))).exists() {
                    d.join(format!("{name}.rs"))
                } else {
                    d.join(name).join("mod.rs")
                };
                (m, file, *has_file)
            })
            .collect();
        self.modules.insert(module.clone());
        self.files.insert(module.clone(), rel.clone());
        self.readings.insert(rel, (module, reading));
        for (m, file, has_file) in children {
            self.modules.insert(m.clone());
            if has_file {
                self.add_file(m, file);
            }
        }
    }

    /// The files of the crate, relative to `src`.
    pub fn files(&self) -> impl Iterator<Item = &PathBuf> {
        self.readings.keys()
    }

    /// Whether `name` is bound at the crate root by a re-export (`pub use x::Name`).
    pub fn root_reexports(&self, name: &str) -> bool {
        self.readings[&self.root].1.named.iter().any(|n| n.reexport && n.bound == name)
    }

    /// Every path written `crate::Name::…` (outside the root file) where `Name` is not a
    /// module but the root's re-export: `(file, line, path)`.
    pub fn paths_through_root_reexports(&self) -> Vec<(PathBuf, usize, String)> {
        let mut out = Vec::new();
        for (file, (_, reading)) in &self.readings {
            if *file == self.root {
                continue;
            }
            for n in &reading.named {
                let through_root = n.segs.len() >= 2 && n.segs[0] == "crate" && self.root_reexports(&n.segs[1]);
                if through_root && !self.modules.contains(&vec![n.segs[1].clone()]) {
                    out.push((file.clone(), n.line, n.segs.join("::")));
                }
            }
        }
        out
    }

    /// The file that holds module `m` (an inline module is in its parent's file).
    fn file_of(&self, m: &[String]) -> &PathBuf {
        (0..=m.len()).rev().find_map(|k| self.files.get(&m[..k])).expect("the root has a file")
    }

    /// The `use` declarations and other paths written in module `m` (inline or not).
    fn named_in(&self, m: &[String]) -> impl Iterator<Item = &Named> {
        let file = self.file_of(m);
        let (fm, reading) = &self.readings[file];
        let inline = m[fm.len()..].to_vec();
        reading.named.iter().filter(move |n| n.inline == inline)
    }

    fn resolve(&self, from: &[String], segs: &[String], depth: usize) -> Option<Target> {
        if depth > 8 || segs.is_empty() {
            return None;
        }
        let mut cur: ModPath;
        let mut rest = segs;
        match segs[0].as_str() {
            "crate" => {
                cur = Vec::new();
                rest = &segs[1..];
            }
            "self" => {
                cur = from.to_vec();
                rest = &segs[1..];
            }
            "super" => {
                cur = from.to_vec();
                while rest.first().is_some_and(|s| s == "super") {
                    cur.pop()?;
                    rest = &rest[1..];
                }
            }
            first => {
                let mut child = from.to_vec();
                child.push(first.to_string());
                if self.modules.contains(&child) {
                    cur = child;
                    rest = &segs[1..];
                } else {
                    // A module imported by name: `use crate::a::b; b::C`.
                    let alias = self.named_in(from).find(|n| n.in_use && n.bound == first && n.segs.len() > 1)?;
                    match self.resolve(from, &alias.segs, depth + 1)? {
                        Target::Module(m) => {
                            cur = m;
                            rest = &segs[1..];
                        }
                        Target::Item(..) => return None,
                    }
                }
            }
        }
        for seg in rest {
            if seg == "*" {
                return Some(Target::Module(cur));
            }
            let mut child = cur.clone();
            child.push(seg.clone());
            if self.modules.contains(&child) {
                cur = child;
            } else {
                return Some(self.item(&cur, seg, depth));
            }
        }
        Some(Target::Module(cur))
    }

    /// Where item `name` of module `m` is defined: through `m`'s imports, if any (a child
    /// module sees its parent's private imports too).
    fn item(&self, m: &[String], name: &str, depth: usize) -> Target {
        let here = Target::Item(m.to_vec(), name.to_string());
        if let Some(re) = self.named_in(m).find(|n| n.in_use && n.bound == name) {
            return self.resolve(m, &re.segs, depth + 1).unwrap_or(here);
        }
        for glob in self.named_in(m).filter(|n| n.reexport && n.bound == "*") {
            if let Some(Target::Module(g)) = self.resolve(m, &glob.segs, depth + 1) {
                let file = self.file_of(&g);
                if g != m && self.readings[file].1.defines.iter().any(|d| d == name) {
                    return self.item(&g, name, depth + 1);
                }
            }
        }
        if m.is_empty() {
            // A `#[macro_export]` macro is named at the crate root but defined in its file.
            let exported = self.readings.values().find(|(_, r)| r.exported_macros.iter().any(|d| d == name));
            if let Some((module, _)) = exported {
                return Target::Item(module.clone(), name.to_string());
            }
        }
        here
    }

    /// The file-level dependencies: file → file → the first path that shows it.
    pub fn edges(&self) -> BTreeMap<PathBuf, BTreeMap<PathBuf, Edge>> {
        let mut out: BTreeMap<PathBuf, BTreeMap<PathBuf, Edge>> = BTreeMap::new();
        for (file, (module, reading)) in &self.readings {
            for n in &reading.named {
                // A re-export is a facade, not a dependency, unless the file uses the name.
                if n.reexport && reading.idents_outside_use.get(&n.bound).copied().unwrap_or(0) == 0 {
                    continue;
                }
                let mut scope = module.clone();
                scope.extend(n.inline.iter().cloned());
                let target = match self.resolve(&scope, &n.segs, 0) {
                    // A module imported by name: the paths through it are the dependencies.
                    Some(Target::Module(_)) if n.in_use && n.bound != "*" => continue,
                    Some(Target::Module(m)) | Some(Target::Item(m, _)) => m,
                    None => continue,
                };
                let to = self.file_of(&target);
                if to != file {
                    out.entry(file.clone())
                        .or_default()
                        .entry(to.clone())
                        .or_insert(Edge { line: n.line, path: n.segs.join("::") });
                }
            }
        }
        out
    }
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
pub fn cycles(edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, Edge>>) -> Vec<Vec<PathBuf>> {
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeMap<PathBuf, Edge>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next.keys() {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}
